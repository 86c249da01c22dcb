"""Benchmarks for TextWorld-Sync (numbers go to docs/benchmarks.md; not a test).

1. Environment actions per second, single-threaded (valid and invalid mixed).
2. ``fork()`` of an extreme task's world, median.
3. The expert's turns and global steps per task by family and difficulty, against the
   shared budget, in flat and delegate modes.

Run: ``.venv/bin/python scripts/bench_textworld.py --per-cell 10``.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import time

import pandas as pd

from sera_core.envs.textworld.expert import ExpertConfig, solve_task
from sera_core.envs.textworld.tasks import generate_split
from sera_core.envs.textworld.world import SyncWorld


def bench_actions(record: dict, n: int) -> float:
    """Actions per second on one world (budget lifted so nothing is refused)."""
    world = SyncWorld.from_record(record)
    world.state.max_steps = 10**9
    rng = random.Random(0)
    names = sorted(world.state.items)
    commands = [rng.choice([f"take {rng.choice(names)}", f"dice {rng.choice(names)}", "go to pantry",
                            "inventory", "open door", "dance"]) for _ in range(n)]
    t = time.perf_counter()
    for cmd in commands:
        world.act("kitchen", cmd)
        world.observe("kitchen")
    return n / (time.perf_counter() - t)


def bench_fork(record: dict, n: int) -> float:
    world = SyncWorld.from_record(record)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        world.fork()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-cell", type=int, default=10, help="test tasks per (family, difficulty)")
    args = ap.parse_args()
    test = generate_split("test")
    extreme = next(r for r in test if r["difficulty"] == "extreme" and r["task_family"] == "hierarchical")
    print(f"# {platform.machine()}, Python {platform.python_version()}")
    print(f"actions/s (act + observe): {bench_actions(extreme, 20000):,.0f}")
    print(f"fork of an extreme world: median {bench_fork(extreme, 500):.0f} us")
    chosen = [r for r in test if int(r["task_id"][-4:]) < args.per_cell]
    rows = []
    for mode in ("flat", "delegate"):
        for r in chosen:
            rows.append(solve_task(r, ExpertConfig(mode=mode)))
    df = pd.DataFrame(rows)
    df["budget_used"] = df["global_steps_used"] / df["global_budget"]
    table = df.groupby(["mode", "difficulty"]).agg(
        tasks=("passed", "size"), passed=("passed", "sum"), turns=("total_steps", "mean"),
        agents=("agents", "mean"), global_steps=("global_steps_used", "mean"), budget=("global_budget", "mean"),
        max_budget_used=("budget_used", "max"), ms=("seconds", "mean"))
    table["ms"] *= 1000
    print(table.round(2).to_string())
    fam = df[df["mode"] == "delegate"].groupby("family").agg(
        passed=("passed", "mean"), turns=("total_steps", "mean"), global_steps=("global_steps_used", "mean"),
        budget=("global_budget", "mean"))
    print(fam.round(2).to_string())


if __name__ == "__main__":
    main()
