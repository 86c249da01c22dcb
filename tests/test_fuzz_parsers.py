"""Property-based tests of every parser of model output (hypothesis).

Each property runs ``SERA_FUZZ_EXAMPLES`` generated inputs (default 200, derandomized so a
run repeats exactly; ``SERA_FUZZ_EXAMPLES=10000 pytest tests/test_fuzz_parsers.py`` is the
long run, figures in docs/reliability.md):

* the rubric parser, the score parser, the TextWorld reply protocol, TextCraft's code
  extraction and sandbox validation never raise, whatever the text;
* a valid rubric round-trips (render -> parse gives it back) and its weights sum to 1;
* a parsed score is always ``g * sum_j w_j c_j``, within [0, 1];
* a valid TextWorld reply round-trips;
* launch spans are sorted, disjoint and inside the text; token roles cover every token,
  and ``launch`` tokens are exactly those overlapping a launch span.
"""

from __future__ import annotations

import json
import math
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sera_core.agents.roles import launch_spans, overlap_mask, roles_for, token_char_spans  # noqa: E402
from sera_core.envs.textcraft.env import extract_code  # noqa: E402
from sera_core.envs.textcraft.sandbox import _prepare  # noqa: E402
from sera_core.envs.textworld.protocol import MAX_DELEGATIONS, parse_reply  # noqa: E402
from sera_core.rubrics import MAX_ITEMS, MIN_ITEMS, Parsed, Rubric, parse_rubric, parse_score  # noqa: E402

EXAMPLES = int(os.environ.get("SERA_FUZZ_EXAMPLES", "200"))
settings.register_profile("sera", max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("sera")

# -- strategies ---------------------------------------------------------------------------------

TAGS = ["<python>", "</python>", "<action>", "</action>", "<delegate>", "</delegate>", "<finish>", "</finish>",
        "<thought>", "</thought>", "```json", "```", "{", "}", "[", "]", '"', ":", ",", "\n", "launch_subagent(",
        "await ", "asyncio.gather(", "for r in ", "):", "\\u00e9", "é", "💥"]
texty = st.lists(st.one_of(st.sampled_from(TAGS), st.text(max_size=12)), max_size=30).map("".join)
"""Text built from the formats' own pieces (tags, JSON punctuation, launch calls) and noise."""
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda s: s.strip() == s and s)


@st.composite
def rubric_json(draw) -> dict:
    """A valid rubric in the official JSON shape (4-8 items, unique names, weights > 0)."""
    n = draw(st.integers(MIN_ITEMS, MAX_ITEMS))
    item_names = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    weights = draw(st.lists(st.floats(0.01, 100.0), min_size=n, max_size=n))
    items = [{"name": name, "weight": w, "description": draw(names), "score_0": draw(names), "score_full": draw(names)}
             for name, w in zip(item_names, weights, strict=True)]
    return {"rubric_items": items, "success_gate": draw(names), "failure_conditions": draw(st.lists(names, min_size=1, max_size=3)),
            "scoring_procedure": draw(names)}


def wrapped(obj_text: str, draw) -> str:
    """A JSON object in prose, in a fence, or alone."""
    return draw(st.sampled_from(["{}", "Here it is:\n{}\nDone.", "```json\n{}\n```"])).replace("{}", obj_text)


# -- rubrics and scores ---------------------------------------------------------------------------

@given(st.one_of(texty, json_values.map(json.dumps), st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_the_rubric_parser_never_raises(text):
    out = parse_rubric(text)
    assert isinstance(out, Parsed) and (out.ok == (out.error is None))
    if out.ok:
        assert isinstance(out.value, Rubric) and math.isclose(sum(i.weight for i in out.value.items), 1.0, abs_tol=1e-9)


@given(st.data())
def test_a_valid_rubric_round_trips_and_its_weights_sum_to_one(data):
    spec = data.draw(rubric_json())
    parsed = parse_rubric(wrapped(json.dumps(spec), data.draw))
    assert parsed.ok, parsed.error
    rubric = parsed.value
    assert [i.name for i in rubric.items] == [i["name"] for i in spec["rubric_items"]]
    assert math.isclose(sum(i.weight for i in rubric.items), 1.0, abs_tol=1e-9) and all(i.weight > 0 for i in rubric.items)
    again = parse_rubric(json.dumps(rubric.to_json()))  # render -> parse gives it back
    assert again.ok
    # weights to float rounding: normalising weights that already sum to 1 may move the last bit
    assert [i.weight for i in again.value.items] == pytest.approx([i.weight for i in rubric.items], rel=1e-12)
    strip = [i.__class__(i.name, 0.0, i.description, i.score_0, i.score_full) for i in rubric.items]
    assert [i.__class__(i.name, 0.0, i.description, i.score_0, i.score_full) for i in again.value.items] == strip
    assert (again.value.success_gate, again.value.failure_conditions, again.value.scoring_procedure) == (
        rubric.success_gate, rubric.failure_conditions, rubric.scoring_procedure)


@given(st.data())
def test_a_well_formed_score_parses_to_g_times_the_weighted_item_scores(data):
    """Every draw is a valid score (a boolean gate, each rubric item once with a score in
    [0, 1], in any order, any claimed total): it parses, except a gate of true with every
    item at 0 (success requires a final score > 0), and ``s = g * sum_j w_j c_j``."""
    rubric = parse_rubric(json.dumps(data.draw(rubric_json()))).value
    gate = data.draw(st.booleans())
    scores = [{"name": item.name, "score": data.draw(st.one_of(st.floats(0, 1), st.sampled_from([0, 1]))), "reason": ""}
              for item in rubric.items]
    scores = data.draw(st.permutations(scores))
    claimed = data.draw(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.none()))
    text = json.dumps({"success": gate, "criterion_scores": scores, "final_score": claimed, "reason": "r"})
    out = parse_score(wrapped(text, data.draw), rubric)
    by_name = {e["name"]: float(e["score"]) for e in scores}
    weighted = sum(item.weight * by_name[item.name] for item in rubric.items)
    if gate and weighted <= 0:
        assert not out.ok and "success requires a final score > 0" in out.error
        return
    assert out.ok, out.error
    s = out.value
    assert s.gate == int(gate) and s.item_scores == by_name and s.claimed_score == claimed
    assert math.isclose(s.final_score, s.gate * weighted, abs_tol=1e-9) and 0.0 <= s.final_score <= 1.0


DEFECTS = {
    "a missing item": "no score for",
    "an item not in the rubric": "is not in the rubric",
    "an item scored twice": "is scored twice",
    "a score outside [0, 1]": "scores are in [0, 1]",
    "a gate that is not a boolean": "`success` must be true or false",
}


@given(st.data(), st.sampled_from(sorted(DEFECTS)))
def test_a_score_with_one_defect_is_malformed_and_says_which(data, defect):
    rubric = parse_rubric(json.dumps(data.draw(rubric_json()))).value
    scores = [{"name": item.name, "score": data.draw(st.floats(0.01, 1)), "reason": ""} for item in rubric.items]
    gate: object = True
    victim = data.draw(st.integers(0, len(scores) - 1))
    if defect == "a missing item":
        del scores[victim]
    elif defect == "an item not in the rubric":
        scores[victim]["name"] = "".join(item.name for item in rubric.items) + "?"
    elif defect == "an item scored twice":
        scores.append(dict(scores[victim]))
    elif defect == "a score outside [0, 1]":
        scores[victim]["score"] = data.draw(st.one_of(st.floats(max_value=-0.001, allow_infinity=False, allow_nan=False),
                                                      st.floats(min_value=1.001, allow_infinity=False, allow_nan=False)))
    else:
        gate = data.draw(st.one_of(st.sampled_from(["true", 1, 0, None]), st.floats(allow_nan=False)))
    text = json.dumps({"success": gate, "criterion_scores": scores, "final_score": 1.0, "reason": "r"})
    out = parse_score(wrapped(text, data.draw), rubric)
    assert not out.ok and DEFECTS[defect] in out.error


@given(st.one_of(texty, json_values.map(json.dumps)))
def test_the_score_parser_never_raises(text):
    rubric = parse_rubric(json.dumps({"rubric_items": [
        {"name": f"i{k}", "weight": 1, "description": "d", "score_0": "0", "score_full": "1"} for k in range(4)],
        "success_gate": "g", "failure_conditions": ["f"], "scoring_procedure": "p"})).value
    out = parse_score(text, rubric)
    assert isinstance(out, Parsed) and (out.ok == (out.error is None))


# -- TextWorld replies ---------------------------------------------------------------------------

@given(st.one_of(texty, st.text(), json_values))
def test_the_textworld_protocol_never_raises(text):
    reply = parse_reply(text)
    assert reply.kind in ("action", "delegate", "finish", "invalid")
    assert (reply.kind == "invalid") == bool(reply.error)


words = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=8)


@given(st.lists(words, min_size=1, max_size=5), st.text(st.characters(blacklist_characters="<>"), max_size=30),
       st.lists(st.tuples(words, st.integers(1, 40)), min_size=1, max_size=MAX_DELEGATIONS))
def test_valid_textworld_replies_round_trip(command, prose, goals):
    action = parse_reply(f"{prose}<action>{' '.join(command)}</action>")
    assert action.kind == "action" and action.action == " ".join(command)
    body = json.dumps({"delegations": [{"goal": g, "max_steps": n} for g, n in goals]})
    delegate = parse_reply(f"{prose}<delegate>{body}</delegate>")
    assert delegate.kind == "delegate" and [(d.goal, d.max_steps) for d in delegate.delegations] == goals


# -- TextCraft code --------------------------------------------------------------------------------

@given(st.one_of(texty, st.text()))
def test_code_extraction_and_sandbox_validation_never_raise(text):
    code = extract_code(text)
    assert code is None or code.strip("\n") in text
    prepared = _prepare(code if code is not None else text)
    assert (prepared.code is None) == (prepared.error_kind is not None)
    assert prepared.error_kind in (None, "syntax", "forbidden")


# -- launch spans and token roles -----------------------------------------------------------------

@given(texty, st.sampled_from(["textcraft", "textworld"]))
def test_launch_spans_are_sorted_disjoint_and_inside_the_text(text, env):
    spans = launch_spans(text, env)
    assert all(0 <= s < e <= len(text) for s, e in spans)
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


@given(texty, st.sampled_from(["textcraft", "textworld"]))
def test_token_roles_cover_every_token_and_launch_tokens_overlap_launch_spans(text, env):
    ids = list(text.encode("utf-8"))  # one token per byte: characters split across tokens
    decoded = _bytes_decode(ids)
    roles = roles_for(ids, _bytes_decode, decoded, env, "act")
    assert len(roles) == len(ids) and set(roles) <= {"execution", "launch"}
    spans = token_char_spans(ids, _bytes_decode)
    assert "".join(decoded[s:e] for s, e in spans) == decoded
    hits = overlap_mask(spans, launch_spans(decoded, env))
    assert [r == "launch" for r in roles] == hits
    assert roles_for(ids, _bytes_decode, decoded, env, "rubric") == ["rubric"] * len(ids)
