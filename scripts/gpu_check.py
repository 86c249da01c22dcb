"""``make gpu-check``: the one prepared check for the day a GPU machine is lent.

It needs vLLM's CUDA build and textworld (the workbook tokenizer's corpus) on that machine
(``pip install -e '.[gpu]'``): the H200 lent on 2026-12-04 had neither, and no network to
install them (what ran there instead: docs/training.md).
The device machine has no network and receives only the working tree (at most 64 MiB of
untracked files), so the model is built on the spot: a randomly initialised Qwen3 (the
architecture of the paper's Qwen3-4B, about 75M parameters) with the workbook's own small
tokenizer. In under 8 minutes on one GPU it records, in ``OUT/gpu_check.json``:

1. ``parity``: vLLM and the ``hf`` backend (transformers, float32) on the same greedy
   prompts: identical tokens, and the largest log-probability difference;
2. ``push``: a perturbed state dict pushed into the running vLLM engine
   (``VLLMPolicy.load_weights``: the worker extension and ``collective_rpc``, as the trainer
   does after every update): vLLM's greedy tokens then match transformers on the perturbed
   model, and differ from before;
3. ``sleep``: the engine put to sleep (level 1, as during an update) frees GPU memory; woken,
   it generates the same tokens as before it slept;
4. ``fsdp``: two updates of the tiny SERA TextCraft config on this model through
   ``accelerate launch`` with FSDP (version 2, bf16) and ``backend: vllm`` (the engine asleep
   during each update, weights pushed after it): exit code, the metrics rows and a checkpoint;
   on one process, and on two (one engine per GPU, ``external_launcher``) when 2 GPUs are there;
5. ``speed``: vLLM generation tokens/s (64 prompts x 128 new tokens at temperature 1) and
   training tokens/s of the updates (trained tokens / update seconds).

LoRA needs no GPU check of its own: an adapter is served merged (the same push), which the CPU
tests run against the real engine on the embedded policy (tests/test_vllm_backend.py).

``--dry-run`` (run by CI on CPU) builds the model, writes the config files and the plan
(commands, sizes) into the JSON and imports the engine's modules, without touching a GPU.

    python scripts/gpu_check.py --out runs/gpu_check [--dry-run]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from sera_core.agents.corpus import default_tokenizer
from sera_core.policy.tiny import TinyModelConfig, init_model
from sera_core.train.config import CONFIGS, load_config

MODEL = TinyModelConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                        num_key_value_heads=4, head_dim=64)
"""The stand-in: Qwen3's architecture (GQA, q/k norms, tied embeddings) at about 75M parameters."""


def build(out: Path) -> tuple[Path, int]:
    """The random Qwen3 and its tokenizer, saved as a Hugging Face folder ``out/model``;
    the folder and the model's parameter count."""
    path = out / "model"
    tokenizer = default_tokenizer()
    model = init_model(tokenizer, MODEL, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def write_configs(out: Path, model: Path) -> tuple[Path, Path]:
    """The training config (tiny SERA on TextCraft with this model, vLLM, bf16, 2 updates)
    and an Accelerate file: the shipped 2 x 8 FSDP file cut to one process."""
    accel = yaml.safe_load((CONFIGS / "accelerate" / "2x8xh200.yaml").read_text())
    accel.update(num_machines=1, num_processes=1)
    for key in ("main_process_ip", "main_process_port", "rdzv_backend", "same_network"):
        accel.pop(key, None)
    accel_file = out / "fsdp_1gpu.yaml"
    accel_file.write_text(yaml.safe_dump(accel))
    train = {"extends": str(CONFIGS / "textcraft" / "sera_tiny.yaml"), "model": str(model.resolve()),
             "backend": "vllm", "mixed_precision": "bf16", "difficulties": ["easy"], "tasks_per_update": 2,
             "trees_per_task": 2, "max_new_tokens": 64, "max_steps_per_agent": 4, "total_updates": 2,
             "checkpoint_every": 2, "filter_zero_variance": False, "out": str((out / "run").resolve())}
    train_file = out / "train.yaml"
    train_file.write_text(yaml.safe_dump(train))
    load_config(train_file)  # fails here, before any GPU work, if the config is wrong
    return accel_file, train_file


def parity_and_push(model: Path) -> tuple[dict, dict, dict, dict]:
    import torch

    from sera_core.policy.base import SamplingParams
    from sera_core.policy.hf import HFPolicy
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy

    hf = HFPolicy(model, device="cuda", dtype=torch.float32)
    vl = VLLMPolicy(model, EngineConfig(dtype="float32", gpu_memory_utilization=0.3, max_model_len=4096))
    prompts = [hf.chat_prompt([{"role": "user", "content": f"Craft the following items: {k}x a1_i{k}"}])
               for k in range(1, 5)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)

    def compare() -> tuple[bool, float | None, list[list[int]]]:
        a, b = hf.generate(prompts, greedy), vl.generate(prompts, greedy)
        same = all(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
        pairs = [(p, q) for x, y in zip(a, b, strict=True) for p, q in zip(x.logprobs, y.logprobs, strict=True)]
        diff = max(abs(p - q) for p, q in pairs) if same else None
        return same, diff, [y.token_ids for y in b]

    same, diff, before = compare()
    parity = {"same_greedy_tokens": same, "max_logprob_diff": diff, "ok": same and diff is not None and diff < 1e-2}
    torch.manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in hf.model.state_dict().items()}
    hf.model.load_state_dict(perturbed)
    vl.load_weights(perturbed)
    same_after, _, after = compare()
    push = {"matches_transformers": same_after, "changed_by_push": after != before, "ok": same_after and after != before}
    free = torch.cuda.mem_get_info()[0]
    vl.sleep()
    freed = torch.cuda.mem_get_info()[0] - free
    vl.wake_up()
    _, _, woken = compare()
    sleep = {"freed_gib": round(freed / 2**30, 2), "same_after_wake": woken == after, "ok": freed > 0 and woken == after}
    batch = [p for p in prompts for _ in range(16)]
    t0 = time.perf_counter()
    out = vl.generate(batch, [SamplingParams(temperature=1.0, max_new_tokens=128, seed=i) for i in range(len(batch))])
    tokens = sum(len(g.token_ids) for g in out)
    speed = {"generation_tokens_per_second": round(tokens / (time.perf_counter() - t0), 1), "generated_tokens": tokens}
    return parity, push, sleep, speed


def fsdp_updates(accel_file: Path, train_file: Path, out: Path, processes: int = 1) -> dict:
    run = out / f"run{processes}"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel_file), "--num_processes",
           str(processes), "-m", "sera_core.cli", "train", "--config", str(train_file), "--out", str(run)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    (out / f"fsdp{processes}.log").write_text(done.stdout + done.stderr)
    result: dict = {"returncode": done.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    metrics = run / "metrics.csv"
    if metrics.exists():
        with metrics.open(newline="") as f:
            rows = list(csv.DictReader(f))
        result["rows"] = [{k: r[k] for k in ("version", "stage", "tokens_trained", "loss", "grad_norm", "seconds_update",
                                             "seconds")} for r in rows]
        trained = sum(int(r["tokens_trained"]) for r in rows)
        update_s = sum(float(r["seconds_update"]) for r in rows)
        result["training_tokens_per_second"] = round(trained / update_s, 1) if update_s else None
    result["checkpoint"] = (run / "checkpoint" / "state.json").exists()
    result["ok"] = done.returncode == 0 and len(result.get("rows", [])) == 2 and result["checkpoint"]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    ap.add_argument("--dry-run", action="store_true", help="build and write the plan; no GPU, no vLLM")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, params = build(args.out)
    accel_file, train_file = write_configs(args.out, model)
    import torch

    report: dict = {"model": str(model), "parameters": params, "accelerate_config": str(accel_file),
                    "train_config": str(train_file), "dry_run": args.dry_run}
    if args.dry_run:
        from sera_core.policy import vllm_backend, vllm_worker  # noqa: F401  (importable without CUDA)

        report["engine"] = vars(load_config(train_file).engine_settings())
        report["plan"] = ["parity: hf vs vllm greedy on 4 prompts", "push: perturbed weights into vllm",
                          "sleep: level 1 frees memory; woken, same tokens",
                          f"fsdp: accelerate launch --config_file {accel_file} -m sera_core.cli train --config {train_file}"
                          " (1 process; 2 when 2 GPUs)",
                          "speed: vllm 64 x 128 tokens; training tokens/s from metrics.csv"]
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu-check needs a GPU (use --dry-run on a CPU machine)")
        report["device"] = torch.cuda.get_device_name(0)
        report["parity"], report["push"], report["sleep"], report["speed"] = parity_and_push(model)
        report["fsdp"] = fsdp_updates(accel_file, train_file, args.out)
        if torch.cuda.device_count() >= 2:
            report["fsdp_2gpu"] = fsdp_updates(accel_file, train_file, args.out, processes=2)
        report["speed"]["training_tokens_per_second"] = report["fsdp"].get("training_tokens_per_second")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    ok = args.dry_run or all(report[k]["ok"] for k in ("parity", "push", "sleep", "fsdp", "fsdp_2gpu") if k in report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
