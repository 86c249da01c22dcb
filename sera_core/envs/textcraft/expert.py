"""The TextCraft expert: an agent that plays tasks through the tools, in code cells.

It never touches the environment's state directly. Each turn it writes a reply in the
model's format (``<thought>...</thought><python>...</python>``), the env runs the cell
in the sandbox, and the expert reads the *observation text* back (it parses the echoed
``get_info`` / ``view_inventory`` values). Turn by turn:

1. look: print the inventory and ``get_info`` the targets;
2. explore: ``get_info`` the unknown ingredients, one recipe level per cell, until
   every leaf is a base item;
3. (``delegate`` mode, when below the depth cap) delegate: every direct ingredient of a
   target whose crafting depth is at least ``min_delegate_depth`` is handed to a child
   with ``launch_subagent`` (several at once with ``asyncio.gather``); the expert does
   not explore those subtrees itself; then it views the inventory again;
4. craft: an aggregated plan (:func:`plan_crafts`) over the recipes it has learned and
   the items it may use (base items plus what it or its children made since its start),
   ``crafts_per_cell`` crafts per cell, with the bookkeeping (units per craft, crafts,
   ingredient totals) spelled out in the thought;
5. finish with a message.

If a craft fails or a child falls short, it looks at the inventory, explores what it
skipped, and re-plans (at most ``max_replans`` times), then finishes anyway.

Noise (off by default; seeded): ``early_finish`` makes it finish early claiming
success, ``waste`` makes it repeat a craft and waste materials, so that counterfactual
branches of one sub-goal contain both outcomes.

:func:`solve_task` runs a whole task (root plus any children, each a fresh expert in a
fresh context on the shared inventory), or replays the record's gold plan (``gold``).

The scripted solver is one state machine (read an observation, plan, write a cell); its
phases share state, so it stays one module.
"""

from __future__ import annotations

import ast
import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sera_core.envs.textcraft.env import TextCraftEnv
from sera_core.envs.textcraft.planner import InfeasiblePlan, plan_crafts
from sera_core.envs.textcraft.tasks import render_goal
from sera_core.envs.textcraft.world import Recipe, RecipeBook
from sera_core.rubrics import rubric_item
from sera_core.utils.seeding import rng_for

MODES: tuple[str, ...] = ("flat", "delegate", "gold")


@dataclass(frozen=True)
class ExpertConfig:
    """How the expert plays."""

    mode: str = "flat"
    """``flat`` (one agent), ``delegate`` (hand large sub-goals to children), ``gold``
    (replay the record's gold plan; root only)."""
    crafts_per_cell: int = 8
    """Craft calls per code cell (the expert acts a few steps at a time)."""
    min_delegate_depth: int = 2
    """Delegate a target's direct ingredient when its crafting depth is at least this."""
    max_replans: int = 2
    """Re-plans after a failed craft or a short child before giving up."""
    max_info_per_cell: int = 40
    """Items looked up per ``get_info`` cell (keeps each observation well under the output cap)."""
    early_finish: float = 0.0
    """Noise: chance, at each turn after the first, of calling ``finish`` at once (claiming
    success): counterfactual branches need failures as well as successes."""
    waste: float = 0.0
    """Noise: chance per craft cell that one of its crafts is done twice over (wasting
    materials that later crafts may miss)."""
    noise_seed: int = 0
    """Seed of the noise; each agent derives its own from it and its targets."""
    explain: bool = False
    """Spell out the decisions a small imitator gets wrong (the embedded warm start's third
    recipe): the delegation decision (each direct ingredient's depth against
    ``min_delegate_depth``, written before the reply commits to delegating or exploring) and
    each craft's arithmetic (crafts x units per craft; ingredients per craft x crafts). The
    moves are the same as without it; only the thoughts are longer."""

    def __post_init__(self) -> None:
        if not (0.0 <= self.early_finish <= 1.0 and 0.0 <= self.waste <= 1.0):
            raise ValueError("early_finish and waste are probabilities in [0, 1]")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if min(self.crafts_per_cell, self.min_delegate_depth, self.max_info_per_cell) < 1 or self.max_replans < 0:
            raise ValueError("crafts_per_cell, min_delegate_depth, max_info_per_cell must be >= 1; max_replans >= 0")


def _reply(thought: str, code: str) -> str:
    return f"<thought>{thought}</thought>\n<python>\n{code}\n</python>"


def _with_thought(prefix: str, reply: str) -> str:
    """``reply`` with ``prefix`` put at the start of its thought."""
    return reply.replace("<thought>", "<thought>" + prefix, 1)


def _info_code(items: list[str]) -> str:
    """A cell that prints one compact ``(item, is_base, depth, recipes)`` line per item."""
    return (f"for info in get_info({items!r}):\n"
            "    print((info['item'], info['is_base'], info['crafting_depth'], info['recipes']))")


def _last_value(observation: str) -> Any:
    """The echoed value on the observation's last line (a Python literal)."""
    lines = [ln for ln in observation.strip().splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty observation")
    return ast.literal_eval(lines[-1])


class TextCraftExpert:
    """One agent's expert policy: call :meth:`act` with the last observation."""

    def __init__(self, cfg: ExpertConfig, targets: Mapping[str, int], *, can_delegate: bool):
        self.cfg = cfg
        self.targets = dict(targets)
        self.delegating = cfg.mode == "delegate" and can_delegate
        self.recipes: dict[str, Recipe] = {}
        self.depths: dict[str, int] = {}
        self.base: set[str] = set()
        self.start: dict[str, int] | None = None
        self.inventory: dict[str, int] = {}
        self.delegated: dict[str, int] = {}
        """Direct ingredients handed to children (their subtrees are not explored)."""
        self.queue: list[dict] = []
        self.replans = 0
        self.noise = rng_for(cfg.noise_seed, "textcraft.expert", sorted(self.targets.items()))
        self.phase = "look"
        """What the last reply asked for: look, looked, explore(d), delegated, recheck(ed),
        plan, craft(ed), done, finished."""
        self.failure: str | None = None

    # -- the turn loop -------------------------------------------------------------
    def act(self, observation: str | None) -> str:
        """The next reply, given what the previous cell printed (None on turn one)."""
        try:
            self._read(observation)
            if observation is not None and self.phase != "finished" and self.noise.random() < self.cfg.early_finish:
                return self._finish_reply()  # noise: give up early, claiming success
            return self._next()
        except (ValueError, SyntaxError, KeyError, TypeError) as exc:  # unexpected observation
            self.failure = f"could not read the observation ({type(exc).__name__}: {exc})"
            self.phase = "done"
            return self._finish_reply()

    def _read(self, observation: str | None) -> None:
        """Update what the expert knows from the output of the cell it wrote last."""
        if self.phase in ("looked", "explored"):
            if self.phase == "looked":
                self.inventory = ast.literal_eval(observation.strip().splitlines()[0])
                self.start = dict(self.inventory)
            self._learn(observation.strip().splitlines()[1 if self.phase == "looked" else 0:])
            self.phase = "explore"
        elif self.phase == "delegated":  # the children's reports; see what they left
            self.phase = "recheck"
        elif self.phase == "rechecked":
            self.inventory = _last_value(observation)
            self.phase = "explore"
        elif self.phase == "crafted":
            bad = [ln for ln in observation.splitlines() if ln.strip() and not ln.startswith("Crafted")]
            if bad and self.replans < self.cfg.max_replans:
                self.replans += 1
                self.queue, self.phase = [], "recheck"
            elif bad:
                self.failure, self.phase = bad[0], "done"
            else:
                self.phase = "craft" if self.queue else "done"

    def _learn(self, lines: list[str]) -> None:
        """Read ``(item, is_base, crafting_depth, recipes)`` lines printed by :func:`_info_code`."""
        for line in lines:
            item, is_base, depth, recipes = ast.literal_eval(line)
            if depth is None:
                raise ValueError(f"unknown item {item!r}")
            self.depths[item] = depth
            if is_base:
                self.base.add(item)
            elif recipes:
                self.recipes[item] = Recipe(item, tuple(recipes[0]["ingredients"].items()), int(recipes[0]["result_count"]))

    def _unknown(self) -> list[str]:
        """Ingredients not yet looked up, outside the delegated subtrees."""
        seen, out = set(), []
        for item, recipe in self.recipes.items():
            if item in self.delegated:
                continue
            for name, _ in recipe.ingredients:
                if name not in self.depths and name not in seen:
                    seen.add(name)
                    out.append(name)
        return out

    def _next(self) -> str:
        if self.phase == "look":
            self.phase = "looked"
            return _reply(
                f"My goal: {render_goal(self.targets)}. First I check the inventory and the target recipes.",
                "print(view_inventory())\n" + _info_code(list(self.targets)),
            )
        if self.phase == "explore":
            decision = ""
            if self.delegating and self.depths.keys() >= self._direct_ingredients().keys():
                self.delegating = False  # decide once
                self.delegated = self._delegation_plan()
                if self.delegated:
                    return self._delegate_reply()
                decision = self._decision_text() + " " if self.cfg.explain else ""
            unknown = self._unknown()[: self.cfg.max_info_per_cell]
            if unknown:
                self.phase = "explored"
                return _reply(f"{decision}I still need the recipes of {len(unknown)} ingredient(s).", _info_code(unknown))
            self.phase = "plan"
            if decision:
                return _with_thought(decision, self._plan_and_craft())
        if self.phase == "recheck":
            self.phase = "rechecked"
            return _reply("Let me check what the inventory holds now.", "view_inventory()")
        if self.phase == "plan":
            return self._plan_and_craft()
        if self.phase == "craft":
            return self._craft_reply()
        return self._finish_reply()

    # -- delegation ------------------------------------------------------------------
    def _direct_ingredients(self) -> dict[str, int]:
        """Units of each direct ingredient the targets need (by their recipes)."""
        need: dict[str, int] = {}
        for target, count in self.targets.items():
            recipe = self.recipes[target]
            crafts = -(-count // recipe.result_count)
            for name, amount in recipe.ingredients:
                need[name] = need.get(name, 0) + crafts * amount
        return need

    def _delegation_plan(self) -> dict[str, int]:
        return {
            name: units for name, units in self._direct_ingredients().items()
            if name not in self.base and (self.depths.get(name) or 0) >= self.cfg.min_delegate_depth
        }

    def _decision_text(self) -> str:
        """The delegation decision spelled out (``explain``): every direct ingredient with
        its depth (base items have depth 0), then the comparison that decides."""
        need, cut = self._direct_ingredients(), self.cfg.min_delegate_depth
        listing = ", ".join(f"{u}x {n} (depth {self.depths.get(n) or 0})" for n, u in need.items())
        deep = [n for n in need if n in self.delegated]
        if deep:
            verdict = "; ".join(f"{n}: depth {self.depths[n]} >= {cut}" for n in deep)
            return f"Direct ingredients: {listing}. {verdict}, so I delegate {'it' if len(deep) == 1 else 'them'}."
        deepest = max((self.depths.get(n) or 0 for n in need), default=0)
        return f"Direct ingredients: {listing}. The deepest has depth {deepest} < {cut}, so I make everything myself."

    def _delegate_reply(self) -> str:
        self.phase = "delegated"
        goal = render_goal(self.targets)
        calls = [f"launch_subagent({{{name!r}: {units}}}, context={f'Needed for: {goal}'!r})"
                 for name, units in self.delegated.items()]
        if self.cfg.explain:
            thought = self._decision_text()
        else:
            lines = ", ".join(f"{u}x {n} (depth {self.depths[n]})" for n, u in self.delegated.items())
            thought = f"These ingredients are deep sub-goals, so I delegate them: {lines}."
        if len(calls) == 1:
            return _reply(thought, f"print(await {calls[0]})")
        code = "import asyncio\nresults = await asyncio.gather(\n" + "".join(f"    {c},\n" for c in calls) + ")\nfor r in results:\n    print(r)"
        return _reply(thought, code)

    # -- planning and crafting ----------------------------------------------------------
    def _usable(self) -> dict[str, int]:
        """Items this agent may consume: base items, plus what was made since its start."""
        start = self.start or {}
        return {k: (v if k in self.base else v - start.get(k, 0)) for k, v in self.inventory.items()
                if k in self.base or v > start.get(k, 0)}

    def _plan_and_craft(self) -> str:
        book_recipes = {k: r for k, r in self.recipes.items() if k not in self.delegated or k in self.targets}
        frontier = set(self.base) | {n for r in book_recipes.values() for n, _ in r.ingredients if n not in book_recipes}
        try:
            book = RecipeBook(recipes=book_recipes, base_items=tuple(sorted(frontier)))
            self.queue = plan_crafts(book, self.targets, self._usable())
        except InfeasiblePlan as exc:
            short_delegated = [k for k in exc.shortfall if k in self.delegated]
            if short_delegated and self.replans < self.cfg.max_replans:
                self.replans += 1  # a child fell short: explore its subtree and make it myself
                for k in short_delegated:
                    del self.delegated[k]
                self.phase = "explore"
                return self._next()
            self.failure = str(exc)
            self.phase = "done"
            return self._finish_reply()
        if not self.queue:
            self.phase = "done"
            return self._finish_reply()
        return self._craft_reply()

    def _craft_reply(self) -> str:
        chunk, self.queue = self.queue[: self.cfg.crafts_per_cell], self.queue[self.cfg.crafts_per_cell:]
        self.phase = "crafted"
        notes, code = [], []
        for step in chunk:
            item, crafts = step["target"]
            per = step["result_count"] // crafts
            uses = ", ".join(f"{v}x {k}" for k, v in step["ingredients"].items())
            if self.cfg.explain:  # the arithmetic a small imitator gets wrong, one product at a time
                each = ", ".join(f"{v // crafts}x {k}" for k, v in step["ingredients"].items())
                notes.append(f"{item}: {crafts} craft(s) x {per} per craft = {step['result_count']}; "
                             f"ingredients {crafts} x ({each}) = {uses}.")
            else:
                notes.append(f"{item}: {per} per craft, {crafts} craft(s) -> {step['result_count']}, using {uses}.")
            code.append(f"print(craft({step['ingredients']!r}, ({item!r}, {step['result_count']})))")
        if self.cfg.waste and self.noise.random() < self.cfg.waste:  # noise: one craft done twice over
            code.insert(self.noise.randrange(len(code)), code[self.noise.randrange(len(code))])
        left = f" {len(self.queue)} craft step(s) left after this." if self.queue else " This is the last batch."
        return _reply(" ".join(notes) + left, "\n".join(code))

    def _finish_reply(self) -> str:
        self.phase = "finished"
        goal = ", ".join(f"{n}x {t}" for t, n in self.targets.items())
        message = f"Could not complete {goal}: {self.failure}" if self.failure else f"Crafted {goal}."
        return _reply("Done; reporting back." if not self.failure else "I cannot finish the goal; reporting why.",
                      f"finish({message!r})")


async def run_expert_agent(env: TextCraftEnv, cfg: ExpertConfig) -> None:
    """Play ``env`` to the end with a fresh expert (its children via the env's hook)."""
    expert = TextCraftExpert(cfg, env.targets, can_delegate=env.can_delegate)
    observation: str | None = None
    while not env.done:
        result = await env.astep(expert.act(observation))
        observation = result.observation


def expert_subagent_hook(cfg: ExpertConfig):
    """A ``launch_subagent`` hook that runs each child as a fresh expert agent."""

    async def hook(parent: TextCraftEnv, targets: dict[str, int], context: str) -> str:
        child = parent.spawn_child(targets, context)
        await run_expert_agent(child, cfg)
        return child.result_text()

    return hook


def replay_gold(env: TextCraftEnv, steps: list[dict], per_cell: int = 25) -> None:
    """Replay a gold plan through the sandbox, ``per_cell`` crafts per cell, then finish."""
    for i in range(0, len(steps), per_cell):
        code = "\n".join(
            f"print(craft({s['ingredients']!r}, ({s['target'][0]!r}, {s['result_count']})))" for s in steps[i:i + per_cell]
        )
        env.step(_reply(f"Gold steps {i}..{min(i + per_cell, len(steps)) - 1}.", code))
    env.step(_reply("Gold plan replayed.", "finish('gold plan replayed')"))


def solve_task(record: Mapping[str, Any], book: RecipeBook, cfg: ExpertConfig, **env_kwargs: Any) -> dict[str, Any]:
    """Solve one task record; return a result row (id, difficulty, passed, steps, ...).

    Synchronous wrapper of :func:`asolve_task` (inside a running event loop, e.g. a
    notebook, ``await asolve_task(...)`` instead)."""
    return asyncio.run(asolve_task(record, book, cfg, **env_kwargs))


async def asolve_task(record: Mapping[str, Any], book: RecipeBook, cfg: ExpertConfig, **env_kwargs: Any) -> dict[str, Any]:
    """Solve one task record with the expert (or replay its gold plan); see :func:`solve_task`."""
    t0 = time.perf_counter()
    env = TextCraftEnv.from_task(record, book, subagent_hook=expert_subagent_hook(cfg), **env_kwargs)
    if cfg.mode == "gold":
        replay_gold(env, record["misc"]["gold_trajectory"])
    else:
        await run_expert_agent(env, cfg)
    agents = list(env.walk())
    verdict = env.check()
    return {
        "id": record.get("id"),
        "difficulty": record["misc"].get("difficulty"),
        "mode": cfg.mode,
        "passed": verdict.passed,
        "reason": verdict.reason,
        "root_steps": env.state.steps,
        "agents": len(agents),
        "total_steps": sum(a.state.steps for a in agents),
        "crafts": env.world.crafts,
        "seconds": round(time.perf_counter() - t0, 4),
    }


# -- the expert as rubric writer and scorer ---------------------------------------------

def expert_rubric(targets: dict[str, int]) -> dict[str, Any]:
    """A rubric for a TextCraft sub-goal: one item per target (the first four; the rest
    share one item), a finished report, error-free crafting and the step budget."""
    named = list(targets.items())[:4]
    rest = list(targets.items())[4:]
    share = 0.6 / (len(named) + (1 if rest else 0))
    items = [rubric_item(f"{item} crafted", share,
                         f"The sub-agent's net gain of {item} (final count minus its count at the sub-agent's start) reaches {n}.",
                         f"No {item} gained.", f"At least {n} {item} gained.")
             for item, n in named]
    if rest:
        listing = ", ".join(f"{n}x {item}" for item, n in rest)
        items.append(rubric_item("other targets crafted", share, f"Net gains reach the counts of: {listing}.",
                                 "None of them gained.", "All of them gained in full."))
    items += [
        rubric_item("finished with a report", 0.15, "The sub-agent called finish() with a message matching what it made.",
                    "finish() was not called.", "finish() called with an accurate report."),
        rubric_item("error-free crafting", 0.15, "Craft and tool calls succeed (no error observations).",
                    "Three or more errors.", "No errors."),
        rubric_item("within budget", 0.1, "The work ends before the step budget runs out.",
                    "The budget ran out.", "Finished with steps to spare."),
    ]
    goal = ", ".join(f"{n}x {item}" for item, n in targets.items())
    return {"rubric_items": items,
            "success_gate": f"finish() was called and the net gain of every target reaches its count ({goal}).",
            "failure_conditions": ["finish() was not called", "a target's net gain is short of its count"],
            "scoring_procedure": "Check the gate on the start and end inventories; if it fails the score is 0. "
                                 "Otherwise score each item in [0, 1]: targets by net gain / count, errors as "
                                 "1 - errors / 3, budget 1 if steps remain else 0.5."}


def item_scores(outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
    """The expert scorer's gate, per-item scores (by item name, for the items of
    :func:`expert_rubric`) and reason, from a child's outcome facts (the runtime's
    ``outcome``: net gains, targets, errors, steps); ``item_names`` are the rubric's items."""
    errors = 1.0 - min(1.0, outcome.get("errors", 0) / 3)
    spare = 1.0 if outcome["steps"] < outcome["max_steps"] else 0.5
    finished = 1.0 if outcome["finished"] else 0.0
    verdict = outcome["verdict"]
    gains, targets = verdict["gains"], outcome["targets"]
    per = {f"{t} crafted": min(1.0, max(0.0, gains.get(t, 0) / n)) for t, n in targets.items()}
    rest = [t for t in targets if f"{t} crafted" not in item_names]
    other = sum(per[f"{t} crafted"] for t in rest) / len(rest) if rest else 1.0
    table = {**per, "other targets crafted": other, "finished with a report": finished,
             "error-free crafting": errors, "within budget": spare}
    gate = bool(verdict["passed"])
    reason = "all targets met" if gate else f"gate failed: {verdict.get('missing') or 'finish() not called'}"
    return gate, table, reason


def gate_check(outcome: dict) -> str:
    """The gate checked in words, from the facts the scoring prompt shows (each target's count
    in the start and end inventories, whether ``finish`` was called): what the expert scorer
    writes before its verdict when it explains (:func:`sera_core.policy.expert.expert_score`)."""
    gains, start = outcome["verdict"]["gains"], outcome.get("start_counts", {})
    parts = [f"{t}: {start.get(t, 0)} at the start, {start.get(t, 0) + gains.get(t, 0)} at the end, net gain "
             f"{gains.get(t, 0)} of {n} needed ({'met' if gains.get(t, 0) >= n else 'short'})"
             for t, n in outcome["targets"].items()]
    return "; ".join(parts) + f"; finish() {'was' if outcome['finished'] else 'was not'} called"
