"""Held-out delegation points: a fixed set on which to measure rubric writing and scoring.

Training moves the policy, so the delegation points it meets in its own rollouts change
with it; comparing two models' pairwise accuracy on their own rollouts mixes how well they
*rank* with which branches they happened to play. This module fixes the branches:

* :func:`heldout_points` plays root tasks with the noisy expert (seeded mistakes, so some
  branches fail) with counterfactual groups of ``B`` and keeps the *mixed* groups (both
  outcomes among the branches): only those carry a ranking signal (SPEC 3). The points are
  the same bytes on every run (the expert and the runtime are seeded).
* :meth:`~sera_core.agents.runtime.Runtime.rescore` lets any policy write the rubric from
  the stored prompt (temperature ``rubric_temperature``, 1 by default) and score every stored
  branch against it; :func:`point_metrics` summarises the result:

  - pairwise accuracy of a group: the share of (success, failure) branch pairs whose scores
    are in the right order, ties counting 1/2
    (:func:`~sera_core.rubrics.ranking_loss`);
  - ranking loss ``L_rank = mean over those pairs of max(0, margin - (s_succ - s_fail))``,
    margin 0.2 (the rubric writer's reward is ``-L_rank``);
  - both averaged over the groups, with a 95% interval ``1.96 * std / sqrt(n)`` (normal
    approximation over groups), and the share of rubrics and scores that parsed;
  - with a ``decode`` function, the **belief accuracy**: the same pairwise accuracy with each
    branch ranked by the probability its scoring call put on ``success: true``
    (:func:`success_belief`) instead of by its score.

Why the belief readout exists (our decision, measured: docs/measurements.md). The official
readout scores at temperature 0, where the shipped scorer writes ``success: true`` and 1.0
for every branch, so every pair ties (accuracy 1/2) although the same greedy call gives
``true`` about 0.87 on branches that succeeded and about 0.83 on those that failed. The
ranking reward trains exactly that probability (a sampled ``true`` on a failed branch earns
a negative advantage), so the belief shows whether training moves the scorer long before
the greedy answer flips. It is read from the greedy call's own recorded log-probabilities
(both engines record the unmodified distribution): no extra model call.

Why the expert plays the branches (our decision): its trajectories are the transcripts the
embedded policy was warm-started to write, the groups are mixed by construction, and the set
costs seconds to build and nothing to store; the policy's own branches would make the set
depend on the model being measured.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from statistics import fmean, pstdev, pvariance
from typing import Any

from sera_core.agents.actors import noisy_expert
from sera_core.agents.points import DelegationPoint
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.rubrics import RankingResult, ranking_loss


def heldout_points(benchmark: str, records: Sequence[dict], *, counterfactual: int = 8, seed: int = 0,
                   tokenizer: Any = None) -> list[DelegationPoint]:
    """The mixed counterfactual groups of the noisy expert's rollouts of ``records`` (B =
    ``counterfactual`` branches, runtime seed ``seed``), in rollout order."""
    cfg = RuntimeConfig(counterfactual=counterfactual, fork_cap=max(16, counterfactual), seed=seed)
    rollouts = Runtime(benchmark, noisy_expert(tokenizer=tokenizer), cfg).run(list(records))
    return [p for r in rollouts for p in r.points if not p.ranking.skipped]


def mean_interval(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and 95% half interval ``t_{0.975, n-1} * s / sqrt(n)`` (Student's t,
    :func:`~sera_core.eval.aggregate.t_interval`: over 3 seeds t is 4.30, not the normal 1.96;
    None for no values, and no interval for one), each rounded to 4 places."""
    from sera_core.eval.aggregate import t_interval

    if not values:
        return None, None
    t = t_interval(values)
    return round(t["mean"], 4), None if t["half"] is None else round(t["half"], 4)


def format_interval(values: Sequence[float | None]) -> str:
    """``mean ± half`` (:func:`mean_interval`, Student's t, 3 places) of the values that are not None;
    the mean alone for one value, ``-`` for none: a table cell over seeds."""
    mean, half = mean_interval([v for v in values if v is not None])
    if mean is None:
        return "-"
    return f"{mean:.3f}" if half is None else f"{mean:.3f} ± {half:.3f}"


GATE = re.compile(r'"success"\s*:\s*(true|false)')
"""The success gate's value in a scoring call's JSON."""


def gate_token(completion_ids: Sequence[int], decode: Callable[[list[int]], str]) -> tuple[int, str] | None:
    """``(t, value)``: the index in ``completion_ids`` of the token that begins the success
    gate's value (the choice between ``true`` and ``false``) and the value written; None when
    the completion spells no ``"success": true|false``. ``decode`` must be lossless
    (:meth:`~sera_core.policy.chat.ChatFormat.decode`): the token is found by decoding prefixes."""
    ids = list(completion_ids)
    match = GATE.search(decode(ids))
    if match is None:
        return None
    lo, hi = 0, len(ids) - 1
    while lo < hi:  # the first token whose prefix reaches past the value's first character
        mid = (lo + hi) // 2
        if len(decode(ids[:mid + 1])) > match.start(1):
            hi = mid
        else:
            lo = mid + 1
    return lo, match.group(1)


def success_belief(completion_ids: Sequence[int], logprobs: Sequence[float], decode: Callable[[list[int]], str]) -> float | None:
    """``P(g = 1)`` that a scoring call put on its success gate, from its recorded log-probabilities::

        p = exp(log pi(t))          t: the token that begins the gate's value (the choice, :func:`gate_token`)
        belief = p if the value is true, else 1 - p

    (the mass the model put on neither spelling is counted against the value it wrote). None
    when the completion spells no ``"success": true|false``."""
    gate = gate_token(completion_ids, decode)
    if gate is None:
        return None
    p = math.exp(logprobs[gate[0]])
    return p if gate[1] == "true" else 1.0 - p


def branch_beliefs(point: DelegationPoint, decode: Callable[[list[int]], str]) -> list[float | None]:
    """Each branch's :func:`success_belief`: the runtime's own score for a forced zero (no
    call: 0), None for a branch with no valid score (no valid rubric or a malformed score),
    in branch order. Pass it to :func:`~sera_core.rubrics.ranking_loss` in place of
    :attr:`~sera_core.agents.points.DelegationPoint.scores` to rank by belief."""
    out: list[float | None] = []
    for b, s in zip(point.branches, point.scores, strict=True):
        t = b.score_turn
        out.append(None if s is None else s if t is None else success_belief(t.completion_ids, t.logprobs, decode))
    return out


def mixed_rankings(points: Sequence[DelegationPoint], values: Sequence[Sequence[float | None]]) -> list[RankingResult]:
    """:func:`~sera_core.rubrics.ranking_loss` of each point's per-branch ``values`` (its
    scores or beliefs; None counted as 0) against its labels, for the mixed groups only."""
    rankings = [ranking_loss([0.0 if v is None else v for v in vs], p.labels) for p, vs in zip(points, values, strict=True)]
    return [r for r in rankings if not r.skipped]


def gate_ceiling(points: Sequence[DelegationPoint], beliefs: Sequence[Sequence[float | None]]) -> tuple[float | None, float | None]:
    """The best mean pairwise accuracy a greedy *gate* could show if training moved only its
    bias, and the threshold that gives it: ``(accuracy, tau)``, over the mixed points.

    A shift ``delta`` of the gate's logit turns each call's belief ``q_b`` into
    ``sigmoid(logit(q_b) + delta)``; the greedy call writes ``true`` where that is at least 1/2,
    i.e. where ``q_b >= tau = sigmoid(-delta)``: one threshold for every call. Reading the gate
    alone as the score (``g_b = 1[q_b >= tau]``, a missing belief counted as 0), each point's
    pairwise accuracy is that of :func:`mixed_rankings`, and::

        ceiling = max over tau of mean over mixed points of accuracy(1[q >= tau])

    ``tau`` runs over every belief value (and above the largest: every gate ``false``, every pair
    tied, 1/2; the lowest of equally good thresholds is returned). It is chosen on the points
    themselves, so it is an upper bound of what a pure bias shift gives, not an estimate. It
    is not bounded by the belief accuracy: a threshold above all of a point's beliefs turns
    its wrong order into ties (1/2), while one bit per branch loses the order within the
    points whose beliefs straddle it. ``(None, None)`` without a mixed point."""
    filled = [[0.0 if v is None else v for v in vs] for vs in beliefs]
    best: tuple[float | None, float | None] = (None, None)
    for tau in sorted({v for vs in filled for v in vs} | {math.inf}):
        ranked = mixed_rankings(points, [[float(v >= tau) for v in vs] for vs in filled])
        accuracy = fmean(r.accuracy for r in ranked) if ranked else None
        if accuracy is not None and (best[0] is None or accuracy > best[0]):
            best = (accuracy, tau)
    return (None, None) if best[0] is None else (round(best[0], 4), None if math.isinf(best[1]) else round(best[1], 4))


def rubric_spread(points: Sequence[DelegationPoint], beliefs: Sequence[Sequence[Sequence[float | None]]]) -> dict[str, Any]:
    """How much the rubric moves the scorer's belief: the same branches scored against ``R``
    rubrics per point. ``beliefs[r][i][b]`` is :func:`branch_beliefs` of branch ``b`` of point
    ``i`` scored against its ``r``-th rubric.

    Only the *complete* mixed points enter: those with a belief for every branch under every
    rubric. A missing one (a rubric or a score that did not parse) would count as 0 in
    :func:`point_metrics` and make the spread across rubrics measure validity instead of the
    rubric's effect; how many points were left out is ``incomplete``. Over the complete
    points (``acc[r][i]``: the pairwise accuracy of ``q[r][i]``)::

        mean_accuracy  = mean_i mean_r acc[r][i]     what a rubric drawn from the writer gives
        best_accuracy  = mean_i max_r acc[r][i]      a writer that always wrote its best draw
        worst_accuracy = mean_i min_r acc[r][i]
        across_rubrics  = mean_i sqrt(mean_b var_r q[r][i][b])   a branch's spread over rubrics
        across_branches = mean_i std_b (mean_r q[r][i][b])       the branches' spread, rubric averaged

    (population variances). ``best - mean`` bounds what training the writer could gain on
    these points by choosing among what it already writes (chosen in-sample: an upper bound);
    ``across_rubrics`` against ``across_branches`` says whether the rubric or the branch
    decides the belief. Needs ``R >= 2``; None values without a complete point."""
    if len(beliefs) < 2 or any(len(b) != len(points) for b in beliefs):
        raise ValueError(f"need beliefs for every point under at least 2 rubrics, got {[len(b) for b in beliefs]} for {len(points)} points")
    mixed = [i for i, p in enumerate(points) if True in p.labels and False in p.labels]
    keep = [i for i in mixed if all(v is not None for run in beliefs for v in run[i])]
    acc = [[r.accuracy for r in mixed_rankings([points[i] for i in keep], [run[i] for i in keep])] for run in beliefs]
    q = [[run[i] for run in beliefs] for i in keep]  # q[i][r][b]
    within = [math.sqrt(fmean(pvariance(col) for col in zip(*qi, strict=True))) for qi in q]  # col: one branch over rubrics
    between = [pstdev([fmean(col) for col in zip(*qi, strict=True)]) for qi in q]
    per_point = list(zip(*acc, strict=True))  # per_point[i][r]

    def mean(xs: list[float]) -> float | None:
        return round(fmean(xs), 4) if xs else None

    return {"rubrics": len(beliefs), "points": len(keep), "incomplete": len(mixed) - len(keep),
            "mean_accuracy": mean([fmean(a) for a in per_point]), "best_accuracy": mean([max(a) for a in per_point]),
            "worst_accuracy": mean([min(a) for a in per_point]), "across_rubrics": mean(within), "across_branches": mean(between)}


def point_metrics(points: Sequence[DelegationPoint], decode: Callable[[list[int]], str] | None = None) -> dict[str, Any]:
    """Pairwise accuracy and ranking loss over the points' mixed groups (mean and 95% half
    interval), how many groups were mixed, and the validity of the rubrics and scores; with
    ``decode``, also the belief accuracy (``belief_accuracy``, ``belief_accuracy_ci``: the
    pairwise accuracy of :func:`branch_beliefs`, module docstring), ``belief_loss``, the
    mean ranking loss of the same beliefs, and ``gate_ceiling`` / ``gate_threshold``, the
    most a shift of the gate's bias alone could give the greedy readout (:func:`gate_ceiling`).

    A branch without a score (its rubric or its scoring output did not parse) counts as a
    score of 0 here, so a model that writes no valid rubric gets accuracy 1/2 and loss 0.2
    (every pair ties) instead of dropping out of the average. (Training instead gives such
    a group no datum: :mod:`sera_core.rewards.rubric_ranking`.)"""
    valid = mixed_rankings(points, [p.scores for p in points])
    accuracy, accuracy_ci = mean_interval([r.accuracy for r in valid])
    loss, loss_ci = mean_interval([r.loss for r in valid])
    called = [b for p in points if p.rubric is not None for b in p.branches if b.score_turn is not None]
    belief: dict[str, Any] = {}
    if decode is not None:
        beliefs = [branch_beliefs(p, decode) for p in points]
        ranked = mixed_rankings(points, beliefs)
        belief["belief_accuracy"], belief["belief_accuracy_ci"] = mean_interval([r.accuracy for r in ranked])
        belief["belief_loss"] = mean_interval([r.loss for r in ranked])[0]
        belief["gate_ceiling"], belief["gate_threshold"] = gate_ceiling(points, beliefs)
    return {"points": len(points), "mixed": len(valid), "pairwise_accuracy": accuracy, "pairwise_accuracy_ci": accuracy_ci,
            "ranking_loss": loss, "ranking_loss_ci": loss_ci,
            "rubric_validity": round(sum(p.rubric is not None for p in points) / len(points), 4) if points else None,
            "score_validity": round(sum(not b.malformed for b in called) / len(called), 4) if called else None,
            **belief}
