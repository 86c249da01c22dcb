"""Rubrics: the parent's frozen success criteria for a child, and the scoring call.

SPEC 2 and 8. Before delegating, the parent's policy writes a rubric from exactly
these inputs, in this order (never the child's future):

    parent task; parent metadata (depths, fork step); parent trajectory before the
    delegation; the delegation decision; observable pre-call environment; delegated
    subtask; child tools; child budget

(:func:`sera_core.agents.prompts.build_rubric_prompt`; long sections are truncated in the
middle). The output is
JSON::

    {"rubric_items": [{"name", "weight", "description", "score_0", "score_full"}, ...],
     "success_gate": "...", "failure_conditions": ["..."], "scoring_procedure": "..."}

:func:`parse_rubric` validates it (4-8 items, names unique and present, conditions
present, weights finite and non-negative with a positive sum) and normalises the
weights to sum to 1; the result is frozen (an immutable :class:`Rubric`).

After the child returns, a separate scoring call (:func:`sera_core.agents.prompts.build_score_prompt`) sees the
frozen rubric, the delegated task, the child's trajectory and the final environment
state, and answers::

    {"success": bool, "criterion_scores": [{"name", "score", "reason"}],
     "final_score": float, "reason": "..."}

:func:`parse_score` computes the score itself from the gate g and the item scores c_j:

    s = g * sum_j w_j * c_j,    g in {0, 1},  c_j in [0, 1],  sum_j w_j = 1

(the model's own ``final_score`` is recorded, not trusted). ``success: false`` means
s = 0; ``success: true`` with every item at 0 is contradictory (the official parser
requires final_score > 0 then) and is malformed. A child that did not finish gets
g = 0 and s = 0 without any scoring call (:func:`forced_zero`; the paper's rule, where
the official code leaves it to the scorer).

Malformed rubric or score output never raises: it is recorded with the raw text and a
reason, and :func:`resolve_child_reward` applies the configured
:class:`MalformedPolicy`: drop that child's gradient (official ``drop_trajectory``),
drop the whole rollout, or fall back to the external binary label.

:func:`ranking_loss` is the rubric-generation signal of SPEC 3: over every
(success, failure) pair of a branch group, L = mean max(0, margin - s_succ + s_fail)
with margin 0.2; groups where all branches succeed or all fail are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

MIN_ITEMS = 4
"""Fewest rubric items (the prompt uses max(4, min_criteria); SPEC 2)."""
MAX_ITEMS = 8
"""Most rubric items."""
RANKING_MARGIN = 0.2
"""Hinge margin of the ranking loss (SPEC 3)."""
class MalformedPolicy(str, Enum):
    """What to do with a child whose rubric or score could not be parsed."""

    DROP_TRAJECTORY = "drop_trajectory"
    """Official default: that child contributes no gradient."""
    DROP_ROLLOUT = "drop_rollout"
    """The whole root rollout is dropped from the batch."""
    BINARY_FALLBACK = "binary_fallback"
    """Use the external binary label (verifier or judge) as the child's reward."""


@dataclass(frozen=True)
class RubricItem:
    """One weighted criterion; ``weight`` is normalised (the item weights sum to 1)."""

    name: str
    weight: float
    description: str
    score_0: str
    """When the criterion scores 0."""
    score_full: str
    """When it scores 1."""


def rubric_item(name: str, weight: float, description: str, score_0: str, score_full: str) -> dict[str, Any]:
    """One rubric item as the official JSON (the weights are normalised when a rubric is parsed)."""
    return asdict(RubricItem(name, weight, description, score_0, score_full))


@dataclass(frozen=True)
class Rubric:
    """A validated, frozen rubric."""

    items: tuple[RubricItem, ...]
    success_gate: str
    failure_conditions: tuple[str, ...]
    scoring_procedure: str

    def to_json(self) -> dict[str, Any]:
        """The official JSON shape (weights normalised)."""
        return {
            "rubric_items": [asdict(item) for item in self.items],
            "success_gate": self.success_gate,
            "failure_conditions": list(self.failure_conditions),
            "scoring_procedure": self.scoring_procedure,
        }


@dataclass(frozen=True)
class Parsed:
    """The outcome of parsing model output: a value, or an error with the raw text."""

    value: Any
    """A :class:`Rubric` or :class:`Score`; None when malformed."""
    error: str | None
    raw: str

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Score:
    """A child's score against a frozen rubric."""

    gate: int
    """g in {0, 1}: the success gate."""
    item_scores: dict[str, float]
    """c_j in [0, 1] per rubric item."""
    final_score: float
    """s = g * sum_j w_j c_j, computed here."""
    claimed_score: float | None
    """The ``final_score`` the scorer wrote (recorded, not trusted)."""
    reason: str
    forced: bool = False
    """True when s = 0 was forced because the child did not finish (no scoring call)."""


def extract_json_object(text: str) -> dict | None:
    """The first JSON object in ``text`` (``json`` fences and prose around it allowed)."""
    if not isinstance(text, str):
        return None
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    return None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _malformed(what: str, why: str, text: Any) -> Parsed:
    """A parse failure that keeps the raw output (``repr`` of a non-string)."""
    return Parsed(None, f"malformed {what}: {why}", text if isinstance(text, str) else repr(text))


def parse_rubric(text: str, *, min_items: int = MIN_ITEMS, max_items: int = MAX_ITEMS) -> Parsed:
    """Validate a rubric writer's output and freeze it (see the module docstring)."""
    def bad(why: str) -> Parsed:
        return _malformed("rubric", why, text)

    data = extract_json_object(text)
    if data is None:
        return bad("no JSON object found")
    items = data.get("rubric_items")
    if not isinstance(items, list):
        return bad("`rubric_items` must be a list")
    if not min_items <= len(items) <= max_items:
        return bad(f"{len(items)} items; a rubric has {min_items} to {max_items}")
    parsed, weights, names = [], [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            return bad(f"item {i} is not an object")
        fields = {k: _text(item.get(k)) for k in ("name", "description", "score_0", "score_full")}
        missing = [k for k, v in fields.items() if v is None]
        if missing:
            return bad(f"item {i} lacks {', '.join(missing)}")
        if fields["name"] in names:
            return bad(f"item name {fields['name']!r} is repeated")
        names.add(fields["name"])
        weight = _number(item.get("weight"))
        if weight is None or weight < 0:
            return bad(f"item {i} ({fields['name']}) has weight {item.get('weight')!r}; weights are finite and >= 0")
        weights.append(weight)
        parsed.append(fields)
    total = sum(weights)
    if total <= 0:
        return bad("the weights sum to 0")
    gate = _text(data.get("success_gate"))
    if gate is None:
        return bad("`success_gate` is missing")
    failures = data.get("failure_conditions", [])
    if not isinstance(failures, list) or not all(_text(f) for f in failures):
        return bad("`failure_conditions` must be a list of non-empty strings")
    rubric = Rubric(
        items=tuple(RubricItem(f["name"], w / total, f["description"], f["score_0"], f["score_full"])
                    for f, w in zip(parsed, weights, strict=True)),
        success_gate=gate,
        failure_conditions=tuple(f.strip() for f in failures),
        scoring_procedure=_text(data.get("scoring_procedure")) or "",
    )
    return Parsed(rubric, None, text)


def parse_score(text: str, rubric: Rubric) -> Parsed:
    """Validate a scoring call's output against the frozen rubric; compute s = g * sum w c."""
    def bad(why: str) -> Parsed:
        return _malformed("score", why, text)

    data = extract_json_object(text)
    if data is None:
        return bad("no JSON object found")
    success = data.get("success")
    if not isinstance(success, bool):
        return bad("`success` must be true or false")
    entries = data.get("criterion_scores")
    if not isinstance(entries, list):
        return bad("`criterion_scores` must be a list")
    scores: dict[str, float] = {}
    known = {item.name for item in rubric.items}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or _text(entry.get("name")) is None:
            return bad(f"criterion score {i} needs a `name`")
        name = entry["name"].strip()
        if name not in known:
            return bad(f"criterion {name!r} is not in the rubric")
        if name in scores:
            return bad(f"criterion {name!r} is scored twice")
        value = _number(entry.get("score"))
        if value is None or not 0.0 <= value <= 1.0:
            return bad(f"criterion {name!r} has score {entry.get('score')!r}; scores are in [0, 1]")
        scores[name] = value
    missing = known - scores.keys()
    if missing:
        return bad(f"no score for {', '.join(sorted(missing))}")
    gate = int(success)
    weighted = sum(item.weight * scores[item.name] for item in rubric.items)
    if gate and weighted <= 0:
        return bad("`success` is true but every criterion scored 0 (success requires a final score > 0)")
    claimed = _number(data.get("final_score"))
    reason = _text(data.get("reason")) or ""
    return Parsed(Score(gate, scores, gate * weighted, claimed, reason), None, text)


def forced_zero(reason: str = "the child did not finish") -> Score:
    """g = 0 and s = 0 for a child that did not complete: no scoring call is made."""
    return Score(0, {}, 0.0, None, reason, forced=True)


@dataclass(frozen=True)
class ChildReward:
    """How a child's execution reward was resolved."""

    reward: float | None
    """The reward, or None when this child gives no gradient."""
    source: str
    """``rubric``, ``forced_zero``, ``binary_fallback``, ``dropped``."""
    drop_rollout: bool = False
    """True when the policy drops the whole rollout."""


def resolve_child_reward(score: Parsed | Score, policy: MalformedPolicy, binary_label: bool | None = None) -> ChildReward:
    """The child's reward s_v, or what the malformed-output policy says to do instead.

    ``binary_label`` is the external label (used only by ``binary_fallback``; without a
    label the child is dropped).
    """
    if isinstance(score, Score):
        return ChildReward(score.final_score, "forced_zero" if score.forced else "rubric")
    if score.ok:
        return ChildReward(score.value.final_score, "rubric")
    policy = MalformedPolicy(policy)
    if policy is MalformedPolicy.BINARY_FALLBACK and binary_label is not None:
        return ChildReward(float(binary_label), "binary_fallback")
    return ChildReward(None, "dropped", drop_rollout=policy is MalformedPolicy.DROP_ROLLOUT)


@dataclass(frozen=True)
class RankingResult:
    """The ranking loss of one branch group (SPEC 3)."""

    loss: float | None
    """mean over (success, failure) pairs of max(0, margin - s_succ + s_fail); None if skipped."""
    pairs: int
    accuracy: float | None
    """Share of pairs with s_succ > s_fail (a tie counts 1/2); None if skipped."""
    skipped: bool
    """All branches succeeded or all failed (or no usable branch): no ordering to learn."""

    @property
    def reward(self) -> float | None:
        """The group's reward attached to the rubric tokens (official: -L_rank)."""
        return None if self.loss is None else -self.loss


def pair_order(good: float, bad: float) -> float:
    """A (success, failure) pair's share of pairwise accuracy: 1 if the success scores above
    the failure, 1/2 if they tie, 0 if reversed."""
    return 1.0 if good > bad else 0.5 if good == bad else 0.0


def ranking_loss(scores: Sequence[float | None], labels: Sequence[bool | None], margin: float = RANKING_MARGIN) -> RankingResult:
    """Hinge ranking loss over the (success, failure) pairs of one branch group.

    Branches without a label (``None``: an unknown judge verdict) or without a score
    (``None``: malformed) are left out; they are never counted as either outcome.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    good = [s for s, y in zip(scores, labels, strict=True) if y is True and s is not None]
    bad = [s for s, y in zip(scores, labels, strict=True) if y is False and s is not None]
    if not good or not bad:
        return RankingResult(None, 0, None, True)
    pairs = [(p, n) for p in good for n in bad]
    loss = sum(max(0.0, margin - p + n) for p, n in pairs) / len(pairs)
    accuracy = sum(pair_order(p, n) for p, n in pairs) / len(pairs)
    return RankingResult(loss, len(pairs), accuracy, False)


GLOBAL_RUBRIC = Rubric(
    items=(
        RubricItem("goal achieved", 0.4, "The delegated goal is fully achieved in the final state.",
                   "Nothing the goal asks for is present.", "Everything the goal asks for is present."),
        RubricItem("correct details", 0.3, "Amounts, items and preparations match the goal exactly.",
                   "Wrong items, amounts or preparations.", "Every detail matches the goal."),
        RubricItem("no damage", 0.15, "Shared resources are not wasted or destroyed.",
                   "Resources others need were wasted or destroyed.", "Nothing was wasted or destroyed."),
        RubricItem("clear report", 0.15, "The child finished and reported what it did.",
                   "No finish or a misleading report.", "A finish message that matches the final state."),
    ),
    success_gate="The final state satisfies the delegated goal.",
    failure_conditions=("The goal is not met in the final state.", "An irreversible mistake was made."),
    scoring_procedure="Check the gate first; if it fails the score is 0, else score each item in [0, 1].",
)
"""The ablation's single rubric for every subtask (Table 3, "one global rubric")."""
