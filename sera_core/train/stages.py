"""The stage schedule: which objective each optimizer update trains.

SERA alternates three stages, one objective per update. The default schedule
``execution:16,delegation:2,rubric_generation:2`` (16:2:2) trains optimizer versions 0-15 on
execution, 16-17 on decomposition (delegation), 18-19 on rubric generation, then repeats the
20-update cycle. Each stage trains the completion tokens of one role of the rollout trees
(:data:`STAGE_ROLE`; the ``score`` role is never trained). Counterfactual branching is used
only in the rollouts of the rubric-generation stage. Ablations drop stages
(``execution:16,rubric_generation:2``) or keep one (``execution:1``: single-agent / RAO).

With ``L`` the cycle length and ``v`` the optimizer version (number of updates already
done)::

    cycle = v // L,   position = v % L,   stage = the part whose span of positions holds it

The stage is a pure function of the version, so a checkpoint needs only the version:
resuming at optimizer version ``v`` continues at :meth:`StageController.stage` ``(v)``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate

STAGES = ("execution", "delegation", "rubric_generation")
"""The stage names, in canonical order."""

STAGE_ROLE = {"execution": "execution", "delegation": "launch", "rubric_generation": "rubric"}
"""The completion-token role each stage trains (roles: execution, launch, rubric, score)."""

DEFAULT_SCHEDULE = "execution:16,delegation:2,rubric_generation:2"
"""The paper's 16:2:2 schedule."""


@dataclass(frozen=True)
class Stage:
    """The stage of one optimizer update."""

    name: str
    """One of :data:`STAGES`."""
    role: str
    """The role whose completion tokens this update trains (:data:`STAGE_ROLE`)."""
    cycle: int
    """0-based index of the schedule cycle the update belongs to."""
    index: int
    """0-based position of the update inside its cycle."""
    counterfactual: bool
    """Whether rollouts for this update branch counterfactually (only ``rubric_generation``)."""


class StageController:
    """Maps optimizer versions to stages under a schedule such as ``"execution:16,delegation:2,rubric_generation:2"``.

    The schedule is a comma-separated list of ``name:count`` parts, run in the given order;
    each name is one of :data:`STAGES` and appears at most once, each count is an integer >= 1.
    """

    def __init__(self, schedule: str) -> None:
        if not schedule.strip():
            raise ValueError("schedule is empty; expected e.g. 'execution:16,delegation:2,rubric_generation:2'")
        parts: list[tuple[str, int]] = []
        for raw in schedule.split(","):
            part = raw.strip()
            if ":" not in part:
                raise ValueError(f"schedule part {part!r} must be 'name:count'")
            name, count_text = (s.strip() for s in part.split(":", 1))
            if name not in STAGES:
                raise ValueError(f"unknown stage {name!r} in schedule part {part!r}; expected one of {STAGES}")
            if any(name == seen for seen, _ in parts):
                raise ValueError(f"stage {name!r} appears more than once in schedule {schedule!r}")
            if not re.fullmatch(r"-?[0-9]+", count_text):
                raise ValueError(f"count {count_text!r} in schedule part {part!r} is not an integer")
            if int(count_text) < 1:
                raise ValueError(f"count {count_text!r} in schedule part {part!r} must be >= 1")
            parts.append((name, int(count_text)))
        self._parts = tuple(parts)
        self._ends = tuple(accumulate(count for _, count in parts))  # exclusive end position of each part

    @classmethod
    def from_counts(cls, **counts: int) -> StageController:
        """The schedule with ``counts[name]`` updates per stage, in :data:`STAGES` order, zero counts dropped."""
        unknown = sorted(set(counts) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; expected names from {STAGES}")
        for name, count in counts.items():
            if count < 0:
                raise ValueError(f"count for {name!r} must be >= 0, got {count}")
        return cls(",".join(f"{name}:{counts[name]}" for name in STAGES if counts.get(name, 0)))

    @property
    def parts(self) -> tuple[tuple[str, int], ...]:
        """The ``(name, count)`` parts, in schedule order."""
        return self._parts

    @property
    def schedule(self) -> str:
        """The canonical schedule string (``name:count`` joined by commas, no spaces)."""
        return ",".join(f"{name}:{count}" for name, count in self._parts)

    @property
    def cycle_length(self) -> int:
        """``L = sum of the counts``: updates per cycle."""
        return self._ends[-1]

    def stage(self, version: int) -> Stage:
        """The stage of optimizer version ``version`` (0-based count of updates done): the part whose span holds ``v % L``."""
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        cycle, position = divmod(version, self.cycle_length)
        name = self._parts[bisect_right(self._ends, position)][0]  # first part whose end exceeds position
        return Stage(name, STAGE_ROLE[name], cycle, position, name == "rubric_generation")

    def stages(self, start: int, n: int) -> list[Stage]:
        """The stages of versions ``start, ..., start + n - 1``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return [self.stage(version) for version in range(start, start + n)]

    def counts(self, versions: int) -> dict[str, int]:
        """Updates per stage among the first ``versions`` updates (every name of :data:`STAGES`; 0 if dropped).

        With ``q, r = divmod(versions, L)`` and a part of ``count`` updates starting at cycle
        position ``offset``: ``q * count + clamp(r - offset, 0, count)``.
        """
        if versions < 0:
            raise ValueError(f"versions must be >= 0, got {versions}")
        full, rest = divmod(versions, self.cycle_length)
        result = dict.fromkeys(STAGES, 0)
        for (name, count), end in zip(self._parts, self._ends, strict=True):
            result[name] = full * count + min(max(rest - (end - count), 0), count)
        return result

    def __repr__(self) -> str:
        return f"StageController({self.schedule!r})"
