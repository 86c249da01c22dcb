"""Generation speed of the embedded policy on this machine (numbers go to docs/benchmarks.md; not a test).

1. Matmul roofline: GFLOP/s of a 2,048 x 576 by 576 x 1,536 matmul (a decode-sized
   MLP product at batch 2,048 rows) in float32 and bfloat16.
2. Prefill: 32 first prompts of TextCraft val tasks (system prompt + goal), with an
   empty prefix store, and again once another agent's first prompt is kept (the system
   prompt's key/value states are shared).
3. Decode: seconds per step at batch 32 (64 tokens at temperature 1, no stop string),
   and the GFLOP/s that makes (2 x linear weights x batch per step: the products a step
   runs; the embedding lookup has none), in float32 and bfloat16.
4. Easy TextCraft val tasks through the runtime at temperature 0 (the evaluation
   contract, the tiny config's caps), seconds per task: one at a time with the prefix
   store on and off (latency), and all at once in one batched runtime (throughput: wall
   time / tasks, what an evaluation of many tasks sees).
5. Mixed lengths: a root of 9,000 tokens beside 8 branches of 400-4,000 (random token
   ids), seconds per decode step in one padded batch and as planned by
   ``hf.plan_batch`` (parts of similar length).

Run: ``.venv/bin/python scripts/bench_generation.py [--model DIR] [--tasks N] [--mixed-only]``
(default: the embedded policy, ``tiny``).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

import sera_core.policy.hf as hf
from sera_core.agents.actors import PolicyActor
from sera_core.agents.prompts import agent_messages
from sera_core.agents.runtime import Runtime
from sera_core.envs.registry import pick_tasks
from sera_core.policy.base import SamplingParams
from sera_core.policy.hf import HFPolicy
from sera_core.policy.models import model_folder
from sera_core.train.config import load_config


def roofline(dtype: torch.dtype, reps: int = 20) -> float:
    a, b = torch.randn(2048, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * 2048 * 576 * 1536 * reps / (time.perf_counter() - t0) / 1e9


def linear_weights(model) -> int:
    """Weights a decode step multiplies each row by: every linear layer's, the output layer's
    included (SmolLM2-135M: 134.5M; its tied embedding counted once, as the output layer)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def first_prompts(policy: HFPolicy, tasks: list[dict]) -> list[list[int]]:
    return [policy.chat_prompt(agent_messages("textcraft", t["goal"], None, depth=0, max_depth=3, max_steps=20))
            for t in tasks]


def prefill(policy: HFPolicy, prompts: list[list[int]]) -> tuple[float, float]:
    """Seconds to prefill ``prompts`` (one new token each) with an empty store, then with a shared prefix kept."""
    one = SamplingParams(temperature=0.0, max_new_tokens=1)
    policy.store.clear()
    t0 = time.perf_counter()
    policy.generate(prompts, one)
    cold = time.perf_counter() - t0
    policy.store.clear()
    policy.generate(prompts[:1], one)
    t0 = time.perf_counter()
    policy.generate(prompts[1:] + prompts[:1], one)
    return cold, time.perf_counter() - t0


def decode(policy: HFPolicy, prompts: list[list[int]], new: int = 64) -> float:
    """Seconds per decode step at batch ``len(prompts)`` (prefill time subtracted)."""
    params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(len(prompts))]
    short = [SamplingParams(temperature=1.0, max_new_tokens=1, seed=i) for i in range(len(prompts))]
    policy.store.clear()
    t0 = time.perf_counter()
    policy.generate(prompts, short)
    t_prefill = time.perf_counter() - t0
    policy.store.clear()
    t0 = time.perf_counter()
    policy.generate(prompts, params)
    return (time.perf_counter() - t0 - t_prefill) / (new - 1)


def mixed_lengths(policy: HFPolicy, new: int = 32) -> tuple[float, float, list[list[int]]]:
    """Seconds per decode step of a root of 9,000 tokens and 8 branches of 400-4,000, in one
    padded batch and as ``plan_batch`` splits it, and the plan."""
    g = torch.Generator().manual_seed(0)
    lengths = [9_000, 400, 900, 1_400, 1_900, 2_500, 3_000, 3_500, 4_000]
    prompts = [torch.randint(100, policy.tokenizer.vocab_size, (n,), generator=g).tolist() for n in lengths]
    plan = hf.plan_batch([n + new for n in lengths], hf._token_bytes(policy.model), hf._weight_bytes(policy.model))
    planner = hf.plan_batch
    try:
        hf.plan_batch = lambda lengths, *a, **k: [list(range(len(lengths)))]
        one = decode(policy, prompts, new)
    finally:
        hf.plan_batch = planner
    return one, decode(policy, prompts, new), plan


def tasks_time(policy: HFPolicy, tasks: list[dict], *, together: bool = False) -> tuple[float, float]:
    """Seconds per task and root success of ``tasks`` played one at a time, or all at once
    when ``together`` (temperature 0)."""
    cfg = load_config("textcraft/sera_tiny.yaml")
    rc = cfg.rollout_settings(branches=False, temperature=0.0, rubric_temperature=0.0)
    t0 = time.perf_counter()
    groups = [tasks] if together else [[t] for t in tasks]
    rollouts = [r for g in groups for r in Runtime("textcraft", PolicyActor(policy), rc).run(g, progress=False)]
    return (time.perf_counter() - t0) / len(tasks), sum(r.tree.root_reward or 0 for r in rollouts) / len(tasks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tasks", type=int, default=4, help="easy TextCraft val tasks timed one at a time")
    parser.add_argument("--batched", type=int, default=16, help="easy TextCraft val tasks timed all at once")
    parser.add_argument("--mixed-only", action="store_true", help="only the mixed-lengths batch (5.)")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    if args.mixed_only:
        return print_mixed(HFPolicy(model_folder(args.model)))
    print(f"\nmatmul roofline: float32 {roofline(torch.float32):.0f} GFLOP/s, bfloat16 {roofline(torch.bfloat16):.0f} GFLOP/s")
    easy = pick_tasks("textcraft", "val", difficulty="easy")
    policy = HFPolicy(model_folder(args.model))
    params = linear_weights(policy.model)
    prompts = first_prompts(policy, easy[:32])
    cold, warm = prefill(policy, prompts)
    print(f"\nprefill of 32 first prompts ({sum(map(len, prompts)):,} tokens): {cold:.2f} s cold, "
          f"{warm:.2f} s with the system prompt kept")
    for dtype in (torch.float32, torch.bfloat16):
        p = policy if dtype == torch.float32 else HFPolicy.from_model(policy.model.to(dtype), policy.tokenizer)
        step = decode(p, prompts)
        print(f"decode at batch 32, {str(dtype)[6:]}: {step * 1000:.0f} ms/step, {2 * params * 32 / step / 1e9:.0f} GFLOP/s")
    policy.model.to(torch.float32)
    kept = tasks_time(policy, easy[:args.tasks])
    plain = tasks_time(HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0), easy[:args.tasks])
    print(f"\neasy TextCraft task, temperature 0: {kept[0]:.1f} s/task with kept prefixes, "
          f"{plain[0]:.1f} s/task recomputing every prompt (success {kept[1]:.2f} / {plain[1]:.2f})")
    batch = easy[:args.batched]
    together = tasks_time(policy, batch, together=True)
    print(f"{len(batch)} easy TextCraft tasks at once: {together[0]:.1f} s/task (success {together[1]:.2f})")
    print_mixed(policy)


def print_mixed(policy: HFPolicy) -> None:
    one, planned, plan = mixed_lengths(policy)
    print(f"\na root of 9,000 tokens and 8 branches of 400-4,000: {one * 1000:.0f} ms/step in one batch, "
          f"{planned * 1000:.0f} ms/step in {len(plan)} parts {plan}")


if __name__ == "__main__":
    main()
