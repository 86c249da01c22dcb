"""One agent's session in a TextWorld-Sync world: turns, delegation, budgets.

A :class:`TextWorldEnv` is an agent's *view* of a shared :class:`SyncWorld`: its own
location, turn budget and history; the world itself is shared by every agent of the
tree (children get a view of the same world, never a clone; SPEC 5). One reply is one
turn (:mod:`protocol`):

* ``<action>`` runs a command in the shared world (see :mod:`world` for which actions
  spend a global step); ``inventory`` shows the shared inventory without advancing the
  world;
* ``<delegate>`` launches one child per goal through ``delegate_hook`` (children of one
  block run concurrently), each with ``min(requested, child_max_steps)`` turns, and
  returns their reports as ``[SubAgent Results]`` lines; at the depth cap it is
  rejected; either way it costs this agent one turn (SPEC 8);
* ``<finish>`` ends the episode with a message for the parent;
* anything else is an invalid turn (it still costs the turn).

The episode ends on ``<finish>`` or when the agent's turns run out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sera_core.envs.textworld.protocol import Delegation, parse_reply
from sera_core.envs.textworld.world import TOOL_ROOM, SyncWorld

DelegateHook = Callable[["TextWorldEnv", Delegation], Awaitable[str]]
"""``hook(parent, delegation) -> report``: runs one child agent to its end."""


@dataclass
class AgentState:
    """One agent's own state (plain data)."""

    goal: str
    depth: int = 0
    max_steps: int = 20
    steps: int = 0
    location: str = TOOL_ROOM
    finished: bool = False
    finish_message: str | None = None
    history: list[dict[str, str]] = field(default_factory=list)
    """``{"reply", "observation"}`` per turn."""
    stopped: str | None = None
    """Why the runtime ended the episode early (``loop``, ``context``), if it did."""


@dataclass(frozen=True)
class StepResult:
    """What one reply did: the next observation and whether the episode is over."""

    observation: str
    done: bool
    kind: str
    """``action``, ``delegate``, ``finish`` or ``invalid``."""


class TextWorldEnv:
    """An agent's session on a shared :class:`SyncWorld` (see the module docstring)."""

    def __init__(
        self,
        world: SyncWorld,
        goal: str,
        *,
        depth: int = 0,
        max_steps: int = 20,
        max_depth: int = 3,
        child_max_steps: int = 20,
        location: str = TOOL_ROOM,
        delegate_hook: DelegateHook | None = None,
    ):
        self.world = world
        self.state = AgentState(goal=goal, depth=depth, max_steps=max_steps, location=location)
        self.max_depth = max_depth
        self.child_max_steps = child_max_steps
        self.delegate_hook = delegate_hook
        self.children: list[TextWorldEnv] = []

    @classmethod
    def from_task(cls, record: dict[str, Any], **kwargs: Any) -> TextWorldEnv:
        """The root agent of a task record, on a freshly built world."""
        return cls(SyncWorld.from_record(record), record["task_description"], **kwargs)

    def spawn_child(self, delegation: Delegation) -> TextWorldEnv:
        """A child on the same world, starting where this agent stands."""
        child = TextWorldEnv(
            self.world, delegation.goal, depth=self.state.depth + 1,
            max_steps=min(delegation.max_steps, self.child_max_steps), max_depth=self.max_depth,
            child_max_steps=self.child_max_steps, location=self.state.location, delegate_hook=self.delegate_hook,
        )
        self.children.append(child)
        return child

    def walk(self):
        """This agent and all its descendants, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()

    # -- turns -------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.state.finished or self.state.steps >= self.state.max_steps or self.state.stopped is not None

    def stop(self, reason: str) -> None:
        """End the episode from outside (the runtime's loop detector or context limit)."""
        if not self.done:
            self.state.stopped = reason

    @property
    def can_delegate(self) -> bool:
        return self.state.depth < self.max_depth

    def prompt(self) -> str:
        """The first observation: the goal, then what the agent sees."""
        role = "" if self.state.depth == 0 else f"You are a sub-agent (depth {self.state.depth}). "
        return f"{role}Your task:\n{self.state.goal}\n\n{self.observation()}"

    def observation(self) -> str:
        with self.world.lock:
            obs = self.world.observe(self.state.location)
        return f"{obs}\nYour turns remaining: {self.state.max_steps - self.state.steps}"

    def step(self, reply: str) -> StepResult:
        """One turn, synchronously (a delegate reply runs its children to completion)."""
        return asyncio.run(self.astep(reply))

    async def astep(self, reply: str) -> StepResult:
        """One turn; children of a delegate block run concurrently on the shared world."""
        if self.done:
            raise RuntimeError("this agent is done (finished or out of turns); no more steps")
        self.state.steps += 1
        parsed = parse_reply(reply)
        if parsed.kind == "invalid":
            text = parsed.error
        elif parsed.kind == "finish":
            self.state.finished, self.state.finish_message = True, parsed.message
            text = "Finished."
        elif parsed.kind == "action":
            result, self.state.location = self.world.act(self.state.location, parsed.action)
            text = result.message
        else:
            text = await self._delegate(parsed.delegations)
        observation = text if self.done else f"{text}\n\n{self.observation()}"
        self.state.history.append({"reply": reply, "observation": observation})
        return StepResult(observation, self.done, parsed.kind)

    async def _delegate(self, delegations: tuple[Delegation, ...]) -> str:
        if not self.can_delegate:
            return f"Delegation rejected: the maximum depth ({self.max_depth}) is reached; act yourself."
        if self.delegate_hook is None:
            return "Delegation rejected: sub-agents are not available in this run."
        reports = await asyncio.gather(*(self.delegate_hook(self, d) for d in delegations))
        lines = ["[SubAgent Results]"]
        lines += [f"- {d.goal}: {r}" for d, r in zip(delegations, reports, strict=True)]
        return "\n".join(lines)

    def result_text(self) -> str:
        """What the parent receives: the finish message and the turns used."""
        message = self.state.finish_message if self.state.finished else "(the sub-agent did not finish)"
        return f"{message} (used {self.state.steps} of {self.state.max_steps} turns)"

    def check(self) -> dict[str, Any]:
        """The root checker on the shared world (see :meth:`SyncWorld.check`)."""
        return self.world.check()
