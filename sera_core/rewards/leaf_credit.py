"""The decomposition reward: leaf coverage (SPEC 3, SPEC 8).

A delegation event ``e`` of tree ``T_i`` is one parent step that launched one or more
children. Its reward goes to that step's launch statement (the ``launch`` tokens)::

    r_leaf(e) = R_i * |L_i(e)| / |L(T_i)|

``L_i(e)``: the leaves under the event's children (the union of their subtrees' leaves);
``L(T_i)``: every leaf of the tree (a root that never delegates is itself a leaf). A failed
tree (``R_i = 0``) gives every event 0. A step with launch tokens that produced no child
(an invalid delegation attempt: a rejected ``<delegate>``, a ``launch_subagent`` call that
raised) gets 0.

Full SERA weights all leaves equally and does not filter them. ``gate_filter=True`` (an
option of the official code) counts in ``L_i(e)`` only the leaves whose child passed its
rubric's success gate (``score.gate`` true); the denominator stays every leaf.
"""

from __future__ import annotations

from sera_core.agents.tree import Tree
from sera_core.rewards import Datum
from sera_core.rewards.execution import root_reward


def _passed_gate(tree: Tree, node_id: str) -> bool:
    score = tree.nodes[node_id].score
    return bool(score and score.get("gate"))


def leaf_datums(tree: Tree, gate_filter: bool = False) -> list[Datum]:
    """One datum per parent step with launch tokens: ``r_leaf`` (module docstring), in
    node order, then turn order."""
    if tree.dropped:
        return []
    r_tree, n_leaves = root_reward(tree), len(tree.leaves())
    covered: dict[tuple[str, int], set[str]] = {}
    for event in tree.delegation_events():
        step = tree.nodes[event.child_ids[0]].launch_step
        leaves = {leaf.node_id for leaf in tree.event_leaves(event)
                  if not gate_filter or _passed_gate(tree, leaf.node_id)}
        covered.setdefault((event.parent_id, step), set()).update(leaves)  # type: ignore[arg-type]
    out = []
    for node in tree.nodes.values():
        for k, turn in enumerate(node.turns):
            if turn.kind != "act" or "launch" not in turn.roles:
                continue
            leaves = covered.get((node.node_id, k))
            reward = r_tree * len(leaves) / n_leaves if leaves else 0.0
            out.append(Datum(tree.tree_id, tree.task_id, node.node_id, k, "launch", node.depth, reward))
    return out
