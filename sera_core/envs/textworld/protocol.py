"""The TextWorld-Sync reply protocol (SPEC 8): exactly one block per reply.

A reply holds exactly one of::

    <action>take red apple</action>
    <delegate>{"goal": "prepare and eat dish_2"}</delegate>
    <delegate>{"delegations": [{"goal": "...", "max_steps": 12}, {"goal": "..."}]}</delegate>
    <finish>all dishes eaten</finish>

Free text around the block (reasoning) is allowed; no block, several blocks, an empty
block, or malformed delegate JSON make the reply an *invalid step* with a message that
says what was wrong. :func:`parse_reply` never raises, whatever the text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

DEFAULT_CHILD_STEPS = 20
"""A child's turn budget when the delegate block does not ask for one (SPEC 8)."""
MAX_DELEGATIONS = 8
"""Most children one delegate block may launch."""
FORMAT_HINT = ("Reply with exactly one block: <action>command</action>, <delegate>{\"goal\": \"...\"}</delegate> "
               "(or {\"delegations\": [{\"goal\": \"...\", \"max_steps\": n}, ...]}), or <finish>message</finish>.")

_BLOCK = re.compile(r"<(action|delegate|finish)>(.*?)</\1>", re.DOTALL)
_OPEN = re.compile(r"<(action|delegate|finish)>")
_DELEGATE = re.compile(r"<delegate>.*?</delegate>", re.DOTALL)


@dataclass(frozen=True)
class Delegation:
    """One requested child: its goal and the turn budget asked for."""

    goal: str
    max_steps: int = DEFAULT_CHILD_STEPS


@dataclass(frozen=True)
class Reply:
    """A parsed reply. ``kind`` is ``action``, ``delegate``, ``finish`` or ``invalid``."""

    kind: str
    action: str = ""
    delegations: tuple[Delegation, ...] = field(default_factory=tuple)
    message: str = ""
    error: str = ""
    """For ``invalid``: what was wrong, then the format hint."""


def _invalid(why: str) -> Reply:
    return Reply("invalid", error=f"Invalid reply: {why} {FORMAT_HINT}")


def _delegations(body: str) -> tuple[Delegation, ...] | str:
    """The children a delegate block asks for, or an error string."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:
        return f"the delegate block is not valid JSON ({type(exc).__name__})."
    if not isinstance(data, dict):
        return "the delegate block must be a JSON object."
    entries = data.get("delegations") if "delegations" in data else [data]
    if not isinstance(entries, list) or not entries:
        return "`delegations` must be a non-empty list."
    if len(entries) > MAX_DELEGATIONS:
        return f"at most {MAX_DELEGATIONS} delegations per block."
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            return f"delegation {i} must be an object with a `goal`."
        goal = entry.get("goal")
        if not isinstance(goal, str) or not goal.strip():
            return f"delegation {i} needs a non-empty string `goal`."
        steps = entry.get("max_steps", DEFAULT_CHILD_STEPS)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            return f"delegation {i}: `max_steps` must be a positive integer."
        out.append(Delegation(goal.strip(), steps))
    return tuple(out)


def parse_reply(text: object) -> Reply:
    """Parse one reply; anything but exactly one well-formed block is ``invalid``."""
    if not isinstance(text, str):
        return _invalid("the reply is not text.")
    blocks = _BLOCK.findall(text)
    if not blocks:
        if _OPEN.search(text):
            return _invalid("a block was opened but never closed.")
        return _invalid("no <action>, <delegate> or <finish> block found.")
    if len(blocks) > 1:
        return _invalid(f"found {len(blocks)} blocks; a reply holds exactly one.")
    kind, body = blocks[0]
    body = body.strip()
    if kind == "action":
        if not body:
            return _invalid("the action block is empty.")
        return Reply("action", action=" ".join(body.split()))
    if kind == "finish":
        return Reply("finish", message=body)
    parsed = _delegations(body)
    if isinstance(parsed, str):
        return _invalid(parsed)
    return Reply("delegate", delegations=parsed)


def delegate_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of every complete ``<delegate>...</delegate>`` block
    of ``text``, tags included: the tokens that write a delegation (``launch``, SPEC 3).
    A block opened but never closed launches nothing and counts nothing."""
    return [(m.start(), m.end()) for m in _DELEGATE.finditer(text)]
