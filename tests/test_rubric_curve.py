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
    shipped = {"spec": "vllm:tiny", "adapter": {"adapter_sha256": "a" * 64, "recipe_hash": "r", "base": {}}}
    with pytest.raises(SystemExit, match="holds runs from an unrecorded start, not this folder's vllm:tiny, adapter aaaaaaaaaaaa"):  # nor runs from another adapter
        SCRIPT["kept_runs"](kept_path, args, None, shipped)


def test_held_out_points_by_protocol_ids_and_their_overlap_with_the_training_pool(tmp_path):
    """Held-out points built on named medium val tasks (a protocol's set) come from those tasks
    only; a missing id is named; the overlap counts the held-out points whose subtask text a
    training point also delegates (all of them, against themselves)."""
    from sera_core.eval.protocol import load_protocol
    from sera_core.tiny.rubric_stage import RubricStageConfig, heldout_set, stage_points, subtask_overlap

    ids = load_protocol("learning")["sets"]["points_test"]["ids"][:3]
    cfg = RubricStageConfig(heldout_ids=ids, points_dir=str(tmp_path))
    points = heldout_set(cfg, "textcraft")
    assert points and {p.task_id for p in points} <= set(ids)
    assert (tmp_path / f"heldout_textcraft_{cfg.heldout_name}.jsonl").exists() and cfg.heldout_name.startswith("ids")
    assert RubricStageConfig().heldout_name == "24"  # the default set's cached files keep their names
    pool = stage_points("textcraft", "train", 4, tmp_path / "pool.jsonl")
    both = subtask_overlap(points, points)
    assert both["points"] == both["shared"] == len(points) and both["subtasks_shared"] >= 1
    against_pool = subtask_overlap(points, pool)
    assert against_pool["points"] == len(points) and 0 <= against_pool["shared"] <= len(points)
    with pytest.raises(ValueError, match="textcraft_synth.val.999999"):
        stage_points("textcraft", "val", ["textcraft_synth.val.999999"], tmp_path / "missing.jsonl")


def test_a_protocol_binds_the_curve_folder_and_its_record(tmp_path):
    """``--protocol learning --report``: the folder is bound to the curve-1 dev set, and the
    results record the protocol and the command; a kept record from no protocol is refused."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "rubric_curve.py"
    out = tmp_path / "curve"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--protocol", "learning", "--report", "--keep", ""],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((out / "results.json").read_text())
    assert record["protocol"]["set"] == "points_dev" and record["protocol"]["role"] == "dev"
    assert "--protocol learning" in record["command"] and record["overlap"] is None  # no points built yet
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"args": vars(args_for(tmp_path)), "results": {}}))
    with pytest.raises(SystemExit, match="measured under protocol None"):
        SCRIPT["kept_runs"](kept, args_for(tmp_path), record["protocol"])
