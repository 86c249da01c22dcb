"""Property-based tests of every parser of model output (hypothesis).

Each property runs ``SERA_FUZZ_EXAMPLES`` generated inputs (default 200, derandomized so a
run repeats exactly; ``SERA_FUZZ_EXAMPLES=10000 pytest tests/test_fuzz_parsers.py`` is the
long run, figures in docs/reliability.md). Inputs are noise built from the formats' own
pieces, and replies *constructed* so that the generator knows the answer: where it put
each launch statement or delegate block, which code it wrote, what the sandbox must say.

* the rubric parser, the score parser, the TextWorld reply protocol, TextCraft's code
  extraction and sandbox validation never raise, whatever the text, and what they accept
  is well formed (weights sum to 1, scores in [0, 1], ...);
* a valid rubric parses to its fields (weights normalised) and round-trips;
* a well-formed score is ``g * sum_j w_j c_j``, with either gate; a score with one defect is
  refused, saying which (every defect on every draw);
* a valid TextWorld reply round-trips; a constructed one gets the kind it was built as (every
  kind on every draw);
* a constructed TextCraft reply gives back the code written and the sandbox's verdict on it;
* launch spans are sorted, disjoint and inside the text, and exactly where the generator put
  the launch statements (TextCraft: every form of launch on every draw) or delegate blocks
  (TextWorld); token roles are ``launch`` exactly on the tokens of those characters.

Each property counts which branch every draw took and asserts that the interesting
branches are a good share of the draws, and each fails on a planted bug (a mutant of
the parser it tests: :func:`test_each_property_fails_on_its_planted_bug`).
"""

from __future__ import annotations
import __future__

import inspect
import json
import math
import os
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sera_core.agents.roles import launch_spans, roles_for, token_char_spans  # noqa: E402
from sera_core.envs.textcraft.env import extract_code  # noqa: E402
from sera_core.envs.textcraft.launch import launch_spans as craft_launch_spans  # noqa: E402
from sera_core.envs.textcraft.sandbox import _prepare  # noqa: E402
from sera_core.envs.textworld.protocol import DEFAULT_CHILD_STEPS, MAX_DELEGATIONS, parse_reply  # noqa: E402
from sera_core.rubrics import MAX_ITEMS, MIN_ITEMS, Parsed, Rubric, parse_rubric, parse_score  # noqa: E402

EXAMPLES = int(os.environ.get("SERA_FUZZ_EXAMPLES", "200"))
settings.register_profile("sera", max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("sera")

# -- running a property -------------------------------------------------------------------------

Property = Callable[..., None]
"""``prop(data, seen, **units)``: draws with ``data``, checks the units under test (the
parsers, as keyword arguments), and counts the branch the draw took in ``seen``."""


def check(prop: Property, config: settings | None = None, **units: Callable) -> Counter:
    """Run ``prop`` on generated draws (``config``: the ``sera`` profile by default) and return
    what it counted over the draws that ran to the end, with ``draws``: how many did."""
    seen: Counter = Counter()

    @settings(config or settings())
    @given(st.data())
    def run(data):
        counted: Counter = Counter()
        prop(data, counted, **units)
        seen.update(counted)  # a draw cut short (its data ran out) counts nothing
        seen["draws"] += 1

    run()
    return seen


def at_least(seen: Counter, share: float, *keys: str) -> None:
    """Each of ``keys`` was counted in at least ``share`` of the draws."""
    for key in keys:
        assert seen[key] >= share * seen["draws"], (key, dict(seen))


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
prose = st.text(st.sampled_from("abcxyz XYZ019.,:;!?()[]{}'\"\n\t-é💥"), max_size=24)
"""Free text around blocks: no ``<`` (so no tag), no U+FFFD (a byte token's partial character decodes to it)."""
goals = st.text(st.sampled_from("abc xyz019-é💥"), min_size=1, max_size=12)


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


not_objects = json_values.filter(lambda v: not isinstance(v, dict))


def damaged_rubric(data) -> str:
    """A valid rubric with one kind of damage (or none), wrapped like model output."""
    spec = data.draw(rubric_json())
    items = spec["rubric_items"]
    victim = data.draw(st.integers(0, len(items) - 1))
    damage = data.draw(st.sampled_from(["none", "none", "negative_weight", "weight", "zero_weights", "drop_item",
                                        "extra_items", "repeat_name", "not_object", "blank_field", "no_gate",
                                        "bad_failures", "items_not_a_list", "cut"]))
    if damage == "negative_weight":  # small: the other weights keep a positive sum
        items[victim]["weight"] = data.draw(st.floats(-1, -0.001))
    elif damage == "weight":  # zero, not finite, not a number
        items[victim]["weight"] = data.draw(st.one_of(st.just(0), st.booleans(), st.none(),
                                                      st.sampled_from([math.inf, -math.inf, math.nan, "1"])))
    elif damage == "zero_weights":
        for item in items:
            item["weight"] = 0
    elif damage == "drop_item":
        del items[victim]
    elif damage == "extra_items":
        items += [dict(items[0], name=f"{items[0]['name']} {k}") for k in range(MAX_ITEMS + 1 - len(items))]
    elif damage == "repeat_name":
        items[victim]["name"] = items[victim - 1]["name"]
    elif damage == "not_object":
        items[victim] = data.draw(not_objects)
    elif damage == "blank_field":
        items[victim][data.draw(st.sampled_from(["name", "description", "score_0", "score_full"]))] = data.draw(
            st.sampled_from(["", "  ", None, 3]))
    elif damage == "no_gate":
        spec["success_gate"] = data.draw(st.sampled_from(["", " ", None, ["g"]]))
    elif damage == "bad_failures":
        spec["failure_conditions"] = data.draw(st.sampled_from(["f", ["f", ""], [None], {"f": 1}]))
    elif damage == "items_not_a_list":
        spec["rubric_items"] = data.draw(not_objects.filter(lambda v: not isinstance(v, list)))
    text = json.dumps(spec)
    if damage == "cut":
        text = text[: data.draw(st.integers(0, len(text) - 1))]
    return wrapped(text, data.draw)


def damaged_score(data, rubric: Rubric) -> str:
    """A well-formed score for ``rubric`` with one kind of damage (or none), wrapped like model output."""
    scores = [{"name": item.name, "score": data.draw(st.floats(0.01, 1)), "reason": ""} for item in rubric.items]
    obj: dict = {"success": data.draw(st.booleans()), "criterion_scores": scores, "final_score": 0.5, "reason": "r"}
    victim = data.draw(st.integers(0, len(scores) - 1))
    damage = data.draw(st.sampled_from(["none", "none", "none", "out_of_range", "out_of_range", "score_value",
                                        "drop_entry", "repeat_entry", "rename", "gate", "entries_not_a_list",
                                        "claimed", "cut"]))
    if damage == "out_of_range":  # finite numbers outside [0, 1]
        scores[victim]["score"] = data.draw(st.one_of(st.floats(-10, -0.001), st.floats(1.001, 10), st.just(2)))
    elif damage == "score_value":
        scores[victim]["score"] = data.draw(json_values)
    elif damage == "drop_entry":
        del scores[victim]
    elif damage == "repeat_entry":
        scores.append(dict(scores[victim]))
    elif damage == "rename":
        scores[victim]["name"] = data.draw(st.one_of(names, json_values))
    elif damage == "gate":
        obj["success"] = data.draw(json_values)
    elif damage == "entries_not_a_list":
        obj["criterion_scores"] = data.draw(not_objects.filter(lambda v: not isinstance(v, list)))
    elif damage == "claimed":  # the model's own total is recorded, never trusted: any value
        obj["final_score"] = data.draw(json_values)
    text = json.dumps(obj)
    if damage == "cut":
        text = text[: data.draw(st.integers(0, len(text) - 1))]
    return wrapped(text, data.draw)


# -- constructed replies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    """A reply built piece by piece, with what its parsers must find in it."""

    text: str
    spans: list[tuple[int, int]]
    """The launch spans: where the generator wrote a launch statement or a delegate block."""
    code: str | None = None
    """TextCraft: the first block's code as written (the newlines around it stripped), None without a block."""
    verdict: str | None = None
    """TextCraft: the sandbox's verdict on that code (None: it runs; ``syntax``; ``forbidden``)."""
    kind: str = "invalid"
    """TextWorld: the kind the protocol must give the reply."""


def unmark(template: str) -> tuple[str, list[tuple[int, int]]]:
    """The template's text without its ``⟦ ⟧`` marks, and the spans they enclosed."""
    text, spans, start = "", [], 0
    for ch in template:
        if ch == "⟦":
            start = len(text)
        elif ch == "⟧":
            spans.append((start, len(text)))
        else:
            text += ch
    return text, spans


CELL_PIECES: dict[str, list[str]] = {
    "launch": ["⟦r = await launch_subagent(G)⟧", "⟦r = await launch_subagent(G)⟧  # then craft",
               "⟦a = await launch_subagent(G)⟧; b = 2", "⟦done = list(map(launch_subagent, [G, H]))⟧",
               "⟦rs = await asyncio.gather(\n    launch_subagent(G),\n    launch_subagent(H),\n)⟧",
               "for g in [G, H]:\n    ⟦out = await launch_subagent(g)⟧\n    print(out)",
               "⟦for r in await asyncio.gather(launch_subagent(G), launch_subagent(H))⟧:\n    print(r)",
               "⟦if await launch_subagent(G)⟧:\n    print('done')", "if G:\n    ⟦await launch_subagent(H)⟧"],
    "plain": ["x = craft(ingredients={G: 2}, target=(H, 1))", "print(get_info([G]))", "total = 3 * 4",
              "# launch_subagent(G) is for later", "note = 'launch_subagent(' + G"],
    "forbidden": ["import os", "class K:\n    pass", "x = _hidden"],
    "syntax": ["y = )", "def (:"],
}
"""Pieces of TextCraft code by kind, G and H standing for goals. ``⟦ ⟧`` marks the launch span
when the code parses: the smallest statement that refers to ``launch_subagent``, or the
header part a reference is in (a comment or a string naming it is no launch). A cell holding
a ``syntax`` piece does not parse; else one holding a ``forbidden`` piece is refused."""


@st.composite
def textcraft_reply(draw, every_launch: bool = False) -> Built:
    """Prose, then (mostly) a ``<python>`` block of generated pieces, closed or not, then prose and
    maybe a second block (which launches nothing: only the first block runs). ``every_launch``:
    prose and a block that parses, holding every launch piece of :data:`CELL_PIECES` in any order."""
    if every_launch:
        before = draw(prose)
        templates = draw(st.permutations(CELL_PIECES["launch"]))
        code, marked = unmark("\n".join(t.replace("G", repr(draw(goals))).replace("H", "'h'") for t in templates))
        base = len(before) + len("<python>")
        return Built(f"{before}<python>{code}</python>", [(base + s, base + e) for s, e in marked], code, None)
    before = draw(prose) + draw(st.sampled_from(["", "I delegate: launch_subagent(x)\n", "<thought>plan</thought>"]))
    if not draw(st.integers(0, 9)):
        after = draw(prose)
        return Built(before + after, [], None, None)
    kinds = draw(st.lists(st.sampled_from(["launch", "launch", "plain", "plain", "forbidden", "syntax"]),
                          min_size=1, max_size=5))
    pieces = [draw(st.sampled_from(CELL_PIECES[k])).replace("G", repr(draw(goals))).replace("H", repr(draw(goals)))
              for k in kinds]
    pad = draw(st.sampled_from(["", "\n", "  \n", "\n\t\n"])), draw(st.sampled_from(["", "\n", "  ", "\n  \n"]))
    code, marked = unmark(pad[0] + "\n".join(pieces) + pad[1])
    base = len(before) + len("<python>")
    verdict = next((k for k in ("syntax", "forbidden") if k in kinds), None)
    if verdict == "syntax":  # the code does not parse: each line that calls launch_subagent, from its first non-blank
        spans, at = [], base
        for line in code.split("\n"):
            if "launch_subagent(" in line:
                spans.append((at + len(line) - len(line.lstrip()), at + len(line)))
            at += len(line) + 1
    else:
        spans = [(base + s, base + e) for s, e in marked]
    closed = draw(st.booleans())
    after = "</python>" + draw(prose) + draw(st.sampled_from(["", "<python>\nr = await launch_subagent('z')\n</python>"]))
    return Built(before + "<python>" + code + (after if closed else ""), spans, code.strip("\n"), verdict)


goal_words = goals.filter(str.strip)
delegate_bodies = st.one_of(
    goal_words.map(lambda g: {"goal": g}),
    st.lists(st.tuples(goal_words, st.integers(1, 40)), min_size=1, max_size=MAX_DELEGATIONS).map(
        lambda gs: {"delegations": [{"goal": g, "max_steps": n} for g, n in gs]})).map(json.dumps)
"""Delegate block bodies the protocol accepts (one goal, or up to 8 with turn budgets)."""
bad_delegate_bodies = st.sampled_from(['{"goal": ', "[]", '{"delegations": []}', '{"delegations": [1]}', '{"goal": " "}',
                                       '{"goal": "x", "max_steps": 0}', '{"goal": "x", "max_steps": true}',
                                       json.dumps({"delegations": [{"goal": "x"}] * (MAX_DELEGATIONS + 1)})])
"""Delegate block bodies it refuses: not JSON, not an object, no or bad entries, a bad budget, too many."""


KINDS = ("action", "delegate", "finish", "invalid")
"""The kinds of TextWorld reply."""


@st.composite
def textworld_reply(draw, kind: str | None = None) -> Built:
    """A reply the protocol must give ``kind`` (any of :data:`KINDS` when None): prose and
    thoughts around its blocks, maybe an unclosed block at the end. One complete, well-formed
    block makes the reply that kind; ``invalid``: no block, two blocks, or a delegate block
    whose body the protocol refuses."""
    kind = kind or draw(st.sampled_from(KINDS))
    blocks = [(kind, True)]  # (block, whether its body is well formed)
    if kind == "invalid":
        blocks = draw(st.sampled_from([[], [("delegate", False)], [(draw(st.sampled_from(KINDS[:3])), True),
                                                                    (draw(st.sampled_from(KINDS[:3])), True)]]))
    text, spans = "", []
    for part, valid in [(None, True), *blocks]:
        if part == "action":
            text += f"<action>{draw(goal_words)}</action>"
        elif part == "finish":
            text += f"<finish>{draw(prose)}</finish>"
        elif part == "delegate":
            piece = f"<delegate>{draw(delegate_bodies if valid else bad_delegate_bodies)}</delegate>"
            spans.append((len(text), len(text) + len(piece)))
            text += piece
        text += draw(st.sampled_from(["", " ", "\n", "<thought>"])) + draw(prose) + draw(st.sampled_from(["", "</thought>"]))
    text += draw(st.sampled_from(["", '<delegate>{"goal": "x"}', "<action>look"]))
    return Built(text, spans, kind=kind)


# -- rubrics and scores ---------------------------------------------------------------------------

def rubric_parser_never_raises(data, seen, parse=parse_rubric):
    """Any text, and rubrics with one kind of damage: a :class:`Parsed`, ``ok`` exactly without an
    error, and what parses is well formed (4-8 items, unique names, weights >= 0 summing to 1)."""
    if data.draw(st.integers(0, 3)):
        text = damaged_rubric(data)
    else:
        text = data.draw(st.one_of(texty, json_values.map(json.dumps),
                                   st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
    out = parse(text)
    assert isinstance(out, Parsed) and (out.ok == (out.error is None))
    seen["parsed" if out.ok else "refused"] += 1
    if out.ok:
        items = out.value.items
        assert isinstance(out.value, Rubric) and MIN_ITEMS <= len(items) <= MAX_ITEMS
        assert len({i.name for i in items}) == len(items) and all(i.name and i.description for i in items)
        assert all(math.isfinite(i.weight) and i.weight >= 0 for i in items)
        assert math.isclose(sum(i.weight for i in items), 1.0, abs_tol=1e-9)


def test_the_rubric_parser_never_raises():
    at_least(check(rubric_parser_never_raises), 0.15, "parsed", "refused")


def valid_rubric_round_trips(data, seen, parse=parse_rubric):
    """A valid rubric (in prose, a fence, or alone) parses to its own fields, weights normalised,
    and render -> parse gives it back."""
    spec = data.draw(rubric_json())
    parsed = parse(wrapped(json.dumps(spec), data.draw))
    assert parsed.ok, parsed.error
    rubric, total = parsed.value, sum(i["weight"] for i in spec["rubric_items"])
    assert [(i.name, i.description, i.score_0, i.score_full) for i in rubric.items] == [
        (i["name"], i["description"], i["score_0"], i["score_full"]) for i in spec["rubric_items"]]
    assert [i.weight for i in rubric.items] == pytest.approx([i["weight"] / total for i in spec["rubric_items"]], rel=1e-12)
    assert (rubric.success_gate, list(rubric.failure_conditions), rubric.scoring_procedure) == (
        spec["success_gate"], spec["failure_conditions"], spec["scoring_procedure"])
    again = parse(json.dumps(rubric.to_json()))  # render -> parse gives it back
    assert again.ok
    # weights to float rounding: normalising weights that already sum to 1 may move the last bit
    assert [i.weight for i in again.value.items] == pytest.approx([i.weight for i in rubric.items], rel=1e-12)
    strip = [i.__class__(i.name, 0.0, i.description, i.score_0, i.score_full) for i in rubric.items]
    assert [i.__class__(i.name, 0.0, i.description, i.score_0, i.score_full) for i in again.value.items] == strip
    assert (again.value.success_gate, again.value.failure_conditions, again.value.scoring_procedure) == (
        rubric.success_gate, rubric.failure_conditions, rubric.scoring_procedure)


def test_a_valid_rubric_parses_to_its_fields_and_round_trips():
    assert check(valid_rubric_round_trips)["draws"] == EXAMPLES


def well_formed_score(data, seen, parse=parse_score):
    """A valid score (each rubric item once with a score in [0, 1], in any order, any claimed
    total), with a gate of false and with a gate of true: each parses to ``s = g * sum_j w_j c_j``,
    except a gate of true with every item at 0 (success requires a final score > 0), which a
    share of the draws has."""
    rubric = parse_rubric(json.dumps(data.draw(rubric_json()))).value
    item_score = st.just(0) | st.just(0.0) if data.draw(st.booleans()) else st.floats(0, 1) | st.sampled_from([0, 1])
    scores = data.draw(st.permutations([{"name": item.name, "score": data.draw(item_score), "reason": ""}
                                        for item in rubric.items]))
    claimed = data.draw(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.none()))
    by_name = {e["name"]: float(e["score"]) for e in scores}
    weighted = sum(item.weight * by_name[item.name] for item in rubric.items)
    for gate in (False, True):
        text = json.dumps({"success": gate, "criterion_scores": scores, "final_score": claimed, "reason": "r"})
        out = parse(wrapped(text, data.draw), rubric)
        if gate and weighted <= 0:
            assert not out.ok and "success requires a final score > 0" in out.error
            seen["refused"] += 1
            continue
        assert out.ok, out.error
        s = out.value
        assert s.gate == int(gate) and s.item_scores == by_name and s.claimed_score == claimed
        assert math.isclose(s.final_score, s.gate * weighted, abs_tol=1e-9) and 0.0 <= s.final_score <= 1.0
        seen[f"parsed, gate {s.gate}"] += 1


def test_a_well_formed_score_parses_to_g_times_the_weighted_item_scores():
    seen = check(well_formed_score)
    assert seen["parsed, gate 0"] == seen["draws"]
    at_least(seen, 0.15, "parsed, gate 1", "refused")


DEFECTS = {
    "a missing item": "no score for",
    "an item not in the rubric": "is not in the rubric",
    "an item scored twice": "is scored twice",
    "a score outside [0, 1]": "scores are in [0, 1]",
    "a gate that is not a boolean": "`success` must be true or false",
}


def score_with_one_defect(data, seen, parse=parse_score):
    """A valid score given each defect in turn (one at a time) is malformed, and the error says which."""
    rubric = parse_rubric(json.dumps(data.draw(rubric_json()))).value
    valid = [{"name": item.name, "score": data.draw(st.floats(0.01, 1)), "reason": ""} for item in rubric.items]
    victim = data.draw(st.integers(0, len(valid) - 1))
    for defect, says in DEFECTS.items():
        scores, gate = [dict(e) for e in valid], True
        if defect == "a missing item":
            del scores[victim]
        elif defect == "an item not in the rubric":
            scores[victim]["name"] = "".join(item.name for item in rubric.items) + "?"
        elif defect == "an item scored twice":
            scores.append(dict(scores[victim]))
        elif defect == "a score outside [0, 1]":
            scores[victim]["score"] = data.draw(st.one_of(
                st.floats(max_value=-0.001, allow_infinity=False, allow_nan=False),
                st.floats(min_value=1.001, allow_infinity=False, allow_nan=False)))
        else:
            gate = data.draw(st.one_of(st.sampled_from(["true", 1, 0, None]), st.floats(allow_nan=False)))
        text = json.dumps({"success": gate, "criterion_scores": scores, "final_score": 1.0, "reason": "r"})
        out = parse(wrapped(text, data.draw), rubric)
        assert not out.ok and says in out.error, (defect, out.error)
    assert parse(json.dumps({"success": True, "criterion_scores": valid, "final_score": 1.0}), rubric).ok


def test_a_score_with_one_defect_is_malformed_and_says_which():
    check(score_with_one_defect)


FOUR_ITEMS = parse_rubric(json.dumps({"rubric_items": [
    {"name": f"i{k}", "weight": k + 1, "description": "d", "score_0": "0", "score_full": "1"} for k in range(4)],
    "success_gate": "g", "failure_conditions": ["f"], "scoring_procedure": "p"})).value
"""A rubric of four items weighted 1 to 4."""


def score_parser_never_raises(data, seen, parse=parse_score):
    """Any text, and scores for :data:`FOUR_ITEMS` with one kind of damage: a :class:`Parsed`, ``ok``
    exactly without an error, and what parses is in range (gate 0 or 1, every item once in
    [0, 1], s = g * sum w c)."""
    rubric = FOUR_ITEMS
    if data.draw(st.integers(0, 3)):
        text = damaged_score(data, rubric)
    else:
        text = data.draw(st.one_of(texty, json_values.map(json.dumps)))
    out = parse(text, rubric)
    assert isinstance(out, Parsed) and (out.ok == (out.error is None))
    seen["parsed" if out.ok else "refused"] += 1
    if out.ok:
        s = out.value
        assert s.gate in (0, 1) and set(s.item_scores) == {item.name for item in rubric.items}
        assert all(0.0 <= c <= 1.0 for c in s.item_scores.values()) and 0.0 <= s.final_score <= 1.0
        weighted = sum(i.weight * s.item_scores[i.name] for i in rubric.items)
        assert math.isclose(s.final_score, s.gate * weighted, abs_tol=1e-9)


def test_the_score_parser_never_raises():
    seen = check(score_parser_never_raises)
    at_least(seen, 0.08, "parsed")
    at_least(seen, 0.2, "refused")


# -- TextWorld replies ---------------------------------------------------------------------------

def textworld_protocol_never_raises(data, seen, parse=parse_reply):
    """Any value: one of the four kinds, ``invalid`` exactly when it says why. A reply built to
    be each kind in turn gets that kind."""
    noise = data.draw(st.one_of(texty, st.text(), json_values))
    for text, kind in [(noise, None), *((data.draw(textworld_reply(k)).text, k) for k in KINDS)]:
        reply = parse(text)
        assert reply.kind in KINDS and (reply.kind == "invalid") == bool(reply.error)
        assert kind is None or reply.kind == kind, (text, kind, reply)


def test_the_textworld_protocol_never_raises_and_gives_each_built_reply_its_kind():
    check(textworld_protocol_never_raises)


words = st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=8)
spaces = st.sampled_from([" ", "  ", "\n", "\t ", " \n "])


def valid_textworld_replies_round_trip(data, seen, parse=parse_reply):
    """An action (its words separated by any whitespace: one space each after parsing) and a
    delegate block (one goal: the default budget; or several with budgets) in prose round-trip."""
    command = data.draw(st.lists(words, min_size=1, max_size=5))
    text = data.draw(st.text(st.characters(blacklist_characters="<>"), max_size=30))
    written = data.draw(spaces) + "".join(w + data.draw(spaces) for w in command)
    action = parse(f"{text}<action>{written}</action>")
    assert action.kind == "action" and action.action == " ".join(command)
    asked = data.draw(st.lists(st.tuples(words, st.integers(1, 40)), min_size=1, max_size=MAX_DELEGATIONS))
    body = json.dumps({"delegations": [{"goal": g, "max_steps": n} for g, n in asked]})
    delegate = parse(f"{text}<delegate>{body}</delegate>")
    assert delegate.kind == "delegate" and [(d.goal, d.max_steps) for d in delegate.delegations] == asked
    one = parse(f"<delegate>{json.dumps({'goal': asked[0][0]})}</delegate>{text}")
    assert one.kind == "delegate" and [(d.goal, d.max_steps) for d in one.delegations] == [
        (asked[0][0], DEFAULT_CHILD_STEPS)]


def test_valid_textworld_replies_round_trip():
    assert check(valid_textworld_replies_round_trip)["draws"] == EXAMPLES


# -- TextCraft code --------------------------------------------------------------------------------

def code_extraction_and_sandbox_validation(data, seen, extract=extract_code, prepare=_prepare):
    """Any text: extraction and validation never raise (the extracted code is in the text; a cell
    is runnable, or a syntax or forbidden error). A constructed reply: the code written comes
    back, and the sandbox's verdict is the one its pieces call for."""
    built = data.draw(textcraft_reply() if data.draw(st.integers(0, 2)) else st.one_of(texty, st.text()))
    text = built.text if isinstance(built, Built) else built
    code = extract(text)
    assert code is None or code.strip("\n") in text
    prepared = prepare(code if code is not None else text)
    assert (prepared.code is None) == (prepared.error_kind is not None)
    assert prepared.error_kind in (None, "syntax", "forbidden")
    if isinstance(built, Built):
        assert code == built.code, (built, code)
        if code is not None:
            assert prepared.error_kind == built.verdict, (built, prepared)
            seen[f"cell {built.verdict or 'runs'}"] += 1


def test_code_extraction_and_sandbox_validation_never_raise_and_find_what_was_written():
    at_least(check(code_extraction_and_sandbox_validation), 0.05, "cell runs", "cell syntax", "cell forbidden")


# -- launch spans and token roles -----------------------------------------------------------------

replies = st.one_of(st.tuples(st.just("textcraft"), textcraft_reply()), st.tuples(st.just("textworld"), textworld_reply()))


def launch_spans_are_where_they_were_written(data, seen, spans_of=launch_spans):
    """Any text: launch spans are sorted, disjoint (half-open: they may touch) and inside it. A
    constructed reply: they are exactly where the generator wrote launch statements (TextCraft,
    the first block only) or complete delegate blocks (TextWorld). Every draw checks noise, a
    reply of each benchmark, and every form of TextCraft launch in a cell that parses."""
    noise = data.draw(texty)
    built = [("textcraft", data.draw(textcraft_reply())), ("textworld", data.draw(textworld_reply())),
             ("textcraft", data.draw(textcraft_reply(every_launch=True)))]
    for env, text in [("textcraft", noise), ("textworld", noise), *((env, reply.text) for env, reply in built)]:
        spans = spans_of(text, env)
        assert all(0 <= s < e <= len(text) for s, e in spans)
        assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False))
    for env, reply in built:
        assert spans_of(reply.text, env) == reply.spans, reply
    for env, reply in built[:2]:
        seen[f"{env} launches"] += bool(reply.spans)


def test_launch_spans_are_sorted_disjoint_and_where_they_were_written():
    at_least(check(launch_spans_are_where_they_were_written), 0.1, "textcraft launches", "textworld launches")


def _bytes_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _chars_decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def token_roles(data, seen, roles=roles_for):
    """A constructed reply, one token per character or per byte (characters split across
    tokens): ``launch`` exactly on the tokens of the characters the generator wrote as launch
    statements or delegate blocks (all bytes of such a character), ``execution`` elsewhere;
    every token of a rubric call is ``rubric``."""
    env, built = data.draw(replies)
    text = built.text
    launch_chars = {i for s, e in built.spans for i in range(s, e)}
    if data.draw(st.booleans()):
        ids, decode = list(text.encode("utf-8")), _bytes_decode
        expected = [i in launch_chars for i, ch in enumerate(text) for _ in ch.encode("utf-8")]
    else:
        ids, decode = [ord(ch) for ch in text], _chars_decode
        expected = [i in launch_chars for i in range(len(text))]
    got = roles(ids, decode, text, env, "act")
    assert got == ["launch" if hit else "execution" for hit in expected]
    spans = token_char_spans(ids, decode)
    assert "".join(text[s:e] for s, e in spans) == text
    assert roles(ids, decode, text, env, "rubric") == ["rubric"] * len(ids)
    seen[f"{env} launch tokens"] += any(expected)


def test_token_roles_are_launch_exactly_on_the_launches_written():
    at_least(check(token_roles), 0.1, "textcraft launch tokens", "textworld launch tokens")


# -- planted bugs: each property fails on a mutant of what it tests ----------------------------------

def mutant(func: Callable, old: str, new: str) -> Callable:
    """``func`` with a planted bug: compiled again from its source with ``old`` (which must occur
    exactly once) replaced by ``new``, in a copy of its module's globals."""
    source = textwrap.dedent(inspect.getsource(func))
    assert source.count(old) == 1, f"{func.__qualname__} no longer holds {old!r}: plant its bug anew"
    namespace = dict(func.__globals__)
    exec(compile(source.replace(old, new), inspect.getsourcefile(func), "exec",  # noqa: S102 (the mutant)
                 flags=__future__.annotations.compiler_flag, dont_inherit=True), namespace)
    return namespace[func.__name__]


def _craft_spans_with(broken: Callable) -> Callable:
    """:func:`launch_spans` with TextCraft's rule replaced by ``broken``."""
    return lambda text, env: broken(text) if env == "textcraft" else launch_spans(text, env)


PLANTED: dict[str, tuple[Property, Callable[[], dict], type[BaseException]]] = {
    "rubric weights: the check for negative weights removed": (
        rubric_parser_never_raises,
        lambda: {"parse": mutant(parse_rubric, "if weight is None or weight < 0:", "if weight is None:")}, AssertionError),
    "rubric items: score_0 and score_full swapped": (
        valid_rubric_round_trips,
        lambda: {"parse": mutant(parse_rubric, 'f["score_0"], f["score_full"])', 'f["score_full"], f["score_0"])')},
        AssertionError),
    "score: the gate ignored": (
        well_formed_score,
        lambda: {"parse": mutant(parse_score, "Score(gate, scores, gate * weighted,", "Score(gate, scores, weighted,")},
        AssertionError),
    "score: an item scored twice accepted (the last one counts)": (
        score_with_one_defect,
        lambda: {"parse": mutant(parse_score, "if name in scores:", "if False:")}, AssertionError),
    "score: the [0, 1] clamp on item scores removed": (
        score_parser_never_raises,
        lambda: {"parse": mutant(parse_score, "if value is None or not 0.0 <= value <= 1.0:", "if value is None:")},
        AssertionError),
    "reply: two blocks accepted (off by one)": (
        textworld_protocol_never_raises,
        lambda: {"parse": mutant(parse_reply, "if len(blocks) > 1:", "if len(blocks) > 2:")}, AssertionError),
    "reply: the action's whitespace not normalised": (
        valid_textworld_replies_round_trip,
        lambda: {"parse": mutant(parse_reply, 'action=" ".join(body.split())', "action=body")}, AssertionError),
    "code: stripped of spaces, not only of newlines": (
        code_extraction_and_sandbox_validation,
        lambda: {"extract": mutant(extract_code, 'strip("\\n")', "strip()")}, AssertionError),
    "launch spans: a launch in a loop's or an if's header marks the whole statement": (
        launch_spans_are_where_they_were_written,
        lambda: {"spans_of": _craft_spans_with(mutant(
            craft_launch_spans, "if header is None or not isinstance(stmt, _COMPOUND):", "if True:"))}, AssertionError),
    "token roles: launch spans one character too long": (
        token_roles,
        lambda: {"roles": mutant(roles_for, "overlap_mask(tok_spans, spans)",
                                 "overlap_mask(tok_spans, [(s, e + 1) for s, e in spans])")}, AssertionError),
}
"""Per property: a bug planted in the parser it tests, and the failure the property must raise."""
PLANTED_RUN = settings(max_examples=1000, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)
"""Up to 1,000 draws (a planted bug is found in a few dozen), the first failure raised as it is (no shrinking)."""


def test_every_property_has_a_planted_bug():
    properties = {f for f in globals().values() if inspect.isfunction(f) and f.__module__ == __name__
                  and list(inspect.signature(f).parameters)[:2] == ["data", "seen"]}
    assert len(properties) == 10 and sorted(prop.__name__ for prop, _, _ in PLANTED.values()) == sorted(
        prop.__name__ for prop in properties)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_each_property_fails_on_its_planted_bug(bug):
    prop, units, error = PLANTED[bug]
    with pytest.raises(error):
        check(prop, PLANTED_RUN, **units())
