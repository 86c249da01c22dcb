"""TextCraft-Synth as a benchmark of the registry (:class:`TextCraftBenchmark`).

The adapter the rest of the workbook reads TextCraft through: its tasks, its agent
interface, its expert and judge, its reply format and the runtime's hooks on a live
:class:`~sera_core.envs.textcraft.env.TextCraftEnv` (the protocol:
:class:`sera_core.envs.registry.Benchmark`). Agents delegate through ``await
launch_subagent(...)`` inside a code cell; a child spec is ``{"targets", "context"}``.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from dataclasses import asdict, replace
from os import PathLike
from random import Random
from typing import Any

from sera_core.envs import count_errors
from sera_core.envs.textcraft import expert as craft_expert
from sera_core.envs.textcraft import tasks as craft_tasks
from sera_core.envs.textcraft.env import TextCraftEnv, extract_code
from sera_core.envs.textcraft.launch import launch_spans as craft_launch_spans
from sera_core.envs.textcraft.verifier import TextCraftVerifier
from sera_core.envs.textcraft.world import WorldConfig, generate_world
from sera_core.utils.jsonio import json_native

NO_LLM_JUDGE = "an LLM judge labels TextWorld subtasks; TextCraft is always checked by its program"


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

    @staticmethod
    def demo_tasks(cfg: Any) -> list[dict]:
        """The warm start's demonstration tasks (``cfg``: a :class:`~sera_core.tiny.demos.DemoConfig`):
        ``textcraft_mix`` train tasks from each of ``textcraft_worlds`` fresh recipe worlds,
        seeded ``world_seed``, ``world_seed + 1``, ... (ids ``demo.w{seed}.{i}``)."""
        tasks = []
        for k in range(cfg.textcraft_worlds):
            seed = cfg.world_seed + k
            task_cfg = craft_tasks.TaskConfig(world=WorldConfig(seed=seed), seed=seed,
                                              splits={"train": dict(cfg.textcraft_mix)})
            drawn = craft_tasks.generate_split("train", task_cfg)
            tasks += [{**t, "id": f"demo.w{seed}.{i}"} for i, t in enumerate(drawn)]
        return tasks

    @staticmethod
    def export_world(path: str | PathLike, *, world_seed: int = 0, items_per_tier: int = 25) -> dict[str, int]:
        """Write the recipe world of ``world_seed`` and ``items_per_tier`` to ``path`` as JSON
        (``sera world``); return its item counts (``items``, ``crafted``, ``base``)."""
        book = generate_world(WorldConfig(seed=world_seed, items_per_tier=items_per_tier))
        book.save(path)
        return {"items": len(book.recipes) + len(book.base_items), "crafted": len(book.recipes),
                "base": len(book.base_items)}

    @staticmethod
    def vocabulary(seed: int = 0) -> list[str]:
        """Texts of the benchmark's own words for the scripted policies' tokenizer
        (:func:`sera_core.agents.corpus.corpus`): the recipes and base items of the recipe
        world of ``seed``, and an expert rubric."""
        book = craft_tasks.world_for(WorldConfig(seed=seed))
        recipes = [f"{item}: {json.dumps(dict(r.ingredients))} -> {r.result_count}"
                   for item, r in sorted(book.recipes.items())]
        return [*recipes, " ".join(book.base_items), json.dumps(craft_expert.expert_rubric({"a1_i5": 3}))]

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
    def noisy_expert_config(noise: float | None = None, **rates: float) -> craft_expert.ExpertConfig:
        """The delegating expert with seeded mistakes (:func:`sera_core.agents.actors.noisy_expert`):
        with ``noise`` p it wastes a craft with chance p and finishes early with chance p / 2
        (the CLI's ``--noise``); with None, the workbook's noisy expert (waste 0.3, early
        finish 0.1). ``rates`` set fields of the config directly (``waste=0.15``)."""
        waste, early_finish = (0.3, 0.1) if noise is None else (noise, noise / 2)
        return replace(craft_expert.ExpertConfig(mode="delegate", waste=waste, early_finish=early_finish), **rates)

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
        return json_native(env.world.snapshot())

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
                "max_steps": env.state.max_steps, "verdict": json_native(verdict), "errors": count_errors(observations)}

    @staticmethod
    def expert_info(env: TextCraftEnv) -> dict:
        return {"targets": env.targets}

    @staticmethod
    def root_result(env: TextCraftEnv) -> tuple[bool, dict]:
        check = env.check()
        return check.passed, {"reason": check.reason, "crafts": env.world.crafts}
