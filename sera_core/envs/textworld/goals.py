"""The subtask checker: verdicts on canonical sub-goals, for labelling branches offline.

SERA's counterfactual branches need an external binary label per branch. For
TextWorld-Sync the paper asks an LLM judge; this checker answers programmatically for
goals written in a canonical form (the expert delegates with these), and says
``unknown`` for anything else, which must never be counted as a label.

Canonical goals (case-insensitive, an optional final period; several joined by ``;``
must all hold)::

    prepare and eat dish_2
    prepare dish_2
    bring the red apple, roasted and sliced, to the counter
    open the door

A goal is judged on the world's state after the child ran: an ingredient "brought to
the counter" counts while it is on the counter or already inside its prepared dish.
"""

from __future__ import annotations

import re

from sera_core.envs.textworld.data import COOKING, CUTTING
from sera_core.envs.textworld.world import SyncWorld

SUCCESS, FAILURE, UNKNOWN = "success", "failure", "unknown"

_DISH = re.compile(r"^(prepare and eat|prepare|eat) (dish_\d+)$")
_BRING = re.compile(
    rf"^bring the (.+?), ({'|'.join(COOKING)}) and ({'|'.join(CUTTING)}), to the counter$"
)


def goal_for_dish(dish: str) -> str:
    """The canonical goal of finishing one dish."""
    return f"prepare and eat {dish}"


def goal_for_ingredient(name: str, preparation: tuple[str, str]) -> str:
    """The canonical goal of readying one ingredient."""
    return f"bring the {name}, {preparation[0]} and {preparation[1]}, to the counter"


def _one(goal: str, world: SyncWorld) -> str:
    s = world.state
    m = _DISH.match(goal)
    if m:
        verb, dish = m.groups()
        if dish not in s.dishes:
            return UNKNOWN
        done = s.prepared[dish] if verb == "prepare" else s.eaten[dish]
        return SUCCESS if done else FAILURE
    m = _BRING.match(goal)
    if m:
        name, cook, cut = m.groups()
        item = s.items.get(name)
        if item is None:
            return UNKNOWN
        ready = (item.place == "counter" or item.place.startswith("dish:")) and item.state == (cook, cut)
        return SUCCESS if ready and not item.ruined else FAILURE
    if goal in ("open the door", "open the gate"):
        return UNKNOWN if s.gate is None else (SUCCESS if s.gate == "open" else FAILURE)
    return UNKNOWN


def check_goal(goal: str, world: SyncWorld) -> str:
    """``success``, ``failure`` or ``unknown`` for a (possibly compound) canonical goal."""
    parts = [" ".join(p.strip().lower().rstrip(".").split()) for p in goal.split(";")]
    parts = [p for p in parts if p]
    if not parts:
        return UNKNOWN
    with world.lock:
        verdicts = [_one(p, world) for p in parts]
    if UNKNOWN in verdicts:
        return UNKNOWN
    return SUCCESS if all(v == SUCCESS for v in verdicts) else FAILURE


def branch_label(goal: str, world: SyncWorld) -> bool | None:
    """The binary label of a branch, or None when the goal is not canonical (never a label)."""
    verdict = check_goal(goal, world)
    return None if verdict == UNKNOWN else verdict == SUCCESS
