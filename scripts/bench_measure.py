"""How much KV cache a protocol measurement's vLLM engine should reserve on CPU (numbers go to
docs/embedded.md, "Generation speed"; not a test).

A measurement (``sera tiny measure --protocol``) plays all the tasks of a set at once: 50 easy
TextCraft trees, each agent's next turn a request. On CPUs the engine reserves
``EngineConfig.kv_cache_gib`` up front (2 GiB: about 46,000 tokens of SmolLM2-135M in float32);
requests that do not fit wait, so the KV cache could cap how many sequences a decode step
batches, where a decode step costs little more for 32 rows than for 8 (docs/embedded.md). It
does not: measured 2026-12-07, 2 GiB and 6 GiB took the same time (docs/embedded.md, "Generation
speed"), so measurements keep the default.

For each ``--kv`` size, in its own process, the sizes side by side with one thread each (as
``make background`` runs its two measurements on 2 cores: give two sizes on 2 cores): the
embedded policy through the runtime at the ``warmstart`` protocol's contract on the first
``--tasks`` tasks of ``--set`` (greedy, as the set says): wall seconds, trees solved, the mean
number of requests open at a generation step (running, or waiting for KV room), the share of
generation time at <= 2 requests open (the tail), and the process's peak resident memory.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_measure.py --tasks 32 --kv 2 6``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def play(set_name: str, n_tasks: int, kv: float) -> dict:
    """One size: the set's first ``n_tasks`` tasks played at once through a fresh engine."""
    import torch

    from sera_core.agents.actors import PolicyActor
    from sera_core.agents.runtime import Runtime
    from sera_core.eval.protocol import load_protocol, protocol_tasks
    from sera_core.policy.models import EMBEDDED
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy
    from sera_core.tiny.measure import set_runtime

    protocol = load_protocol("warmstart")
    spec = protocol["sets"][set_name]
    tasks = protocol_tasks(protocol, set_name)[:n_tasks]
    policy = VLLMPolicy(EMBEDDED, EngineConfig(kv_cache_gib=kv))
    policy.step_log = []
    t0 = time.perf_counter()
    rollouts = Runtime(spec["benchmark"], PolicyActor(policy), set_runtime(spec, protocol["contract"])).run(tasks)
    wall = time.perf_counter() - t0
    log = policy.step_log
    seconds = sum(s for _, s in log)
    return {"kv_cache_gib": kv, "threads": torch.get_num_threads(), "set": set_name, "tasks": len(tasks),
            "seconds": round(wall, 1), "solved": sum((r.tree.root_reward or 0) >= 1 for r in rollouts),
            "mean_requests_open": round(sum(n * s for n, s in log) / seconds, 1) if seconds else 0.0,
            "tail_share": round(sum(s for n, s in log if n <= 2) / seconds, 3) if seconds else 0.0,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", default="textcraft_easy_dev", help="a set of the warmstart protocol (a dev set: timing a test set touches it)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--kv", type=float, nargs="+", default=[2.0, 6.0], help="KV cache sizes in GiB, one process each")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one size, in a child process
    parser.add_argument("--out", default="runs/bench/measure")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        row = play(args.set, args.tasks, args.kv[0])
        (out / f"kv{args.kv[0]:g}.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row), flush=True)
        return
    runs = [subprocess.Popen([sys.executable, __file__, "--one", "--set", args.set, "--tasks", str(args.tasks),
                              "--kv", str(kv), "--out", str(out)], env=os.environ) for kv in args.kv]
    if any(run.wait() for run in runs):
        raise SystemExit("a size failed (its output is above)")
    rows = [json.loads((out / f"kv{kv:g}.json").read_text()) for kv in args.kv]
    keys = [k for k in rows[0] if k != "kv_cache_gib"]
    print("| measure | " + " | ".join(f"{r['kv_cache_gib']:g} GiB" for r in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r[k]) for r in rows) + " |")


if __name__ == "__main__":
    main()
