"""Held-out delegation points (sera_core/eval/points.py): a fixed, mixed set that any policy
rescores; the metrics count an unparsable rubric as ties, never as a skipped group."""

from __future__ import annotations

import json
import math

import pytest

from sera_core.agents.actors import PolicyActor
from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.course import noisy_expert, pick_tasks
from sera_core.eval.points import branch_beliefs, gate_ceiling, heldout_points, point_metrics, rubric_spread, success_belief
from sera_core.policy.base import Generation, per_prompt
from sera_core.policy.chat import ChatFormat
from sera_core.rubrics import GLOBAL_RUBRIC


@pytest.fixture(scope="module")
def points():
    return heldout_points("textcraft", pick_tasks("textcraft", "val", difficulty="medium", count=3))


def test_heldout_points_are_mixed_and_the_same_every_time(points):
    assert points and all(True in p.labels and False in p.labels for p in points)
    again = heldout_points("textcraft", pick_tasks("textcraft", "val", difficulty="medium", count=3))
    assert [json.dumps(p.to_json()) for p in again] == [json.dumps(p.to_json()) for p in points]


def test_point_metrics_of_the_expert_and_of_a_policy_that_writes_no_rubric(points):
    expert = point_metrics(Runtime("textcraft", noisy_expert()).rescore_all(points))
    assert expert["points"] == expert["mixed"] == len(points)
    assert expert["pairwise_accuracy"] == 1.0 and expert["rubric_validity"] == 1.0 and expert["score_validity"] == 1.0
    # recomputed by hand from the rescored scores and the fixed labels
    rescored = Runtime("textcraft", noisy_expert()).rescore_all(points)
    losses = []
    for p in rescored:
        pairs = [(a, b) for a, ya in zip(p.scores, p.labels, strict=True) if ya for b, yb in zip(p.scores, p.labels, strict=True) if yb is False]
        losses.append(sum(max(0.0, 0.2 - a + b) for a, b in pairs) / len(pairs))
    assert expert["ranking_loss"] == round(sum(losses) / len(losses), 4)

    class Mute:
        """A policy that answers every call with text that is no rubric."""

        def __init__(self):
            self.tokenizer = default_tokenizer()
            self.chat = ChatFormat(self.tokenizer)

        def generate(self, prompts, params):
            ids = self.chat.encode("I am not sure.")
            return [Generation(ids, [-1.0] * len(ids), "I am not sure.", "stop") for _ in per_prompt(params, len(prompts))]

    mute = point_metrics(Runtime("textcraft", PolicyActor(Mute()), RuntimeConfig()).rescore_all(points))
    assert mute["rubric_validity"] == 0.0 and mute["score_validity"] is None
    assert (mute["mixed"], mute["pairwise_accuracy"], mute["ranking_loss"]) == (len(points), 0.5, 0.2)


def test_success_belief_reads_the_gate_tokens_probability_and_counts_false_against_it():
    chat = ChatFormat(default_tokenizer())
    for value in ("true", "false"):
        ids = chat.encode('{"criterion_scores": [{"name": "a", "score": 1, "reason": "true"}], "success": %s, "final_score": 0}' % value)
        gate = next(i for i in range(len(ids)) if chat.decode(ids[:i + 1]).endswith('"success": ' + value[0]))
        logprobs = [-0.001] * len(ids)
        logprobs[gate] = math.log(0.8)
        belief = success_belief(ids, logprobs, chat.decode)
        assert belief == pytest.approx(0.8 if value == "true" else 0.2)  # the "true" in the reason is not the gate
    assert success_belief(chat.encode('{"final_score": 1.0}'), [-0.1] * len(chat.encode('{"final_score": 1.0}')), chat.decode) is None


def test_belief_accuracy_ranks_branches_that_the_greedy_score_ties(points):
    """A scorer that writes ``success: true`` and 1.0 for every branch (every pair ties: 1/2)
    but puts a different probability on ``true`` per call: the belief accuracy is the
    pairwise accuracy of those probabilities, recomputed here by hand."""
    rubric = GLOBAL_RUBRIC.to_json()

    class Believer:
        def __init__(self):
            self.tokenizer = default_tokenizer()
            self.chat = ChatFormat(self.tokenizer)
            self.calls = 0

        def generate(self, prompts, params):
            out = []
            for prompt in prompts:
                if '"success"' in self.chat.decode(prompt):  # a scoring call
                    items = [{"name": i["name"], "score": 1.0, "reason": ""} for i in rubric["rubric_items"]]
                    text = json.dumps({"success": True, "criterion_scores": items, "final_score": 1.0, "reason": "ok"})
                else:
                    text = json.dumps(rubric)
                ids = self.chat.encode(text)
                self.calls += 1
                out.append(Generation(ids, [math.log(0.5 + (self.calls * 37 % 50) / 100)] * len(ids), text, "stop"))
            return out

        def decode(self, ids):
            return self.chat.decode(ids)

    believer = Believer()
    rescored = Runtime("textcraft", PolicyActor(believer), RuntimeConfig()).rescore_all(points)
    m = point_metrics(rescored, believer.decode)
    assert m["pairwise_accuracy"] == 0.5 and m["score_validity"] == 1.0
    by_hand = []
    for p in rescored:
        beliefs = [math.exp(b.score_turn.logprobs[0]) if b.score_turn is not None else 0.0 for b in p.branches]
        assert beliefs == pytest.approx(branch_beliefs(p, believer.decode))
        pairs = [(a, c) for a, ya in zip(beliefs, p.labels, strict=True) if ya for c, yc in zip(beliefs, p.labels, strict=True) if yc is False]
        by_hand.append(sum(1.0 if a > c else 0.5 if a == c else 0.0 for a, c in pairs) / len(pairs))
    assert m["belief_accuracy"] == round(sum(by_hand) / len(by_hand), 4) != 0.5
    assert "belief_accuracy" not in point_metrics(rescored)
    assert 0.5 <= m["gate_ceiling"] <= 1.0 and m["gate_threshold"] is not None


def test_the_gate_ceiling_is_the_best_single_threshold_on_the_beliefs(points):
    """Two points by hand. A: successes believed 0.9, failures 0.8 (one failure unscored:
    None, counted 0); B inverted: successes 0.7, failures 0.85. Belief order: A right (1),
    B wrong (0), mean 1/2. One threshold for both, g = 1[q >= tau]:
    tau above 0.9: every gate false, ties, 1/2; tau = 0.9: A 1, B ties 1/2, mean 3/4;
    tau = 0.85: A 1, B 0, 1/2; tau = 0.8: A's failures but the unscored one pass, B 0;
    tau <= 0.7: ties again. The best is 3/4 at 0.9: above the belief accuracy, because a
    threshold over B's beliefs turns its wrong order into ties."""
    a, b = points[0], points[1]
    qa = [0.9 if y else 0.8 for y in a.labels]
    qa[a.labels.index(False)] = None
    qb = [0.7 if y else 0.85 for y in b.labels]
    assert gate_ceiling([a, b], [qa, qb]) == (0.75, 0.9)
    assert gate_ceiling([a], [[0.5] * len(a.labels)]) == (0.5, 0.5)  # no order to keep: every threshold ties
    assert gate_ceiling([], []) == (None, None)


def test_rubric_spread_separates_what_the_rubric_moves_from_what_the_branch_does(points):
    """Two points, two rubrics each, by hand. Rubric 0: A right (successes 0.9, failures 0.8:
    1), B wrong (0.7 / 0.85: 0). Rubric 1: A ties (all 0.5: 1/2), B right (0.9 / 0.6: 1).
    mean = (3/4 + 1/2) / 2, best = (1 + 1) / 2, worst = (1/2 + 0) / 2. A success branch of A
    moves 0.9 -> 0.5 across rubrics (variance 0.04), a failure 0.8 -> 0.5 (0.0225); the
    branches' rubric-averaged beliefs are 0.7 and 0.65. A third point with a missing belief
    stays out of every number (it would count as 0 and measure validity, not the rubric)."""
    a, b = points[0], points[1]

    def by_label(point, good, bad):
        return [good if y else bad for y in point.labels]

    c = points[2]  # a third point, one of whose branches did not parse under the second rubric: left out
    beliefs = [[by_label(a, 0.9, 0.8), by_label(b, 0.7, 0.85), by_label(c, 0.9, 0.1)],
               [by_label(a, 0.5, 0.5), by_label(b, 0.9, 0.6), [None] + by_label(c, 0.9, 0.1)[1:]]]
    got = rubric_spread([a, b, c], beliefs)
    assert (got["rubrics"], got["points"], got["incomplete"]) == (2, 2, 1)
    assert (got["mean_accuracy"], got["best_accuracy"], got["worst_accuracy"]) == (0.625, 1.0, 0.25)

    def spread(point, var_good, var_bad, mean_gap):
        n_good, n_bad = point.labels.count(True), point.labels.count(False)
        within = math.sqrt((n_good * var_good + n_bad * var_bad) / (n_good + n_bad))
        return within, mean_gap * math.sqrt(n_good * n_bad) / (n_good + n_bad)

    (wa, ba), (wb, bb) = spread(a, 0.04, 0.0225, 0.05), spread(b, 0.01, 0.015625, 0.075)
    assert got["across_rubrics"] == pytest.approx((wa + wb) / 2, abs=1e-4)
    assert got["across_branches"] == pytest.approx((ba + bb) / 2, abs=1e-4)
    with pytest.raises(ValueError, match="at least 2 rubrics"):
        rubric_spread([a, b, c], beliefs[:1])
