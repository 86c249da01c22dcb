"""The ``sera`` command end to end (real subprocesses, real files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sera_core.cli import main

SERA = [sys.executable, "-m", "sera_core"]


def run(args, env=None, check=True):
    out = subprocess.run(SERA + args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if check:
        assert out.returncode == 0, out.stderr + out.stdout
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def test_tasks_is_byte_identical_across_runs_and_hash_seeds(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _, summary = run(["tasks", "--env", "textcraft", "--split", "val", "--out", str(a)], env={"PYTHONHASHSEED": "1"})
    run(["tasks", "--env", "textcraft", "--split", "val", "--out", str(b)], env={"PYTHONHASHSEED": "987"})
    assert a.read_bytes() == b.read_bytes()
    assert summary["command"] == "tasks" and summary["tasks"] == 632
    assert {d: s["tasks"] for d, s in summary["stats"].items()} == {"easy": 147, "medium": 213, "hard": 136, "extreme": 136}
    assert len(a.read_text().splitlines()) == 632


def test_tasks_of_one_difficulty_are_the_split_s_tasks_of_that_level_in_order(tmp_path, capsys):
    whole, easy = tmp_path / "val.jsonl", tmp_path / "easy.jsonl"
    assert main(["tasks", "--split", "val", "--out", str(whole)]) == 0
    assert main(["tasks", "--split", "val", "--difficulty", "easy", "--limit", "8", "--out", str(easy)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = [ln for ln in whole.read_text().splitlines() if json.loads(ln)["misc"]["difficulty"] == "easy"]
    assert easy.read_text().splitlines() == lines[:8] and summary["tasks"] == 8
    assert main(["tasks", "--split", "val", "--difficulty", "easy", "--difficulty", "medium", "--out", str(easy)]) == 0
    assert len(easy.read_text().splitlines()) == 147 + 213
    assert main(["tasks", "--split", "val", "--difficulty", "trivial", "--out", str(easy)]) == 2  # not a level


def test_solve_ends_with_a_json_summary(tmp_path, capsys):
    tasks = tmp_path / "val.jsonl"
    assert main(["tasks", "--split", "val", "--limit", "12", "--out", str(tasks)]) == 0
    capsys.readouterr()
    rows = tmp_path / "rows.jsonl"
    assert main(["solve", "--env", "textcraft", "--tasks", str(tasks), "--mode", "delegate", "--out", str(rows)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["command"] == "solve" and summary["tasks"] == 12 and summary["passed"] == 12
    assert sum(v["tasks"] for v in summary["by_difficulty"].values()) == 12
    assert summary["agents"] > 12  # delegate mode spawned children
    assert len(rows.read_text().splitlines()) == 12


def test_solve_official_samples_report_pass(official_dir):
    sample = official_dir / "textcraft_synth_val_sample.jsonl"
    _, summary = run(["solve", "--env", "textcraft", "--tasks", str(sample), "--format", "official"])
    n = len(sample.read_text().splitlines())
    assert summary["mode"] == "gold" and summary["tasks"] == n and summary["passed"] == n


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json}\n", "not valid JSON"),
    ('{"goal": "x"}\n', "no 'misc'"),
])
def test_bad_input_gives_a_clear_error(tmp_path, capsys, content, message):
    path = tmp_path / "tasks.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["solve", "--tasks", str(path)]) == 2
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["command"] == "solve" and message in last["error"]


def test_a_user_input_error_exits_2_in_one_line_and_a_bug_exits_1_with_its_traceback(tmp_path, capsys, monkeypatch):
    """A config key that does not exist is the user's to fix: exit 2, one JSON line naming the
    file and the key, no traceback. A ValueError from a bug (planted in the plan of a dry run)
    is not: exit 1, its traceback on stderr, and a last line that says it is internal."""
    from sera_core.train import trainer
    from sera_core.train.config import CONFIGS

    config = tmp_path / "run.yaml"
    config.write_text(f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\nlearning_rate: 0.001\n")
    assert main(["train", "--config", str(config), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and "Traceback" not in err
    assert json.loads(out)["error"].startswith(f"{config}: unknown config key 'learning_rate'")

    def plan(cfg):  # a bug: the method's name read as a number
        return {"updates": int(cfg.method)}

    monkeypatch.setattr(trainer, "plan", plan)
    assert main(["train", "--config", "textcraft/sera_tiny.yaml", "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("Traceback (most recent call last):") and "in plan" in err
    assert err.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'sera'")
    assert json.loads(out.splitlines()[-1]) == {
        "command": "train", "error": "internal error: ValueError: invalid literal for int() with base 10: 'sera'"}


def test_bad_arguments_end_with_json(capsys):
    assert main(["tasks", "--split", "nope", "--out", "x"]) == 2
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"] == "invalid arguments"


def test_world_export_loads_back(tmp_path):
    from sera_core.envs.textcraft.world import RecipeBook, generate_world

    out, summary = run(["world", "--out", str(tmp_path / "w.json")])
    assert summary["items"] == 1550 and summary["base"] == 50
    assert RecipeBook.load(tmp_path / "w.json").to_json() == generate_world().to_json()


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "sera"
    assert exe.exists()
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("sera ")


def test_solve_resumes_from_its_result_file(tmp_path, capsys):
    tasks, rows = tmp_path / "val.jsonl", tmp_path / "rows.jsonl"
    assert main(["tasks", "--split", "val", "--limit", "6", "--out", str(tasks)]) == 0
    assert main(["solve", "--tasks", str(tasks), "--limit", "3", "--out", str(rows)]) == 0
    first = rows.read_text().splitlines()
    assert len(first) == 3
    with open(rows, "a") as fh:  # an interrupted write: half a line
        fh.write(first[0][: len(first[0]) // 2])
    capsys.readouterr()
    assert main(["solve", "--tasks", str(tasks), "--out", str(rows)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["resumed"] == 3 and summary["tasks"] == 6 and summary["passed"] == 6
    lines = rows.read_text().splitlines()
    assert lines[:3] == first and len(lines) == 6  # nothing lost, nothing duplicated
    assert len({json.loads(x)["id"] for x in lines}) == 6
    assert main(["solve", "--tasks", str(tasks), "--mode", "delegate", "--out", str(rows)]) == 2
    assert "holds results of mode" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_solve_results_repeat_exactly_under_any_hash_seed(tmp_path):
    tasks = tmp_path / "val.jsonl"
    run(["tasks", "--split", "val", "--limit", "16", "--out", str(tasks)])
    results = []
    for seed in ("3", "77"):
        out = tmp_path / f"rows{seed}.jsonl"
        run(["solve", "--tasks", str(tasks), "--mode", "delegate", "--out", str(out)], env={"PYTHONHASHSEED": seed})
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        results.append([{k: v for k, v in r.items() if k != "seconds"} for r in rows])
    assert results[0] == results[1] and len(results[0]) == 16


def test_textworld_tasks_are_byte_identical_and_solve_reports_families(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _, summary = run(["tasks", "--env", "textworld", "--split", "test", "--out", str(a)], env={"PYTHONHASHSEED": "5"})
    run(["tasks", "--env", "textworld", "--split", "test", "--out", str(b)], env={"PYTHONHASHSEED": "6"})
    assert a.read_bytes() == b.read_bytes() and summary["tasks"] == 1400
    first = json.loads(a.read_text().splitlines()[0])
    assert list(first) == sorted(first)  # written with sorted keys, like the official files
    dev = tmp_path / "dev.jsonl"
    _, summary = run(["tasks", "--env", "textworld", "--split", "dev", "--out", str(dev)])
    assert summary["tasks"] == 200
    lines = dev.read_text().splitlines()
    picked = tmp_path / "picked.jsonl"  # two tasks of every family, across difficulties
    picked.write_text("\n".join(lines[i] for i in range(0, 200, 7)) + "\n")
    _, summary = run(["solve", "--env", "textworld", "--tasks", str(picked), "--mode", "delegate"])
    n = len(range(0, 200, 7))
    assert summary["tasks"] == summary["passed"] == n
    assert set(summary["by_family"]) == {json.loads(x)["task_family"] for x in picked.read_text().splitlines()}
    assert sum(v["tasks"] for v in summary["by_difficulty"].values()) == n and summary["agents"] > n


def test_textworld_official_sample_solves(official_dir):
    sample = official_dir / "textworld_sync_test_sample.jsonl"
    _, summary = run(["solve", "--env", "textworld", "--tasks", str(sample), "--format", "official", "--mode", "delegate"])
    assert summary["tasks"] == summary["passed"] == len(sample.read_text().splitlines())
    assert len(summary["by_family"]) == 7


def test_textworld_rejects_unknown_splits_and_modes(tmp_path, capsys):
    assert main(["tasks", "--env", "textworld", "--split", "val", "--out", str(tmp_path / "x")]) == 2
    assert "textworld has splits test, train, dev" in json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    dev = tmp_path / "dev.jsonl"
    assert main(["tasks", "--env", "textworld", "--split", "dev", "--limit", "2", "--out", str(dev)]) == 0
    capsys.readouterr()
    assert main(["solve", "--env", "textworld", "--tasks", str(dev), "--mode", "gold"]) == 2
    assert "not 'gold'" in json.loads(capsys.readouterr().out.splitlines()[-1])["error"]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "x"}) + "\n")
    assert main(["solve", "--env", "textworld", "--tasks", str(tmp_path / "bad.jsonl")]) == 2
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["command"] == "solve"


def test_rollout_writes_trees_points_and_summary(tmp_path, capsys):
    from sera_core.agents.summary import read_points
    from sera_core.agents.tree import read_trees

    tasks = tmp_path / "dev.jsonl"
    assert main(["tasks", "--env", "textworld", "--split", "dev", "--limit", "2", "--out", str(tasks)]) == 0
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(["rollout", "--env", "textworld", "--tasks", str(tasks), "--counterfactual", "4", "--noise", "0.2",
                 "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["command"] == "rollout" and summary["trees"] == 2 and summary["rubrics"]["validity"] == 1.0
    assert json.loads((out / "summary.json").read_text()) == {k: v for k, v in summary.items() if k != "command"}
    trees, points = read_trees(out / "trees.jsonl"), read_points(out / "delegation_points.jsonl")
    assert len(trees) == 2 and summary["groups"]["total"] == len(points) > 0
    assert all(len(p.branches) == 4 for p in points)
    assert main(["rollout", "--env", "textworld", "--tasks", str(tasks), "--policy", "gpt", "--out", str(out)]) == 2
    assert "--policy: a policy is 'expert'" in capsys.readouterr().out
    assert main(["rollout", "--env", "textworld", "--tasks", str(tasks), "--policy", f"hf:{tmp_path}", "--out", str(out)]) == 2
    assert "neither a Hugging Face model folder" in capsys.readouterr().out


def test_an_external_writer_needs_an_endpoint(tmp_path, capsys):
    """One factory (``agents.actors.external_actor``) for the CLI and the trainer."""
    from sera_core.agents.actors import ExternalChatActor, external_actor

    assert external_actor("policy", "policy", None, None) is None
    actor = external_actor("external", "policy", "http://127.0.0.1:9/v1", "judge-model")
    assert isinstance(actor, ExternalChatActor) and actor.endpoint.config.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ValueError, match="needs an endpoint"):
        external_actor("policy", "external", None, None)
    tasks = tmp_path / "dev.jsonl"
    assert main(["tasks", "--env", "textworld", "--split", "dev", "--limit", "1", "--out", str(tasks)]) == 0
    capsys.readouterr()
    assert main(["rollout", "--env", "textworld", "--tasks", str(tasks), "--scorer", "external",
                 "--out", str(tmp_path / "run")]) == 2
    assert "--external-url" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_the_command_keeps_vllm_to_errors_unless_the_environment_says_otherwise(tmp_path, monkeypatch):
    """``sera`` sets ``VLLM_LOGGING_LEVEL=ERROR`` before vLLM is imported (its INFO lines would
    bury the command's output, as in the notebooks); a level the user set is kept."""
    import os

    from sera_core.cli import QUIET_VLLM, main

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert main(["tasks", "--env", "textcraft", "--split", "val", "--limit", "1", "--out", str(tmp_path / "a.jsonl")]) == 0
    assert os.environ["VLLM_LOGGING_LEVEL"] == QUIET_VLLM == "ERROR"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    assert main(["tasks", "--env", "textcraft", "--split", "val", "--limit", "1", "--out", str(tmp_path / "b.jsonl")]) == 0
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
