"""What the runtime needs to know about each benchmark, behind one interface.

An adapter builds root agents from task records, installs the runtime's delegation
hook, starts children on the live world (shared) or on a forked world (a
counterfactual branch), commits a branch, renders what an agent can observe (rubric
inputs, the scorer's final state), summarises a finished child for the expert scorer,
and gives the root verdict. TextCraft delegates through ``await launch_subagent(...)``
inside a code cell (a child spec is ``{"targets", "context"}``); TextWorld through a
``<delegate>`` block (a child spec is a :class:`~sera_core.envs.textworld.protocol.Delegation`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from sera_core.envs.textcraft.env import TextCraftEnv
from sera_core.envs.textcraft.tasks import book_for_record
from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import check_goal
from sera_core.envs.textworld.protocol import Delegation
from sera_core.judges import TextCraftVerifier, TextWorldVerifier

ERROR_PREFIXES = ("Error", "Traceback", "Invalid", "Delegation rejected")
"""Observation lines that report a failed call or step (counted for the expert scorer)."""


def count_errors(observations: list[str | None]) -> int:
    """Observation lines that start with one of :data:`ERROR_PREFIXES`."""
    return sum(1 for obs in observations if obs for line in obs.splitlines() if line.startswith(ERROR_PREFIXES))


def _plain(obj: Any) -> Any:
    """A JSON-native copy (tuples become lists)."""
    return json.loads(json.dumps(obj))


class TextCraftAdapter:
    """TextCraft-Synth: CodeAct cells, shared inventory, ``launch_subagent``."""

    name = "textcraft"
    stop = ("</python>",)
    loop_repeats: int | None = 4
    """The official CodeAct loop detector: a reply pattern repeated 4 times ends the episode."""
    max_context_tokens = 10_240
    max_new_tokens = 512

    def __init__(self, official: bool = False):
        self.official = official
        self._books: dict[str, Any] = {}

    def root_env(self, record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> TextCraftEnv:
        key = json.dumps(record["misc"].get("world") or record.get("id"), sort_keys=True) if not self.official else record["id"]
        if key not in self._books:
            self._books[key] = book_for_record(record, official=self.official)
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
                "max_steps": env.state.max_steps, "verdict": _plain(verdict), "errors": count_errors(observations)}

    @staticmethod
    def expert_info(env: TextCraftEnv) -> dict:
        return {"targets": env.targets}

    @staticmethod
    def root_result(env: TextCraftEnv) -> tuple[bool, dict]:
        check = env.check()
        return check.passed, {"reason": check.reason, "crafts": env.world.crafts}

    @staticmethod
    def default_judge():
        return TextCraftVerifier()


class TextWorldAdapter:
    """TextWorld-Sync: one block per reply, a shared world under a lock, ``<delegate>``."""

    name = "textworld"
    stop = ("</action>", "</delegate>", "</finish>")
    loop_repeats: int | None = None
    """No loop detector (waiting out a tool cooldown legitimately repeats a reply)."""
    max_context_tokens = 13_312
    max_new_tokens = 3_072

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

    @staticmethod
    def default_judge():
        return TextWorldVerifier()


ADAPTERS = {"textcraft": TextCraftAdapter, "textworld": TextWorldAdapter}


def adapter_for(env: str, **kwargs: Any):
    """The adapter of benchmark ``env`` (``textcraft`` or ``textworld``)."""
    if env not in ADAPTERS:
        raise ValueError(f"env must be one of {sorted(ADAPTERS)}, got {env!r}")
    return ADAPTERS[env](**kwargs)
