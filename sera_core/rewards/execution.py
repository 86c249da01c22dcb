"""The execution reward (SPEC 3).

For tree ``T_i`` of root task ``x``, every agent ``v`` gets one reward for all of its
execution tokens (its ``act`` turns, launch statements excluded)::

    r_exec(i, v) = R_i                 v is the root (the environment's verdict, {0, 1})
                 = s_v                 v is a child (its frozen-rubric score in [0, 1]; SERA)
                 = y_v                 v is a child and source == "label" (external binary
                                       label: the RAO rows of the paper's tables)

A child without a reward (a malformed rubric or score under ``drop_trajectory``; no
label under ``label``) gives no datum: its tokens get no gradient. A tree marked
``drop_rollout`` (that malformed-output policy) gives no datums at all. Agents without
execution tokens (no act turn) give none either.
"""

from __future__ import annotations

from sera_core.agents.tree import Tree
from sera_core.rewards import Datum

SOURCES = ("rubric", "label")
"""Where a child's execution reward comes from: its rubric score (SERA) or the external label (RAO)."""


def root_reward(tree: Tree) -> float:
    """``R_i``: the root checker's verdict (a tree that errored or never finished counts 0)."""
    return float(tree.root_reward or 0.0)


def child_reward(tree: Tree, node_id: str, source: str = "rubric") -> float | None:
    """``s_v`` (``source="rubric"``: the reward the runtime resolved from the score,
    None when dropped) or ``float(y_v)`` (``source="label"``: None without a label)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    node = tree.nodes[node_id]
    if source == "label":
        return None if node.label is None else float(node.label)
    reward = node.result.get("reward")
    return None if reward is None else float(reward)


def execution_datums(tree: Tree, source: str = "rubric") -> list[Datum]:
    """One datum per agent with execution tokens: ``r_exec(i, v)`` (module docstring)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if tree.dropped:
        return []
    out = []
    for node in tree.nodes.values():
        if not any("execution" in t.roles for t in node.turns if t.kind == "act"):
            continue
        reward = root_reward(tree) if node.parent_id is None else child_reward(tree, node.node_id, source)
        if reward is not None:
            out.append(Datum(tree.tree_id, tree.task_id, node.node_id, None, "execution", node.depth, reward))
    return out
