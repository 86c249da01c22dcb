"""Which engine rolls out on CPU: the ``hf`` backend against vLLM's CPU build, side by side
(numbers go to docs/benchmarks.md; not a test).

For each backend, in its own process (``--backend``), on the embedded policy:

1. start: seconds to a ready policy (vLLM: the engine, its first call included);
2. decode: completion tokens per second at batch 1, 8 and 32 from the first prompts of
   TextCraft val tasks (temperature 1, seeded, up to ``--new`` tokens, EOS allowed);
3. tasks: the first ``--tasks`` easy TextCraft val tasks through the runtime at temperature 0
   (the evaluation's settings): seconds a task, tasks solved, and the batching tail, the share
   of generation time spent at <= 2 sequences generating (``step_log`` of each backend);
4. update: one SERA update of ``textcraft/sera_tiny.yaml`` on easy train tasks (2 tasks x 4
   trees at temperature 1, execution stage): seconds, of which generation and the update.

``--lora`` (vLLM only) measures the two ways an adapter's updates reach the engine:
merged weights pushed (the engine serves base + adapter merged; per update: merge and push)
against the engine on the base with ``enable_lora`` and a ``LoRARequest`` with a new adapter
id per update (per update: peft saves the adapter, the engine loads it on its first request).
Each: decode tokens a second at batch 8 and the per-update cost.

Each runs at the tiny configs' precision (``auto``: bfloat16 engine and update where the CPU
runs bfloat16 natively) and, for vLLM, also at ``--precision float32`` throughout.

Run: ``.venv/bin/python scripts/bench_engines.py`` (all three, about 45 minutes on 2 cores,
most of it the ``hf`` update) or ``--backend vllm [--precision float32]`` for one.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tail_share(log: list[tuple[int, float]]) -> float:
    """Share of the logged generation seconds spent at <= 2 sequences generating."""
    total = sum(s for _, s in log)
    return sum(s for n, s in log if n <= 2) / total if total else 0.0


def measure(backend: str, new: int, n_tasks: int, precision: str) -> dict:
    import torch

    from sera_core.agents.actors import PolicyActor, make_actor
    from sera_core.agents.prompts import agent_messages
    from sera_core.agents.runtime import Runtime
    from sera_core.envs.registry import select_tasks
    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.policy.base import SamplingParams
    from sera_core.policy.models import EMBEDDED
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy
    from sera_core.train.config import load_config
    from sera_core.train.trainer import Trainer

    label = backend if precision == "auto" else f"{backend}-{precision}"
    row: dict = {"backend": label, "threads": torch.get_num_threads()}
    # the update's precision (and the engine's): the tiny configs' auto, or float32 throughout
    settings = {} if precision == "auto" else {"engine_dtype": "float32", "mixed_precision": "no"}
    t0 = time.perf_counter()
    if backend == "vllm" and settings:
        actor = PolicyActor(VLLMPolicy(EMBEDDED, EngineConfig(dtype="float32")))
    else:
        actor = make_actor(f"{backend}:tiny")
    policy = actor.policy
    val = generate_split("val")
    prompts = [policy.chat_prompt(agent_messages("textcraft", t["goal"], None, depth=0, max_depth=3, max_steps=20))
               for t in val[:32]]
    policy.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=4))  # first call (vLLM warms up)
    row["start_s"] = round(time.perf_counter() - t0, 1)
    for batch in (1, 8, 32):
        params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(batch)]
        t0 = time.perf_counter()
        gens = policy.generate(prompts[:batch], params)
        row[f"decode_b{batch}_tok_s"] = round(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0), 1)
    print(row, flush=True)
    cfg = load_config("textcraft/sera_tiny.yaml", backend=backend)
    easy = select_tasks("textcraft", val, difficulty="easy", count=n_tasks)
    policy.step_log = []
    t0 = time.perf_counter()
    rollouts = Runtime("textcraft", actor, cfg.rollout_settings(branches=False, temperature=0.0, rubric_temperature=0.0)).run(easy)
    row["tasks"] = len(easy)
    row["task_s"] = round((time.perf_counter() - t0) / len(easy), 1)
    row["tasks_solved"] = sum((r.tree.root_reward or 0.0) >= 1.0 for r in rollouts)
    row["tasks_tail_share"] = round(tail_share(policy.step_log), 3)
    print(row, flush=True)
    del actor, policy
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config("textcraft/sera_tiny.yaml", backend=backend, difficulties=["easy"], out=out, total_updates=1,
                          **settings)
        t0 = time.perf_counter()
        trainer = Trainer(cfg, progress=False)
        row["update_start_s"] = round(time.perf_counter() - t0, 1)
        trainer.policy.step_log = []
        metrics = trainer.run_update()
        row["update_s"] = metrics["seconds"]
        row["update_generation_s"] = metrics["seconds_generation"]
        row["update_training_s"] = metrics["seconds_update"]
        row["update_tokens_trained"] = metrics["tokens_trained"]
        row["update_tail_share"] = round(tail_share(trainer.policy.step_log), 3)
    return row


def measure_lora(new: int) -> dict:
    """Merged push against a ``LoRARequest`` per update (module docstring), on the embedded policy."""
    import torch
    from vllm.lora.request import LoRARequest

    from sera_core.agents.prompts import agent_messages
    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.policy.base import SamplingParams
    from sera_core.policy.models import EMBEDDED, adapter_base, load_model, merge_lora_state
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy, engine_kwargs
    from sera_core.utils.hardware import native_bf16
    from sera_core.utils.weights import full_weights

    row: dict = {"backend": "vllm-lora", "threads": torch.get_num_threads()}
    model, _ = load_model(EMBEDDED, trainable=True)
    val = generate_split("val")
    policy = VLLMPolicy(EMBEDDED)
    prompts = [policy.chat_prompt(agent_messages("textcraft", t["goal"], None, depth=0, max_depth=3, max_steps=20))
               for t in val[:8]]
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(8)]

    def decode(generate) -> float:
        t0 = time.perf_counter()
        return round(sum(len(g) for g in generate()) / (time.perf_counter() - t0), 1)

    policy.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=4))
    row["merged_decode_b8_tok_s"] = decode(lambda p=policy: [g.token_ids for g in p.generate(prompts, params)])
    t0 = time.perf_counter()
    policy.load_weights(merge_lora_state(full_weights(model), model.peft_config["default"].to_dict()))
    row["merged_per_update_s"] = round(time.perf_counter() - t0, 2)
    del policy
    gc.collect()

    import vllm
    kwargs = engine_kwargs(adapter_base(EMBEDDED), EngineConfig(), cuda=False, distributed=False, max_model_len=8192,
                           bf16=native_bf16(cuda=False))
    llm = vllm.LLM(**kwargs, enable_lora=True, max_lora_rank=16, max_loras=2)
    sp = [vllm.SamplingParams(temperature=1.0, max_tokens=new, seed=i) for i in range(8)]
    inputs = [{"prompt_token_ids": p} for p in prompts]

    def lora_generate(request):
        return [o.outputs[0].token_ids for o in llm.generate(inputs, sp, lora_request=request, use_tqdm=False)]

    lora_generate(LoRARequest("a0", 1, str(EMBEDDED)))
    row["lora_decode_b8_tok_s"] = decode(lambda: lora_generate(LoRARequest("a0", 1, str(EMBEDDED))))
    costs = []
    with tempfile.TemporaryDirectory() as tmp:
        for update in range(2, 5):  # a new adapter id per update: peft saves, the first request loads
            t0 = time.perf_counter()
            model.save_pretrained(tmp)
            llm.generate(inputs[:1], vllm.SamplingParams(max_tokens=1), lora_request=LoRARequest(f"a{update}", update, tmp),
                         use_tqdm=False)
            costs.append(time.perf_counter() - t0)
    row["lora_per_update_s"] = round(sum(costs) / len(costs), 2)
    return row


def table(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if k != "backend"]
    lines = ["| measure | " + " | ".join(r["backend"] for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(r.get(k, "")) for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("hf", "vllm"))
    parser.add_argument("--new", type=int, default=128, help="tokens per sequence in the decode test")
    parser.add_argument("--tasks", type=int, default=8, help="easy val tasks through the runtime")
    parser.add_argument("--precision", choices=("auto", "float32"), default="auto",
                        help="auto: the tiny configs' (bfloat16 where the CPU runs it natively); float32 throughout")
    parser.add_argument("--lora", action="store_true", help="merged push against a LoRARequest per update")
    parser.add_argument("--out", default="runs/bench/engines")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.lora:
        row = measure_lora(args.new)
        (out / "lora.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row))
        return
    if args.backend:
        row = measure(args.backend, args.new, args.tasks, args.precision)
        (out / f"{row['backend']}.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row))
        return
    runs = [("hf", "auto"), ("vllm", "auto"), ("vllm", "float32")]
    for backend, precision in runs:  # one process each: threads, memory and engines do not mix
        subprocess.run([sys.executable, __file__, "--backend", backend, "--precision", precision, "--new", str(args.new),
                        "--tasks", str(args.tasks), "--out", str(out)], check=True, env=os.environ)
    labels = [b if p == "auto" else f"{b}-{p}" for b, p in runs]
    print(table([json.loads((out / f"{label}.json").read_text()) for label in labels]))


if __name__ == "__main__":
    main()
