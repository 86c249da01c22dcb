"""External judges: the binary labels of counterfactual branches, and what they cost.

At a rubric-generation delegation point SERA runs B = 8 counterfactual child branches
on forked worlds, and each branch gets an *external* binary label y_b (SPEC 3). The
ranking loss only compares branches that have a label, so a judge must be able to say
"no label" as well as "success" or "failure". The judges:

* :class:`~sera_core.envs.textcraft.verifier.TextCraftVerifier` - TextCraft-Synth's
  program checker, applied to a child :class:`~sera_core.envs.textcraft.env.TextCraftEnv`:
  the verdict frozen when the child's episode ended (net gain against the child's own
  start, after ``finish()``).
* :class:`~sera_core.envs.textworld.verifier.TextWorldVerifier` - our programmatic subtask
  checker for TextWorld-Sync (:mod:`sera_core.envs.textworld.goals`): labels children whose
  goal is written in the canonical form; any other goal gets no label.
* :class:`LLMJudge` (here) - the paper's TextWorld judge (Kimi in the paper): any
  OpenAI-compatible chat-completions endpoint, asked for strict JSON
  ``{"success": bool, "reason": str}`` about a goal, a trajectory and a final state. The
  requests (retries, the response cache, token accounting) go through
  :class:`sera_core.chat_endpoint.ChatEndpoint`. It never raises: network errors and
  unparseable replies give no label.
* :class:`~sera_core.envs.textworld.verifier.CanonicalOrLLM` - TextWorld with an LLM judge
  configured (``judge: llm``): a goal in the canonical form is checked by the program, any
  other by the LLM judge on the child's rendered trajectory.

This module knows no benchmark: the verdict and its counters (:class:`JudgeVerdict`,
:class:`JudgeStats`, :class:`CountingJudge`) and the LLM judge; each benchmark's checker lives
with its benchmark and builds on them.

The benchmark registry builds the judge a config names
(:meth:`sera_core.envs.registry.Benchmark.make_judge`;
training and evaluation share it).

Every judge returns a :class:`JudgeVerdict`. ``success=None`` means *no label*
(unknown goal, unparseable reply, network error): it must never be counted as a
success or a failure; callers drop that branch from the ranking pairs.

What is counted (the paper's Table 2 reports external supervision calls, and for
TextWorld the judge's input tokens): every judge keeps a :class:`JudgeStats` in
``.stats``, updated under a lock (branches may be judged from several threads):

* ``calls`` - judge invocations that consulted the external supervisor (a program
  check, or an LLM request including all its retries); a cache hit is not a call;
* ``cache_hits`` - LLM invocations answered from the response cache (no tokens spent);
* ``failures`` - invocations that ended in an error or an unparseable reply;
* ``unlabeled`` - verdicts with ``success=None`` (failures plus, for the TextWorld
  verifier, non-canonical goals);
* ``requests`` - HTTP requests sent (an LLM call with retries sends several);
* ``input_tokens`` / ``output_tokens`` - the endpoint's ``usage.prompt_tokens`` and
  ``usage.completion_tokens`` (estimated when the endpoint omits them; see
  :mod:`sera_core.chat_endpoint`); program judges spend none.

Every judge returns the same verdict type and keeps the same counters (Table 2's cost). A
judge that may wait on a network says so with ``remote = True``: the runtime calls it off the
event loop.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sera_core.chat_endpoint import ChatEndpoint, ChatEndpointConfig, EndpointStats
from sera_core.utils.text import truncate_middle

__all__ = [
    "CountingJudge",
    "JudgeStats",
    "JudgeVerdict",
    "LLMJudge",
    "parse_judge_output",
    "truncate_middle",
]


@dataclass(frozen=True)
class JudgeVerdict:
    """One judge's answer about one branch."""

    success: bool | None
    """True / False: the external label; None: no label (unknown, unparseable, error)."""
    reason: str
    """Why (the checker's reason, the judge's reason, or the error)."""
    source: str
    """Which judge gave it (``textcraft_verifier``, ``textworld_verifier``, ``llm:<model>``)."""
    input_tokens: int = 0
    """Prompt tokens this verdict spent (0 for program judges and cache hits)."""
    output_tokens: int = 0
    """Completion tokens this verdict spent."""
    cached: bool = False
    """True when the answer came from the response cache."""

    @property
    def labeled(self) -> bool:
        """Whether this verdict is a usable binary label."""
        return self.success is not None


@dataclass
class JudgeStats(EndpointStats):
    """Counters of one judge: an external supervisor's (:class:`~sera_core.chat_endpoint.EndpointStats`)
    and ``unlabeled`` (see the module docstring for what each one means for a judge)."""

    unlabeled: int = 0


class CountingJudge:
    """What every judge shares: a name, its :class:`JudgeStats` and the lock that guards them
    (the base of the program checkers and of :class:`LLMJudge`)."""

    name = "judge"

    def __init__(self) -> None:
        self.stats = JudgeStats()
        self._lock = threading.Lock()

    def _record(self, verdict: JudgeVerdict, *, failure: bool = False, requests: int = 0) -> JudgeVerdict:
        with self._lock:
            s = self.stats
            if verdict.cached:
                s.cache_hits += 1
            else:
                s.calls += 1
            s.failures += int(failure)
            s.unlabeled += int(verdict.success is None)
            s.requests += requests
            s.input_tokens += verdict.input_tokens
            s.output_tokens += verdict.output_tokens
        return verdict

    def stats_snapshot(self) -> dict[str, int]:
        """A consistent copy of the counters."""
        with self._lock:
            return self.stats.as_dict()


# -- the LLM judge -----------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are a strict judge. You decide whether an agent accomplished its goal in a text-based "
    "environment, using only the evidence given: the goal, the agent's trajectory and the final "
    "environment state. Claims the agent makes without evidence in the state do not count.\n"
    'Reply with exactly one JSON object and nothing else: {"success": true or false, '
    '"reason": "one short sentence"}'
)


def build_messages(goal: str, trajectory: str, final_state: str, *, max_chars: int = 0) -> list[dict[str, str]]:
    """The judge's chat messages (system + user)."""
    user = (
        f"## Goal\n{goal.strip()}\n\n"
        f"## Agent trajectory\n{truncate_middle(trajectory.strip(), max_chars) or '(empty)'}\n\n"
        f"## Final environment state\n{final_state.strip() or '(not given)'}\n\n"
        'Did the agent accomplish the goal? Answer with the JSON object only: {"success": ..., "reason": ...}'
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


_FENCE = re.compile(r"^```(?:json|JSON)?[ \t]*\n?(.*?)\n?[ \t]*```$", re.DOTALL)


def parse_judge_output(content: Any) -> tuple[bool, str] | None:
    """``(success, reason)`` from a judge reply, or None when it is not strict JSON.

    The reply must be one JSON object with a boolean ``success`` and a string
    ``reason``, optionally surrounded by whitespace or wrapped in a ```` ```json ````
    fence. Anything else (prose around it, two objects, ``"success": "yes"``) is None.
    """
    if not isinstance(content, str):
        return None
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("success"), bool) or not isinstance(obj.get("reason"), str):
        return None
    return obj["success"], obj["reason"]


class LLMJudge(CountingJudge):
    """An LLM judge over any OpenAI-compatible ``/chat/completions`` endpoint.

    ``judge(goal, trajectory, final_state)`` sends a short system + user prompt
    (:func:`build_messages`) asking for strict JSON ``{"success": bool, "reason": str}`` and
    returns a :class:`JudgeVerdict`. It never raises: after all retries a network failure is
    ``success=None`` with reason ``judge request failed: ...``; a reply that is not such an
    object (:func:`parse_judge_output`) is ``success=None`` with reason ``unparseable judge
    output: ...``; both count as failures.

    The requests go through a :class:`~sera_core.chat_endpoint.ChatEndpoint` built from
    ``endpoint`` (``.endpoint``): retries with backoff, the tokens spent (the endpoint's
    ``usage``, estimated when it omits it; an unparseable reply's tokens count, they were
    spent) and, with ``endpoint.cache``, a cache of the parseable verdicts only (optionally
    in the JSONL file ``endpoint.cache_path``): unparseable replies and errors are asked
    again. A cache hit returns ``cached=True``, counts in ``cache_hits`` (not ``calls``) and
    spends no tokens. Trajectories longer than ``max_trajectory_chars`` are cut in the middle
    (0: never cut). ``sleep`` is called between retries.

    Counters are guarded by a lock, so branches may be judged from several threads.
    """

    remote = True
    """It waits on an endpoint: the runtime calls it off the event loop."""

    def __init__(self, endpoint: ChatEndpointConfig, *, max_trajectory_chars: int = 48_000,
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__()
        self.endpoint = ChatEndpoint(endpoint, keep=lambda content: parse_judge_output(content) is not None,
                                     sleep=sleep)
        self.name = f"llm:{endpoint.model}"
        self.max_trajectory_chars = max_trajectory_chars

    def judge(self, goal: str, trajectory: str, final_state: str) -> JudgeVerdict:
        """The verdict of the endpoint's model on whether ``goal`` was accomplished (see the
        class docstring), counted."""
        reply = self.endpoint.chat(build_messages(goal, trajectory, final_state, max_chars=self.max_trajectory_chars))
        if not reply.answered:
            return self._record(JudgeVerdict(None, f"judge request failed: {reply.error}", self.name), failure=True,
                                requests=reply.requests)
        parsed = parse_judge_output(reply.content)
        if parsed is None:
            shown = reply.content if reply.content is not None else reply.error
            verdict = JudgeVerdict(None, f"unparseable judge output: {shown[:300]!r}", self.name, reply.input_tokens,
                                   reply.output_tokens)
            return self._record(verdict, failure=True, requests=reply.requests)
        success, reason = parsed
        return self._record(JudgeVerdict(success, reason, self.name, reply.input_tokens, reply.output_tokens,
                                         reply.cached), requests=reply.requests)
