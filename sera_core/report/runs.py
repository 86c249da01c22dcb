"""Your own evaluation runs, read for the side-by-side rows of the report.

:func:`load_runs` finds every ``summary.json`` under a folder whose ``format`` is
``sera.eval/1`` (written by :func:`sera_core.eval.aggregate.summarize_runs`); other
``summary.json`` files (another tool's) are skipped. Of each it reads::

    env            a benchmark's name ("textcraft", "textworld": the registry's)
    label          non-empty text naming model and scale ("SmolLM2-135M + LoRA (CPU) - SERA tiny run")
    method         a method config name ("sera", "rao", ...) or null
    average        {"mean": %, "std": % | null, "n": seeds}
    by_difficulty  {difficulty: {"mean", "std", "n"}}   (some or all of easy..extreme)

A file that is not JSON, or a ``sera.eval/1`` file missing one of these or holding a
value of the wrong kind, raises :class:`~sera_core.utils.errors.UserInputError` naming
the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sera_core.envs.registry import BENCHMARKS
from sera_core.eval.aggregate import DIFFICULTIES, SUMMARY_FORMAT
from sera_core.utils.errors import UserInputError


@dataclass(frozen=True)
class Stat:
    """A success rate over seeds."""

    mean: float
    """Mean over seeds (%)."""
    std: float | None
    """Std over seeds (%), None when the file gives none."""
    n: int
    """Seeds."""


@dataclass(frozen=True)
class UserRun:
    """One evaluation summary of yours."""

    path: str
    """The file, relative to the runs folder (POSIX separators)."""
    env: str
    """The benchmark's name (a key of :data:`~sera_core.envs.registry.BENCHMARKS`)."""
    label: str
    """Model and scale, free text; shown as ``yours: <label>``."""
    method: str | None
    """The method config name, if any."""
    average: Stat
    """The benchmark average."""
    by_difficulty: dict[str, Stat]
    """Per-difficulty rates (the difficulties the run evaluated)."""

    @property
    def name(self) -> str:
        """The row label in tables and plots: ``yours: <label>``."""
        return f"yours: {self.label}"


def load_runs(runs_dir: str | Path) -> list[UserRun]:
    """Every ``sera.eval/1`` summary under ``runs_dir`` (recursively), in path order.

    Raises :class:`~sera_core.utils.errors.UserInputError` when ``runs_dir`` is not a folder or
    a summary is malformed.
    """
    root = Path(runs_dir)
    if not root.is_dir():
        raise UserInputError(f"runs folder {root} does not exist")
    runs = []
    for path in sorted(root.rglob("summary.json"), key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserInputError(f"{path}: not a readable JSON file ({exc})") from None
        if isinstance(data, dict) and data.get("format") == SUMMARY_FORMAT:
            runs.append(_parse(data, rel, path))
    return runs


def _parse(data: dict[str, Any], rel: str, path: Path) -> UserRun:
    """A :class:`UserRun` from one summary's JSON object."""
    env = data.get("env")
    if env not in BENCHMARKS:
        raise UserInputError(f"{path}: env must be one of {tuple(BENCHMARKS)}, got {env!r}")
    label = data.get("label")
    if not isinstance(label, str) or not label.strip():
        raise UserInputError(f"{path}: label must be non-empty text naming the model and scale, got {label!r}")
    method = data.get("method")
    if method is not None and not isinstance(method, str):
        raise UserInputError(f"{path}: method must be text or null, got {method!r}")
    by_difficulty = data.get("by_difficulty")
    if not isinstance(by_difficulty, dict):
        raise UserInputError(f"{path}: by_difficulty must be an object, got {by_difficulty!r}")
    unknown = sorted(set(by_difficulty) - set(DIFFICULTIES))
    if unknown:
        raise UserInputError(f"{path}: by_difficulty has unknown difficulties {unknown}")
    return UserRun(
        path=rel,
        env=env,
        label=" ".join(label.split()),
        method=method,
        average=_stat(data.get("average"), "average", path),
        by_difficulty={d: _stat(by_difficulty[d], f"by_difficulty.{d}", path) for d in DIFFICULTIES
                       if d in by_difficulty},
    )


def _stat(obj: Any, field: str, path: Path) -> Stat:
    """A :class:`Stat` from ``{"mean", "std", "n"}``; mean in [0, 100], std >= 0 or null, n >= 1."""
    if not isinstance(obj, dict):
        raise UserInputError(f"{path}: {field} must be an object {{mean, std, n}}, got {obj!r}")
    mean, std, n = obj.get("mean"), obj.get("std"), obj.get("n")
    if not _number(mean) or not 0.0 <= mean <= 100.0:
        raise UserInputError(f"{path}: {field}.mean must be a success rate in [0, 100], got {mean!r}")
    if std is not None and (not _number(std) or std < 0.0):
        raise UserInputError(f"{path}: {field}.std must be a non-negative number or null, got {std!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserInputError(f"{path}: {field}.n must be a positive integer (seeds), got {n!r}")
    return Stat(float(mean), None if std is None else float(std), n)


def _number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
