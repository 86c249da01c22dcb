"""The TextCraft-Synth environment: CodeAct tools, the checker, and forkable state.

State is split in two, both plain data:

* :class:`CraftWorld` - what agents share: the live inventory (and a craft counter).
  Children of a normal delegation get a view of the *same* world object, so they
  share the inventory by reference (SPEC 8).
* :class:`AgentState` - what is one agent's own: its targets, the inventory at its
  own start (its checker measures net gain against it), depth, steps, finish flag.

A :class:`TextCraftEnv` is one agent's view: it owns an :class:`AgentState`, points at
a :class:`CraftWorld`, exposes the tools to a sandboxed executor, and counts steps
(one step = one reply = one code cell). ``snapshot()/restore()`` copy both parts as
plain dicts; ``fork()`` gives an independent env over a deep copy of the world (a
counterfactual branch); ``commit(branch)`` writes a branch's world back into this
env's world *in place*, so every view sharing it sees the committed state. A fork gets
a fresh executor namespace: forks are taken at delegation points, where the agent
that runs on the branch is a fresh child anyway.

Tools (official CodeAct interface, SPEC 8)::

    get_info(items: list) -> list[dict]   # item, can_craft, is_base, in_inventory,
                                          # crafting_depth, recipes
    view_inventory() -> dict
    craft(ingredients: dict, target: tuple[str, int]) -> str
    finish(message: str = "") -> str
    await launch_subagent(targets: dict, context: str = "") -> str

``craft`` takes the *total* ingredients and the number of *units* wanted: the count
must be a multiple of the recipe's units per craft, and the ingredients must equal the
per-craft amounts times the number of crafts, with no extras.

Checker (SPEC 5): PASS only after ``finish()``, and only if for every target
``inventory[t] - start_inventory[t] >= required`` (items held at the agent's own start
do not count).

One agent's environment (tools, step, checker, fork, commit) is one class with its
helpers, so it stays one module.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sera_core.envs.textcraft.sandbox import CellResult, SandboxExecutor, SandboxLimits
from sera_core.envs.textcraft.tasks import render_goal
from sera_core.envs.textcraft.world import RecipeBook

SubagentHook = Callable[["TextCraftEnv", dict[str, int], str], Awaitable[str]]
"""``hook(parent_env, targets, context) -> result text``: runs one child agent."""

PYTHON_BLOCK = re.compile(r"<python>(.*?)(?:</python>|\Z)", re.DOTALL)
"""The first code block of a reply (the closing tag may be missing: generation stops at it)."""


@dataclass
class CraftWorld:
    """The state all agents of one tree share: the live inventory."""

    inventory: dict[str, int]
    crafts: int = 0
    """Successful ``craft`` calls so far (over all agents)."""

    def snapshot(self) -> dict[str, Any]:
        return {"inventory": dict(self.inventory), "crafts": self.crafts}

    def restore(self, snap: Mapping[str, Any]) -> None:
        """Overwrite this world in place with a snapshot (views keep sharing it)."""
        self.inventory.clear()
        self.inventory.update(snap["inventory"])
        self.crafts = int(snap["crafts"])

    def fork(self) -> CraftWorld:
        snap = self.snapshot()
        return CraftWorld(inventory=snap["inventory"], crafts=snap["crafts"])


@dataclass
class AgentState:
    """One agent's own state (plain data)."""

    targets: dict[str, int]
    start_inventory: dict[str, int]
    depth: int = 0
    max_steps: int = 75
    steps: int = 0
    finished: bool = False
    finish_message: str | None = None
    context: str = ""
    stopped: str | None = None
    """Why the runtime ended the episode early (``loop``, ``context``), if it did."""
    verdict: dict[str, Any] | None = None
    """The checker's verdict frozen when the episode ended (finish or out of steps):
    a child's label is its net gain *then*, before its parent consumes its products."""

    def to_dict(self) -> dict[str, Any]:
        """A plain-data copy (dicts copied, so later changes do not leak into it)."""
        return {**vars(self), "targets": dict(self.targets), "start_inventory": dict(self.start_inventory),
                "verdict": copy.deepcopy(self.verdict)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentState:
        return cls(**{**data, "targets": dict(data["targets"]), "start_inventory": dict(data["start_inventory"]),
                      "verdict": copy.deepcopy(data.get("verdict"))})


@dataclass(frozen=True)
class CheckResult:
    """The checker's verdict for one agent."""

    passed: bool
    finished: bool
    gains: dict[str, int]
    """Net gain of each target against the agent's own start."""
    missing: dict[str, int]
    """Units still missing per target (empty when all are met)."""

    @property
    def reason(self) -> str:
        if not self.finished:
            return "finish() was not called"
        if self.missing:
            return "missing " + ", ".join(f"{n}x {t}" for t, n in self.missing.items())
        return "all targets crafted"


@dataclass(frozen=True)
class StepResult:
    """What one reply did: the observation the agent sees next, and whether it is done."""

    observation: str
    done: bool
    cell: CellResult | None
    """The executed cell (None when the reply held no code block)."""


def extract_code(reply: str) -> str | None:
    """The code inside the reply's first ``<python>`` block (closing tag optional,
    since generation stops at ``</python>``), or None if there is no block."""
    match = PYTHON_BLOCK.search(reply)
    return match.group(1).strip("\n") if match else None


class TextCraftEnv:
    """One agent's view of a TextCraft-Synth world (see the module docstring)."""

    def __init__(
        self,
        book: RecipeBook,
        world: CraftWorld,
        targets: Mapping[str, int],
        *,
        depth: int = 0,
        max_steps: int = 75,
        max_depth: int = 3,
        child_max_steps: int = 20,
        context: str = "",
        subagent_hook: SubagentHook | None = None,
        limits: SandboxLimits | None = None,
    ):
        self.book = book
        self.world = world
        self.state = AgentState(
            targets=dict(targets), start_inventory=dict(world.inventory), depth=depth,
            max_steps=max_steps, context=context,
        )
        self.max_depth = max_depth
        self.child_max_steps = child_max_steps
        self.subagent_hook = subagent_hook
        self.limits = limits
        self._executor: SandboxExecutor | None = None
        self.children: list[TextCraftEnv] = []

    # -- construction ------------------------------------------------------------
    @classmethod
    def from_task(cls, record: Mapping[str, Any], book: RecipeBook, **kwargs: Any) -> TextCraftEnv:
        """Root env of a task record (official or generated)."""
        misc = record["misc"]
        world = CraftWorld(inventory={k: int(v) for k, v in misc["initial_inventory"].items()})
        kwargs.setdefault("max_steps", int(record.get("max_steps", 75)))
        return cls(book, world, {k: int(v) for k, v in misc["target_items"].items()}, **kwargs)

    def spawn_child(self, targets: Mapping[str, int], context: str = "") -> TextCraftEnv:
        """A child agent on the *same* world (shared inventory), one level deeper.

        The child is recorded in :attr:`children`, so the tree can be walked."""
        child = TextCraftEnv(
            self.book, self.world, targets, depth=self.state.depth + 1, max_steps=self.child_max_steps,
            max_depth=self.max_depth, child_max_steps=self.child_max_steps, context=context,
            subagent_hook=self.subagent_hook, limits=self.limits,
        )
        self.children.append(child)
        return child

    def walk(self) -> Iterator[TextCraftEnv]:
        """This agent and all its descendants, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()

    # -- goal and prompt -----------------------------------------------------------
    @property
    def targets(self) -> dict[str, int]:
        return dict(self.state.targets)

    @property
    def goal(self) -> str:
        """The goal text; a child's carries the parent's context (SPEC 8)."""
        text = render_goal(self.state.targets)
        if self.state.context:
            text += f"\nContext provided from parent agent: {self.state.context}"
        return text

    @property
    def can_delegate(self) -> bool:
        return self.state.depth < self.max_depth

    # -- stepping --------------------------------------------------------------------
    @property
    def executor(self) -> SandboxExecutor:
        if self._executor is None:
            self._executor = SandboxExecutor(self.tools(), self.limits)
        return self._executor

    @property
    def done(self) -> bool:
        return self.state.finished or self.state.steps >= self.state.max_steps or self.state.stopped is not None

    def stop(self, reason: str) -> None:
        """End the episode from outside (the runtime's loop detector or context limit):
        no more steps; the verdict is frozen now, like at any other end."""
        if not self.done:
            self.state.stopped = reason
            self.state.verdict = asdict(self.check())

    def step(self, reply: str) -> StepResult:
        """Run one reply synchronously (cells that await subagents need :meth:`astep`)."""
        code = self._begin_step(reply)
        return self._end_step(self.executor.run(code) if code is not None else None)

    async def astep(self, reply: str) -> StepResult:
        """Run one reply; its cell may ``await launch_subagent(...)``."""
        code = self._begin_step(reply)
        return self._end_step(await self.executor.run_async(code) if code is not None else None)

    def _begin_step(self, reply: str) -> str | None:
        if self.done:
            raise RuntimeError("this agent is done (finished or out of steps); no more steps")
        self.state.steps += 1
        return extract_code(reply)

    def _end_step(self, cell: CellResult | None) -> StepResult:
        if self.done and self.state.verdict is None:
            self.state.verdict = asdict(self.check())
        if cell is None:
            obs = "Error: no <python>...</python> block found. Reply with <thought>...</thought> then <python>...</python>."
        else:
            obs = cell.observation.rstrip("\n") or "(no output)"
        return StepResult(obs, self.done, cell)

    # -- tools ---------------------------------------------------------------------------
    def tools(self) -> dict[str, Callable]:
        return {
            "get_info": self.get_info,
            "view_inventory": self.view_inventory,
            "craft": self.craft,
            "finish": self.finish,
            "launch_subagent": self.launch_subagent,
        }

    def view_inventory(self) -> dict[str, int]:
        """A copy of the live inventory (items with a positive count)."""
        return {k: v for k, v in self.world.inventory.items() if v > 0}

    def get_info(self, items: list) -> list[dict]:
        """Facts about each item: recipe(s), whether it is base, count held, depth."""
        if isinstance(items, str):
            items = [items]
        if not isinstance(items, (list, tuple)):
            raise TypeError("get_info expects a list of item names, e.g. get_info(['a1_i5'])")
        out = []
        for item in items:
            item = str(item)
            known = self.book.knows(item)
            recipe = self.book.recipes.get(item)
            info = {
                "item": item,
                "can_craft": recipe is not None,
                "is_base": self.book.is_base(item),
                "in_inventory": self.world.inventory.get(item, 0),
                "crafting_depth": self.book.depth(item) if known else None,
                "recipes": [{"ingredients": dict(recipe.ingredients), "result_count": recipe.result_count}] if recipe else [],
            }
            if not known:
                info["error"] = f"unknown item {item!r}"
            out.append(info)
        return out

    def craft(self, ingredients: dict, target: tuple) -> str:
        """Craft ``target = (item, units)`` from exactly the recipe's ingredients.

        Returns ``"Crafted {units}x {item}"`` or an error string that says exactly what
        was wrong; on an error nothing changes.
        """
        if not isinstance(ingredients, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in ingredients.items()
        ):
            return "Error: ingredients must be a dict of item name -> int amount, e.g. {'raw_a1': 2}."
        if not (isinstance(target, (tuple, list)) and len(target) == 2 and isinstance(target[0], str)
                and isinstance(target[1], int) and not isinstance(target[1], bool)):
            return "Error: target must be a tuple (item_name, count), e.g. ('a1_i2', 3)."
        item, count = target
        recipe = self.book.recipes.get(item)
        if recipe is None:
            if self.book.is_base(item):
                return f"Error: no recipe for {item}: it is a base item and cannot be crafted."
            return f"Error: no recipe for {item}: unknown item."
        if count <= 0:
            return f"Error: count must be positive, got {count}."
        per_craft = recipe.result_count
        if count % per_craft:
            return (f"Error: count not divisible: {item} is made {per_craft} per craft, so the count must be a "
                    f"multiple of {per_craft} (got {count}).")
        crafts = count // per_craft
        needed = recipe.ingredient_dict(crafts)
        extra = sorted(set(ingredients) - set(needed))
        if extra:
            return f"Error: extra ingredient(s) not in the recipe for {item}: {', '.join(extra)}."
        missing = [k for k in needed if k not in ingredients]
        if missing:
            return f"Error: missing ingredient(s) for {item}: " + ", ".join(f"{k} (need {needed[k]})" for k in missing) + "."
        wrong = [k for k in needed if ingredients[k] != needed[k]]
        if wrong:
            return (f"Error: wrong amount for {count}x {item} ({crafts} craft{'s' if crafts > 1 else ''}): "
                    + ", ".join(f"{k} needs {needed[k]}, got {ingredients[k]}" for k in wrong) + ".")
        inv = self.world.inventory
        short = [k for k in needed if inv.get(k, 0) < needed[k]]
        if short:
            return "Error: insufficient " + ", ".join(f"{k} (need {needed[k]}, have {inv.get(k, 0)})" for k in short) + "."
        for k, v in needed.items():
            inv[k] -= v
            if inv[k] == 0:
                del inv[k]
        inv[item] = inv.get(item, 0) + count
        self.world.crafts += 1
        return f"Crafted {count}x {item}."

    def finish(self, message: str = "") -> str:
        """End this agent's episode with a message for whoever launched it."""
        if self.state.finished:
            return "Already finished."
        self.state.finished = True
        self.state.finish_message = str(message)
        return "Finished."

    async def launch_subagent(self, targets: dict, context: str = "") -> str:
        """Run a child agent on ``targets`` (sharing this inventory); return its report."""
        if not self.can_delegate:
            return f"Error: maximum delegation depth ({self.max_depth}) reached; you cannot launch subagents."
        if self.subagent_hook is None:
            return "Error: subagents are not available in this run."
        if not isinstance(targets, Mapping) or not targets:
            return "Error: targets must be a non-empty dict of item name -> count, e.g. {'a7_i4': 3}."
        for item, count in targets.items():
            if not isinstance(item, str) or not isinstance(count, int) or isinstance(count, bool) or count <= 0:
                return f"Error: invalid target {item!r}: {count!r}; counts must be positive ints."
            if item not in self.book.recipes:
                return f"Error: {item} cannot be crafted, so it cannot be delegated."
        return await self.subagent_hook(self, dict(targets), str(context))

    def result_text(self) -> str:
        """What a parent receives from this (child) agent: its finish message and budget."""
        message = self.state.finish_message if self.state.finished else "(the subagent did not call finish)"
        used, total = self.state.steps, self.state.max_steps
        return f"{message}\nSubagent budget: used {used} of {total} steps, {total - used} remaining."

    # -- checker -------------------------------------------------------------------------
    def check(self) -> CheckResult:
        """The verdict for this agent (net gain against its own start, after finish)."""
        inv, start = self.world.inventory, self.state.start_inventory
        gains = {t: inv.get(t, 0) - start.get(t, 0) for t in self.state.targets}
        missing = {t: n - gains[t] for t, n in self.state.targets.items() if gains[t] < n}
        return CheckResult(self.state.finished and not missing, self.state.finished, gains, missing)

    # -- snapshot / fork / commit --------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Plain-data copy of the world and this agent's state."""
        return {"world": self.world.snapshot(), "agent": self.state.to_dict()}

    def restore(self, snap: Mapping[str, Any]) -> None:
        """Restore world (in place) and agent state from :meth:`snapshot`."""
        self.world.restore(snap["world"])
        self.state = AgentState.from_dict(snap["agent"])

    def fork(self) -> TextCraftEnv:
        """An independent copy: same book and settings, a deep copy of world and agent."""
        branch = TextCraftEnv(
            self.book, self.world.fork(), self.state.targets, max_depth=self.max_depth,
            child_max_steps=self.child_max_steps, subagent_hook=self.subagent_hook, limits=self.limits,
        )
        branch.state = AgentState.from_dict(self.state.to_dict())
        return branch

    def commit(self, branch: TextCraftEnv) -> None:
        """Make this env's (shared) world equal to ``branch``'s world, in place."""
        self.world.restore(branch.world.snapshot())
