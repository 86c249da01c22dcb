"""Benchmarks for TextCraft-Synth (numbers go to docs/benchmarks.md; not a test).

1. A typical code cell in the sandbox vs the same cell in IPython's InteractiveShell,
   warm (the cell's source was seen before: compile cache hit) and cold (every cell new).
2. ``fork()`` of a hard task's state, median over many forks.
3. Expert steps per second on each difficulty, flat and delegate modes.

Run: ``make bench`` (or ``.venv/bin/python scripts/bench_textcraft.py --tasks 20``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import statistics
import time

from sera_core.envs.registry import select_tasks
from sera_core.envs.textcraft.env import TextCraftEnv
from sera_core.envs.textcraft.expert import ExpertConfig, solve_task
from sera_core.envs.textcraft.sandbox import _prepare
from sera_core.envs.textcraft.tasks import DIFFICULTIES, TaskConfig, generate_split, world_for

CELL = "inv = view_inventory()\nprint(craft({'raw_a1': 2}, ('a1_i1', 3)))\nprint(get_info(['a1_i1'])[0]['in_inventory'])\ninv"


def _cell_env() -> TextCraftEnv:
    from sera_core.envs.textcraft.env import CraftWorld
    from sera_core.envs.textcraft.world import Recipe, RecipeBook

    book = RecipeBook({"a1_i1": Recipe("a1_i1", (("raw_a1", 2),), 3)}, base_items=("raw_a1",))
    return TextCraftEnv(book, CraftWorld({"raw_a1": 10**9}), {"a1_i1": 3})


def _per_call_us(fn, n: int) -> float:
    for _ in range(min(50, n)):
        fn(0)
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n * 1e6


def bench_cells(n: int) -> dict:
    from IPython.core.interactiveshell import InteractiveShell

    env = _cell_env()
    sandbox_warm = _per_call_us(lambda i: env.executor.run(CELL), n)
    sandbox_cold = _per_call_us(lambda i: env.executor.run(CELL + f"\n{i}"), n)
    shell = InteractiveShell.instance()
    shell.user_ns.update(env.tools())

    def ipython(i: int, cold: bool) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            shell.run_cell(CELL + (f"\n{i}" if cold else ""), store_history=False)

    ipy_warm = _per_call_us(lambda i: ipython(i, False), n)
    ipy_cold = _per_call_us(lambda i: ipython(i, True), n)
    return {
        "sandbox_warm_us": round(sandbox_warm, 1), "sandbox_cold_us": round(sandbox_cold, 1),
        "ipython_warm_us": round(ipy_warm, 1), "ipython_cold_us": round(ipy_cold, 1),
        "speedup_warm": round(ipy_warm / sandbox_warm, 1), "speedup_cold": round(ipy_cold / sandbox_cold, 1),
    }


def bench_fork(records: list[dict], n: int) -> dict:
    book = world_for(TaskConfig().world)
    record = max((r for r in records if r["misc"]["difficulty"] == "hard"), key=lambda r: len(r["misc"]["initial_inventory"]))
    env = TextCraftEnv.from_task(record, book)
    for step in record["misc"]["gold_trajectory"][: len(record["misc"]["gold_trajectory"]) // 2]:
        env.craft(step["ingredients"], (step["target"][0], step["result_count"]))  # a mid-task state
    times = []
    for _ in range(n):
        t = time.perf_counter()
        env.fork()
        times.append(time.perf_counter() - t)
    return {"fork_median_us": round(statistics.median(times) * 1e6, 1), "inventory_items": len(env.world.inventory)}


def bench_expert(records: list[dict], per_difficulty: int) -> list[dict]:
    book = world_for(TaskConfig().world)
    rows = []
    for mode in ("flat", "delegate"):
        cfg = ExpertConfig(mode=mode)
        for d in DIFFICULTIES:
            chosen = select_tasks("textcraft", records, difficulty=d, count=per_difficulty)
            _prepare.cache_clear()
            t = time.perf_counter()
            results = [solve_task(r, book, cfg) for r in chosen]
            seconds = time.perf_counter() - t
            steps = sum(r["total_steps"] for r in results)
            rows.append({"mode": mode, "difficulty": d, "tasks": len(results), "passed": sum(r["passed"] for r in results),
                         "steps_per_task": round(steps / len(results), 1), "agents_per_task": round(sum(r["agents"] for r in results) / len(results), 1),
                         "steps_per_s": round(steps / seconds), "ms_per_task": round(seconds / len(results) * 1e3, 1),
                         "cache_hits": round(_prepare.cache_info().hits / steps, 2)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=2000, help="cells per timing")
    ap.add_argument("--forks", type=int, default=2000)
    ap.add_argument("--tasks", type=int, default=30, help="tasks per difficulty for the expert")
    args = ap.parse_args()
    records = generate_split("val")
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    cells = bench_cells(args.cells)
    print("cells:", json.dumps(cells))
    fork = bench_fork(records, args.forks)
    print("fork:", json.dumps(fork))
    print("| mode | difficulty | tasks | passed | steps/task | agents/task | steps/s | ms/task | cell cache hits |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in bench_expert(records, args.tasks):
        print(f"| {r['mode']} | {r['difficulty']} | {r['tasks']} | {r['passed']} | {r['steps_per_task']} | "
              f"{r['agents_per_task']} | {r['steps_per_s']} | {r['ms_per_task']} | {r['cache_hits']:.0%} |")


if __name__ == "__main__":
    main()
