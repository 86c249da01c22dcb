"""TextCraft-Synth's program checker as the children's judge (the external label of a
counterfactual branch: :mod:`sera_core.judges` says what a judge returns and counts)."""

from __future__ import annotations

from typing import Any

from sera_core.envs.textcraft.env import CheckResult
from sera_core.judges import CountingJudge, JudgeVerdict


class TextCraftVerifier(CountingJudge):
    """TextCraft-Synth's program checker as a branch judge (one call per branch, no tokens).

    ``judge(env)`` reads the child's verdict frozen when its episode ended
    (``env.state.verdict``: the net gain *then*, before a parent consumed its
    products); if the episode has not ended it falls back to the live ``env.check()``.
    """

    name = "textcraft_verifier"

    def judge(self, env: Any) -> JudgeVerdict:
        frozen = env.state.verdict
        if frozen is not None:
            result, note = CheckResult(**frozen), ""
        else:
            result, note = env.check(), " (live check: the episode has not ended)"
        verdict = JudgeVerdict(bool(result.passed), result.reason + note, self.name)
        return self._record(verdict)
