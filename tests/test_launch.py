"""The commands of a whole run (notebook 11, ``make train-full``) and running them with live output."""

from __future__ import annotations

import sys

import pytest

from sera_core.train.config import CONFIGS, load_config
from sera_core.train.launch import eval_command, export_command, run_command, tasks_command, train_command


def test_full_configs_launch_through_accelerate_with_the_shipped_fsdp_config():
    cfg = load_config(CONFIGS / "textcraft" / "sera_full.yaml")
    cmd = train_command(cfg, "cfg.yaml", num_machines=2, machine_rank=1, main_process_ip="10.0.0.1", resume=True)
    assert cmd[:2] == ["accelerate", "launch"]
    assert cmd[-6:] == ["-m", "sera_core", "train", "--config", "cfg.yaml", "--resume"]
    flags = dict(zip(cmd[2:-6:2], cmd[3:-6:2], strict=True))
    assert flags["--config_file"] == str(CONFIGS / "accelerate" / "2x8xh200.yaml")
    assert flags["--num_processes"] == "16" and flags["--num_machines"] == "2" and flags["--machine_rank"] == "1"
    assert flags["--main_process_ip"] == "10.0.0.1"
    plain = train_command(cfg, "cfg.yaml")
    assert "--num_machines" not in plain and plain[plain.index("--num_processes") + 1] == "16"
    with pytest.raises(ValueError, match="main_process_ip"):
        train_command(cfg, "cfg.yaml", num_machines=2)


def test_tiny_configs_run_plainly_and_the_other_commands():
    cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml")
    assert train_command(cfg, "t.yaml", out="o") == [sys.executable, "-m", "sera_core", "train", "--config", "t.yaml", "--out", "o"]
    assert tasks_command("textworld", "t.jsonl")[3:] == ["tasks", "--env", "textworld", "--split", "test", "--out", "t.jsonl"]
    assert export_command("run", "hf")[3:] == ["export", "--run", "run", "--out", "hf"]
    assert train_command(cfg, "t.yaml", total_updates=2)[-2:] == ["--total-updates", "2"]
    ev = eval_command(cfg, "hf", "t.jsonl", "ev", label="tiny", seeds=3, limit=40)
    assert ev[-2:] == ["--limit", "40"]
    assert ev[ev.index("--policy") + 1] == "vllm:hf" and ev[ev.index("--seeds") + 1] == "3" and ev[ev.index("--method") + 1] == "sera"
    ev = eval_command(cfg.replace(backend="hf"), "hf", "t.jsonl", "ev", label="tiny")
    assert ev[ev.index("--policy") + 1] == "hf:hf"
    full = load_config(CONFIGS / "textworld" / "sera_full.yaml")
    ev = eval_command(full, "m", "t", "e", label="x")
    assert ev[ev.index("--policy") + 1] == "vllm:m"


def test_run_command_streams_lines_and_progress_and_reports_failures(tmp_path):
    seen = []
    script = "import sys; print('a'); sys.stdout.write('10%\\r50%\\r100%\\n'); print('done', file=sys.stderr)"
    run_command([sys.executable, "-c", script], tmp_path / "log.txt", echo=seen.append)
    assert seen == ["a", "10%", "50%", "100%", "done"]
    log = (tmp_path / "log.txt").read_text().splitlines()
    assert log[0].startswith("$ ") and log[1:] == seen
    with pytest.raises(RuntimeError, match="exit 3") as err:
        run_command([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "log.txt", echo=seen.append)
    assert "boom" in str(err.value)
