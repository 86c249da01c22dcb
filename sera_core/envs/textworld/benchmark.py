"""TextWorld-Sync as a benchmark of the registry (:class:`TextWorldBenchmark`).

The adapter the rest of the workbook reads TextWorld through: its tasks, its agent
interface, its expert and judges, its reply format and the runtime's hooks on a live
:class:`~sera_core.envs.textworld.env.TextWorldEnv` (the protocol:
:class:`sera_core.envs.registry.Benchmark`). Agents delegate through a ``<delegate>``
block; a child spec is a :class:`~sera_core.envs.textworld.protocol.Delegation`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from random import Random
from typing import Any

from sera_core.chat_endpoint import ChatEndpointConfig
from sera_core.envs import count_errors
from sera_core.envs.textworld import expert as world_expert
from sera_core.envs.textworld import tasks as world_tasks
from sera_core.envs.textworld.data import COOKING, CUTTING, ROOMS, load_foods
from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import check_goal
from sera_core.envs.textworld.protocol import Delegation, delegate_spans, parse_reply
from sera_core.envs.textworld.verifier import CanonicalOrLLM, TextWorldVerifier
from sera_core.judges import LLMJudge
from sera_core.utils.jsonio import json_native


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

    @staticmethod
    def demo_tasks(cfg: Any) -> list[dict]:
        """The warm start's demonstration tasks (``cfg``: a :class:`~sera_core.tiny.demos.DemoConfig`):
        ``textworld_tasks`` records spread evenly over the train split (train-fold foods), then
        ``textworld_easy`` easy 2-dish tasks from the same foods (:func:`~sera_core.envs.textworld.tasks.train_fold_tasks`:
        the train split holds no easy task)."""
        tasks = []
        if cfg.textworld_tasks:
            split = world_tasks.generate_split("train")
            step = max(1, len(split) // cfg.textworld_tasks)
            tasks = split[::step][: cfg.textworld_tasks]
        return tasks + world_tasks.train_fold_tasks("easy", cfg.textworld_easy)

    export_world = None
    """No world of its own to export (``sera world``): each task builds its kitchen."""

    @staticmethod
    def vocabulary(seed: int = 0) -> list[str]:
        """Texts of the benchmark's own words for the scripted policies' tokenizer
        (:func:`sera_core.agents.corpus.corpus`): every CookingWorld food with every
        preparation, the rooms, and an expert rubric (``seed`` changes nothing: the foods are fixed)."""
        foods = sorted(load_foods())
        return [*(f"bring the {f}, {c} and {k}, to the counter" for f in foods for c in COOKING for k in CUTTING),
                *(f"go to {r}" for r in ROOMS), json.dumps(world_expert.expert_rubric("prepare and eat dish_1"))]

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
    def noisy_expert_config(noise: float | None = None, **rates: float) -> world_expert.ExpertConfig:
        """The delegating expert with seeded mistakes (:func:`sera_core.agents.actors.noisy_expert`):
        with ``noise`` p it uses a wrong preparation with chance p and finishes early with
        chance p / 2 (the CLI's ``--noise``); with None, the workbook's noisy expert (mistake
        0.15, early finish 0.05). ``rates`` set fields of the config directly (``mistake=0.4``)."""
        mistake, early_finish = (0.15, 0.05) if noise is None else (noise, noise / 2)
        return replace(world_expert.ExpertConfig(mode="delegate", mistake=mistake, early_finish=early_finish), **rates)

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
        return json_native(asdict(env.world.snapshot()))

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
        return bool(verdict["passed"]), json_native(verdict)
