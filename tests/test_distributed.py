"""Distributed training on CPU: the update's work split over processes equals the one-process update.

* :func:`~sera_core.train.update.process_share` gives every process the same number of
  micro-batches (padding with zero-weight ones) and loses none;
* the processes' scaled gradients, averaged as DDP/FSDP average them, equal the one-process
  gradient (the normaliser N_tokens is the whole update's);
* three real processes (``torchrun``, Accelerate's MULTI_CPU over gloo) train five updates of a task
  count no process count divides and end with the one-process weights (tests/distributed_run.py).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launching import run_launch

from sera_core.agents.corpus import default_tokenizer
from sera_core.policy.tiny import TinyModelConfig, init_model
from sera_core.train.update import TokenRow, loss_and_backward, micro_batches, process_share

RUN = Path(__file__).parent / "distributed_run.py"
FSDP_RUN = Path(__file__).parent / "fsdp_run.py"


def _rows(n: int) -> list[TokenRow]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for i in range(n):
        length = 6 + 5 * (i % 4)
        ids = tuple(torch.randint(5, 400, (length,), generator=g).tolist())
        trained = tuple(t >= length // 2 for t in range(length))
        old = tuple(-3.0 - 0.1 * t if m else 0.0 for t, m in enumerate(trained))
        adv = tuple((1.0 if i % 3 else -0.5) if m else 0.0 for m in trained)
        rows.append(TokenRow(ids, trained, old, adv))
    return rows


def test_every_process_gets_the_same_number_of_micro_batches_and_none_is_lost():
    groups = micro_batches(_rows(7), 20)
    assert len(groups) == 7
    shares = [process_share(groups, (i, 3)) for i in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    real = [g for s in shares for g in s if any(r.tokens for r in g)]
    assert sorted(map(id, real)) == sorted(map(id, groups))
    padding = [g for s in shares for g in s if not any(r.tokens for r in g)]
    assert len(padding) == 2 and all(len(g[0].ids) > 0 and not any(g[0].advantage) for g in padding)
    assert process_share([], (2, 3)) == []
    with pytest.raises(ValueError, match="part"):
        process_share(groups, (3, 3))


def test_the_processes_averaged_gradients_equal_the_one_process_gradient():
    model = init_model(default_tokenizer(), TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16), seed=0)
    rows = _rows(7)
    n = sum(r.tokens for r in rows)

    def grads(part):
        m = copy.deepcopy(model)
        stats = loss_and_backward(m, rows, pad_id=0, total_tokens=n, micro_batch_tokens=20, part=part)
        return [p.grad.clone() for p in m.parameters()], stats

    whole, stats = grads((0, 1))
    parts = [grads((i, 3)) for i in range(3)]
    averaged = [sum(g[k] for g, _ in parts) / 3 for k in range(len(whole))]  # what DDP's all-reduce computes
    for a, b in zip(averaged, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert sum(s["tokens"] for _, s in parts) == stats["tokens"] == n
    assert sum(s["loss"] for _, s in parts) == pytest.approx(stats["loss"], rel=1e-5)
    assert sum(s["ratio_mean_sum"] for _, s in parts) / n == pytest.approx(stats["ratio_mean"], rel=1e-5)


def _launch(out: Path, processes: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if processes == 1:
        cmd = [sys.executable, str(RUN), str(out)]
    else:
        # `accelerate launch --cpu` starts one process (its multi-CPU path needs MPI); torchrun's
        # environment (RANK, WORLD_SIZE) makes Accelerate run MULTI_CPU over gloo
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(RUN), str(out)]
    done = run_launch(cmd, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


@pytest.mark.timeout(1200)
def test_three_processes_train_like_one(tmp_path):
    one = _launch(tmp_path / "one", 1)
    three = _launch(tmp_path / "three", 3)
    assert three["processes"] == 3 and one["processes"] == 1
    assert three["closed"] and one["closed"]  # Trainer.close ended the group before the processes exited
    assert three["gloo_threads"] == []  # ... and its threads (DDP's reducer no longer keeps the group alive)
    assert three["run_versions"] == one["run_versions"] == [3, 4]
    for a, b in zip(three["updates"], one["updates"], strict=True):
        assert a["trees"] == b["trees"] and len(a["trees"]) == 10
        assert a["datums"] == b["datums"] and a["tokens"] == b["tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert all(u["tokens"] > 0 for u in one["updates"]) and one["updates"][0]["grad_norm"] > 0  # real updates
    w1, w3 = torch.load(tmp_path / "one" / "weights.pt"), torch.load(tmp_path / "three" / "weights.pt")
    assert w1.keys() == w3.keys()
    for name in w1:
        torch.testing.assert_close(w3[name], w1[name], rtol=1e-4, atol=1e-6, msg=name)
    assert (tmp_path / "three" / "run" / "checkpoint" / "state.json").exists()


@pytest.mark.timeout(600)
def test_a_checkpoint_write_that_fails_on_the_main_process_fails_every_process(tmp_path):
    """Two processes save; the main one cannot write. Both raise the same error naming the
    checkpoint of update 0 (before: the main one raised before the closing barrier and the
    other waited there for ever, until the subprocess timeout). Then both end the process group
    (``Trainer.close``) and its threads: gloo's worker threads once outlived the group inside
    DDP's reducer, and at exit one rank aborted (``terminate called without an active
    exception``, CI 2026-12-06) and one deadlocked on the GIL (2026-12-07), so the launch
    failed or never ended. ``run_launch`` fails the test if any rank outlives the launch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(RUN),
           str(tmp_path), "failing-save"]
    done = run_launch(cmd, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [(tmp_path / f"save.{rank}.txt").read_text() for rank in (0, 1)]
    assert said[0] == said[1]
    assert "could not write the checkpoint of update 0" in said[0] and "there is no earlier one" in said[0]
    assert said[0].endswith("\nclosed: True\ngloo threads: []")  # Trainer.close ended the group and its threads on both


@pytest.mark.timeout(600)
def test_a_process_that_fails_ends_the_whole_launch(tmp_path):
    """One process of two raises once its trainer is built, under ``leave_on_failure`` as in
    ``sera train``; the other trains and waits at its first collective. The failing one exits
    at once with its traceback, the launcher stops the other, and the launch fails within
    seconds, leaving no process (the gloo timeout would have held the other for 30 minutes)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(RUN),
           str(tmp_path), "failing-rank"]
    done = run_launch(cmd, env=env, timeout=300)
    assert done.returncode != 0
    assert "RuntimeError: process 1 fails on purpose" in done.stderr


def _fsdp(out: Path, processes: int, steps: int, resume: Path | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = [str(FSDP_RUN), str(out), str(steps)] + ([str(resume)] if resume else [])
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
           if processes > 1 else [sys.executable]) + run
    done = run_launch(cmd, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "state.json").read_text())


@pytest.mark.timeout(900)
def test_fsdp2_checkpoints_gather_and_resume_on_cpu(tmp_path):
    """FSDP2 on CPU (torch ``fully_shard`` over gloo): the checkpoint that two sharded processes
    write after 2 updates equals the one-process model's (full tensors, tied embedding once);
    two sharded processes resume from it to the one-process weights after a third update, and
    one process resumes from the sharded checkpoint alike (the format does not depend on sharding).
    Each sharded process gathers the full weights for its own rollout engine (``full_weights``)."""
    from safetensors.torch import load_file

    two = _fsdp(tmp_path / "two", 2, steps=2)
    assert two == {"steps": 2, "processes": 2, "sharded": True}
    one = _fsdp(tmp_path / "one", 1, steps=3)

    def close(a: Path, b: Path, name: str) -> None:
        wa, wb = load_file(str(a / name)), load_file(str(b / name))
        assert wa.keys() == wb.keys() and "lm_head.weight" not in wa and "model.embed_tokens.weight" in wa
        for k in wa:
            torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-6, msg=k)

    _fsdp(tmp_path / "one_at_2", 1, steps=2)
    close(tmp_path / "two", tmp_path / "one_at_2", "model.safetensors")
    assert _fsdp(tmp_path / "two_resumed", 2, steps=1, resume=tmp_path / "two")["steps"] == one["steps"] == 3
    close(tmp_path / "two_resumed", tmp_path / "one", "model.safetensors")
    _fsdp(tmp_path / "one_resumed", 1, steps=1, resume=tmp_path / "two")
    close(tmp_path / "one_resumed", tmp_path / "one", "model.safetensors")
    for rank in (0, 1):  # each process's engine gets the whole model (the old push: rank 0 all, rank 1 nothing)
        engine = load_file(str(tmp_path / "two" / f"engine.{rank}.safetensors"))
        saved = load_file(str(tmp_path / "two" / "model.safetensors"))
        assert engine.keys() == saved.keys()
        for k in saved:
            torch.testing.assert_close(engine[k], saved[k], rtol=0, atol=0, msg=k)
    moments = torch.load(tmp_path / "two" / "optimizer.pt", weights_only=True)
    assert moments["state"]["model.embed_tokens.weight"]["exp_avg"].shape == (64, 32)  # full, not a shard


def test_the_gpu_check_builds_its_model_and_configs_without_a_gpu(tmp_path):
    """``make gpu-check`` with ``--dry-run``: the stand-in Qwen3 is built, both config files
    are valid (the training config loads; the FSDP file is the shipped one cut to 1 process),
    ``vllm.EngineArgs`` takes the CUDA multi-process settings (external launcher, sleep mode,
    bfloat16, the weight loader with its three methods) and the FSDP plan wraps a layer the
    model has; the verdict lists both checks ok. Without CUDA the real check refuses in one line."""
    import yaml

    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path), "--dry-run"],
                          capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and 50e6 < report["parameters"] < 150e6
    accel = yaml.safe_load((tmp_path / "fsdp_1gpu.yaml").read_text())
    assert accel["distributed_type"] == "FSDP" and accel["num_processes"] == 1 and accel["mixed_precision"] == "bf16"
    from sera_core.train.config import load_config

    cfg = load_config(tmp_path / "train.yaml")
    assert cfg.backend == "vllm" and cfg.total_updates == 2 and cfg.model == str((tmp_path / "model").resolve())
    assert (tmp_path / "model" / "config.json").exists()
    assert report["verdict"] == "ok" and [c["name"] for c in report["checks"]] == ["engine_arguments", "fsdp_plan"]
    engine = report["checks"][0]["numbers"]
    assert engine["distributed_executor_backend"] == "external_launcher" and engine["enable_sleep_mode"] is True
    assert engine["dtype"] == "bfloat16" and engine["kv_cache_memory_bytes"] is None
    if torch.cuda.is_available():
        return  # a GPU machine runs the check itself, not its refusal
    refused = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path / "real")],
                             capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
    assert refused.returncode == 2 and refused.stdout.startswith("gpu-check refused: ") and len(refused.stdout.splitlines()) == 1
