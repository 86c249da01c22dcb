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
    # t1 gained in both seeds, then t2 (seed 0), t4 (lost in seed 0), t5 and t6 (seed 1)
    assert SCRIPT["moved"](results).splitlines()[2:] == [
        "| t1 | failed | 2 | 0 1 |", "| t2 | failed | 1 | 0 |", "| t4 | solved | 1 | 0 |", "| t5 | failed | 1 | 1 |",
        "| t6 | failed | 1 | 1 |"]
    assert SCRIPT["moved"](results) in table
    SCRIPT["figure"](results, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 10_000


def test_a_before_of_the_same_start_tasks_and_settings_is_reused_and_any_other_is_refused(tmp_path):
    from dataclasses import replace

    import pytest

    from sera_core.eval.evaluator import EvalConfig, eval_plan

    tasks = tmp_path / "easy_val.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(3)))
    cfg = EvalConfig(env="textcraft", policy="vllm:runs/start", label="before")
    ids = ["t0", "t1", "t2"]
    for name, plan in [("good", eval_plan(cfg, ids, 1)),
                       ("other_policy", eval_plan(replace(cfg, policy="vllm:x"), ids, 1)),
                       ("other_tasks", eval_plan(cfg, ids[:2], 1)),
                       ("other_steps", eval_plan(replace(cfg, max_steps_per_agent=12), ids, 1)),
                       ("unfinished", eval_plan(cfg, ids, 1))]:
        write_eval(tmp_path / name, [True, False, True][:len(plan["tasks"])])
        (tmp_path / name / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "unfinished" / "summary.json").unlink()
    for name, words in [("other_policy", "other policy"), ("other_tasks", "other tasks"), ("other_steps", "other config"),
                        ("unfinished", "unfinished")]:
        with pytest.raises(SystemExit, match=words):
            SCRIPT["reuse_before"](tmp_path / name, tmp_path / name / "out", "vllm:runs/start", tasks)
        assert not (tmp_path / name / "out" / "before").exists()
    (tmp_path / "out").mkdir()
    SCRIPT["reuse_before"](tmp_path / "good", tmp_path / "out", "vllm:runs/start", tasks)
    assert SCRIPT["collect"](tmp_path / "out", [0]) == {"tasks": 3, "runs": []}
