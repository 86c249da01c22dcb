"""scripts/execution_curve.py's bookkeeping: the paired before/after of each finished seed, the
table and the figure (no model runs here: a seed takes most of an hour on 2 cores,
docs/measurements.md)."""

from __future__ import annotations

import csv
import json
import runpy
from pathlib import Path

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "execution_curve.py"))


def write_eval(folder: Path, outcomes: list[bool]) -> None:
    """An evaluation folder as ``sera eval`` leaves it: one row per task in ``seed0.jsonl`` and a summary."""
    folder.mkdir(parents=True)
    rows = [{"task_id": f"t{i}", "success": ok, "error": None, "seconds": 10.0} for i, ok in enumerate(outcomes)]
    (folder / "seed0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text("{}")


def write_metrics(folder: Path, updates: int) -> None:
    folder.mkdir(parents=True)
    with (folder / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["version", "stage", "root_success", "tokens_trained", "seconds_generation",
                                          "seconds_update", "seconds"])
        w.writeheader()
        w.writerows({"version": v, "stage": "execution", "root_success": 0.25, "tokens_trained": 1000,
                     "seconds_generation": 120, "seconds_update": 30, "seconds": 180} for v in range(updates))


def test_each_finished_seed_is_paired_task_by_task_with_the_start(tmp_path):
    before = [True, False, False, False, True, False, False, False]
    write_eval(tmp_path / "before", before)
    write_eval(tmp_path / "seed0" / "after", [True, True, True, False, False, False, False, False])  # +2, -1
    write_metrics(tmp_path / "seed0" / "train", 4)
    write_eval(tmp_path / "seed1" / "after", [True, True, False, False, True, True, True, False])  # +3
    write_metrics(tmp_path / "seed1" / "train", 4)
    write_metrics(tmp_path / "seed2" / "train", 2)  # still training: no "after" yet, not in the table
    results = SCRIPT["collect"](tmp_path, [0, 1, 2])
    assert results["tasks"] == 8 and [r["seed"] for r in results["runs"]] == [0, 1]
    first = results["runs"][0]["change"]
    assert (first["gained"], first["lost"]) == (2, 1) and first["difference"]["rate"] == 1 / 8
    assert first["before"]["rate"] == 2 / 8 and first["after"]["rate"] == 3 / 8
    assert results["runs"][1]["change"]["difference"]["rate"] == 3 / 8
    table = SCRIPT["report"](results)
    assert "| 0 | 25% | 38% | +0.125 ± " in table and "| 2 / 1 | 4,000 | 8 / 2 / 12 |" in table
    assert "| mean over 2 seeds | | | +0.250 ± 0.245 |" in table  # (1/8 + 3/8) / 2, 1.96 * std / sqrt(2)
    SCRIPT["figure"](results, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 10_000
