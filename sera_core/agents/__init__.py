"""Recursive agents: the rollout record (:mod:`sera_core.agents.tree`) and the runtime.

:mod:`sera_core.agents.tree` holds one :class:`~sera_core.agents.tree.Tree` per
rollout: nodes (agents) with their turns' exact prompt/completion token ids, the
logprobs recorded at generation, and a role per completion token (``execution``,
``launch``, ``rubric``, ``score``), from which the three training objectives take
their disjoint token masks.
"""
