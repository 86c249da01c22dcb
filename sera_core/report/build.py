"""``build_report``: every table and plot of the published numbers into one folder.

Writes, after :func:`~sera_core.report.checks.check_published` has passed:
``table1``, ``table1_gains``, ``table2``, ``table3``, ``table3_gains``, ``table4``,
``table7``, ``checks`` and ``published`` as ``.csv`` and ``.md``, and the PNGs of
:mod:`sera_core.report.plots`. With ``runs_dir`` your ``summary.json`` runs appear beside the paper's
as ``yours: <label>`` rows and bars. Every file is written atomically (a temporary
sibling renamed into place) and the same inputs give the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sera_core.report.plots import build_plots
from sera_core.report.runs import load_runs
from sera_core.report.tables import build_tables, to_csv, to_markdown
from sera_core.utils.jsonio import write_atomic


def build_report(out_dir: str | Path, runs_dir: str | Path | None = None) -> dict[str, Any]:
    """Write the report into ``out_dir`` and return ``{"files": [paths written, sorted],
    "runs": [your summaries, relative to runs_dir]}``.

    Raises :class:`~sera_core.report.checks.ReportError` when a published number
    disagrees with its recomputation, :class:`~sera_core.utils.errors.UserInputError` when a
    summary under ``runs_dir`` is malformed.
    """
    runs = load_runs(runs_dir) if runs_dir is not None else []
    contents: dict[str, bytes] = {}
    for table in build_tables(runs):
        contents[f"{table.name}.csv"] = to_csv(table).encode("utf-8")
        contents[f"{table.name}.md"] = to_markdown(table).encode("utf-8")
    contents.update(build_plots(runs))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        write_atomic(out / name, data)
    return {"files": sorted(str(out / name) for name in contents), "runs": [r.path for r in runs]}
