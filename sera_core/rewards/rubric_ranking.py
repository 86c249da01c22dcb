"""The rubric-generation reward: ranking counterfactual branches (SPEC 3).

At a delegation point the runtime ran ``B`` branches of the same subtask from the same
start, labelled each (``y_b``: checker or judge) and scored each against the frozen
rubric (``s_b``, detached scoring calls). The group's ranking loss over every
(success, failure) pair (:func:`sera_core.rubrics.ranking_loss`, margin 0.2)::

    L_rank = mean_{(p, n): y_p = 1, y_n = 0} max(0, 0.2 - s_p + s_n)

and the reward of the rubric-writing tokens (official)::

    r_rubric = -L_rank                                  variant "ranking" (SERA)
    r_rubric = -L_rank + lambda * std_b(s_b)            variant "discriminative" (Table 3 ablation)

``std_b`` is the population standard deviation of the group's valid scores (branches with
a label and a score). The paper names the "discriminativeness" reward (score spread)
without its formula; this form and ``lambda = 1`` are the workbook's decision.

Groups where every branch succeeded or every branch failed (``ranking.skipped``) carry
no ordering and give no datum; nor does a point whose rubric no policy call wrote (the
global-rubric and external-writer ablations); nor a point of a tree marked
``drop_rollout`` (:func:`kept_points`).
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import pstdev

from sera_core.agents.points import DelegationPoint
from sera_core.rewards import Datum

VARIANTS = ("ranking", "discriminative")


def kept_points(rollouts: Iterable) -> list[DelegationPoint]:
    """The delegation points of the rollouts whose tree is not marked ``drop_rollout``."""
    return [p for r in rollouts if not r.tree.dropped for p in r.points]


def group_spread(point: DelegationPoint) -> float:
    """``std_b(s_b)`` over the branches with both a label and a score."""
    valid = [s for s, y in zip(point.scores, point.labels, strict=True) if s is not None and y is not None]
    return pstdev(valid) if len(valid) > 1 else 0.0


def rubric_datums(points: Iterable[DelegationPoint], variant: str = "ranking", spread_weight: float = 1.0) -> list[Datum]:
    """One datum per valid :class:`~sera_core.agents.points.DelegationPoint`: the
    reward of its rubric-writing call (module docstring). The writer's depth is read
    from its node id (``"0"`` root, ``"0.1"`` depth 1, ...)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    out = []
    for p in points:
        if p.ranking.skipped or p.rubric_turn is None:
            continue
        reward = -p.ranking.loss
        if variant == "discriminative":
            reward += spread_weight * group_spread(p)
        out.append(Datum(p.tree_id, p.task_id, p.parent_id, p.rubric_turn, "rubric",
                         p.parent_id.count("."), reward, group=f"{p.parent_id}>{p.child_id}"))
    return out
