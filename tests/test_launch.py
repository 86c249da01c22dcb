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


def test_update_budget_counts_the_rubric_stage_branches_and_the_token_ceilings():
    """The paper's TextCraft config: 8 x 8 trees; a rubric update opens at most 16 // 8 = 2
    groups per tree, replaying 7 children each; an agent generates at most 20 x 512 tokens."""
    from sera_core.train.launch import update_budget
    from sera_core.train.trainer import plan

    cfg = load_config(CONFIGS / "textcraft" / "sera_full.yaml")
    rows = {r["stage"]: r for r in update_budget(cfg)}
    assert list(rows) == ["execution", "delegation", "rubric_generation"]
    assert [rows[s]["trains"] for s in rows] == ["execution", "launch", "rubric"]
    assert [rows[s]["updates_in_run"] for s in rows] == [202, 24, 24]  # 250 updates of 16:2:2
    rubric, execution = rows["rubric_generation"], rows["execution"]
    assert (rubric["groups"], rubric["forked_runs"], rubric["branch_labels"], rubric["detached_scores"]) == (128, 896, 1024, 896)
    assert execution["groups"] == execution["forked_runs"] == rows["delegation"]["branch_labels"] == 0
    assert execution["episode_tokens"] == 10240 and execution["trained_tokens_max"] == plan(cfg)["tokens_per_update_max"]
    assert rubric["generated_tokens_max"] == (64 + 896) * 10240 and rubric["trained_tokens_max"] == 128 * 1024
    assert rows["delegation"]["trained_tokens_max"] is None
    measured = {r["stage"]: r for r in update_budget(cfg, agents_per_tree=12.5)}
    assert measured["execution"]["agent_runs"] == 800 and measured["execution"]["trained_tokens_max"] == 800 * 10240
    # fewer branches: more groups fit under the cap, each replaying fewer children
    four = {r["stage"]: r for r in update_budget(cfg.replace(counterfactual=4))}["rubric_generation"]
    assert (four["groups"], four["forked_runs"], four["branch_labels"]) == (256, 768, 1024)
    # TextWorld: 3,072 tokens a turn, capped by the 13,312-token context
    assert update_budget(load_config(CONFIGS / "textworld" / "sera_full.yaml"))[0]["episode_tokens"] == 13312
    assert [r["stage"] for r in update_budget(load_config(CONFIGS / "textcraft" / "sera_wo_d_rt_full.yaml"))] == ["execution"]
