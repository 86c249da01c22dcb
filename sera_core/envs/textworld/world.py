"""The TextWorld-Sync world: one shared cooking world per root task.

Every agent of a recursive tree acts in the *same* :class:`SyncWorld` (delegation
creates a view, not a clone; SPEC 5). What is shared: items and where they are, the
shared inventory (with an optional capacity), the counter of ready ingredients, the
gate, tool cooldowns, per-dish progress and the global action budget. What is one
agent's own lives in the agent session (``env.py``): location, history, turn budget.

Rules (our reading of SPEC 8 where the official V9 environment is not public):

* Rooms: the first clamp(numLocations, 4, 11) of kitchen, pantry, garden,
  supermarket, hallway, dining room, garage, study, basement, attic, courtyard. Every
  agent starts in the kitchen. The knife, stove, oven, grill and the cookbook are in
  the kitchen.
* Each ingredient sits at one of its two ``candidate_source_locations``, drawn from
  the task seed; distractor foods sit at random locations. ``take <item>`` works in
  the item's room, if the item is not hidden and the shared inventory has room.
* The gate: with ``includeDoors`` there is one door, in the hallway. For
  ``dependency_gate`` tasks it hides every ingredient of the gated dishes (the
  ``gate_1 -> dish_k`` edges) until someone runs ``open door`` there.
* Preparing: an ingredient is cooked (``cook X in stove`` -> fried, ``in oven`` ->
  roasted, ``on grill`` -> grilled) and/or cut (``chop|slice|dice X``, needs the knife)
  while held, in the kitchen. Once its state equals the recipe's preparation it moves
  to the shared counter (freeing inventory room); an ingredient whose recipe is
  ``(raw, uncut)`` goes there as soon as it is taken. Mistakes are irreversible: a wrong
  cooking or cut leaves it unusable, cooking twice burns it, ``eat`` on an ingredient
  destroys it; any of these makes the task fail.
* Tools have a cooldown of ``tool_cooldown_steps`` global steps: a tool used at global
  step t is busy until step t + cooldown has passed (matters when agents share it).
* ``prepare <dish>`` (in the kitchen) needs all its ingredients on the counter;
  ``eat <dish>`` needs the dish prepared.
* The global budget (``parallelism.shared_environment_max_steps``) counts every action
  that touches shared state, *and every invalid action*. Moving (``go to``), reading the
  cookbook and ``inventory`` change nothing shared and are free for the world (they
  still cost the acting agent a turn; an invalid one spends a step like any invalid
  action); this matches the official estimate
  ``estimated_sequential_actions = total_branch_work + 2 x dishes + includeDoors``,
  which counts no movement. Once the budget is spent every action is refused.

Every action runs under one lock and commits atomically, so agents on several threads
never lose or duplicate an effect, and the budget is never overspent.

Root checker (SPEC 5): PASS iff every dish is prepared and eaten, which (since
``prepare`` consumes exactly the required, correctly prepared ingredients) means every
ingredient was collected, not destroyed, and prepared exactly as required.

The shared world is one locked state machine (every command, its rules and its events),
so it stays one module.
"""

from __future__ import annotations

import copy
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sera_core.envs.textworld.data import COOK_APPLIANCE, CUT_VERB, distractor_foods, load_foods, rooms_for

TOOL_ROOM = "kitchen"
"""Where the knife, stove, oven, grill and cookbook are."""
GATE_ROOM = "hallway"
"""Where the door (gate) is, when the task has one."""
APPLIANCE_STATE: dict[str, str] = {v: k for k, v in COOK_APPLIANCE.items()}
"""stove -> fried, oven -> roasted, grill -> grilled."""
VERB_STATE: dict[str, str] = {v: k for k, v in CUT_VERB.items()}
"""chop -> chopped, slice -> sliced, dice -> diced."""
FREE_VERBS = ("go", "read", "inventory")
"""Actions that touch no shared state and spend no global step."""


@dataclass
class Item:
    """One object: an ingredient or a distractor (plain data)."""

    name: str
    place: str
    """``room.container`` or ``room`` where it lies, or ``inventory``, ``counter``,
    ``dish:<id>`` (used in a prepared dish), ``destroyed``."""
    cook: str = "raw"
    cut: str = "uncut"
    hidden: bool = False
    """Behind the closed gate."""
    ruined: bool = False
    """An irreversible mistake made it unusable."""

    @property
    def room(self) -> str:
        return self.place.split(".", 1)[0]

    @property
    def state(self) -> tuple[str, str]:
        return (self.cook, self.cut)


@dataclass
class WorldState:
    """Everything the agents share (plain data; copied by snapshot/fork)."""

    rooms: list[str]
    items: dict[str, Item]
    required: dict[str, tuple[str, str]]
    """Ingredient -> required (cook, cut)."""
    dishes: dict[str, list[str]]
    """Dish id -> its ingredients, in recipe order."""
    prepared: dict[str, bool]
    eaten: dict[str, bool]
    gate: str | None
    """None (no door), ``closed`` or ``open``."""
    tool_busy_until: dict[str, int]
    """Tool -> last global step at which it is still busy."""
    cooldown: int
    capacity: int | None
    max_steps: int
    steps: int = 0
    events: list[str] = field(default_factory=list)
    """Irreversible mistakes, in order (``"burned red apple"``, ...)."""

    def copy(self) -> WorldState:
        """An independent copy (items hold only immutable fields, so a shallow copy each suffices)."""
        return WorldState(
            rooms=list(self.rooms), items={k: copy.copy(v) for k, v in self.items.items()},
            required=dict(self.required), dishes={k: list(v) for k, v in self.dishes.items()},
            prepared=dict(self.prepared), eaten=dict(self.eaten), gate=self.gate,
            tool_busy_until=dict(self.tool_busy_until), cooldown=self.cooldown, capacity=self.capacity,
            max_steps=self.max_steps, steps=self.steps, events=list(self.events),
        )


@dataclass(frozen=True)
class ActionResult:
    """The outcome of one action."""

    ok: bool
    message: str
    spent: bool
    """Whether it spent a global step."""


class SyncWorld:
    """The shared world of one TextWorld-Sync task (see the module docstring)."""

    def __init__(self, state: WorldState, description: str = "", cookbook: str = ""):
        self.state = state
        self.description = description
        self.cookbook = cookbook
        self.lock = threading.RLock()

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SyncWorld:
        """Build the world of a task record (ours or official), seeded by ``record["seed"]``."""
        params = record["game_params"]
        par = record["parallelism"]
        rng = random.Random(int(record["seed"]))
        rooms = list(rooms_for(params["numLocations"]))
        foods = load_foods()
        gated = {e["to"] for e in par.get("dependencies", []) if e.get("type") == "door"}
        has_gate = bool(params.get("includeDoors")) and GATE_ROOM in rooms
        items: dict[str, Item] = {}
        required: dict[str, tuple[str, str]] = {}
        dishes: dict[str, list[str]] = {}
        for dish in record["dishes"]:
            dishes[dish["dish_id"]] = []
            for entry in dish["recipe"]:
                name = entry["name"]
                places = [p for p in entry["candidate_source_locations"] if p.split(".")[0] in rooms]
                if not places:
                    raise ValueError(f"{name}: none of its source locations is among the task's rooms {rooms}")
                items[name] = Item(name, rng.choice(places), hidden=has_gate and dish["dish_id"] in gated)
                required[name] = (entry["preparation"][0], entry["preparation"][1])
                dishes[dish["dish_id"]].append(name)
        spare = [f for f in distractor_foods() if f not in items]
        for name in rng.sample(spare, min(len(spare), int(params.get("numDistractorItems", 0)))):
            places = [p for p in foods[name].locations if p.split(".")[0] in rooms] or [rng.choice(rooms[1:])]
            items[name] = Item(name, rng.choice(places))
        capacity = None
        if params.get("limitInventorySize"):
            cap = (par.get("resource_capacity") or {}).get("inventory")
            cap = cap or record.get("generation", {}).get("v7_sampled_parameters", {}).get("inventory_capacity")
            capacity = int(cap or 1)
        state = WorldState(
            rooms=rooms, items=items, required=required, dishes=dishes,
            prepared={d: False for d in dishes}, eaten={d: False for d in dishes},
            gate="closed" if has_gate else None,
            tool_busy_until={t: -1 for t in ("knife", "stove", "oven", "grill")},
            cooldown=int(par.get("mechanisms", {}).get("tool_cooldown_steps", 0)),
            capacity=capacity, max_steps=int(par["shared_environment_max_steps"]),
        )
        return cls(state, record.get("task_description", ""), render_cookbook(record))

    # -- state copies --------------------------------------------------------------------
    def snapshot(self) -> WorldState:
        """A deep, plain-data copy of the shared state."""
        with self.lock:
            return self.state.copy()

    def restore(self, snap: WorldState) -> None:
        """Replace the shared state in place (every agent view sees it)."""
        with self.lock:
            self.state = snap.copy()

    def fork(self) -> SyncWorld:
        """An independent world with a copy of the state (a counterfactual branch)."""
        return SyncWorld(self.snapshot(), self.description, self.cookbook)

    def commit(self, branch: SyncWorld) -> None:
        """Make this world's state equal to ``branch``'s (branch 0 continues for real)."""
        self.restore(branch.snapshot())

    # -- queries -------------------------------------------------------------------------
    @property
    def steps_left(self) -> int:
        return self.state.max_steps - self.state.steps

    def held(self) -> list[Item]:
        return [i for i in self.state.items.values() if i.place == "inventory"]

    def on_counter(self) -> list[Item]:
        return [i for i in self.state.items.values() if i.place == "counter"]

    def visible(self, room: str) -> list[Item]:
        return [i for i in self.state.items.values()
                if i.room == room and not i.hidden and i.place not in ("inventory", "counter", "destroyed")
                and not i.place.startswith("dish:")]

    def dish_progress(self, dish: str) -> tuple[int, int]:
        """(ingredients ready on the counter or used in the meal, ingredients in total)."""
        names = self.state.dishes[dish]
        ready = sum(1 for n in names if self.state.items[n].place in ("counter", f"dish:{dish}"))
        return ready, len(names)

    def check(self) -> dict[str, Any]:
        """The root checker: PASS iff every dish is prepared and eaten."""
        s = self.state
        missing = [d for d in s.dishes if not s.eaten[d]]
        return {"passed": not missing, "dishes_eaten": sum(s.eaten.values()), "dishes": len(s.dishes),
                "unfinished": missing, "mistakes": list(s.events), "steps_used": s.steps}

    # -- acting --------------------------------------------------------------------------
    def act(self, location: str, command: str) -> tuple[ActionResult, str]:
        """Run one command for an agent standing in ``location``, atomically.

        Returns the result and the agent's (possibly new) location.
        """
        with self.lock:
            command = " ".join(command.strip().lower().split())
            verb = command.split(" ", 1)[0]
            free = None
            if verb in FREE_VERBS:
                free, new_location = self._free(location, command)
                if free.ok:
                    return free, new_location
            if self.state.steps >= self.state.max_steps:
                return ActionResult(False, "No shared steps remain: the world accepts no more actions.", False), location
            self.state.steps += 1  # every other action, and every invalid one, spends a global step
            if free is not None:
                return ActionResult(False, free.message, True), location
            try:
                return ActionResult(True, self._apply(location, command), True), location
            except _Invalid as exc:
                return ActionResult(False, f"Invalid action: {exc}", True), location

    def _free(self, location: str, command: str) -> tuple[ActionResult, str]:
        if command == "inventory":
            return ActionResult(True, self.inventory_text(), False), location
        if command == "read cookbook":
            if location != TOOL_ROOM:
                return ActionResult(False, "Invalid action: the cookbook is in the kitchen.", False), location
            return ActionResult(True, self.cookbook, False), location
        if command.startswith("go to "):
            room = command[6:].strip()
            if room not in self.state.rooms:
                return ActionResult(False, f"Invalid action: there is no room called {room!r} here.", False), location
            if room == location:
                return ActionResult(False, f"Invalid action: you are already in the {room}.", False), location
            return ActionResult(True, f"You go to the {room}.", False), room
        return ActionResult(False, f"Invalid action: unknown command {command!r}.", False), location

    def _item(self, name: str) -> Item:
        item = self.state.items.get(name)
        if item is None or item.place == "destroyed":
            raise _Invalid(f"there is no {name} here")
        return item

    def _use_tool(self, tool: str) -> None:
        busy = self.state.tool_busy_until[tool]
        if busy >= self.state.steps:
            raise _Invalid(f"the {tool} is busy for {busy - self.state.steps + 1} more step(s)")
        self.state.tool_busy_until[tool] = self.state.steps + self.state.cooldown

    def _maybe_ready(self, item: Item) -> str:
        if item.name in self.state.required and not item.ruined and item.state == self.state.required[item.name]:
            item.place = "counter"
            return f" The {item.name} is ready and goes to the counter."
        return ""

    def _apply(self, location: str, command: str) -> str:
        s = self.state
        words = command.split()
        verb, rest = words[0] if words else "", " ".join(words[1:])
        if verb == "take":
            item = self._item(rest)
            if item.place in ("inventory", "counter") or item.place.startswith("dish:"):
                raise _Invalid(f"the {rest} was already taken")
            if item.room != location or item.hidden:
                raise _Invalid(f"you see no {rest} in the {location}")
            if s.capacity is not None and len(self.held()) >= s.capacity:
                raise _Invalid(f"the shared inventory is full ({s.capacity} item(s)); prepare or use what it holds first")
            item.place = "inventory"
            return f"You take the {rest}." + self._maybe_ready(item)
        if verb in VERB_STATE or verb == "cook":
            if verb == "cook":
                for sep, appliances in ((" in ", ("stove", "oven")), (" on ", ("grill",))):
                    name, _, appliance = rest.partition(sep)
                    if appliance in appliances:
                        break
                else:
                    raise _Invalid("write `cook <item> in stove`, `cook <item> in oven` or `cook <item> on grill`")
                tool, new = appliance, APPLIANCE_STATE[appliance]
            else:
                name, tool, new = rest, "knife", VERB_STATE[verb]
            item = self._item(name)
            if item.place != "inventory":
                raise _Invalid(f"you are not holding the {name}")
            if location != TOOL_ROOM:
                raise _Invalid(f"the {tool} is in the kitchen")
            if tool == "knife" and item.cut != "uncut":
                raise _Invalid(f"the {name} is already {item.cut}")
            self._use_tool(tool)
            if tool == "knife":
                item.cut = new
            elif item.cook != "raw":
                item.cook, item.ruined, item.place = "burned", True, "destroyed"
                if name in s.required:
                    s.events.append(f"burned {name}")
                return f"You cook the {name} again and burn it to ashes."
            else:
                item.cook = new
            req = s.required.get(name)
            if req is not None and (item.cook not in ("raw", req[0]) or item.cut not in ("uncut", req[1])):
                item.ruined = True
                s.events.append(f"ruined {name} ({item.cook}, {item.cut})")
            action = f"{verb} the {name}" if tool == "knife" else f"cook the {name}"
            return f"You {action}: it is now {item.cook} and {item.cut}." + self._maybe_ready(item)
        if verb == "open" and rest in ("door", "gate"):
            if s.gate is None:
                raise _Invalid("there is no door in this task")
            if location != GATE_ROOM:
                raise _Invalid(f"the door is in the {GATE_ROOM}")
            if s.gate == "open":
                raise _Invalid("the door is already open")
            s.gate = "open"
            for item in s.items.values():
                item.hidden = False
            return "You open the door. What was behind it is now reachable."
        if verb == "prepare":
            if rest not in s.dishes:
                raise _Invalid(f"there is no dish called {rest!r}")
            if s.prepared[rest]:
                raise _Invalid(f"{rest} is already prepared")
            if location != TOOL_ROOM:
                raise _Invalid("dishes are prepared in the kitchen")
            missing = [n for n in s.dishes[rest] if s.items[n].place != "counter"]
            if missing:
                raise _Invalid(f"{rest} still needs on the counter: {', '.join(missing)}")
            for n in s.dishes[rest]:
                s.items[n].place = f"dish:{rest}"
            s.prepared[rest] = True
            return f"You prepare {rest}."
        if verb == "eat":
            if rest in s.dishes:
                if not s.prepared[rest]:
                    raise _Invalid(f"{rest} is not prepared yet")
                if s.eaten[rest]:
                    raise _Invalid(f"{rest} was already eaten")
                s.eaten[rest] = True
                return f"You eat {rest}. Delicious."
            item = self._item(rest)
            if item.place not in ("inventory", "counter"):
                raise _Invalid(f"you are not holding the {rest}")
            item.place, item.ruined = "destroyed", True
            if rest in s.required:
                s.events.append(f"ate {rest}")
            return f"You eat the {rest}."
        raise _Invalid(f"unknown command {command!r}")

    # -- text ------------------------------------------------------------------------------
    def inventory_text(self) -> str:
        held = ", ".join(f"{i.name} ({i.cook}, {i.cut})" for i in self.held()) or "nothing"
        cap = f" (capacity {self.state.capacity})" if self.state.capacity is not None else ""
        return f"Shared inventory{cap}: {held}."

    def valid_actions(self, location: str) -> list[str]:
        """Commands that make sense now (wrong preparations included: mistakes are possible)."""
        s = self.state
        acts = [f"go to {r}" for r in s.rooms if r != location]
        acts += [f"take {i.name}" for i in self.visible(location)]
        if location == TOOL_ROOM:
            acts.append("read cookbook")
            for i in self.held():
                acts += [f"{v} {i.name}" for v in VERB_STATE] if i.cut == "uncut" else []
                acts += [cook_command(i.name, a) for a in COOK_APPLIANCE.values()]
            acts += [f"prepare {d}" for d in s.dishes
                     if not s.prepared[d] and all(s.items[n].place == "counter" for n in s.dishes[d])]
        if location == GATE_ROOM and s.gate == "closed":
            acts.append("open door")
        acts += [f"eat {d}" for d in s.dishes if s.prepared[d] and not s.eaten[d]]
        return acts

    def observe(self, location: str) -> str:
        """What an agent in ``location`` sees (SPEC 8): no object locations elsewhere, no checker state."""
        s = self.state
        lines = [f"Location: {location}"]
        visible = self.visible(location)
        lines.append("You see: " + (", ".join(i.name for i in visible) if visible else "nothing to take"))
        if s.gate is not None:
            lines.append(f"Gate: the door in the {GATE_ROOM} is {s.gate}")
        busy = [f"{t} busy for {u - s.steps} more step(s)" for t, u in s.tool_busy_until.items() if u > s.steps]
        lines.append("Tools: " + ("; ".join(busy) if busy else "all ready"))
        lines.append(self.inventory_text())
        lines.append("Counter: " + (", ".join(f"{i.name} ({i.cook}, {i.cut})" for i in self.on_counter()) or "empty"))
        progress = []
        for d in s.dishes:
            r, n = self.dish_progress(d)
            progress.append(f"{d}: {r}/{n} ingredients prepared, meal_prepared={s.prepared[d]}, meal_eaten={s.eaten[d]}")
        lines.append("Dishes: " + "; ".join(progress))
        lines.append(f"Shared steps remaining: {self.steps_left}")
        lines.append("Valid actions: " + ", ".join(self.valid_actions(location)))
        return "\n".join(lines)


class _Invalid(Exception):
    """An action that cannot be done (it still spends a global step)."""


def render_cookbook(record: Mapping[str, Any]) -> str:
    """The in-game cookbook: every dish's ingredients with their preparations."""
    lines = ["Cookbook:"]
    for dish in record["dishes"]:
        parts = [f"{e['name']} ({e['preparation'][0]}, {e['preparation'][1]})" for e in dish["recipe"]]
        lines.append(f"{dish['dish_id']}: " + "; ".join(parts))
    return "\n".join(lines)


def cook_command(name: str, appliance: str) -> str:
    """``cook <name> in stove|oven`` or ``cook <name> on grill``."""
    return f"cook {name} {'on' if appliance == 'grill' else 'in'} {appliance}"


def preparation_commands(name: str, preparation: tuple[str, str]) -> list[str]:
    """The commands that turn a held ingredient into ``preparation`` (cut, then cook)."""
    cook, cut = preparation
    commands = [f"{CUT_VERB[cut]} {name}"] if cut != "uncut" else []
    if cook != "raw":
        commands.append(cook_command(name, COOK_APPLIANCE[cook]))
    return commands
