"""SERA's three rewards (SPEC 3), each a small pure function over rollout trees.

Every reward is attached to a :class:`Datum`: the tokens of one role in one place of a
tree (an agent's execution tokens, the launch statement of one parent step, one
rubric-writing call) together with the reward those tokens receive. The advantages
(:mod:`sera_core.train.advantages`) and the CISPO loss (:mod:`sera_core.train.cispo`)
consume datums; nothing here touches a model.

* :mod:`~sera_core.rewards.execution` - root ``R_i``; non-root ``s_v`` (or the external
  binary label for the RAO rows).
* :mod:`~sera_core.rewards.leaf_credit` - ``r_leaf(e) = R_i |L_i(e)| / |L(T_i)|``.
* :mod:`~sera_core.rewards.rubric_ranking` - ``-L_rank`` of each counterfactual group.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Datum:
    """The tokens of one role in one place of one tree, and their reward."""

    tree_id: str
    """The rollout tree the tokens belong to."""
    task_id: str
    """The root task (trees of the same root task form a leave-one-out group)."""
    node_id: str
    """The agent whose turns hold the tokens."""
    turn: int | None
    """Index into the node's ``turns`` (a launch statement, a rubric call); None: every
    ``act`` turn of the node (an agent's execution tokens)."""
    role: str
    """The token role trained: ``execution``, ``launch`` or ``rubric``."""
    depth: int
    """Depth of the agent that wrote the tokens (root 0): the key of depth weighting."""
    reward: float
    """The reward of these tokens."""
    group: str = ""
    """Extra grouping key (rubric datums: the delegation point); informational."""


__all__ = ["Datum"]
