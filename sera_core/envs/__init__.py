"""Benchmark environments: TextCraft-Synth (``textcraft``) and TextWorld-Sync (``textworld``).

:mod:`sera_core.envs.registry` is the one place that lists them and says what each provides.
"""

DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard", "extreme")
"""The four difficulty levels of both benchmarks, easiest first (SPEC 5)."""
