"""scripts/execution_curve.py's bookkeeping: the paired before/after of each finished seed, the
table and the figure (no model runs here: a seed takes most of an hour on 2 cores,
docs/measurements.md)."""

from __future__ import annotations

import argparse
import csv
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from sera_core.report.curves import curve2_figure, measured
from sera_core.report.plots import render

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
    assert "| 0 | 25% | 38% | +0.125 ± " in table and "| 2 / 1 (1) | 4,000 | 8 / 2 / 12 |" in table
    assert "| 3 / 0 (0.25) |" in table  # exact McNemar: 2 * (1/2)^3
    assert "| mean over 2 seeds (Student's t) | | | +0.250 ± 1.588 |" in table  # (1/8 + 3/8) / 2, t_{0.975, 1} * std / sqrt(2)
    # t1 gained in both seeds, then t2 (seed 0), t4 (lost in seed 0), t5 and t6 (seed 1)
    assert SCRIPT["moved"](results).splitlines()[2:] == [
        "| t1 | failed | 2 | 0 1 |", "| t2 | failed | 1 | 0 |", "| t4 | solved | 1 | 0 |", "| t5 | failed | 1 | 1 |",
        "| t6 | failed | 1 | 1 |"]
    assert SCRIPT["moved"](results) in table
    assert len(render(curve2_figure(results))) > 10_000
    (tmp_path / "figs").mkdir()  # --report writes the table and copies the figure and results under --name
    script = Path(__file__).resolve().parents[1] / "scripts" / "execution_curve.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--seeds", "0", "1", "2", "--report",
                    "--figures", str(tmp_path / "figs"), "--name", "curve_x"], check=True, capture_output=True)
    assert (tmp_path / "table.md").read_text() == table + "\n"
    assert json.loads((tmp_path / "figs" / "curve_x.json").read_text())["runs"][1]["seed"] == 1
    assert (tmp_path / "figs" / "curve_x.png").stat().st_size > 10_000


def test_a_before_of_the_same_start_tasks_and_settings_is_reused_and_any_other_is_refused(tmp_path):
    from dataclasses import replace

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
    start = {"spec": "vllm:runs/start", "adapter": {"adapter_sha256": "a" * 64, "recipe_hash": "r", "base": {}}}
    (tmp_path / "start.json").write_text(json.dumps(start))  # beside the sources: their OUT's start (bind_start)
    for name, words in [("other_policy", "other policy"), ("other_tasks", "other tasks"), ("other_steps", "other config"),
                        ("unfinished", "unfinished")]:
        with pytest.raises(SystemExit, match=words):
            SCRIPT["reuse_before"](tmp_path / name, tmp_path / name / "out", "vllm:runs/start", tasks, start)
        assert not (tmp_path / name / "out" / "before").exists()
    (tmp_path / "out").mkdir()
    shipped_since = start | {"adapter": start["adapter"] | {"adapter_sha256": "b" * 64}}  # same spec, other weights
    with pytest.raises(SystemExit, match="measured from vllm:runs/start, adapter aaaaaaaaaaaa .*not this folder's vllm:runs/start, adapter bbbbbbbbbbbb"):
        SCRIPT["reuse_before"](tmp_path / "good", tmp_path / "out", "vllm:runs/start", tasks, shipped_since)
    (tmp_path / "start.json").unlink()
    with pytest.raises(SystemExit, match="measured from an unrecorded start"):
        SCRIPT["reuse_before"](tmp_path / "good", tmp_path / "out", "vllm:runs/start", tasks, start)
    (tmp_path / "start.json").write_text(json.dumps(start))
    SCRIPT["reuse_before"](tmp_path / "good", tmp_path / "out", "vllm:runs/start", tasks, start)
    assert SCRIPT["collect"](tmp_path / "out", [0]) == {"tasks": 3, "runs": []}


def write_checkpoint(folder: Path, version: int) -> None:
    """A checkpoint folder as the trainer writes it: ``state.json`` naming its files by sha256."""
    from sera_core.utils.folders import sha256_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(f"weights of update {version}".encode())
    (folder / "state.json").write_text(json.dumps({
        "version": version, "files": {"model.safetensors": sha256_file(folder / "model.safetensors")},
        "config": {"model": "tiny"}, "counters": {}}))


def test_held_in_selection_stops_keeps_each_checkpoint_and_picks_the_best_latest_on_a_tie(tmp_path):
    assert SCRIPT["stops"](16, 4) == [4, 8, 12, 16] and SCRIPT["stops"](10, 4) == [4, 8, 10]
    assert SCRIPT["stops"](16, None) == [16] == SCRIPT["stops"](16, 16)
    assert SCRIPT["best_version"]({0: 5, 4: 7, 8: 7, 12: 3, 16: 6}) == 8  # 7 twice: the later of the two
    assert SCRIPT["best_version"]({0: 5, 4: 2, 8: 4}) == 0  # no checkpoint beat the start: keep the start
    run = tmp_path / "seed0"
    write_checkpoint(run / "train" / "checkpoint", 4)
    kept = SCRIPT["keep_checkpoint"](run, 4)
    assert kept == run / "v004" and (kept / "checkpoint" / "model.safetensors").read_bytes() == b"weights of update 4"
    assert not (kept / "partial").exists()
    write_checkpoint(run / "train" / "checkpoint", 8)  # the run trained on; the copy of update 4 stays as it was
    assert SCRIPT["keep_checkpoint"](run, 4) == kept
    assert (kept / "checkpoint" / "model.safetensors").read_bytes() == b"weights of update 4"
    with pytest.raises(SystemExit, match="at update 8, not 12"):  # update 12's checkpoint was never written
        SCRIPT["keep_checkpoint"](run, 12)
    assert not (run / "v012").exists()
    assert SCRIPT["trained_to"](run) == 8 and SCRIPT["trained_to"](tmp_path / "seed9") == 0
    args = argparse.Namespace(updates=4, select_every=None, max_craft_steps=None, start="tiny", set=[], val_curve=False)
    with pytest.raises(SystemExit, match="has trained 8 updates, more than --updates 4"):  # before any command runs
        SCRIPT["run_seed"](args, tmp_path, 0, tmp_path / "easy_val.jsonl")


def test_the_held_in_measures_are_tabled_with_the_checkpoint_kept(tmp_path):
    write_eval(tmp_path / "before", [True, False, False, False])
    (tmp_path / "select_tasks.jsonl").write_text("".join(json.dumps({"id": f"train.{i}"}) + "\n" for i in range(4)))
    write_eval(tmp_path / "select_start", [True, True, False, False])  # the start: 2 of 4
    for seed, solved in [(0, {4: [True, True, True, False], 8: [True, False, False, False]}),  # update 4: 3
                         (1, {4: [False, False, False, False], 8: [True, True, False, False]})]:  # none beats the start
        for version, outcomes in solved.items():
            write_eval(tmp_path / f"seed{seed}" / "select" / f"v{version:03d}", outcomes)
        write_eval(tmp_path / f"seed{seed}" / "after", [True, True, False, False])
        write_metrics(tmp_path / f"seed{seed}" / "train", 8)
    results = SCRIPT["collect"](tmp_path, [0, 1], [4, 8])
    assert [(r["held_in"], r["kept"]) for r in results["runs"]] == [({0: 2, 4: 3, 8: 1}, 4), ({0: 2, 4: 0, 8: 2}, 8)]
    assert results["select_tasks"] == 4
    table = SCRIPT["report"](results)
    assert "| seed | held-in solved of 4: the start | update 4 | update 8 | kept |" in table
    assert "| 0 | 2 | 3 | 1 | update 4 |" in table and "| 1 | 2 | 0 | 2 | update 8 |" in table
    assert "held_in" not in SCRIPT["collect"](tmp_path, [0], [])["runs"][0]  # without selection: no held-in columns
    assert "val_curve" not in results["runs"][0] and "val solved" not in table  # no --val-curve: no val column
    write_eval(tmp_path / "seed0" / "val" / "v008", [False, False, False, False])  # --val-curve: the one not kept
    with_val = SCRIPT["collect"](tmp_path, [0, 1], [4, 8])
    assert with_val["runs"][0]["val_curve"] == {0: 1, 4: 2, 8: 0}  # the start's before, update 4's after, update 8
    assert "val_curve" not in with_val["runs"][1]
    assert "| seed | val solved of 4 (chooses nothing): the start | update 4 | update 8 | kept |" in SCRIPT["report"](with_val)
    assert "| 0 | 1 | 2 | 0 | update 4 |" in SCRIPT["report"](with_val)
    assert len(render(curve2_figure(json.loads(json.dumps(with_val))))) > 10_000  # as read back from its JSON


def test_a_bad_selection_setting_fails_before_any_work(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "execution_curve.py"
    for bad in (["--select-every", "0"], ["--select-every", "17"]):
        done = subprocess.run([sys.executable, str(script), "--updates", "16", "--out", str(tmp_path / "out"), *bad],
                              capture_output=True, text=True)
        assert done.returncode == 2 and "--select-every must be between 1 and --updates (16)" in done.stderr
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), "--val-curve"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--val-curve measures the checkpoints that --select-every keeps" in done.stderr
    assert not (tmp_path / "out").exists()
    tasks = [{"id": f"train.{i}"} for i in range(10)]
    SCRIPT["write_select_tasks"](tmp_path / "held_in.jsonl", tasks, 4)
    assert [json.loads(line)["id"] for line in (tmp_path / "held_in.jsonl").open()] == [
        "train.0", "train.2", "train.5", "train.7"]  # i * 10 // 4
    with pytest.raises(SystemExit, match="between 1 and the 10 training tasks"):
        SCRIPT["write_select_tasks"](tmp_path / "more.jsonl", tasks, 11)


def test_the_val_tasks_can_match_the_training_curriculum_and_a_folder_keeps_its_tasks(tmp_path):
    every, matched = SCRIPT["easy_tasks"]("val", None), SCRIPT["easy_tasks"]("val", 3)
    assert all(t["misc"]["difficulty"] == "easy" for t in every)
    assert matched == [t for t in every if t["misc"]["num_craft_steps"] <= 3]  # file order kept
    assert 50 <= len(matched) < len(every) and {t["misc"]["num_craft_steps"] for t in matched} == {2, 3}
    assert SCRIPT["easy_tasks"]("train", 3)[0]["id"].startswith("textcraft_synth.train.")
    path = tmp_path / "easy_val.jsonl"
    SCRIPT["write_tasks"](path, matched[:50], "val tasks")
    SCRIPT["write_tasks"](path, matched[:50], "val tasks")  # the same selection again: kept as it is
    with pytest.raises(SystemExit, match="holds other val tasks than these options select"):
        SCRIPT["write_tasks"](path, every[:50], "val tasks")
    assert [json.loads(line)["id"] for line in path.open()] == [t["id"] for t in matched[:50]]
    assert measured({"tasks": 50, "args": {"val_max_craft_steps": 3}}) == "50 easy val tasks of <= 3 crafts"
    assert measured({"tasks": 50}) == "50 easy val tasks"
    script = Path(__file__).resolve().parents[1] / "scripts" / "execution_curve.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), "--val-max-craft-steps", "2"],
                          capture_output=True, text=True)  # 8 easy val tasks of 2 crafts, not the 50 asked for
    assert done.returncode == 1 and "--tasks 50: the val split has 8 easy tasks of these crafts" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_val_curve_measures_each_kept_checkpoint_but_the_one_kept_and_nothing_twice(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setitem(SCRIPT["run_seed"].__globals__, "sera", lambda *args: commands.append(args))  # the `sera` processes
    run = tmp_path / "seed0"
    write_checkpoint(run / "train" / "checkpoint", 8)  # trained to 8: no training command
    for version in (4, 8):
        write_checkpoint(run / f"v{version:03d}" / "checkpoint", version)
    write_eval(tmp_path / "select_start", [True, False])
    write_eval(run / "select" / "v004", [True, True])  # update 4 is kept
    write_eval(run / "select" / "v008", [False, False])
    write_eval(run / "after", [True, True])
    (run / "after" / "summary.json").write_text(json.dumps({"label": "execution curve, seed 0, update 4 of 8 (the best held-in)"}))
    args = argparse.Namespace(updates=8, select_every=4, max_craft_steps=None, start="tiny", set=[], val_curve=True)
    SCRIPT["run_seed"](args, tmp_path, 0, tmp_path / "easy_val.jsonl")
    assert len(commands) == 1 and commands[0][0] == "eval"  # update 8 only: update 4's is the "after"
    assert str(run / "v008") in commands[0][commands[0].index("--policy") + 1]
    assert commands[0][commands[0].index("--out") + 1] == str(run / "val" / "v008")
    write_eval(run / "val" / "v008", [False, True])
    commands.clear()
    SCRIPT["run_seed"](args, tmp_path, 0, tmp_path / "easy_val.jsonl")
    assert commands == []  # finished: nothing runs again


def test_a_protocol_binds_the_folder_and_a_changed_one_is_refused_before_any_work(tmp_path):
    """``--protocol learning``: the before/after tasks are the protocol set's, written with the
    folder's ``protocol.json``; the same folder run against another set stops before any model
    runs, naming the difference (the ``sera`` commands are never reached: ``--report`` aside,
    the refusal comes first)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "execution_curve.py"
    out = tmp_path / "curve"
    done = subprocess.run([sys.executable, str(script), "--out", str(out), "--protocol", "learning", "--report"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    bound = json.loads((out / "protocol.json").read_text())
    assert (bound["name"], bound["set"], bound["role"], bound["tasks"]) == ("learning", "textcraft_easy_dev", "dev", 50)
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"] == bound and "--protocol learning" in results["command"]
    refused = subprocess.run([sys.executable, str(script), "--out", str(out), "--protocol", "learning", "--measure",
                              "textcraft_easy_test"], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "measures set 'textcraft_easy_dev' of learning, not 'textcraft_easy_test'" in refused.stderr
    assert not (out / "before").exists()


def test_a_training_override_given_to_the_script_wins_over_its_defaults(tmp_path, monkeypatch):
    """``--set difficulties=[medium]`` (``make learning-dev-curve2-medium``): the seed's ``sera train``
    command ends with it, and the CLI reads the last setting of a key, so the run trains on medium
    tasks instead of the script's easy ones."""
    from sera_core.cli import _setting, build_parser

    commands = []
    monkeypatch.setitem(SCRIPT["run_seed"].__globals__, "sera", lambda *args: commands.append(args))
    args = argparse.Namespace(updates=2, select_every=None, max_craft_steps=None, start="tiny",
                              set=["difficulties=[medium]"], val_curve=False)
    SCRIPT["run_seed"](args, tmp_path, 0, tmp_path / "medium_val.jsonl")
    train = build_parser().parse_args(list(commands[0]))
    assert train.command == "train" and dict(_setting(s) for s in train.set)["difficulties"] == ["medium"]
    assert commands[1][0] == "eval"  # then the after, on the tasks given
