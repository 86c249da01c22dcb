"""Training configs: every shipped method loads, bad keys fail before any work, the full plan matches the paper."""

from __future__ import annotations

import json

import pytest

from sera_core.cli import main
from sera_core.train.config import ConfigError, TrainConfig, load_config, shipped_configs, validate
from sera_core.train.trainer import plan

METHODS = {"grpo", "cispo", "rao", "rao_rt", "rao_d", "sera_wo_d_rt", "sera_wo_d", "sera"}
ABLATIONS = {"ablation_external_writer", "ablation_external_scorer", "ablation_external_both",
             "ablation_global_rubric", "ablation_discriminative"}


def test_every_method_and_scale_is_shipped_and_valid():
    names = {(p.parent.name, p.stem) for p in shipped_configs()}
    for env in ("textcraft", "textworld"):
        for scale in ("tiny", "full"):
            for m in METHODS:
                assert (env, f"{m}_{scale}") in names
    assert {(e, f"{a}_{s}") for e in ["textcraft"] for a in ABLATIONS for s in ("tiny", "full")} <= names
    for path in shipped_configs():
        cfg = load_config(path)
        assert cfg.method == path.stem.rsplit("_", 1)[0] and cfg.env == path.parent.name


@pytest.mark.parametrize("method, child_reward, schedule, depth", [
    ("cispo", "rubric", "execution:1", 0), ("grpo", "rubric", "execution:1", 0),
    ("rao", "label", "execution:1", 3), ("rao_rt", "label", "execution:16,rubric_generation:2", 3),
    ("rao_d", "label", "execution:16,delegation:2", 3), ("sera_wo_d_rt", "rubric", "execution:1", 3),
    ("sera_wo_d", "rubric", "execution:16,rubric_generation:2", 3),
    ("sera", "rubric", "execution:16,delegation:2,rubric_generation:2", 3),
])
def test_methods_match_the_papers_table(method, child_reward, schedule, depth):
    from sera_core.train.config import CONFIGS

    cfg = load_config(CONFIGS / "textcraft" / f"{method}_full.yaml")
    assert (cfg.child_reward, cfg.schedule, cfg.max_depth) == (child_reward, schedule, depth)
    assert cfg.loss == ("grpo" if method == "grpo" else "cispo")


def test_full_plan_matches_the_paper(capsys):
    from sera_core.train.config import CONFIGS

    assert main(["train", "--config", str(CONFIGS / "textcraft" / "sera_full.yaml"), "--dry-run"]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert p["batch"] == {"root_tasks": 8, "trees_per_task": 8, "trees": 64, "counterfactual_branches": 8}
    assert p["schedule"] == "execution:16,delegation:2,rubric_generation:2" and p["lr"] == 3e-6
    assert p["context_tokens"] == 10240 and p["max_new_tokens"] == 512 and p["updates"] == 250
    assert p["updates_per_stage"] == {"execution": 202, "delegation": 24, "rubric_generation": 24}
    assert p["clip"] == [0.0, 5.0] and p["weight_decay"] == 0.017 and p["betas"] == [0.9, 0.95]
    assert p["devices"]["gpus"] == 16 and p["devices"]["accelerate_config"].endswith("2x8xh200.yaml")
    assert p["memory"]["parameters"] > 4e9
    tw = plan(load_config(CONFIGS / "textworld" / "sera_full.yaml"))
    assert tw["context_tokens"] == 13312 and tw["max_new_tokens"] == 3072 and tw["updates"] == 400


def test_set_overrides_any_key_and_is_checked_before_work(capsys):
    args = ["train", "--config", "textcraft/sera_tiny.yaml", "--dry-run"]
    assert main([*args, "--set", "difficulties=[easy]", "--set", "max_new_tokens=128", "--set", "lr=2e-4"]) == 0
    p = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert p["max_new_tokens"] == 128 and p["lr"] == 2e-4
    for bad, says in (("difficulties=[impossible]", "difficulties"), ("lrr=1", "lrr"), ("lr", "KEY=VALUE"),
                      ("max_new_tokens=[1", "not YAML")):
        assert main([*args, "--set", bad]) == 2
        assert says in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def write(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, key", [
    ("lrr: 1\n", "lrr"),
    ("lr: -1\n", "lr"),
    ("env: minecraft\n", "env"),
    ("tasks_per_update: 0\n", "tasks_per_update"),
    ("betas: [0.9, 1.5]\n", "betas"),
    ("schedule: 'execution:16,planning:2'\n", "schedule"),
    ("counterfactual: 0\n", "counterfactual"),  # SERA's rubric stage needs branches
    ("max_depth: 0\n", "schedule"),  # a single agent cannot delegate
    ("rubric_writer: global\n", "rubric_writer"),  # nothing to train in the rubric stage
    ("scorer: external\n", "external_url"),
    ("clip_high: 0.0\n", "clip_high"),
    ("depth_weighting: 1\n", "depth_weighting"),
    ("backend: hf\naccelerate_config: accelerate/2x8xh200.yaml\n", "backend"),  # FSDP + hf generation would hang
    ("mixed_precision: fp16\n", "mixed_precision"),
    ("engine_gpu_memory_utilization: 1.5\n", "engine_gpu_memory_utilization"),
    ("engine_kv_cache_gib: 0\n", "engine_kv_cache_gib"),
    ("engine_dtype: fp8\n", "engine_dtype"),
])
def test_bad_configs_fail_naming_the_key(tmp_path, text, key):
    from sera_core.train.config import CONFIGS

    path = write(tmp_path, f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\n{text}")
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(path)


def test_the_vllm_backend_runs_the_tiny_model_on_cpu_with_engine_settings_from_the_config():
    """``model: tiny`` runs on ``backend: vllm`` by default, a valid CPU config whose precision
    follows the machine (``auto``: bfloat16 only where it is native), and the engine's
    max_model_len comes from the benchmark's caps unless set."""
    from unittest import mock

    cfg = load_config("textcraft/sera_tiny.yaml")
    engine = cfg.engine_settings()
    assert cfg.backend == "vllm" and cfg.mixed_precision == "auto" and engine.dtype == "auto"
    assert engine.max_model_len == 10240 + 256 and engine.kv_cache_gib == 2.0
    for native, precision in ((True, "bf16"), (False, "no")):
        with mock.patch("sera_core.utils.hardware.native_bf16", return_value=native):
            assert cfg.precision() == precision
    assert cfg.replace(mixed_precision="no").precision() == "no"
    assert load_config("textworld/sera_full.yaml").engine_settings().max_model_len == 13312 + 3072
    assert load_config("textcraft/sera_tiny.yaml", backend="vllm", engine_max_model_len=4096).engine_settings().max_model_len == 4096


def test_a_renamed_key_fails_naming_its_new_name(tmp_path):
    """``max_steps`` (optimizer updates) became ``total_updates``: an old config says so."""
    from sera_core.train.config import CONFIGS

    path = write(tmp_path, f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\nmax_steps: 3\n")
    with pytest.raises(ConfigError, match="'max_steps' was renamed 'total_updates'.*max_steps_per_agent"):
        load_config(path)
    cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", total_updates=3)
    assert cfg.total_updates == 3
    with pytest.raises(ConfigError, match="renamed 'total_updates'"):
        cfg.replace(max_steps=2)


def test_tasks_per_step_fails_naming_tasks_per_update(tmp_path):
    """``tasks_per_step`` became ``tasks_per_update`` (a training iteration is an update): in a
    file, as an override and in ``replace`` the error names the new key."""
    from sera_core.train.config import CONFIGS

    path = write(tmp_path, f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\ntasks_per_step: 3\n")
    with pytest.raises(ConfigError, match="'tasks_per_step' was renamed 'tasks_per_update'"):
        load_config(path)
    with pytest.raises(ConfigError, match="'tasks_per_step' was renamed 'tasks_per_update'"):
        load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", tasks_per_step=3)
    cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", tasks_per_update=3)
    assert cfg.tasks_per_update == 3
    with pytest.raises(ConfigError, match="renamed 'tasks_per_update'"):
        cfg.replace(tasks_per_step=2)


def test_extends_overrides_and_cycles(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("lr: 0.5\nseed: 3\n")
    child = write(tmp_path, "extends: base.yaml\nseed: 4\nschedule: 'execution:1'\n")
    cfg = load_config(child)
    assert (cfg.lr, cfg.seed) == (0.5, 4)
    base.write_text("extends: c.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(child)
    with pytest.raises(ConfigError, match="no such config"):
        load_config(tmp_path / "missing.yaml")
    assert validate(TrainConfig()) == TrainConfig()


def test_cli_reports_bad_configs_before_work(tmp_path, capsys):
    path = write(tmp_path, "tasks_per_update: two\n")
    assert main(["train", "--config", str(path), "--dry-run"]) == 2
    assert "tasks_per_update" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]


def test_shipped_config_names_resolve_and_unknown_names_fail_clearly(tmp_path, monkeypatch):
    from sera_core.train.config import CONFIGS, config_file

    assert config_file("textcraft/sera_tiny.yaml") == CONFIGS / "textcraft" / "sera_tiny.yaml"
    assert load_config("textcraft/sera_tiny.yaml") == load_config(CONFIGS / "textcraft" / "sera_tiny.yaml")
    mine = tmp_path / "textcraft" / "sera_tiny.yaml"  # a file of the same relative name wins over the shipped one
    mine.parent.mkdir()
    mine.write_text(f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\nlr: 0.5\n")
    monkeypatch.chdir(tmp_path)
    assert load_config("textcraft/sera_tiny.yaml").lr == 0.5
    with pytest.raises(ConfigError, match="no such config file: textcraft/nope.yaml .*shipped: .*textcraft/sera_tiny.yaml"):
        load_config("textcraft/nope.yaml")


def test_rollout_settings_are_the_configs_own():
    from sera_core.train.config import CONFIGS

    cfg = load_config(CONFIGS / "textworld" / "sera_tiny.yaml", max_depth=2, max_steps_per_agent=7, fork_cap=4,
                      malformed_policy="binary_fallback", seed=11, temperature=0.7)
    rc = cfg.rollout_settings()
    assert (rc.max_depth, rc.max_steps_per_agent, rc.max_new_tokens, rc.counterfactual, rc.fork_cap, rc.seed, rc.temperature) == (
        2, 7, 256, 8, 4, 11, 0.7)
    assert rc.malformed_policy == "binary_fallback" and rc.rubric_writer == "policy" and rc.scorer == "policy"
    greedy = cfg.rollout_settings(branches=False, seed=3, temperature=0.0, rubric_temperature=0.0)
    assert (greedy.counterfactual, greedy.seed, greedy.temperature, greedy.rubric_temperature) == (0, 3, 0.0, 0.0)
    with pytest.raises(TypeError):
        cfg.rollout_settings(not_a_field=1)


def test_the_training_pool_filters_by_difficulty_and_the_plan_shows_it():
    from sera_core.train.trainer import plan

    full = load_config("textcraft/sera_full.yaml")
    assert full.difficulties == ("medium",)
    pool = full.task_pool()
    assert len(pool) == 852 and {t["misc"]["difficulty"] for t in pool} == {"medium"}  # SPEC 3
    assert plan(full)["task_pool"] == {"tasks": "train", "difficulties": ["medium"], "size": 852}
    assert len(full.replace(difficulties=None).task_pool()) == 2522
    with pytest.raises(ConfigError, match="difficulties"):
        load_config("textcraft/sera_full.yaml", difficulties=["trivial"])


def test_one_process_may_train_at_one_precision_then_another():
    """Accelerate refuses a second precision in a process; ``make_accelerator`` lets a notebook or a
    test run a float32 trainer after a bfloat16 one (``mixed_precision: auto`` next to ``no``)."""
    from sera_core.utils.hardware import make_accelerator

    for precision in ("no", "bf16", "no"):
        assert make_accelerator(precision, cpu=True).mixed_precision == precision
