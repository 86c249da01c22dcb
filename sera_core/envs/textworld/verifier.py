"""TextWorld-Sync's children's judges: the canonical-goal checker, and with an LLM judge
configured (``judge: llm``) the checker for canonical goals and the LLM for any other
(:mod:`sera_core.judges` says what a judge returns and counts)."""

from __future__ import annotations

from typing import Any

from sera_core.envs.textworld import goals
from sera_core.judges import CountingJudge, JudgeVerdict, LLMJudge


class TextWorldVerifier(CountingJudge):
    """TextWorld-Sync's programmatic subtask checker as a branch judge.

    ``judge(env)`` checks the child's goal (``env.state.goal``) on its world
    (``env.world``, after the child ran) with :func:`goals.check_goal`. A goal that is
    not in the canonical form gets ``success=None`` (never a label); it still counts as
    a call, and in ``unlabeled``, but not as a failure.
    """

    name = "textworld_verifier"

    def judge(self, env: Any) -> JudgeVerdict:
        goal = env.state.goal
        verdict = goals.check_goal(goal, env.world)
        if verdict == goals.UNKNOWN:
            return self._record(JudgeVerdict(None, "goal is not canonical; no label", self.name))
        ok = verdict == goals.SUCCESS
        reason = f"goal {'met' if ok else 'not met'}: {goal}"
        return self._record(JudgeVerdict(ok, reason, self.name))


def render_trajectory(env: Any) -> tuple[str, str]:
    """``(trajectory, final_state)`` texts of a TextWorld-Sync agent, what
    :meth:`~sera_core.judges.LLMJudge.judge` reads besides its goal."""
    turns = []
    for i, turn in enumerate(env.state.history, 1):
        turns.append(f"[turn {i}] agent:\n{turn['reply'].strip()}\n"
                     f"[turn {i}] environment:\n{turn['observation'].strip()}")
    with env.world.lock:
        final_state = env.world.observe(env.state.location)
    if env.state.finished:
        final_state += f"\nThe agent finished with the message: {env.state.finish_message}"
    else:
        final_state += "\nThe agent did not finish (it ran out of turns)."
    return "\n\n".join(turns), final_state


class CanonicalOrLLM:
    """TextWorld's labels with an LLM judge configured: the program checker for a goal in
    the canonical form (exact and free), the LLM judge for any other goal (which the
    program alone leaves unlabelled). ``stats_snapshot()`` adds both judges' counters;
    ``llm`` holds the LLM judge's own (Table 2 counts its calls and input tokens)."""

    name = "textworld_verifier+llm"
    remote = True
    """It may wait on an endpoint: the runtime calls it off the event loop."""

    def __init__(self, program: TextWorldVerifier, llm: LLMJudge):
        self.program, self.llm = program, llm

    def judge(self, env: Any) -> JudgeVerdict:
        verdict = self.program.judge(env)
        return verdict if verdict.success is not None else self.llm.judge(env.state.goal, *render_trajectory(env))

    def stats_snapshot(self) -> dict[str, int]:
        a, b = self.program.stats_snapshot(), self.llm.stats_snapshot()
        return {k: a[k] + b[k] for k in a}
