"""scripts/rubric_curve.py's bookkeeping: finished runs in OUT and the committed record that lets
curve 1 continue on a fresh machine (no model runs here: a run takes half an hour,
docs/measurements.md)."""

from __future__ import annotations

import argparse
import csv
import json
import runpy
from pathlib import Path

import pytest

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "rubric_curve.py"))


def args_for(tmp_path: Path, **overrides) -> argparse.Namespace:
    values = {"arms": ["rubric_scorer"], "seeds": [0, 1, 2], "updates": 6, "points_per_update": 4, "eval_every": 6,
              "score_calls": 4, "lr": None, "config": "textcraft/sera_tiny.yaml", "out": str(tmp_path / "runs")}
    return argparse.Namespace(**(values | overrides))


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def finished(out: Path, arm: str, seed: int, end: float, last: int = 6) -> None:
    """A run folder whose held-out measure reached update ``last`` with pairwise accuracy ``end``."""
    held = [{"version": v, "pairwise_accuracy": a, "seconds": 60} for v, a in ((0, 0.5), (last, end))]
    write_rows(out / f"{arm}_seed{seed}" / "heldout.csv", held)
    write_rows(out / f"{arm}_seed{seed}" / "updates.csv", [{"version": v, "seconds": 120} for v in range(last)])


def test_a_committed_record_fills_the_seeds_a_fresh_machine_lacks(tmp_path):
    args = args_for(tmp_path)
    out = Path(args.out)
    finished(out, "rubric_scorer", 2, 0.55)  # this machine's run
    finished(out, "rubric_scorer", 1, 0.9, last=3)  # unfinished here: the kept record stands in
    kept_path = tmp_path / "rubric_curve.json"
    old = {"seed": 0, "heldout": [{"version": 0.0, "pairwise_accuracy": 0.5}], "updates": [], "seconds": 1.0}
    kept_path.write_text(json.dumps({"args": vars(args) | {"report": True},
                                     "results": {"rubric_scorer": [old, old | {"seed": 1}, old | {"seed": 2}]}}))
    kept = SCRIPT["kept_runs"](kept_path, args)
    assert sorted(kept) == [("rubric_scorer", 0), ("rubric_scorer", 1), ("rubric_scorer", 2)]
    results = SCRIPT["collect"](out, args.arms, args.seeds, args.updates, kept)
    runs = results["rubric_scorer"]
    assert [r["seed"] for r in runs] == [0, 1, 2]
    assert runs[0] is kept["rubric_scorer", 0] and runs[1] is kept["rubric_scorer", 1]
    assert runs[2]["heldout"][-1]["pairwise_accuracy"] == 0.55  # a finished local run wins over the record
    assert runs[2]["seconds"] == 6 * 120 + 60  # its updates and its measures after the start
    assert SCRIPT["collect"](out, args.arms, args.seeds, args.updates, {})["rubric_scorer"] == [runs[2]]
    assert SCRIPT["kept_runs"](tmp_path / "none.json", args) == {}
    with pytest.raises(SystemExit, match="'updates': 6"):  # another budget never enters the table
        SCRIPT["kept_runs"](kept_path, args_for(tmp_path, updates=20))
