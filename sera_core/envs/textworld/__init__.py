"""TextWorld-Sync: a shared multi-dish CookingWorld, its task families and checkers.

Modules: ``data`` (CookingWorld foods and preparations from the ``textworld``
package), ``tasks`` (the seven families x four difficulties, official record format),
``world`` (the shared world: actions under one lock, observation, root checker,
snapshot/fork/commit), ``protocol`` (the one-block reply parser), ``env`` (one agent's
session: turns, delegation, budgets), ``goals`` (the subtask checker for canonical
sub-goals), ``expert`` (the scripted agent).
"""
