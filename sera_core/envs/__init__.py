"""Benchmark environments: TextCraft-Synth (``textcraft``) and TextWorld-Sync (``textworld``).

:mod:`sera_core.envs.registry` is the one place that lists them and says what each provides;
each benchmark's adapter is its folder's ``benchmark.py``. Here: what every benchmark shares.
"""

DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard", "extreme")
"""The four difficulty levels of both benchmarks, easiest first (SPEC 5)."""

ERROR_PREFIXES = ("Error", "Traceback", "Invalid", "Delegation rejected")
"""Observation lines that report a failed call or step (counted for the expert scorer)."""


def count_errors(observations: list[str | None]) -> int:
    """Observation lines that start with one of :data:`ERROR_PREFIXES`."""
    return sum(1 for obs in observations if obs for line in obs.splitlines() if line.startswith(ERROR_PREFIXES))
