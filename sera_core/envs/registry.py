"""The benchmark registry: everything the rest of the workbook knows about a benchmark.

Each benchmark implements :class:`Benchmark` once; :data:`BENCHMARKS` maps its name to
the class and :func:`benchmark` builds one. Nothing outside this module switches on a
benchmark's name. A benchmark provides:

* **tasks**: its splits (``generate_split``, ``eval_split``), record validation
  (generated and official formats), ids, difficulty, statistics;
* **names and the agent interface**: ``title`` and ``short_title`` (figures and tables), the
  agent's introduction, tools and delegation tool (``agent_intro``, ``agent_tools``,
  ``delegate_tool``: :func:`sera_core.agents.prompts.system_prompt`), the levels ``sera
  tiny measure`` plays (``measured_levels``, ``measured_spread``);
* **the expert**: solving a task alone (``solver``), and as an actor's agent, rubric
  writer and scorer (``expert_config``, ``expert_agent``, ``expert_rubric``,
  ``expert_item_scores``);
* **judging**: the root checker (``root_result``) and the children's judge
  (``make_judge``: the program checker, or TextWorld's LLM judge);
* **the reply format**: generation stop strings, the well-formed test of an act reply,
  and the character spans that write a delegation (``launch_spans``: the ``launch`` tokens);
* **the runtime's hooks**: root agents from task records, the delegation hook,
  children on the live world (shared) or a forked world (a counterfactual branch),
  committing a branch, what an agent can observe (rubric inputs, the scorer's final
  state), a finished child's facts for the expert scorer.

TextCraft delegates through ``await launch_subagent(...)`` inside a code cell (a child
spec is ``{"targets", "context"}``); TextWorld through a ``<delegate>`` block (a child
spec is a :class:`~sera_core.envs.textworld.protocol.Delegation`).

The registry is long on purpose: it is the one place that knows each benchmark (one
class per benchmark, one protocol).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from random import Random
from typing import Any, ClassVar, Protocol

from sera_core.chat_endpoint import ChatEndpointConfig
from sera_core.envs import DIFFICULTIES
from sera_core.envs.textcraft import expert as craft_expert
from sera_core.envs.textcraft import tasks as craft_tasks
from sera_core.envs.textcraft.env import TextCraftEnv, extract_code
from sera_core.envs.textcraft.launch import launch_spans as craft_launch_spans
from sera_core.envs.textcraft.verifier import TextCraftVerifier
from sera_core.envs.textcraft.world import WorldConfig
from sera_core.envs.textworld import expert as world_expert
from sera_core.envs.textworld import tasks as world_tasks
from sera_core.envs.textworld.data import ROOMS
from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import check_goal
from sera_core.envs.textworld.protocol import Delegation, delegate_spans, parse_reply
from sera_core.envs.textworld.verifier import CanonicalOrLLM, TextWorldVerifier
from sera_core.judges import LLMJudge

ERROR_PREFIXES = ("Error", "Traceback", "Invalid", "Delegation rejected")
"""Observation lines that report a failed call or step (counted for the expert scorer)."""


def count_errors(observations: list[str | None]) -> int:
    """Observation lines that start with one of :data:`ERROR_PREFIXES`."""
    return sum(1 for obs in observations if obs for line in obs.splitlines() if line.startswith(ERROR_PREFIXES))


def _plain(obj: Any) -> Any:
    """A JSON-native copy (tuples become lists)."""
    return json.loads(json.dumps(obj))


NO_LLM_JUDGE = "an LLM judge labels TextWorld subtasks; TextCraft is always checked by its program"


def record_value(record: dict, key: str) -> Any:
    """A task record's ``key`` (``difficulty``, ``task_family``): top level first, then under
    ``misc`` (TextCraft's generated and official records keep it there); None if absent."""
    return record.get(key, (record.get("misc") or {}).get(key))


class Benchmark(Protocol):
    """What every benchmark provides (module docstring). Methods are documented on
    :class:`TextCraftBenchmark`; :class:`TextWorldBenchmark` implements the same."""

    name: ClassVar[str]
    title: ClassVar[str]
    short_title: ClassVar[str]
    agent_intro: ClassVar[str]
    agent_tools: ClassVar[str]
    delegate_tool: ClassVar[str]
    measured_levels: ClassVar[tuple[str, ...]]
    measured_spread: ClassVar[bool]
    splits: ClassVar[tuple[str, ...]]
    eval_split: ClassVar[str]
    difficulties: ClassVar[tuple[str, ...]]
    expert_modes: ClassVar[tuple[str, ...]]
    judges: ClassVar[tuple[str, ...]]
    sorted_keys: ClassVar[bool]
    eval_counts: ClassVar[dict[str, int]]
    pool_weighted: ClassVar[bool]
    stop: ClassVar[tuple[str, ...]]
    loop_repeats: ClassVar[int | None]
    max_context_tokens: ClassVar[int]
    max_new_tokens: ClassVar[int]
    official: bool

    def generate_split(self, split: str, *, progress: bool = False, **options: Any) -> list[dict]: ...
    def validate_record(self, record: dict, where: str = "record") -> None: ...
    def split_stats(self, records: list[dict]) -> dict: ...
    def task_id(self, record: dict) -> str: ...
    def solver(self, mode: str) -> tuple[Callable[[dict], dict], tuple[str, ...]]: ...
    def well_formed(self, text: str) -> bool: ...
    def launch_spans(self, text: str) -> list[tuple[int, int]]: ...
    def make_judge(self, kind: str = "program", **options: Any) -> Any: ...
    def expert_config(self, config: Any = None, *, explain: bool = False) -> Any: ...
    def expert_agent(self, config: Any, info: dict) -> Any: ...
    def expert_rubric(self, info: dict) -> dict: ...
    def expert_item_scores(self, outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]: ...
    def expert_check(self, outcome: dict) -> str: ...
    def perturbation(self, observation: str | None, info: dict, rng: Random) -> str: ...
    def after_mistake(self, held: str | None, current: str | None) -> str | None: ...
    def root_env(self, record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> Any: ...
    def root_result(self, env: Any) -> tuple[bool, dict]: ...

    # -- the runtime's hooks on a live agent (agents/runtime.py) ------------------------------
    def install_hook(self, env: Any, hook: Any) -> None:
        """Route ``env``'s delegations to ``await hook(env, spec)``, which plays the child and
        returns the report the parent reads."""

    def goal(self, env: Any) -> str:
        """The agent's goal, as its first user message states it."""

    def first_observation(self, env: Any) -> str | None:
        """What the agent sees before its first turn (None: nothing)."""

    def spec_goal(self, parent: Any, spec: Any) -> str:
        """The goal a child of ``parent`` with delegation ``spec`` would have (the rubric's subject)."""

    def spawn(self, parent: Any, spec: Any) -> Any:
        """The child's environment on the parent's live world (shared)."""

    def fork_child(self, parent: Any, spec: Any) -> Any:
        """The child's environment on a fork of the parent's world (a counterfactual branch)."""

    def commit(self, parent: Any, branch: Any) -> None:
        """Make a forked branch's world the parent's (the branch the runtime keeps)."""

    def observable(self, env: Any) -> str:
        """What the parent can see of the world now (the rubric writer's state section)."""

    def final_state(self, env: Any) -> str:
        """The child's world when it ended, as the scorer reads it."""

    def world_json(self, env: Any) -> dict:
        """The world as JSON, recorded on the tree."""

    def child_budget(self, parent: Any, spec: Any) -> str:
        """The child's step budget in words (the rubric writer's budget section)."""

    def spec_json(self, spec: Any) -> dict:
        """A delegation spec as JSON, recorded on the child's node."""

    def start_facts(self, env: Any) -> dict:
        """What :meth:`outcome` needs from the child's start (taken before it runs)."""

    def outcome(self, env: Any, start: dict, observations: list[str | None]) -> dict:
        """A finished child's facts for the expert scorer (:meth:`expert_item_scores`)."""

    def expert_info(self, env: Any) -> dict:
        """What the expert agent needs about ``env`` besides its observation."""


class TextCraftBenchmark:
    """TextCraft-Synth: CodeAct cells, shared inventory, ``launch_subagent``.

    ``official``: task records are in the official format (their own recipe books)."""

    name = "textcraft"
    title = "TextCraft-Synth"
    short_title = "TextCraft"
    """The name in table headings."""
    agent_intro = ("You craft items in TextCraft. Each turn, reply with <thought>...</thought> then "
                   "<python>...</python>; the code runs in a persistent Python session (top-level await allowed) "
                   "and its printed output is your next observation. Tools:\n")
    """The opening of every agent's system message (:func:`sera_core.agents.prompts.system_prompt`)."""
    agent_tools = (
        "get_info(items: list) -> list[dict]  # item, can_craft, is_base, in_inventory, crafting_depth, recipes\n"
        "view_inventory() -> dict\n"
        "craft(ingredients: dict, target: tuple[str, int]) -> str  # exact total ingredients for `count` units; "
        "count a multiple of the recipe's result count\n"
        "finish(message: str) -> str  # end your episode with a report"
    )
    """The tools every agent has."""
    delegate_tool = (
        "await launch_subagent(targets: dict, context: str = '') -> str  # a child agent crafts `targets` "
        "on the shared inventory; several at once with asyncio.gather"
    )
    """The delegation tool, shown only to agents that may delegate."""
    measured_levels = ("easy", "medium")
    """The difficulties ``sera tiny measure`` plays (the levels the embedded policy has targets on)."""
    measured_spread = False
    """Whether the measured tasks are spread over each level (else its first ones)."""
    splits = ("train", "val")
    eval_split = "val"
    """The split the paper evaluates on."""
    difficulties = craft_tasks.DIFFICULTIES
    expert_modes = ("flat", "delegate", "gold")
    """``sera solve`` modes: one agent, the delegating expert, or an official record's gold trajectory."""
    judges = ("program",)
    """The children's judges it offers (:meth:`make_judge`)."""
    sorted_keys = False
    """Whether a task file is written with sorted keys (the official files' layout)."""
    eval_counts = dict(craft_tasks.DEFAULT_SPLITS["val"])
    """Tasks per difficulty of the evaluation pool (632 in all)."""
    pool_weighted = True
    """The paper's benchmark average weighs each difficulty by its pool count (SPEC 5);
    False: every difficulty weighs the same (a macro average)."""
    stop = ("</python>",)
    loop_repeats: int | None = 4
    """The official CodeAct loop detector: a reply pattern repeated 4 times ends the episode."""
    max_context_tokens = 10_240
    max_new_tokens = 512

    def __init__(self, official: bool = False):
        self.official = official
        self._books: dict[str, Any] = {}

    # -- tasks -------------------------------------------------------------------------
    @staticmethod
    def generate_split(split: str, *, progress: bool = False, world_seed: int = 0, items_per_tier: int = 25,
                       seed: int = 0) -> list[dict]:
        """The generated task records of ``split``: tasks drawn with ``seed`` from the recipe
        world of ``world_seed`` and ``items_per_tier`` (the defaults: the workbook's world)."""
        world = WorldConfig(seed=world_seed, items_per_tier=items_per_tier)
        return craft_tasks.generate_split(split, craft_tasks.TaskConfig(world=world, seed=seed), progress=progress)

    @staticmethod
    def validate_record(record: dict, where: str = "record") -> None:
        """Raise ValueError (naming ``where``) unless ``record`` is a task record (either format)."""
        craft_tasks.validate_record(record, where)

    @staticmethod
    def split_stats(records: list[dict]) -> dict:
        return craft_tasks.split_stats(records)

    def solver(self, mode: str) -> tuple[Callable[[dict], dict], tuple[str, ...]]:
        """``(solve(record) -> result row, the row keys to break results down by)`` of the
        scripted expert alone (``sera solve``), in ``mode`` (:attr:`expert_modes`)."""
        cfg = craft_expert.ExpertConfig(mode=mode)
        official = self.official
        return (lambda rec: craft_expert.solve_task(rec, craft_tasks.book_for_record(rec, official=official), cfg)), \
            ("difficulty",)

    # -- the reply format ----------------------------------------------------------------
    @staticmethod
    def well_formed(text: str) -> bool:
        """Whether an act reply is in the format: a ``<python>`` block whose code parses."""
        code = extract_code(text)
        if code is None:
            return False
        try:
            ast.parse(code)
        except (SyntaxError, ValueError):
            return False
        return True

    @staticmethod
    def launch_spans(text: str) -> list[tuple[int, int]]:
        """Character spans of ``text`` that write a delegation (:mod:`sera_core.envs.textcraft.launch`)."""
        return craft_launch_spans(text)

    # -- the expert and the judge ----------------------------------------------------------
    @staticmethod
    def expert_config(config: craft_expert.ExpertConfig | None = None, *,
                      explain: bool = False) -> craft_expert.ExpertConfig:
        """The expert's settings as an actor plays it: ``config`` (default: the delegating
        expert, no noise), with ``explain`` its agents spelling out their decisions."""
        config = config or craft_expert.ExpertConfig(mode="delegate")
        return replace(config, explain=True) if explain else config

    @staticmethod
    def expert_agent(config: craft_expert.ExpertConfig, info: dict) -> craft_expert.TextCraftExpert:
        """The scripted expert playing one runtime agent (``info``: the call's facts; its
        ``seed`` seeds the expert's noise)."""
        return craft_expert.TextCraftExpert(replace(config, noise_seed=info["seed"]), info["targets"],
                                            can_delegate=info["can_delegate"])

    @staticmethod
    def expert_rubric(info: dict) -> dict:
        return craft_expert.expert_rubric(info["targets"])

    @staticmethod
    def expert_item_scores(outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
        return craft_expert.item_scores(outcome, item_names)

    @staticmethod
    def expert_check(outcome: dict) -> str:
        return craft_expert.gate_check(outcome)

    @staticmethod
    def perturbation(observation: str | None, info: dict, rng: Random) -> str:
        """A plausible mistake in the reply format that changes nothing in the world (the
        warm start's recovery demonstrations): a craft of a target with missing ingredients,
        or with a count of 0; the cell prints an error and the inventory stays as it was."""
        item, count = rng.choice(sorted(info["targets"].items()))
        if rng.random() < 0.5:
            return (f"<thought>I craft {item} now.</thought>\n<python>\n"
                    f"print(craft(ingredients={{}}, target=({item!r}, {count})))\n</python>")
        return (f"<thought>I craft the {item}.</thought>\n<python>\n"
                f"print(craft(ingredients={{}}, target=({item!r}, 0)))\n</python>")

    @staticmethod
    def after_mistake(held: str | None, current: str | None) -> str | None:
        """What the expert reads after a :meth:`perturbation`: the output of its own last cell
        (the failed cell printed only an error, and the inventory is what it was)."""
        return held

    @staticmethod
    def make_judge(kind: str = "program", **options: Any) -> TextCraftVerifier:
        """The children's judge: always the program checker (an LLM judge is refused)."""
        if kind != "program":
            raise ValueError(NO_LLM_JUDGE)
        return TextCraftVerifier()

    # -- the runtime's hooks ---------------------------------------------------------------

    def root_env(self, record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> TextCraftEnv:
        key = json.dumps(record["misc"].get("world") or record.get("id"), sort_keys=True) if not self.official else record["id"]
        if key not in self._books:
            self._books[key] = craft_tasks.book_for_record(record, official=self.official)
        return TextCraftEnv.from_task(record, self._books[key], max_steps=max_steps, max_depth=max_depth,
                                      child_max_steps=child_max_steps)

    @staticmethod
    def task_id(record: dict) -> str:
        return str(record.get("id"))

    @staticmethod
    def install_hook(env: TextCraftEnv, hook) -> None:
        async def launch(parent: TextCraftEnv, targets: dict[str, int], context: str) -> str:
            return await hook(parent, {"targets": targets, "context": context})
        env.subagent_hook = launch

    @staticmethod
    def goal(env: TextCraftEnv) -> str:
        return env.goal

    @staticmethod
    def first_observation(env: TextCraftEnv) -> str | None:
        return None

    @staticmethod
    def spec_goal(parent: TextCraftEnv, spec: dict) -> str:
        probe = TextCraftEnv(parent.book, parent.world, spec["targets"], context=spec["context"])
        return probe.goal

    @staticmethod
    def spawn(parent: TextCraftEnv, spec: dict) -> TextCraftEnv:
        return parent.spawn_child(spec["targets"], spec["context"])

    @staticmethod
    def fork_child(parent: TextCraftEnv, spec: dict) -> TextCraftEnv:
        return TextCraftEnv(
            parent.book, parent.world.fork(), spec["targets"], depth=parent.state.depth + 1,
            max_steps=parent.child_max_steps, max_depth=parent.max_depth, child_max_steps=parent.child_max_steps,
            context=spec["context"], subagent_hook=parent.subagent_hook, limits=parent.limits,
        )

    @staticmethod
    def commit(parent: TextCraftEnv, branch: TextCraftEnv) -> None:
        parent.commit(branch)

    @staticmethod
    def observable(env: TextCraftEnv) -> str:
        return f"Inventory: {env.view_inventory()}"

    @staticmethod
    def final_state(env: TextCraftEnv) -> str:
        return (f"Inventory when the sub-agent started: {dict(sorted(env.state.start_inventory.items()))}\n"
                f"Inventory when it ended: {dict(sorted(env.view_inventory().items()))}")

    @staticmethod
    def world_json(env: TextCraftEnv) -> dict:
        return _plain(env.world.snapshot())

    @staticmethod
    def child_budget(parent: TextCraftEnv, spec: dict) -> str:
        return f"{parent.child_max_steps} steps (code cells)."

    @staticmethod
    def spec_json(spec: dict) -> dict:
        return {"targets": dict(spec["targets"]), "context": spec["context"]}

    @staticmethod
    def start_facts(env: TextCraftEnv) -> dict:
        return {}

    @staticmethod
    def outcome(env: TextCraftEnv, start: dict, observations: list[str | None]) -> dict:
        verdict = env.state.verdict or asdict(env.check())
        return {"env": "textcraft", "targets": env.targets, "finished": env.state.finished, "steps": env.state.steps,
                "start_counts": {t: env.state.start_inventory.get(t, 0) for t in env.targets},
                "max_steps": env.state.max_steps, "verdict": _plain(verdict), "errors": count_errors(observations)}

    @staticmethod
    def expert_info(env: TextCraftEnv) -> dict:
        return {"targets": env.targets}

    @staticmethod
    def root_result(env: TextCraftEnv) -> tuple[bool, dict]:
        check = env.check()
        return check.passed, {"reason": check.reason, "crafts": env.world.crafts}



class TextWorldBenchmark:
    """TextWorld-Sync: one block per reply, a shared world under a lock, ``<delegate>``.
    (Both task formats are read alike: ``official`` is accepted and changes nothing.)"""

    name = "textworld"
    title = "TextWorld-Sync"
    short_title = "TextWorld"
    agent_intro = ("You cook in a shared TextWorld kitchen with other agents. Each turn, think briefly, then reply with "
                   "exactly one block:\n")
    agent_tools = (
        "<action>command</action>  # go to <room>, take <item>, read cookbook, chop|slice|dice <item>, "
        "cook <item> in stove|oven, cook <item> on grill, open door, prepare <dish>, eat <dish>, inventory\n"
        "<finish>message</finish>  # end your episode with a report"
    )
    """The reply blocks every agent has."""
    delegate_tool = (
        '<delegate>{"goal": "..."}</delegate> or <delegate>{"delegations": [{"goal": "...", "max_steps": n}, ...]}'
        "</delegate>  # child agents work on the shared world; their reports come back as [SubAgent Results]"
    )
    measured_levels = ("easy",)
    measured_spread = True
    """The test file is ordered by family: the measured tasks are spread over the level."""
    splits = world_tasks.SPLITS
    eval_split = "test"
    difficulties = world_tasks.DIFFICULTIES
    expert_modes = ("flat", "delegate")
    judges = ("program", "llm")
    sorted_keys = True
    eval_counts = {d: world_tasks.TaskConfig().tasks_per_cell * len(world_tasks.FAMILIES) for d in world_tasks.DIFFICULTIES}
    """Tasks per difficulty of the test split (350 each, 1,400 in all)."""
    pool_weighted = False
    stop = ("</action>", "</delegate>", "</finish>")
    loop_repeats: int | None = None
    """No loop detector (waiting out a tool cooldown legitimately repeats a reply)."""
    max_context_tokens = 13_312
    max_new_tokens = 3_072

    def __init__(self, official: bool = False):
        self.official = official

    # -- tasks -------------------------------------------------------------------------
    @staticmethod
    def generate_split(split: str, *, progress: bool = False, **textcraft_options: Any) -> list[dict]:
        """The generated task records of ``split`` (the official V9 draws; TextCraft's world
        options, ``world_seed`` and the like, do not apply and are ignored)."""
        return world_tasks.generate_split(split, progress=progress)

    @staticmethod
    def validate_record(record: dict, where: str = "record") -> None:
        world_tasks.validate_record(record, where)

    @staticmethod
    def split_stats(records: list[dict]) -> dict:
        return world_tasks.split_stats(records)

    @staticmethod
    def solver(mode: str) -> tuple[Callable[[dict], dict], tuple[str, ...]]:
        cfg = world_expert.ExpertConfig(mode=mode)
        return (lambda rec: world_expert.solve_task(rec, cfg)), ("difficulty", "family")

    # -- the reply format ----------------------------------------------------------------
    @staticmethod
    def well_formed(text: str) -> bool:
        """Whether an act reply is in the format: exactly one valid block."""
        return parse_reply(text).kind != "invalid"

    @staticmethod
    def launch_spans(text: str) -> list[tuple[int, int]]:
        """Every complete ``<delegate>`` block (:func:`~sera_core.envs.textworld.protocol.delegate_spans`)."""
        return delegate_spans(text)

    # -- the expert and the judge ----------------------------------------------------------
    @staticmethod
    def expert_config(config: world_expert.ExpertConfig | None = None, *,
                      explain: bool = False) -> world_expert.ExpertConfig:
        """``config`` (default: the delegating expert, no noise); ``explain`` changes nothing
        here (TextWorld's agents have no arithmetic to spell out; the scorer's check is
        :meth:`expert_check`)."""
        return config or world_expert.ExpertConfig(mode="delegate")

    @staticmethod
    def expert_agent(config: world_expert.ExpertConfig, info: dict) -> world_expert.TextWorldExpert:
        return world_expert.TextWorldExpert(replace(config, noise_seed=info["seed"]), can_delegate=info["can_delegate"])

    @staticmethod
    def expert_rubric(info: dict) -> dict:
        return world_expert.expert_rubric(info["subtask"])

    @staticmethod
    def expert_item_scores(outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
        return world_expert.item_scores(outcome, item_names)

    @staticmethod
    def expert_check(outcome: dict) -> str:
        return world_expert.gate_check(outcome)

    @staticmethod
    def perturbation(observation: str | None, info: dict, rng: Random) -> str:
        """A plausible mistake that changes nothing in the world (a refused ``go to``; like
        every refused action it still spends one shared step): going to the room the agent
        is in, or to a room by a wrong name (``the kitchen``: one of the four rooms every
        task has)."""
        here = next((ln[len("Location: "):].strip() for ln in (observation or "").splitlines()
                     if ln.startswith("Location: ")), None)
        if here is not None and rng.random() < 0.5:
            return f"I go to the {here}.\n<action>go to {here}</action>"
        room = rng.choice(ROOMS[:4])
        return f"I go to the {room}.\n<action>go to the {room}</action>"

    @staticmethod
    def after_mistake(held: str | None, current: str | None) -> str | None:
        """What the expert reads after a :meth:`perturbation`: the result line of its own last
        action with the world as it is now (other agents went on meanwhile)."""
        sep = "\n\nLocation: "
        if held is None or current is None or sep not in held or sep not in current:
            return held
        return held.split(sep, 1)[0] + sep + current.split(sep, 1)[1]

    @staticmethod
    def make_judge(kind: str = "program", *, url: str | None = None, model: str | None = None, cache: str | None = None,
                   timeout_s: float = 60.0, max_retries: int = 4) -> TextWorldVerifier | CanonicalOrLLM:
        """The children's judge: ``program`` (the canonical-goal checker) or ``llm``
        (:class:`~sera_core.envs.textworld.verifier.CanonicalOrLLM`: canonical goals to the checker, free-form
        ones to an OpenAI-compatible endpoint at ``url`` serving ``model``, with an optional
        JSONL response ``cache``, ``timeout_s`` per request and ``max_retries``; key:
        ``$SERA_JUDGE_API_KEY``)."""
        if kind == "program":
            return TextWorldVerifier()
        if kind != "llm":
            raise ValueError(f"judge must be 'program' or 'llm', got {kind!r}")
        if not url or not model:
            raise ValueError("judge 'llm' needs a base URL and a model name")
        llm = LLMJudge(ChatEndpointConfig(base_url=url, model=model, api_key_env="SERA_JUDGE_API_KEY",
                                          timeout_s=timeout_s, max_retries=max_retries, cache=True, cache_path=cache))
        return CanonicalOrLLM(TextWorldVerifier(), llm)

    # -- the runtime's hooks ---------------------------------------------------------------
    def root_env(self, record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> TextWorldEnv:
        return TextWorldEnv.from_task(dict(record), max_steps=max_steps, max_depth=max_depth,
                                      child_max_steps=child_max_steps)

    @staticmethod
    def task_id(record: dict) -> str:
        return str(record.get("task_id"))

    @staticmethod
    def install_hook(env: TextWorldEnv, hook) -> None:
        async def delegate(parent: TextWorldEnv, delegation: Delegation) -> str:
            return await hook(parent, delegation)
        env.delegate_hook = delegate

    @staticmethod
    def goal(env: TextWorldEnv) -> str:
        return env.state.goal

    @staticmethod
    def first_observation(env: TextWorldEnv) -> str:
        return env.prompt()

    @staticmethod
    def spec_goal(parent: TextWorldEnv, spec: Delegation) -> str:
        return spec.goal

    @staticmethod
    def spawn(parent: TextWorldEnv, spec: Delegation) -> TextWorldEnv:
        return parent.spawn_child(spec)

    @staticmethod
    def fork_child(parent: TextWorldEnv, spec: Delegation) -> TextWorldEnv:
        return TextWorldEnv(
            parent.world.fork(), spec.goal, depth=parent.state.depth + 1,
            max_steps=min(spec.max_steps, parent.child_max_steps), max_depth=parent.max_depth,
            child_max_steps=parent.child_max_steps, location=parent.state.location,
            delegate_hook=parent.delegate_hook,
        )

    @staticmethod
    def commit(parent: TextWorldEnv, branch: TextWorldEnv) -> None:
        parent.world.commit(branch.world)

    @staticmethod
    def observable(env: TextWorldEnv) -> str:
        return env.observation()

    @staticmethod
    def final_state(env: TextWorldEnv) -> str:
        with env.world.lock:
            events = list(env.world.state.events)
        mistakes = "; ".join(events) if events else "none"
        return f"{env.observation()}\nIrreversible mistakes so far: {mistakes}"

    @staticmethod
    def world_json(env: TextWorldEnv) -> dict:
        return _plain(asdict(env.world.snapshot()))

    @staticmethod
    def child_budget(parent: TextWorldEnv, spec: Delegation) -> str:
        turns = min(spec.max_steps, parent.child_max_steps)
        return f"{turns} turns; shared steps remaining: {parent.world.steps_left}."

    @staticmethod
    def spec_json(spec: Delegation) -> dict:
        return {"goal": spec.goal, "max_steps": spec.max_steps}

    @staticmethod
    def start_facts(env: TextWorldEnv) -> dict:
        with env.world.lock:
            return {"events": len(env.world.state.events), "global_steps": env.world.state.steps}

    @staticmethod
    def outcome(env: TextWorldEnv, start: dict, observations: list[str | None]) -> dict:
        with env.world.lock:
            events, steps = len(env.world.state.events), env.world.state.steps
        return {"env": "textworld", "goal": env.state.goal, "finished": env.state.finished, "steps": env.state.steps,
                "max_steps": env.state.max_steps, "goal_verdict": check_goal(env.state.goal, env.world),
                "errors": count_errors(observations), "mistakes": events - start.get("events", 0),
                "global_steps": steps - start.get("global_steps", 0)}

    @staticmethod
    def expert_info(env: TextWorldEnv) -> dict:
        return {}

    @staticmethod
    def root_result(env: TextWorldEnv) -> tuple[bool, dict]:
        verdict = env.check()
        return bool(verdict["passed"]), _plain(verdict)



BENCHMARKS: dict[str, type[Benchmark]] = {"textcraft": TextCraftBenchmark, "textworld": TextWorldBenchmark}
"""Every benchmark, by name."""
ENVS: tuple[str, ...] = tuple(BENCHMARKS)
"""The benchmark names (a tree's ``env``, a config's ``env``)."""
assert all(b.difficulties == DIFFICULTIES for b in BENCHMARKS.values())  # one scale for both benchmarks (SPEC 5)


def benchmark(env: str, *, official: bool = False) -> Benchmark:
    """The benchmark named ``env`` (``official``: its task records are in the official format)."""
    if env not in BENCHMARKS:
        raise ValueError(f"env must be one of {list(ENVS)}, got {env!r}")
    return BENCHMARKS[env](official=official)


def select_tasks(env: str, records: Sequence[dict], *, difficulty: str | Sequence[str] | None = None,
                 family: str | None = None, per_level: int | None = None, spread: bool = False,
                 count: int | None = None, source: str = "the task records") -> list[dict]:
    """The one task selection: of ``env``'s ``records``, in file order, those of ``difficulty``
    (one level or several; default every level) and ``family`` (TextWorld), the first
    ``per_level`` of each level (levels in the order given; ``spread``: ``per_level`` spread
    evenly over the level instead), then the first ``count`` of all.

    A difficulty or family that matches no record of a non-empty ``records`` is a
    :class:`ValueError` naming ``source``, not an empty selection."""
    levels = (difficulty,) if isinstance(difficulty, str) else tuple(difficulty or BENCHMARKS[env].difficulties)
    if family is not None:
        records = [r for r in records if record_value(r, "task_family") == family]
    by_level = {level: [r for r in records if record_value(r, "difficulty") == level] for level in levels}
    if records and difficulty is not None and not any(by_level.values()):
        wanted = ", ".join(levels) + (f" (family {family})" if family else "")
        raise ValueError(f"{source}: no task of difficulty {wanted}")
    if per_level is None:  # the file order across levels (every record when no level is asked for)
        picked = list(records) if difficulty is None else [r for r in records if record_value(r, "difficulty") in by_level]
    else:
        picked = [r for level in levels
                  for r in (by_level[level][::max(1, len(by_level[level]) // per_level)] if spread else by_level[level])[:per_level]]
    return picked[:count]


def pick_tasks(env: str, split: str | None = None, *, official: bool = False, **selection: Any) -> list[dict]:
    """Task records of ``env``, selected by :func:`select_tasks` (``selection``: ``difficulty``,
    ``family``, ``per_level``, ``spread``, ``count``). ``split`` is a split name (generated
    records; default the benchmark's evaluation split, TextCraft val / TextWorld test) or a
    JSONL file of task records (each validated; ``official``: in the official format)."""
    bench = benchmark(env, official=official)
    split = split or bench.eval_split
    if split in ("train", "val", "dev", "test") and split not in bench.splits:
        raise ValueError(f"{env} has splits {', '.join(bench.splits)}, not {split!r}")
    if split in bench.splits:
        records = bench.generate_split(split)
    else:
        from sera_core.utils.jsonio import read_jsonl

        records = list(read_jsonl(split))
        for i, rec in enumerate(records):
            bench.validate_record(rec, f"{split}:{i + 1}")
    return select_tasks(env, records, source=split, **selection)
