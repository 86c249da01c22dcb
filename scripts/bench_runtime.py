"""Benchmarks for the recursive runtime (numbers go to docs/benchmarks.md; not a test).

1. The expert policy through the runtime on a spread of tasks of both benchmarks: trees
   per second, agents and tokens per tree, with and without counterfactual groups (B = 8,
   noisy expert), and the share of valid (mixed) groups.
2. A tiny random-weight Qwen3 model through the ``hf`` backend: generation batch sizes
   and tokens per second on CPU, batched (many trees at once) vs one tree at a time.

Run: ``.venv/bin/python scripts/bench_runtime.py --every 10``.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time

from sera_core.agents.actors import PolicyActor, noisy_expert
from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.agents.summary import summarize
from sera_core.envs.registry import BENCHMARKS
from sera_core.policy.expert import ExpertPolicy
from sera_core.policy.tiny import TinyModelConfig, init_model


def timed(runtime: Runtime, tasks: list[dict], trees: int = 1) -> tuple[dict, float]:
    t0 = time.perf_counter()
    rollouts = runtime.run(tasks, trees=trees)
    seconds = time.perf_counter() - t0
    return summarize(rollouts, runtime.judge, seconds), seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=10, help="take every N-th task of TextCraft val / TextWorld test")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, python {platform.python_version()}")
    tokenizer = default_tokenizer()
    clean = ExpertPolicy(tokenizer)
    noisy = noisy_expert(tokenizer=tokenizer)
    splits = {env: bench.generate_split(bench.eval_split)[::args.every] for env, bench in BENCHMARKS.items()}
    print("| env | policy | B | trees | success | agents/tree | tokens/tree | groups (valid) | trees/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for env, tasks in splits.items():
        for name, actor, b in (("expert", clean, 0), ("noisy expert", noisy, 8)):
            s, sec = timed(Runtime(env, actor, RuntimeConfig(counterfactual=b)), tasks)
            tokens = sum(s["tokens"].values())
            print(f"| {env} | {name} | {b} | {s['trees']} | {s['root_success_rate']:.3f} | {s['agents'] / s['trees']:.1f} "
                  f"| {tokens / s['trees']:.0f} | {s['groups']['total']} ({s['groups']['valid']}) | {s['trees'] / sec:.2f} |")
    from sera_core.policy.hf import HFPolicy

    path = tempfile.mkdtemp()
    init_model(tokenizer, TinyModelConfig(), seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    tasks = splits["textcraft"][:8]
    cfg = RuntimeConfig(max_steps_per_agent=3, max_new_tokens=64)
    print("\n| hf tiny (random weights) | trees | batch sizes | completion tokens/s |")
    print("|---|---|---|---|")
    for label, max_batch in (("batched", 64), ("one at a time", 1)):
        actor = PolicyActor(HFPolicy(path), max_batch=max_batch)
        s, sec = timed(Runtime("textcraft", actor, cfg), tasks, trees=2)
        sizes = sorted(set(actor.batcher.batches))
        print(f"| {label} | {s['trees']} | {sizes[0]}..{sizes[-1]} | {sum(s['tokens'].values()) / sec:.0f} |")


if __name__ == "__main__":
    main()
