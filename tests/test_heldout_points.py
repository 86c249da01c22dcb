"""Held-out delegation points (sera_core/eval/points.py): a fixed, mixed set that any policy
rescores; the metrics count an unparsable rubric as ties, never as a skipped group."""

from __future__ import annotations

import json

import pytest

from sera_core.agents.actors import PolicyActor
from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.course import noisy_expert, pick_tasks
from sera_core.eval.points import heldout_points, point_metrics
from sera_core.policy.base import Generation, per_prompt
from sera_core.policy.chat import ChatFormat


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
