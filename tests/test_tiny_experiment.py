"""scripts/tiny_experiment.py's bookkeeping: the arms' schedules, the committed records that let
the ablation continue on a fresh machine, and the table (no model runs here: the experiment
itself takes hours, docs/measurements.md)."""

from __future__ import annotations

import argparse
import json
import runpy
from pathlib import Path

import pytest

SCRIPT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "scripts" / "tiny_experiment.py"))


def args_for(tmp_path: Path, **overrides) -> argparse.Namespace:
    values = {"seeds": [0, 1, 2], "arms": ["sera", "sera_wo_rt"], "updates": 4, "ratio": "2:1:1", "difficulties": ["easy"],
              "before_seeds": [0], "points_tasks": 24, "eval_tasks": 50, "eval_levels": ["easy"], "eval_max_new_tokens": 256,
              "out": str(tmp_path / "runs"), "keep": str(tmp_path / "keep"), "warm_start": "tiny", "protocol_record": None,
              "start": {"spec": "tiny", "adapter": {"adapter_sha256": "a" * 64, "recipe_hash": "r", "base": {}}}}
    return argparse.Namespace(**(values | overrides))


def record(args, seed: int, accuracy: float, success: float, tokens: dict | None = None) -> dict:
    row = {"settings": SCRIPT["settings"](args), "seed": seed, "points": {"pairwise_accuracy": accuracy, "ranking_loss": 0.2},
           "root_success": success, "by_difficulty": {"easy": 100 * success}, "seconds": 1200.0}
    if tokens is not None:
        row |= {"tokens_by_stage": tokens, "mixed_group_share": 0.5, "delegations_per_tree": 1.0,
                "seconds_per_update": 300.0, "curve_tokens": [1, 2, 3, 4]}
    return row


def test_the_arms_share_a_budget_and_only_sera_trains_rubrics():
    schedule = SCRIPT["schedule"]
    assert schedule("sera", "2:1:1") == "execution:2,delegation:1,rubric_generation:1"
    assert schedule("sera_wo_rt", "2:1:1") == "execution:2,delegation:1"
    assert schedule("sera", "8:0:1") == "execution:8,rubric_generation:1"
    assert schedule("rao", "2:1:1") is None  # RAO's config has its one stage


def test_kept_records_make_the_table_and_other_settings_stop_before_any_work(tmp_path):
    args = args_for(tmp_path)
    keep = Path(args.keep)
    keep.mkdir()
    rows = {"before_seed0": record(args, 0, 0.5, 0.30),
            "sera_seed0": record(args, 0, 0.5, 0.20, {"execution": 100, "rubric_generation": 30}),
            "sera_seed1": record(args, 1, 0.6, 0.30, {"execution": 300, "rubric_generation": 10}),
            "sera_wo_rt_seed2": record(args, 2, 0.5, 0.25, {"execution": 50, "delegation": 7})}
    for name, row in rows.items():
        (keep / f"{name}.json").write_text(json.dumps(row))
    results = SCRIPT["collect"](args, run_missing=False)  # reads the kept records, runs nothing
    assert [r["seed"] for r in results["sera"]] == [0, 1] and [r["seed"] for r in results["sera_wo_rt"]] == [2]
    assert len(results["before"]) == 1 and results["rao"] == []
    lines = SCRIPT["report"](results).splitlines()
    sera = next(line for line in lines if line.startswith("| SERA |"))
    # mean ± the 95% Student's t half interval over seeds (t_{0.975, 1} = 12.706: 12.706 * 0.0707 / sqrt 2);
    # medium was not evaluated; tokens per stage averaged over seeds
    assert "| 2 | 0.550 ± 0.635 |" in sera and "| 0.250 ± 0.635 | 0.250 ± 0.635 | - | 200 / 0 / 20 |" in sera
    assert "| SERA w/o RT | 1 | 0.500 |" in "\n".join(lines) and sera.endswith("| 20 / 20 |")  # 4 updates x 300 s; 1,200 s
    assert next(line for line in lines if line.startswith("| warm start")).endswith("| - | - | - / 20 |")
    # a record made with another budget is never mixed into the table
    stale = record(args_for(tmp_path, updates=10), 1, 0.9, 0.9, {"execution": 1})
    (keep / "sera_wo_rt_seed1.json").write_text(json.dumps(stale))
    with pytest.raises(SystemExit, match="'updates': 10"):
        SCRIPT["collect"](args, run_missing=True)
    assert not Path(args.out).exists()  # stopped before any work


def test_another_warm_start_is_measured_apart_from_the_shipped_one(tmp_path, monkeypatch):
    """``--warm-start`` names the measured adapter in its records' settings, so its measures never
    mix with the shipped adapter's; with an arm to train it stops before any work."""
    shipped, rebuilt = args_for(tmp_path), args_for(tmp_path, warm_start="vllm:/adapters/rebuilt")
    assert "warm_start" not in SCRIPT["settings"](shipped)  # the records kept so far stay valid
    Path(shipped.keep).mkdir()
    (Path(shipped.keep) / "before_seed0.json").write_text(json.dumps(record(rebuilt, 0, 0.7, 0.4)))
    with pytest.raises(SystemExit, match="vllm:/adapters/rebuilt"):
        SCRIPT["collect"](shipped, run_missing=False)
    monkeypatch.setattr("sys.argv", ["tiny_experiment.py", "--warm-start", "vllm:/x", "--arms", "sera", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit) as stop:
        SCRIPT["main"]()
    assert stop.value.code == 2 and not (tmp_path / "o").exists()


def test_a_unit_runs_in_its_own_process_and_its_failure_stops_the_script():
    """Each model's unit runs in a fresh spawned process (the script's ``isolated``): its exit
    code reaches the parent, a failure as SystemExit naming it."""
    import sys

    SCRIPT["isolated"](sys.exit, 0)
    with pytest.raises(SystemExit, match=r"exit.* failed \(exit code 3\); run the script again"):
        SCRIPT["isolated"](sys.exit, 3)


def test_a_protocol_binds_the_folder_and_joins_the_settings_a_kept_record_must_match(tmp_path, monkeypatch):
    """``--protocol learning``: the folder is bound to the ablation's points set and the eval set
    before any work, and a record kept under no protocol does not enter the protocol's table."""
    from sera_core.eval.protocol import bind_protocol

    bound = bind_protocol(tmp_path / "runs", "learning", "points_dev", "textcraft_easy_dev")
    assert bound["set"] == "points_dev+textcraft_easy_dev" and bound["role"] == "dev+dev" and bound["tasks"] == 74
    under = args_for(tmp_path, protocol_record=bound)
    assert SCRIPT["settings"](under)["protocol"] == [bound["hash"], bound["set"], "dev+dev"]
    assert SCRIPT["settings"](under)["start"] == "a" * 64  # a record from another adapter is not reused
    other = args_for(tmp_path, protocol_record=bound, start={"spec": "tiny", "adapter": {"adapter_sha256": "b" * 64}})
    assert SCRIPT["settings"](other) != SCRIPT["settings"](under)
    assert "start" not in SCRIPT["settings"](args_for(tmp_path))  # the records kept before the protocol stay valid
    Path(under.keep).mkdir()
    (Path(under.keep) / "before_seed0.json").write_text(json.dumps(record(args_for(tmp_path), 0, 0.5, 0.3)))
    with pytest.raises(SystemExit, match="pass the same settings"):
        SCRIPT["collect"](under, run_missing=False)
    monkeypatch.setattr("sys.argv", ["tiny_experiment.py", "--protocol", "learning", "--points-set", "points_test",
                                     "--out", str(tmp_path / "runs"), "--report"])
    with pytest.raises(Exception, match="measures set 'points_dev\\+textcraft_easy_dev' of learning"):
        SCRIPT["main"]()
