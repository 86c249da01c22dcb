"""Rubric parsing and freezing, the scoring call's parser, s = g * sum w c, the forced zero,
malformed-output policies and the ranking loss (worked by hand)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sera_core.agents.prompts import RubricInputs, build_rubric_prompt, build_score_prompt
from sera_core.utils.text import truncate_middle
from sera_core.rubrics import (
    GLOBAL_RUBRIC, MalformedPolicy, extract_json_object, forced_zero, parse_rubric, parse_score, ranking_loss,
    resolve_child_reward,
)


def rubric_json(n=4, weights=None, **overrides):
    weights = weights if weights is not None else [1, 1, 1, 2][:n] + [1] * max(0, n - 4)
    data = {
        "rubric_items": [{"name": f"c{i}", "weight": w, "description": f"criterion {i}", "score_0": "none",
                          "score_full": "all"} for i, w in enumerate(weights)],
        "success_gate": "3x a1_i5 were crafted", "failure_conditions": ["no finish"], "scoring_procedure": "gate first",
    }
    data.update(overrides)
    return json.dumps(data)


def score_json(success=True, scores=(1, 0.5, 0, 1), **overrides):
    data = {"success": success, "criterion_scores": [{"name": f"c{i}", "score": s, "reason": "r"}
                                                     for i, s in enumerate(scores)],
            "final_score": 0.7, "reason": "ok"}
    data.update(overrides)
    return json.dumps(data)


def test_rubric_is_validated_normalised_and_frozen():
    parsed = parse_rubric("Here is my rubric:\n```json\n" + rubric_json() + "\n```")
    assert parsed.ok
    rubric = parsed.value
    assert [i.weight for i in rubric.items] == [0.2, 0.2, 0.2, 0.4]
    assert rubric.success_gate == "3x a1_i5 were crafted" and rubric.failure_conditions == ("no finish",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rubric.items[0].weight = 1.0  # frozen
    assert parse_rubric(json.dumps(rubric.to_json())).value == rubric  # round trip


@pytest.mark.parametrize("text, why", [
    ("garbage", "no JSON object"),
    ('{"rubric_items": [', "no JSON object"),
    (rubric_json(n=3, weights=[1, 1, 1]), "3 items"),
    (rubric_json(n=9, weights=[1] * 9), "9 items"),
    (rubric_json(weights=[1, -1, 1, 1]), "weights are finite and >= 0"),
    (rubric_json(weights=[0, 0, 0, 0]), "sum to 0"),
    (rubric_json(weights=[1, 1, 1, "heavy"]), "weight 'heavy'"),
    (rubric_json(weights=[1, 1, 1, 1e999]), "weight inf"),
    (rubric_json().replace('"weight": 1,', '"weight": NaN,', 1), "weight nan"),
    (rubric_json(success_gate=""), "success_gate"),
    (rubric_json(failure_conditions="none"), "failure_conditions"),
    (rubric_json().replace('"name": "c1"', '"name": "c0"'), "repeated"),
    (rubric_json().replace('"score_0": "none", ', "", 1), "lacks score_0"),
    (json.dumps({"rubric_items": [1, 2, 3, 4], "success_gate": "g"}), "item 0 is not an object"),
    (None, "no JSON object"),
])
def test_malformed_rubrics_are_recorded_never_raised(text, why):
    parsed = parse_rubric(text)
    assert not parsed.ok and parsed.value is None and why in parsed.error
    assert parsed.raw == (text if isinstance(text, str) else repr(text))


def test_score_is_g_times_weighted_sum():
    rubric = parse_rubric(rubric_json()).value
    parsed = parse_score(score_json(), rubric)
    assert parsed.ok
    # s = 1 * (0.2*1 + 0.2*0.5 + 0.2*0 + 0.4*1) = 0.7
    assert parsed.value.final_score == pytest.approx(0.7) and parsed.value.gate == 1
    assert parsed.value.claimed_score == 0.7
    failed = parse_score(score_json(success=False, final_score=0.9), rubric).value
    assert failed.final_score == 0.0 and failed.gate == 0 and failed.claimed_score == 0.9


@pytest.mark.parametrize("text, why", [
    ("not json", "no JSON object"),
    (score_json(success="yes"), "`success` must be true or false"),
    (score_json(scores=(1, 1, 1)), "no score for c3"),
    (score_json(scores=(1, 1, 1, 2)), "scores are in [0, 1]"),
    (score_json(scores=(1, 1, 1, float("nan"))), "score nan"),
    (score_json(success=True, scores=(0, 0, 0, 0)), "success requires a final score > 0"),
    (score_json(criterion_scores=[{"name": "c9", "score": 1}]), "not in the rubric"),
    (score_json(criterion_scores=[{"name": "c0", "score": 1}, {"name": "c0", "score": 1}]), "scored twice"),
])
def test_malformed_scores_are_recorded_never_raised(text, why):
    rubric = parse_rubric(rubric_json()).value
    parsed = parse_score(text, rubric)
    assert not parsed.ok and why in parsed.error and parsed.raw == text


def test_forced_zero_and_malformed_policies():
    zero = forced_zero()
    assert zero.final_score == 0.0 and zero.gate == 0 and zero.forced
    assert resolve_child_reward(zero, MalformedPolicy.DROP_TRAJECTORY).source == "forced_zero"
    rubric = parse_rubric(rubric_json()).value
    good, bad = parse_score(score_json(), rubric), parse_score("???", rubric)
    assert resolve_child_reward(good, "drop_rollout").reward == pytest.approx(0.7)
    dropped = resolve_child_reward(bad, MalformedPolicy.DROP_TRAJECTORY, binary_label=True)
    assert dropped.reward is None and not dropped.drop_rollout
    assert resolve_child_reward(bad, MalformedPolicy.DROP_ROLLOUT).drop_rollout
    assert resolve_child_reward(bad, MalformedPolicy.BINARY_FALLBACK, binary_label=True).reward == 1.0
    assert resolve_child_reward(bad, MalformedPolicy.BINARY_FALLBACK, binary_label=None).reward is None


def test_ranking_loss_worked_by_hand():
    scores = [0.9, 0.5, 0.3, 0.1]
    labels = [True, True, False, False]
    r = ranking_loss(scores, labels)
    # pairs (succ, fail): (0.9,0.3) 0, (0.9,0.1) 0, (0.5,0.3) max(0, .2-.5+.3)=0, (0.5,0.1) 0 -> 0
    assert r.loss == pytest.approx(0.0) and r.pairs == 4 and r.accuracy == 1.0 and not r.skipped
    r = ranking_loss([0.4, 0.5, 0.45, None], [True, False, True, False])
    # pairs: (0.4, 0.5): .2-.4+.5 = .3; (0.45, 0.5): .25 -> mean .275; both misordered
    assert r.loss == pytest.approx(0.275) and r.accuracy == 0.0 and r.pairs == 2 and r.reward == pytest.approx(-0.275)
    assert ranking_loss([0.5, 0.5], [True, False]).accuracy == 0.5
    assert ranking_loss([0.1, 0.9], [True, True]).skipped  # homogeneous group: skipped
    assert ranking_loss([0.1, 0.9], [None, False]).skipped  # an unknown label is never counted
    with pytest.raises(ValueError):
        ranking_loss([0.1], [True, False])


def test_global_rubric_is_valid():
    assert parse_rubric(json.dumps(GLOBAL_RUBRIC.to_json())).value == GLOBAL_RUBRIC
    assert sum(i.weight for i in GLOBAL_RUBRIC.items) == pytest.approx(1.0)


def test_prompts_hold_exactly_the_allowed_sections_in_order():
    inputs = RubricInputs("craft 3x a1_i5", "parent depth 0; child depth 1; step 3", "T" * 20000,
                          "await launch_subagent({'a7_i4': 3})", "inventory: ...", "Craft 3x a7_i4",
                          "craft, get_info", "20 steps")
    prompt = build_rubric_prompt(inputs)
    heads = [line for line in prompt.splitlines() if line.startswith("## ")]
    assert heads == ["## Parent task", "## Parent metadata", "## Parent trajectory before delegation",
                     "## Delegation decision", "## Observable environment before the call", "## Delegated subtask",
                     "## Child tools", "## Child budget", "## Output"]
    assert "characters omitted" in prompt and len(prompt) < 9000  # the long trajectory was cut in the middle
    score_prompt = build_score_prompt(GLOBAL_RUBRIC, "Craft 3x a7_i4", "turn 1 ...", "inventory ...")
    assert "goal achieved" in score_prompt and "## Final environment state" in score_prompt


def test_truncate_middle_and_extract_json():
    text = "a" * 50 + "b" * 50
    cut = truncate_middle(text, 60)
    assert len(cut) <= 60 and cut.startswith("a") and cut.endswith("b")
    assert truncate_middle("short", 60) == "short"
    assert extract_json_object('x {"a": 1} y {"b": 2}') == {"a": 1}
    assert extract_json_object("[1, 2] then {bad json} then {\"ok\": true}") == {"ok": True}
    assert extract_json_object("{" * 5000) is None
