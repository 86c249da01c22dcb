"""Advantages of the three objectives: leave-one-out baselines and depth weighting (SPEC 3, 4, 8).

Trees of one root task form a group (``K`` trees, ``R_j`` their root verdicts). For a
datum of tree ``i`` with reward ``r``::

    execution   A = r - (1 / (K - 1)) * sum_{j != i} R_j
    launch      A = r - (sum_j m_j - m_i) / (K - 1)       (reward_first_root_balanced)
                m_i = mean of tree i's launch rewards (0 if it launched nothing)
                (not the naive per-event baseline, :func:`naive_per_event_advantages`)
    rubric      A_g = r_g - mean_{g' != g} r_g'           (across the batch's valid groups)

A group of one (``K = 1``, a single valid rubric group) has baseline 0. Averaging a tree's
launch rewards first keeps trees with many delegations from biasing the baseline.

Depth weighting: a datum at depth ``d`` is multiplied by
``w_d = N / (D * n_d)``, where ``n_d`` is the number of datums (trajectories) at depth
``d``, ``D`` the number of depths present and ``N`` the number of datums; so ``w_d`` is
proportional to ``1 / n_d`` and the weights sum to ``N``.

Zero-variance filtering (official ``filter_zero_variance_groups``): a group whose datums
all have the same reward teaches no preference and is dropped before its advantages are
computed (execution: the datums of one root task; launch: the datums of one root task
together with its trees' ``m_j``, see :func:`leaf_advantages`; rubric: the batch's groups).
No advantage normalisation (SPEC 4).

A tree marked ``drop_rollout`` (that malformed-output policy) gives no datums and leaves
every baseline: the group of its root task is its other trees (``K`` counts only those).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from sera_core.agents.tree import Tree
from sera_core.rewards import Datum
from sera_core.rewards.execution import root_reward


@dataclass(frozen=True)
class Advantage:
    """A datum with its advantage and depth weight; the CISPO loss uses ``value``."""

    datum: Datum
    advantage: float
    """``A`` before depth weighting."""
    weight: float = 1.0
    """``w_d`` (1 without depth weighting)."""

    @property
    def value(self) -> float:
        """``w_d * A``: what multiplies the datum's tokens in the loss."""
        return self.weight * self.advantage


def _group(items: Sequence, key) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for x in items:
        out[key(x)].append(x)
    return out


REWARD_TOLERANCE = 1e-9
"""Rewards closer than this are equal: ``-L_rank`` of two groups whose every pair ties is 0.2
up to float rounding (``0.2 - 1.0 + 1.0`` is 0.19999999999999996), and training on that
difference would be training on rounding noise (and Adam's momentum would move the weights
on a batch that prefers nothing)."""


def uniform(rewards: Sequence[float]) -> bool:
    """True when ``max - min <= REWARD_TOLERANCE`` (none or one reward included): nothing to prefer."""
    return not rewards or max(rewards) - min(rewards) <= REWARD_TOLERANCE


def zero_variance(datums: Sequence[Datum]) -> bool:
    """True when every datum has the same reward, to :data:`REWARD_TOLERANCE` (nothing to prefer)."""
    return uniform([d.reward for d in datums])


def leave_one_out(rewards: Sequence[float]) -> list[float]:
    """``A_i = r_i - mean_{j != i} r_j`` (baseline 0 for a single reward)."""
    total, n = sum(rewards), len(rewards)
    return [r - ((total - r) / (n - 1) if n > 1 else 0.0) for r in rewards]


def _keep(datums: Sequence[Datum], filter_zero_variance: bool) -> list[Datum]:
    if not filter_zero_variance:
        return list(datums)
    return [d for group in _group(datums, lambda d: d.task_id).values() if not zero_variance(group) for d in group]


def kept_trees(trees: Sequence[Tree]) -> list[Tree]:
    """The trees that count in baselines: all but those marked ``drop_rollout``."""
    return [t for t in trees if not t.dropped]


def execution_advantages(datums: Sequence[Datum], trees: Sequence[Tree], *, filter_zero_variance: bool = True) -> list[Advantage]:
    """``A = r - mean_{j != i} R_j`` over the (kept) trees of the datum's root task."""
    roots = _group(kept_trees(trees), lambda t: t.task_id)
    out = []
    for d in _keep(datums, filter_zero_variance):
        others = [root_reward(t) for t in roots[d.task_id] if t.tree_id != d.tree_id]
        out.append(Advantage(d, d.reward - (fmean(others) if others else 0.0)))
    return out


def leaf_advantages(datums: Sequence[Datum], trees: Sequence[Tree], *, filter_zero_variance: bool = True) -> list[Advantage]:
    """``reward_first_root_balanced``: ``A = r - (sum_j m_j - m_i) / (K - 1)``.

    A root task's group is zero-variance only when its launch rewards *and* the ``m_j``
    of all its trees are equal (every advantage is then 0): one tree whose launches earned
    1.0 beside seven that never delegated (``m = 0``) is a preference, and is kept."""
    trees = kept_trees(trees)
    rewards = _group(datums, lambda d: d.tree_id)
    m = {t.tree_id: fmean(d.reward for d in rewards[t.tree_id]) if rewards.get(t.tree_id) else 0.0 for t in trees}
    group = _group(trees, lambda t: t.task_id)
    flat = {task_id for task_id, ds in _group(datums, lambda d: d.task_id).items()
            if uniform([d.reward for d in ds] + [m[t.tree_id] for t in group[task_id]])}
    out = []
    for d in datums:
        if filter_zero_variance and d.task_id in flat:
            continue
        k = len(group[d.task_id])
        baseline = (sum(m[t.tree_id] for t in group[d.task_id]) - m[d.tree_id]) / (k - 1) if k > 1 else 0.0
        out.append(Advantage(d, d.reward - baseline))
    return out


def naive_per_event_advantages(datums: Sequence[Datum]) -> list[Advantage]:
    """The naive baseline that :func:`leaf_advantages` is built *not* to be (notebook 06
    contrasts the two; the trainer never uses this one): every launch datum of the task's
    other trees counts once, ``A = r - mean_{e in T_j, j != i} r(e)`` (baseline 0 when the
    other trees launched nothing). Written with each tree's mean ``m_j`` and event count
    ``n_j``, the baseline is ``sum_{j != i} n_j m_j / sum_{j != i} n_j``: tree ``j`` weighs
    ``n_j``, so the trees with many delegation events set it, and a tree that launched
    nothing is left out (root balanced: every other tree weighs ``1 / (K - 1)``, one that
    launched nothing with ``m_j = 0``). No zero-variance filtering."""
    by_task = _group(datums, lambda d: d.task_id)
    out = []
    for d in datums:
        others = [e.reward for e in by_task[d.task_id] if e.tree_id != d.tree_id]
        out.append(Advantage(d, d.reward - (fmean(others) if others else 0.0)))
    return out


def rubric_advantages(datums: Sequence[Datum], *, filter_zero_variance: bool = True) -> list[Advantage]:
    """``A_g = r_g - mean_{g' != g} r_g'`` across the batch's valid groups."""
    if filter_zero_variance and zero_variance(datums):
        return []
    return [Advantage(d, a) for d, a in zip(datums, leave_one_out([d.reward for d in datums]), strict=True)]


def depth_weighted(advantages: Sequence[Advantage]) -> list[Advantage]:
    """Each advantage with ``w_d = N / (D * n_d)`` (module docstring)."""
    counts = Counter(a.datum.depth for a in advantages)
    n, depths = len(advantages), len(counts)
    return [Advantage(a.datum, a.advantage, n / (depths * counts[a.datum.depth])) for a in advantages]
