"""How a protocol measurement's vLLM engine is best fed on CPU: the sets one at a time or
together through one gate, and how much KV cache it reserves (numbers go to docs/embedded.md,
"Generation speed"; not a test).

A measurement (``sera tiny measure --protocol``) plays every tree of its sets, each agent's
next turn a request, and a decode step costs little more for 32 rows than for 8
(docs/embedded.md). Played one set at a time, each set's last slow trees leave the engine a
batch of one or two (measured 2026-12-07: a quarter of the generation time); played together
(:func:`~sera_core.tiny.measure.measure_protocol`: at most ``trees_in_flight`` trees at a time,
entering round robin across the sets), the batch stays full until the last set's tail. On
CPUs the engine reserves ``EngineConfig.kv_cache_gib`` up front (2 GiB: about 46,000 tokens of
SmolLM2-135M in float32); requests that do not fit wait.

Each ``--run KV:FEED`` (KV in GiB; FEED ``set`` for one set at a time, each all at once, or a
number of trees in flight) runs in its own process, the runs side by side with one thread each
(as ``make background`` runs its two measurements on 2 cores: give two runs on 2 cores), on the
first ``--tasks`` tasks of each of ``--sets`` of the ``warmstart`` protocol (dev sets by
default: timing a test set touches it), at its contract, with the embedded policy: wall
seconds, trees solved, the mean number of requests open at a generation step (running, or
waiting for KV room), the share of generation time at <= 2 requests open (the tail), and the
process's peak resident memory.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_measure.py --tasks 12 --run 2:set 2:32``.
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

DEV_SETS = ["textcraft_easy_dev", "textworld_easy_dev", "textcraft_medium_dev"]


def cut_protocol(sets: list[str], n_tasks: int, out: Path) -> Path:
    """The ``warmstart`` protocol with only ``sets``, each cut to its first ``n_tasks`` ids, as a file."""
    from sera_core.eval.protocol import load_protocol

    protocol = load_protocol("warmstart")
    cut = {**protocol, "name": "bench", "sets": {n: {**protocol["sets"][n], "ids": protocol["sets"][n]["ids"][:n_tasks]}
                                                 for n in sets}}
    path = out / "protocol.json"
    path.write_text(json.dumps(cut, indent=1))
    return path


def play(protocol: Path, sets: list[str], kv: float, feed: str, out: Path) -> dict:
    """One run: the sets measured through a fresh engine, fed as ``feed`` says."""
    import torch

    from sera_core.agents.actors import PolicyActor
    from sera_core.policy.models import EMBEDDED
    from sera_core.policy.vllm_backend import EngineConfig, VLLMPolicy
    from sera_core.tiny.measure import measure_protocol

    policy = VLLMPolicy(EMBEDDED, EngineConfig(kv_cache_gib=kv))
    policy.step_log = []
    actor = PolicyActor(policy)
    t0 = time.perf_counter()
    if feed == "set":
        results = {"sets": {}}
        for name in sets:
            results["sets"] |= measure_protocol("vllm:tiny", protocol, [name], out=out / name, actor=actor,
                                                trees_in_flight=10_000)["sets"]
    else:
        results = measure_protocol("vllm:tiny", protocol, sets, out=out / "together", actor=actor,
                                   trees_in_flight=int(feed))
    wall = time.perf_counter() - t0
    log = policy.step_log
    seconds = sum(s for _, s in log)
    return {"run": f"{kv:g} GiB, {'one set at a time' if feed == 'set' else feed + ' trees in flight'}",
            "threads": torch.get_num_threads(), "sets": " + ".join(sets),
            "trees": sum(s["trees"] for s in results["sets"].values()), "seconds": round(wall, 1),
            "solved": sum(s["trees_solved"] for s in results["sets"].values()),
            "mean_requests_open": round(sum(n * s for n, s in log) / seconds, 1) if seconds else 0.0,
            "tail_share": round(sum(s for n, s in log if n <= 2) / seconds, 3) if seconds else 0.0,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sets", nargs="+", default=DEV_SETS, help="sets of the warmstart protocol (dev sets: timing a test set touches it)")
    parser.add_argument("--tasks", type=int, default=12, help="the first tasks of each set")
    parser.add_argument("--run", nargs="+", default=["2:set", "2:32"],
                        help="KV:FEED, one process each: KV cache GiB; FEED 'set' (one set at a time) or trees in flight")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # one run, in a child process
    parser.add_argument("--out", default="runs/bench/measure")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        kv, feed = args.one.split(":")
        row = play(out / "protocol.json", args.sets, float(kv), feed, out / args.one.replace(":", "_"))
        (out / f"{args.one.replace(':', '_')}.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row), flush=True)
        return
    for run in args.run:
        kv, _, feed = run.partition(":")
        if not (feed == "set" or feed.isdigit()) or float(kv) <= 0 or (out / run.replace(":", "_")).exists():
            raise SystemExit(f"--run {run}: KV:FEED with KV > 0 and FEED 'set' or a number of trees, into a new --out")
    cut_protocol(args.sets, args.tasks, out)
    runs = [subprocess.Popen([sys.executable, __file__, "--one", run, "--sets", *args.sets, "--out", str(out)], env=os.environ)
            for run in args.run]
    if any(run.wait() for run in runs):
        raise SystemExit("a run failed (its output is above)")
    rows = [json.loads((out / f"{run.replace(':', '_')}.json").read_text()) for run in args.run]
    keys = [k for k in rows[0] if k != "run"]
    print("| measure | " + " | ".join(r["run"] for r in rows) + " |")
    print("|---" * (len(rows) + 1) + "|")
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r[k]) for r in rows) + " |")


if __name__ == "__main__":
    main()
