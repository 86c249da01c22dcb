"""The TextWorld-Sync expert: a scripted agent that plays through the block protocol.

It never touches the world's state. Optional seeded noise (``early_finish``,
``mistake``) makes some runs fail, for counterfactual branch groups with both outcomes. Each turn it writes one reply (a short reasoning
line, then exactly one ``<action>``, ``<delegate>`` or ``<finish>`` block), the env runs
it, and the expert reads the *observation text* back: its task from the prompt, the
rooms from the ``go to`` entries of ``Valid actions``, what lies in a room from the
``You see:`` line (only after walking there), the shared inventory and its capacity,
the counter, tool cooldowns (``Tools:``), the gate, per-dish progress and the global
steps left. Preparations come from the task text, from its own canonical goal, or (for
``coarse`` tasks, whose text names only ingredients) from ``read cookbook`` in the
kitchen. It never reads item locations from the world or the record.

One agent, turn by turn:

1. setup: learn missing preparations (``read cookbook``); open the gate (go to the
   hallway, ``open door``, walk back to the kitchen) when the task says items are behind
   it, or later when a needed item is nowhere to be seen and the gate is still closed;
2. (``delegate`` mode, below the depth cap, once) delegate in ONE block: an agent with
   several dishes (the root) hands every unfinished dish to a child with a canonical
   compound goal (:func:`dish_goal`: ``bring the ..., to the counter; ...; prepare and
   eat dish_k``); an agent whose own work does not fit its turns (a pessimistic
   bound, :meth:`TextWorldExpert.turns_bound`: every action, a walk through every room,
   extra kitchen trips forced by the inventory capacity) hands every ingredient to a
   grandchild (:func:`goals.goal_for_ingredient`) and keeps the meal for itself (with
   ``turn_reserve`` turns to spare);
3. work (whatever is left, including after children fell short): explore rooms in
   the listed order until every needed item has been seen, take what is needed (items
   that need no preparation first; never beyond the inventory capacity), cook and cut
   in the kitchen (never twice, never a wrong preparation), then ``prepare`` and
   ``eat`` the dishes. In the kitchen it picks among the useful global actions one whose
   tool is free, preferring the tool with most pending work, and fills a cooldown with
   another useful action (a take, a prepare, an eat, or a trip to fetch the next item)
   instead of waiting;
4. finish with a message (also when its last turn comes or nothing more can be done).

Children of one delegate block run under ``asyncio.gather`` (:mod:`env`), but an
expert's turn never awaits anything real, so an agent runs uninterrupted until it
delegates itself: leaves act one after another and each leaves the shared inventory
empty. That avoids contention for inventory capacity and tools, and makes a run
deterministic (same task, same replies, every run); tool cooldowns left by an earlier
sibling are still read from the ``Tools:`` line.

:func:`solve_task` runs a whole task and returns a result row; :func:`run_task` returns
the root env (the whole tree) for inspection.

The scripted solver is one state machine (parse the observation, plan dishes and tools,
act or delegate), so it stays one module.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sera_core.envs.textworld.data import (
    COOK_APPLIANCE,
    COOKING,
    CUT_VERB,
    CUTTING,
    branch_work,
)
from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import FAILURE, SUCCESS, goal_for_dish, goal_for_ingredient
from sera_core.envs.textworld.world import GATE_ROOM, TOOL_ROOM, cook_command
from sera_core.rubrics import rubric_item
from sera_core.utils.seeding import rng_for

MODES: tuple[str, ...] = ("flat", "delegate")
SPLITS: tuple[str, ...] = ("auto", "always", "never")

Prep = tuple[str, str]


@dataclass(frozen=True)
class ExpertConfig:
    """How the expert plays."""

    mode: str = "flat"
    """``flat`` (the root does everything itself) or ``delegate`` (one child per dish,
    grandchildren per ingredient where a dish does not fit a child's turns)."""
    flat_max_steps: int = 400
    """The root's turn budget in ``flat`` mode. Generous on purpose: one agent walks for
    every ingredient (moves cost turns but no global steps); the longest runs over the
    official sample and the generated splits (5 dishes x 4 ingredients, inventory
    capacity 1) take about 85 turns, easy tasks about 20."""
    agent_max_steps: int = 20
    """Turns of every agent in ``delegate`` mode, the root included (SPEC 5)."""
    child_max_steps: int = 20
    """Turns a child gets (asked for in the delegate block; the env caps it too)."""
    max_depth: int = 3
    """Depth cap of the tree (agents at this depth never delegate)."""
    split_dishes: str = "auto"
    """When a dish child delegates its ingredients: ``auto`` (when its pessimistic turn
    bound exceeds its turns), ``always`` (whenever it may), ``never``."""
    turn_reserve: int = 2
    """Turns kept in reserve when an agent judges whether its work fits its turns (with
    ``split_dishes="auto"``): a trip to fetch an item left behind to avoid a cooldown
    stall costs two moves the bound does not count."""
    open_gate: bool = True
    """Open a closed gate when needed. ``False`` only for tests: it shows that gated
    items stay hidden (and the task fails) when nobody opens it."""
    early_finish: float = 0.0
    """Noise: chance, at each turn after the first, of finishing at once claiming success
    (counterfactual branches need failures as well as successes)."""
    mistake: float = 0.0
    """Noise: chance that a cut or cook action uses the wrong cut or appliance (an
    irreversible mistake)."""
    noise_seed: int = 0
    """Seed of the noise; each agent derives its own from it and its task text."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.early_finish <= 1.0 and 0.0 <= self.mistake <= 1.0):
            raise ValueError("early_finish and mistake are probabilities in [0, 1]")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.split_dishes not in SPLITS:
            raise ValueError(f"split_dishes must be one of {SPLITS}, got {self.split_dishes!r}")
        budgets = (self.flat_max_steps, self.agent_max_steps, self.child_max_steps)
        if min(budgets) < 1 or min(self.max_depth, self.turn_reserve) < 0:
            raise ValueError("turn budgets must be >= 1; max_depth and turn_reserve >= 0")


# ------------------------------------------------------------------------ reading text

_ITEM = re.compile(r"([a-z][a-z ]*?) \((\w+), (\w+)\)")
_DISH_LINE = re.compile(r"(dish_\d+): (\d+)/(\d+) ingredients prepared, meal_prepared=(True|False), meal_eaten=(True|False)")
_BUSY = re.compile(r"(\w+) busy for (\d+) (?:more )?step")
_COOKBOOK_LINE = re.compile(r"^(dish_\d+): (.+)$")
_BRING = re.compile(rf"^bring the (.+?), ({'|'.join(COOKING)}) and ({'|'.join(CUTTING)}), to the counter$")
_MEAL = re.compile(r"^(prepare and eat|prepare|eat) (dish_\d+)$")
_STRUCT_DISH = re.compile(r"^Dish (dish_\d+): prepare the following ingredients:$")
_COARSE_DISH = re.compile(r"^Dish (dish_\d+) uses: (.+?)\.?$")
_STRUCT_ITEM = re.compile(r"^- (.+?) \((\w+), (\w+)\)$")


@dataclass
class DishStatus:
    ready: int
    total: int
    prepared: bool
    eaten: bool


@dataclass
class View:
    """One observation, parsed (every field from the text)."""

    message: str = ""
    """What the last reply did (the text before the ``Location:`` line)."""
    location: str | None = None
    see: list[str] = field(default_factory=list)
    gate: str | None = None
    busy: dict[str, int] = field(default_factory=dict)
    capacity: int | None = None
    held: dict[str, Prep] = field(default_factory=dict)
    counter: dict[str, Prep] = field(default_factory=dict)
    dishes: dict[str, DishStatus] = field(default_factory=dict)
    steps_left: int | None = None
    valid: list[str] = field(default_factory=list)
    turns_left: int | None = None


def _items(text: str) -> dict[str, Prep]:
    return {n.strip(): (c, u) for n, c, u in _ITEM.findall(text)}


def parse_observation(text: str) -> View:
    """Parse an observation (or a prompt) into a :class:`View`; missing parts stay empty."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Location: ")), len(lines))
    view = View(message="\n".join(lines[:start]).strip())
    for line in lines[start:]:
        head, _, rest = line.partition(": ")
        if head == "Location":
            view.location = rest.strip()
        elif head == "You see":
            view.see = [] if rest.strip() == "nothing to take" else [s.strip() for s in rest.split(",") if s.strip()]
        elif head == "Gate":
            view.gate = rest.rsplit(" ", 1)[-1].strip()
        elif head == "Tools":
            view.busy = {t: int(n) for t, n in _BUSY.findall(rest)}
        elif line.startswith("Shared inventory"):
            cap = re.search(r"capacity (\d+)", line)
            view.capacity = int(cap.group(1)) if cap else None
            view.held = _items(line.split("): ", 1)[-1] if cap else rest)
        elif head == "Counter":
            view.counter = _items(rest)
        elif head == "Dishes":
            view.dishes = {d: DishStatus(int(r), int(n), p == "True", e == "True")
                           for d, r, n, p, e in _DISH_LINE.findall(rest)}
        elif head == "Shared steps remaining":
            view.steps_left = int(rest)
        elif head == "Valid actions":
            view.valid = [a.strip() for a in rest.split(",") if a.strip()]
        elif head == "Your turns remaining":
            view.turns_left = int(rest)
    return view


def parse_cookbook(text: str) -> dict[str, list[tuple[str, Prep]]]:
    """``dish -> [(ingredient, (cook, cut)), ...]`` from a ``read cookbook`` message."""
    book = {}
    for line in text.splitlines():
        m = _COOKBOOK_LINE.match(line.strip())
        if m:
            book[m.group(1)] = [(n.strip(), (c, u)) for n, c, u in _ITEM.findall(m.group(2))]
    return book


def task_of(prompt: str) -> str:
    """The agent's task text, from its first prompt (``Your task:`` ... first observation)."""
    _, _, rest = prompt.partition("Your task:\n")
    return rest.split("\n\nLocation: ", 1)[0].strip()


def dish_goal(dish: str, ingredients: list[tuple[str, Prep]]) -> str:
    """The canonical compound goal of one dish: bring each ingredient, then prepare and eat."""
    return "; ".join([goal_for_ingredient(n, p) for n, p in ingredients] + [goal_for_dish(dish)])


def _ops(state: Prep, want: Prep) -> list[tuple[str, str]] | None:
    """``[(tool, command-verb)]`` still needed to turn ``state`` into ``want``; None if ruined."""
    (cook, cut), (wcook, wcut) = state, want
    if cook not in ("raw", wcook) or cut not in ("uncut", wcut):
        return None
    ops = []
    if cook != wcook:
        ops.append((COOK_APPLIANCE[wcook], "cook"))
    if cut != wcut:
        ops.append(("knife", CUT_VERB[wcut]))
    return ops


def _command(name: str, tool: str, verb: str) -> str:
    if verb != "cook":
        return f"{verb} {name}"
    return cook_command(name, tool)


# ------------------------------------------------------------------------ the expert

class TextWorldExpert:
    """One agent's policy: call :meth:`act` with the prompt, then with every observation."""

    def __init__(self, cfg: ExpertConfig, *, can_delegate: bool):
        self.cfg = cfg
        self.delegating = cfg.mode == "delegate" and can_delegate
        self.task = ""
        self.prep: dict[str, Prep | None] = {}
        """What I must bring to the counter, with its preparation (None until known)."""
        self.meals: dict[str, tuple[bool, bool]] = {}
        """Dish -> (prepare it, eat it)."""
        self.members: dict[str, list[str]] = {}
        """Dish -> its ingredients, where known."""
        self.whole_dish = False
        """Whether the task text names every ingredient of every dish (a root task)."""
        self.gate_hint = False
        """The task says items are behind the gate (or my goal is to open it)."""
        self.door_goal = False
        self.cookbook_read = False
        self.rooms: list[str] = []
        self.seen: dict[str, list[str]] = {}
        """Room -> what its ``You see:`` line showed the last time I stood there."""
        self.visited: set[str] = set()
        self.delivered: set[str] = set()
        self.view = View()
        self.invalid = 0
        self.delegated = False
        self.gate_trip = False
        """Between opening the gate and walking on."""
        self.failure: str | None = None
        self.turn = 0
        self.last_tool: str | None = None
        """The tool my last reply used (to learn the cooldown from the next ``Tools:`` line)."""
        self.cooldown: int | None = None
        """Global steps a tool stays busy after use, once seen (assumed >= 1 until then)."""

    # -- the turn loop -------------------------------------------------------------
    def act(self, observation: str) -> str:
        """The next reply, given the prompt (turn one) or the last observation."""
        if self.turn == 0:
            self._read_task(task_of(observation))
            self.noise = rng_for(self.cfg.noise_seed, "textworld.expert", self.task)
        self.turn += 1
        self._read(observation)
        if self.failure:
            return self._finish()
        if self.view.turns_left is not None and self.view.turns_left <= 1 and not self._all_done():
            self.failure = "ran out of turns"
            return self._finish()
        if self.turn > 1 and self.noise.random() < self.cfg.early_finish:
            return _reply("I think I am done.", "finish", "Done: " + self.task.replace("\n", " ")[:300])
        return self._botch(self._next())

    def _botch(self, reply: str) -> str:
        """Noise: with probability ``mistake``, a cut or cook uses the wrong cut or appliance."""
        m = re.search(r"<action>(chop|slice|dice|cook) (.+?)(?: (?:in|on) (stove|oven|grill))?</action>", reply)
        if m is None or self.noise.random() >= self.cfg.mistake:
            return reply
        verb, item, appliance = m.groups()
        if verb == "cook":
            command = cook_command(item, self.noise.choice([a for a in COOK_APPLIANCE.values() if a != appliance]))
        else:
            command = f"{self.noise.choice([v for v in CUT_VERB.values() if v != verb])} {item}"
        return reply[: m.start()] + f"<action>{command}</action>" + reply[m.end():]

    def _read_task(self, task: str) -> None:
        self.task = task
        self.gate_hint = "gate" in task.lower() and "opened" in task.lower()
        dish = None
        for raw in task.splitlines():
            line = raw.strip()
            if m := _STRUCT_DISH.match(line):
                dish = m.group(1)
                self.members[dish], self.meals[dish] = [], (True, True)
            elif (m := _STRUCT_ITEM.match(line)) and dish:
                name = m.group(1).strip()
                self.members[dish].append(name)
                self.prep[name] = (m.group(2), m.group(3))
            elif m := _COARSE_DISH.match(line):
                dish = m.group(1)
                names = [n.strip() for n in m.group(2).split(",") if n.strip()]
                self.members[dish], self.meals[dish] = names, (True, True)
                for name in names:
                    self.prep[name] = None
        if self.meals:
            self.whole_dish = True
            return
        for part in (p.strip().lower().rstrip(".") for p in task.split(";")):
            part = " ".join(part.split())
            if m := _BRING.match(part):
                self.prep[m.group(1)] = (m.group(2), m.group(3))
            elif m := _MEAL.match(part):
                verb, dish = m.groups()
                self.meals[dish] = (verb != "eat", verb != "prepare")
            elif part in ("open the door", "open the gate"):
                self.gate_hint = self.door_goal = True
            elif part:
                self.failure = f"I do not understand the goal {part!r}"

    def _read(self, observation: str) -> None:
        view = parse_observation(observation)
        self.view = view
        if view.message.startswith("Invalid action") or view.message.startswith("Invalid reply"):
            self.invalid += 1
            if self.invalid >= 3:
                self.failure = f"too many refused actions (last: {view.message})"
        if view.message.startswith("No shared steps remain"):
            self.failure = "the shared step budget is spent"
        if view.message.startswith("Cookbook:"):
            self.cookbook_read = True
            for dish, entries in parse_cookbook(view.message).items():
                self.members[dish] = [n for n, _ in entries]
                for name, prep in entries:
                    if name in self.prep or dish in self.meals:
                        self.prep[name] = prep
        if view.location is None:
            return
        if self.last_tool and not view.message.startswith("Invalid"):
            self.cooldown = view.busy.get(self.last_tool, 0)
        self.last_tool = None
        if not self.rooms:
            self.rooms = [view.location] + [a[6:] for a in view.valid if a.startswith("go to ")]
        self.seen[view.location] = list(view.see)
        self.visited.add(view.location)
        self.delivered |= set(view.counter)
        for dish, st in view.dishes.items():
            if st.prepared:
                self.delivered |= set(self.members.get(dish, ()))

    # -- what is left -------------------------------------------------------------
    def _left(self) -> list[str]:
        """Ingredients I still have to bring (not on the counter or in a meal yet)."""
        return [n for n in self.prep if n not in self.delivered]

    def _meals_left(self) -> list[str]:
        out = []
        for dish, (prep, eat) in self.meals.items():
            st = self.view.dishes.get(dish)
            if st is None or (prep and not st.prepared) or (eat and not st.eaten):
                out.append(dish)
        return out

    def _all_done(self) -> bool:
        door = self.door_goal and self.view.gate == "closed"
        return not self._left() and not self._meals_left() and not door

    def _free_slots(self) -> float:
        cap = self.view.capacity
        return float("inf") if cap is None else cap - len(self.view.held)

    def _tool_free(self, tool: str) -> bool:
        """A tool the ``Tools:`` line lists as busy cannot be used by the next action."""
        return tool not in self.view.busy

    def turns_bound(self) -> int:
        """A pessimistic count of the turns my remaining work takes if I do it all myself."""
        left = self._left()
        spends = sum(branch_work(self.prep[n]) for n in left if self.prep[n])
        spends += sum(p + e for d, (p, e) in self.meals.items() if d in self._meals_left())
        moves = len(self.rooms) + (self.view.location != TOOL_ROOM)
        cap = self.view.capacity
        prepared = sum(1 for n in left if self.prep[n] and self.prep[n] != ("raw", "uncut"))
        if cap is not None and prepared > cap:
            moves += 2 * (-(-prepared // cap) - 1)
        return spends + moves + 1

    # -- deciding -------------------------------------------------------------------
    def _next(self) -> str:
        v = self.view
        if self._all_done():
            return self._finish()
        # 1. learn missing preparations from the cookbook
        if any(p is None for n, p in self.prep.items() if n not in self.delivered) and not self.cookbook_read:
            if v.location != TOOL_ROOM:
                return self._go(TOOL_ROOM, "The preparations are in the cookbook, in the kitchen.")
            return _reply("The task names only ingredients; I read the cookbook for their preparations.",
                          "action", "read cookbook")
        unknown = [n for n in self._left() if self.prep[n] is None]
        if unknown:
            self.failure = f"the cookbook gives no preparation for {', '.join(unknown)}"
            return self._finish()
        # 2. the gate, when the task says items are behind it
        if self.gate_trip or (self.gate_hint and v.gate == "closed" and self.cfg.open_gate
                              and (self._left() or self.door_goal)):
            return self._gate_step("The task says some ingredients are behind the gate; I open it first.")
        # 3. delegate once
        if self.delegating and not self.delegated:
            self.delegated = True
            reply = self._delegate()
            if reply:
                return reply
        # 4. do the work
        return self._work()

    def _gate_step(self, why: str) -> str:
        v = self.view
        if v.gate == "closed":
            self.gate_trip = True
            if v.location != GATE_ROOM:
                return self._go(GATE_ROOM, why)
            self.visited = {GATE_ROOM}  # hidden items appear in their rooms: look again
            return _reply("I open the door to reach what is behind it.", "action", "open door")
        self.gate_trip = False
        if self.delegating and not self.delegated and v.location != TOOL_ROOM:
            return self._go(TOOL_ROOM, "The gate is open; back to the kitchen, where the tools are.")
        return self._next()

    def _delegate(self) -> str | None:
        left = self._left()
        if self.whole_dish and len(self._meals_left()) > 1:
            block = [(d, [(n, self.prep[n]) for n in self.members[d] if n in left]) for d in self._meals_left()]
            goals = [dish_goal(d, items) if items else goal_for_dish(d) for d, items in block]
            why = f"{len(goals)} dishes to finish; one sub-agent per dish, each with its ingredients and preparations."
        elif len(left) > 1 and (self.cfg.split_dishes == "always" or (
                self.cfg.split_dishes == "auto"
                and self.turns_bound() > (self.view.turns_left or 0) - self.cfg.turn_reserve)):
            goals = [goal_for_ingredient(n, self.prep[n]) for n in left]
            why = (f"My work may take up to {self.turns_bound()} turns (finding {len(left)} ingredients without "
                   f"knowing where they are), too many for my {self.view.turns_left}; one sub-agent per ingredient, "
                   "then I prepare the meal.")
        else:
            return None
        body = {"delegations": [{"goal": g, "max_steps": self.cfg.child_max_steps} for g in goals]}
        return _reply(why, "delegate", json.dumps(body))

    def _work(self) -> str:
        v = self.view
        left = self._left()
        held = {n: s for n, s in v.held.items() if n in left}
        pending: dict[str, list[tuple[str, str]]] = {}
        for name, state in held.items():
            ops = _ops(state, self.prep[name])
            if ops is None:
                self.failure = f"the {name} is ruined ({state[0]}, {state[1]})"
                return self._finish()
            pending[name] = ops
        free = self._free_slots()
        here = [n for n in left if n in v.see and n not in held]
        here.sort(key=lambda n: self.prep[n] != ("raw", "uncut"))  # no-preparation items first (no slot kept)
        fillers = here  # in the kitchen, a take also lets a busy tool cool down
        here = [n for n in here if self._batch_ok(pending, n)]
        if v.location == TOOL_ROOM:
            load: dict[str, int] = {}
            for ops in pending.values():
                for tool, _ in ops:
                    load[tool] = load.get(tool, 0) + 1
            usable = [(load[t], name, t, verb) for name, ops in pending.items() for t, verb in ops
                      if self._tool_free(t)]
            if usable:
                _, name, tool, verb = max(usable, key=lambda u: u[0])
                want = self.prep[name]
                self.last_tool = tool
                return _reply(f"The {name} must become {want[0]} and {want[1]}; the {tool} is free.",
                              "action", _command(name, tool, verb))
            if (here or (pending and fillers)) and free >= 1:
                return self._take((here or fillers)[0])
            for dish in self._meals_left():
                if f"prepare {dish}" in v.valid and self.meals[dish][0]:
                    return _reply(f"Every ingredient of {dish} is on the counter.", "action", f"prepare {dish}")
            for dish in self._meals_left():
                if f"eat {dish}" in v.valid and self.meals[dish][1]:
                    return _reply(f"{dish} is prepared.", "action", f"eat {dish}")
            if pending:  # every pending tool is cooling down and nothing else to do here
                move = self._fetch_move(left, pending, free)
                if move:
                    return move
                return self._wait(bool([n for n in left if n not in held]))
        elif here and free >= 1:
            return self._take(here[0])
        elif any(f"eat {d}" in v.valid and self.meals[d][1] for d in self._meals_left()):
            dish = next(d for d in self._meals_left() if f"eat {d}" in v.valid and self.meals[d][1])
            return _reply(f"{dish} is prepared.", "action", f"eat {dish}")
        # moving
        move = None if free < 1 else self._fetch_move(left, pending, free)
        if pending and move is None:
            return self._go(TOOL_ROOM, "I carry what I can; to the kitchen to prepare it.")
        if move:
            return move
        todo = [n for n in left if n not in held]
        if todo and free < 1:
            self.failure = "the shared inventory is full of items I cannot use"
            return self._finish()
        if todo:
            if v.gate == "closed" and self.cfg.open_gate:
                return self._gate_step(f"I looked everywhere and found no {todo[0]}; it must be behind the gate.")
            self.failure = f"could not find {', '.join(todo)} in any room"
            return self._finish()
        meals = self._meals_left()
        if meals and v.location != TOOL_ROOM:
            return self._go(TOOL_ROOM, "Everything is ready; to the kitchen for the meal.")
        if meals and any(not self.view.dishes.get(d, DishStatus(0, 0, False, False)).prepared for d in meals):
            if not self.cookbook_read:  # a dish needs more than I was told: look it up
                return _reply("The dish still lacks ingredients I was not told about; I check the cookbook.",
                              "action", "read cookbook")
            missing = [d for d in meals if d not in self.members]
            self.failure = f"{', '.join(meals)} cannot be prepared yet" + (f" ({missing} unknown)" if missing else "")
            return self._finish()
        self.failure = f"nothing more I can do for {', '.join(meals)}"
        return self._finish()

    def _batch_ok(self, pending: Mapping[str, list[tuple[str, str]]], name: str) -> bool:
        """Whether I can add ``name`` to what I carry and still prepare it all without waiting.

        With a cooldown, two uses of one tool need another global action between them;
        a batch whose busiest tool has more uses than the other actions can separate
        would stall in the kitchen, so such an item is left where it is for a later trip."""
        if self.cooldown == 0 or not pending:
            return True
        ops = _ops(("raw", "uncut"), self.prep[name]) or []
        counts: dict[str, int] = {}
        for tool, _ in [op for o in pending.values() for op in o] + ops:
            counts[tool] = counts.get(tool, 0) + 1
        if not counts:
            return True
        top = max(counts.values())
        gap = max(1, self.cooldown or 1)
        return (top - 1) * gap <= sum(counts.values()) - top

    def _fetch_move(self, left: list[str], pending: Mapping[str, list[tuple[str, str]]], free: float) -> str | None:
        """A walk towards the next needed item (known room first, else an unvisited room)."""
        if free < 1:
            return None
        todo = [n for n in left if n not in pending]
        loc = self.view.location
        for name in (n for n in todo if self._batch_ok(pending, n)):
            for room in self.rooms:
                if room != loc and name in self.seen.get(room, ()):
                    return self._go(room, f"I saw the {name} in the {room}.")
        unseen = [n for n in todo if not any(n in items for items in self.seen.values())]
        if unseen:
            for room in self.rooms:
                if room not in self.visited and room != loc:
                    return self._go(room, f"I still have to find: {', '.join(unseen)}. I look in the {room}.")
        return None

    def _wait(self, more_to_fetch: bool) -> str:
        """Every pending tool is cooling down and no useful action exists: spend one step.

        :meth:`_batch_ok` keeps this from happening on every generated and official task;
        as a last resort the least harmful step is taking a distractor lying here, if the
        slot it takes is not needed later (it stays in the inventory; it is never eaten
        or cooked, so no ingredient is harmed)."""
        v = self.view
        spare = [n for n in v.see if n not in self.prep]
        if spare and self._free_slots() >= (2 if more_to_fetch else 1):
            return _reply("Every tool I need is cooling down and nothing else is useful now; "
                          f"I spend one step taking the {spare[0]}.", "action", f"take {spare[0]}")
        self.failure = "every tool I need is cooling down and no action can pass the time"
        return self._finish()

    # -- replies ---------------------------------------------------------------------
    def _go(self, room: str, why: str) -> str:
        return _reply(why, "action", f"go to {room}")

    def _take(self, name: str) -> str:
        want = self.prep[name]
        note = "it needs no preparation" if want == ("raw", "uncut") else f"it must become {want[0]} and {want[1]}"
        return _reply(f"The {name} is here; {note}.", "action", f"take {name}")

    def _finish(self) -> str:
        done = self._all_done()
        if done:
            message = "Done: " + self.task.replace("\n", " ")[:300]
        else:
            message = f"Could not complete the task: {self.failure or 'unknown reason'}"
        return _reply("Reporting back." if done else "I cannot finish; reporting why.", "finish", message)


def _reply(thought: str, kind: str, body: str) -> str:
    return f"{thought}\n<{kind}>{body}</{kind}>"


# ------------------------------------------------------------------------ running

async def run_expert_agent(env: TextWorldEnv, cfg: ExpertConfig) -> None:
    """Play ``env`` to the end with a fresh expert (its children via the env's hook)."""
    expert = TextWorldExpert(cfg, can_delegate=env.can_delegate and env.delegate_hook is not None)
    observation = env.prompt()
    while not env.done:
        result = await env.astep(expert.act(observation))
        observation = result.observation


def expert_delegate_hook(cfg: ExpertConfig):
    """A delegate hook that runs each child as a fresh expert agent and returns its report."""

    async def hook(parent: TextWorldEnv, delegation) -> str:
        child = parent.spawn_child(delegation)
        await run_expert_agent(child, cfg)
        return child.result_text()

    return hook


def make_env(record: Mapping[str, Any], cfg: ExpertConfig) -> TextWorldEnv:
    """The root env of a task as the expert plays it (flat: no hook, ``flat_max_steps``)."""
    if cfg.mode == "flat":
        return TextWorldEnv.from_task(dict(record), max_steps=cfg.flat_max_steps, max_depth=cfg.max_depth)
    return TextWorldEnv.from_task(dict(record), max_steps=cfg.agent_max_steps, max_depth=cfg.max_depth,
                                  child_max_steps=cfg.child_max_steps, delegate_hook=expert_delegate_hook(cfg))


async def arun_task(record: Mapping[str, Any], cfg: ExpertConfig) -> TextWorldEnv:
    """Play one task with the expert; return the root env (the tree, the shared world)."""
    env = make_env(record, cfg)
    await run_expert_agent(env, cfg)
    return env


def run_task(record: Mapping[str, Any], cfg: ExpertConfig) -> TextWorldEnv:
    """Synchronous :func:`arun_task`."""
    return asyncio.run(arun_task(record, cfg))


def result_row(record: Mapping[str, Any], env: TextWorldEnv, cfg: ExpertConfig, seconds: float = 0.0) -> dict[str, Any]:
    """The result row of a played task (see :func:`solve_task`)."""
    agents = list(env.walk())
    verdict = env.check()
    if verdict["passed"]:
        reason = f"all {verdict['dishes']} dishes eaten"
    else:
        reason = f"unfinished: {', '.join(verdict['unfinished'])}"
        if verdict["mistakes"]:
            reason += f"; mistakes: {', '.join(verdict['mistakes'])}"
    return {
        "id": record.get("task_id"),
        "difficulty": record.get("difficulty"),
        "family": record.get("task_family"),
        "mode": cfg.mode,
        "passed": verdict["passed"],
        "reason": reason,
        "root_steps": env.state.steps,
        "agents": len(agents),
        "depth": max(a.state.depth for a in agents),
        "total_steps": sum(a.state.steps for a in agents),
        "global_steps_used": env.world.state.steps,
        "global_budget": env.world.state.max_steps,
        "seconds": round(seconds, 4),
    }


async def asolve_task(record: Mapping[str, Any], cfg: ExpertConfig) -> dict[str, Any]:
    """Solve one task record with the expert; see :func:`solve_task`."""
    t0 = time.perf_counter()
    env = await arun_task(record, cfg)
    return result_row(record, env, cfg, time.perf_counter() - t0)


def solve_task(record: Mapping[str, Any], cfg: ExpertConfig) -> dict[str, Any]:
    """Solve one task record; return a result row.

    Keys: ``id`` (task_id), ``difficulty``, ``family``, ``mode``, ``passed`` (root
    checker), ``reason``, ``root_steps`` (root turns), ``agents``, ``depth`` (deepest
    agent), ``total_steps`` (turns over all agents), ``global_steps_used``,
    ``global_budget``, ``seconds``. Synchronous wrapper of :func:`asolve_task` (inside a
    running event loop, ``await asolve_task(...)`` instead)."""
    return asyncio.run(asolve_task(record, cfg))


# -- the expert as rubric writer and scorer ---------------------------------------------

def expert_rubric(goal: str) -> dict[str, Any]:
    """A rubric for a TextWorld sub-goal: the goal's state, a report, valid actions, no
    irreversible mistakes, and economy with the shared steps."""
    items = [
        rubric_item("goal state reached", 0.5, f"In the final world state: {goal}.",
                    "The goal's state is not reached.", "The goal's state is reached exactly."),
        rubric_item("finished with a report", 0.15, "The sub-agent ended with <finish> and a truthful message.",
                    "No <finish>.", "<finish> with a message that matches the state."),
        rubric_item("valid actions", 0.15, "Actions and blocks are valid (no 'Invalid' observations).",
                    "Three or more invalid steps.", "No invalid steps."),
        rubric_item("no irreversible mistakes", 0.1, "No ingredient is burned, wrongly cut or destroyed.",
                    "A mistake was recorded.", "No mistake recorded."),
        rubric_item("economy of shared steps", 0.1, "The sub-agent ends before its turns run out.",
                    "Its turns ran out.", "It finished with turns to spare."),
    ]
    return {"rubric_items": items,
            "success_gate": f"The final world state satisfies the goal: {goal}.",
            "failure_conditions": ["the goal's state is not reached", "an ingredient the goal needs was ruined"],
            "scoring_procedure": "Check the gate on the final state; if it fails the score is 0. Otherwise score "
                                 "each item in [0, 1]."}


def item_scores(outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
    """The expert scorer's gate, per-item scores (by item name, for the items of
    :func:`expert_rubric`) and reason, from a child's outcome facts (the runtime's
    ``outcome``: the goal's state in the final world, errors, mistakes, steps)."""
    errors = 1.0 - min(1.0, outcome.get("errors", 0) / 3)
    spare = 1.0 if outcome["steps"] < outcome["max_steps"] else 0.5
    finished = 1.0 if outcome["finished"] else 0.0
    state = outcome["goal_verdict"]
    reached = 1.0 if state == SUCCESS else 0.0
    table = {"goal state reached": reached, "finished with a report": finished, "valid actions": errors,
             "no irreversible mistakes": 0.0 if outcome.get("mistakes") else 1.0, "economy of shared steps": spare}
    gate = state == SUCCESS if state in (SUCCESS, FAILURE) else bool(outcome["finished"] and not outcome.get("mistakes"))
    reason = "goal met" if gate else "gate failed: the goal's state is not reached"
    return gate, table, reason


def gate_check(outcome: dict) -> str:
    """The gate checked in words (see :func:`sera_core.envs.textcraft.expert.gate_check`): the
    goal's state in the final world, whether ``finish`` was called, irreversible mistakes."""
    return (f"the goal's state: {outcome['goal_verdict']}; finish() {'was' if outcome['finished'] else 'was not'} "
            f"called; irreversible mistakes: {len(outcome.get('mistakes') or [])}")
