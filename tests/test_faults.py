"""Faults during a run: a real ``sera eval`` process killed (SIGKILL) at generated points
resumes to the uninterrupted result, with nothing lost and nothing counted twice.

The kill points are fractions of the uninterrupted run's own wall time (seeded), so they
fall before the first row, between rows and while rows are being written; a half-written
last line is dropped on reopening (``JsonlCheckpoint``)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import write_train_config

SERA = [sys.executable, "-m", "sera_core"]


def _eval(tasks: Path, out: Path, *extra: str) -> list[str]:
    return [*SERA, "eval", "--env", "textcraft", "--tasks", str(tasks), "--policy", "expert", "--noise", "0.15",
            "--concurrency", "2", "--out", str(out), *extra]


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def _kept_rows(path: Path) -> int:
    """Whole JSON rows in ``path`` (0 when it does not exist yet; a half-written last line does not count)."""
    return sum(map(_is_object, path.read_text().splitlines())) if path.exists() else 0


def _summary(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in summary.items() if k not in ("rollout_seconds",)}


@pytest.mark.timeout(900)
def test_a_killed_evaluation_resumes_to_the_uninterrupted_result(tmp_path, val_tasks):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tasks = tmp_path / "tasks.jsonl"
    picked = [t for d in ("easy", "medium", "hard") for t in [x for x in val_tasks if x["misc"]["difficulty"] == d][:3]]
    tasks.write_text("".join(json.dumps(t) + "\n" for t in picked))
    subprocess.run(_eval(tasks, tmp_path / "ref"), env=env, check=True, capture_output=True, timeout=600)
    reference = _summary(tmp_path / "ref")
    assert 0 < reference["average"]["mean"] < 100  # a mix of outcomes: a lost or doubled row would show
    rng = random.Random(19)
    killed = 0
    for k in range(3):
        out = tmp_path / f"run{k}"
        rows = out / "seed0.shard0of1.jsonl"
        target = rng.randint(1, len(picked) - 1)  # kill once this many rows are kept (not after a wall time: CI's load varies)
        proc = subprocess.Popen(_eval(tasks, out), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and _kept_rows(rows) < target:
            time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
        before = _kept_rows(rows)
        done = subprocess.run(_eval(tasks, out, "--resume"), env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert _summary(out) == reference  # the same result: nothing lost, nothing counted twice
        lines = (out / "seed0.jsonl").read_text().splitlines()
        assert sorted(json.loads(ln)["task_id"] for ln in lines) == sorted(t["id"] for t in picked)
        assert json.loads(done.stdout.strip().splitlines()[-1])["played"] <= len(picked) - min(before, len(picked))
    assert killed >= 2  # the kills landed while the run was going


def _train_config(tmp_path: Path, out: Path, schedule: str = "execution:1") -> Path:
    """The tiny SERA config (tests/tiny_run.py), a checkpoint after every update."""
    return write_train_config(tmp_path, out, checkpoint_every=1, schedule=schedule, max_new_tokens=32,
                              max_steps_per_agent=2, filter_zero_variance=False)


def _rows(out: Path) -> list[dict]:
    """The rows of the run's ``metrics.csv``, every column (timings included)."""
    import csv

    with (out / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _metrics(out: Path) -> list[dict]:
    """The rows of the run's ``metrics.csv`` without the timings (which no two runs share)."""
    return [{k: v for k, v in row.items() if not k.startswith("seconds")} for row in _rows(out)]


@pytest.mark.timeout(1200)
def test_a_killed_training_run_resumes_to_the_uninterrupted_weights_and_metrics(tmp_path):
    """``sera train`` killed (SIGKILL) at seeded points of a 4-update run, then ``--resume``d
    until it finishes: the resumed process runs only the updates after the checkpoint (rows
    past it are replayed, never doubled; rows before it are left as they were), and the final
    weights and every metrics row equal the uninterrupted run's."""
    from sera_core.policy.checkpoints import read_checkpoint

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    schedule = "execution:2,delegation:1,rubric_generation:1"
    ref_cfg = _train_config(tmp_path, tmp_path / "ref", schedule)
    subprocess.run([*SERA, "train", "--config", str(ref_cfg), "--total-updates", "4"], env=env, check=True,
                   capture_output=True, timeout=900)
    reference = read_checkpoint(tmp_path / "ref" / "checkpoint")["files"]
    rng = random.Random(7)
    for k in range(2):
        cfg = _train_config(tmp_path, tmp_path / f"run{k}", schedule)
        cmd = [*SERA, "train", "--config", str(cfg), "--total-updates", "4", "--resume"]
        metrics, target = tmp_path / f"run{k}" / "metrics.csv", rng.randint(2, 3)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # kill after `target` updates' rows plus a seeded moment (not after a wall time: CI's load varies)
        while proc.poll() is None and (not metrics.exists() or len(metrics.read_text().splitlines()) - 1 < target):
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL  # killed mid-run, not after it finished
        kept = read_checkpoint(tmp_path / f"run{k}" / "checkpoint")["version"]
        assert kept >= 1  # at least `target` - 1 updates were checkpointed (all 4 when it was killed on its way out)
        checkpointed = _rows(tmp_path / f"run{k}")[:kept]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        # it continued from the checkpoint: a run restarted from update 0 would reach the same
        # weights and metrics (every draw is seeded), but it would run all 4 updates and
        # rewrite the checkpointed updates' rows with new timings
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert (summary["updates"], summary["version"]) == (4 - kept, 4)
        after = _rows(tmp_path / f"run{k}")
        assert [r["version"] for r in after] == ["0", "1", "2", "3"]  # none missing, none twice
        assert after[:kept] == checkpointed  # as the killed process wrote them, timings included
        assert read_checkpoint(tmp_path / f"run{k}" / "checkpoint")["files"] == reference  # the same weights (sha256)
        assert _metrics(tmp_path / f"run{k}") == _metrics(tmp_path / "ref")


def _file_size_limit(limit: int):
    """In the child: writes past ``limit`` bytes fail with EFBIG (the kernel's limit, a real fault)."""
    import resource

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.timeout(900)
def test_a_checkpoint_write_that_fails_keeps_the_previous_checkpoint_and_says_why(tmp_path):
    """``sera train`` whose checkpoint write hits a file-size limit (as a full disk would):
    exit 2 with one JSON line naming the checkpoint and the kept update; the previous
    checkpoint is whole (its hashes check) and no half-written folder is left; a rerun
    without the limit resumes from it."""
    from sera_core.policy.checkpoints import read_checkpoint

    cfg = _train_config(tmp_path, tmp_path / "run")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run([*SERA, "train", "--config", str(cfg), "--total-updates", "1"], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    ckpt = tmp_path / "run" / "checkpoint"
    size = (ckpt / "model.safetensors").stat().st_size
    failed = subprocess.run([*SERA, "train", "--config", str(cfg), "--total-updates", "2", "--resume"], env=env,
                            capture_output=True, text=True, timeout=600, preexec_fn=_file_size_limit(size // 2))
    assert failed.returncode == 2, failed.stdout[-2000:] + failed.stderr[-2000:]
    error = json.loads(failed.stdout.strip().splitlines()[-1])["error"]
    assert "could not write the checkpoint of update 2" in error and "previous one (update 1) is intact" in error
    assert read_checkpoint(ckpt)["version"] == 1  # whole: every file's hash checks
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    again = subprocess.run([*SERA, "train", "--config", str(cfg), "--total-updates", "2", "--resume"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert read_checkpoint(ckpt)["version"] == 2
