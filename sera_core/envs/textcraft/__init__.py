"""TextCraft-Synth: synthetic recipe worlds, tasks, the CodeAct environment and its expert.

Modules: ``world`` (recipe world generator and recipe book), ``planner`` (aggregated
gold plans), ``tasks`` (task splits and records), ``sandbox`` (the CodeAct executor),
``env`` (tools, checker, snapshot/fork/commit), ``expert`` (the scripted agent).
"""
