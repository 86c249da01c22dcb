"""The ``sera`` command. Every subcommand prints a one-line JSON summary last.

Subcommands (later issues add more):

* ``sera tasks --env textcraft --split val --out FILE``: write a task split (JSONL);
  identical bytes on every run and under any PYTHONHASHSEED.
* ``sera solve --env textcraft --tasks FILE [--format native|official]
  [--mode flat|delegate|gold]``: play tasks with the expert and report the checker's
  verdicts (``tasks``, ``passed``, ``success_rate``, ``by_difficulty``).
* ``sera world --env textcraft --out FILE``: export the recipe book as JSON.

On a usage or input error the last line is ``{"command": ..., "error": ...}`` and the
exit status is 2.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sera_core import __version__


class CommandError(Exception):
    """A user-facing error: bad arguments or bad input files."""


def _world_config(args: argparse.Namespace):
    from sera_core.envs.textcraft.world import WorldConfig

    return WorldConfig(seed=args.world_seed, items_per_tier=args.items_per_tier)


def cmd_tasks(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.envs.textcraft.tasks import TaskConfig, generate_split, split_stats
    from sera_core.utils.jsonio import write_jsonl

    cfg = TaskConfig(world=_world_config(args), seed=args.seed)
    records = generate_split(args.split, cfg, progress=True)
    if args.limit is not None:
        records = records[: args.limit]
    write_jsonl(args.out, records)
    digest = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()
    return {"env": args.env, "split": args.split, "tasks": len(records), "out": str(args.out),
            "sha256": digest, "by_difficulty": split_stats(records)}


def cmd_solve(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.envs.textcraft.expert import ExpertConfig, solve_task
    from sera_core.envs.textcraft.tasks import DIFFICULTIES, book_for_record, validate_record
    from sera_core.utils.jsonio import JsonlCheckpoint, read_jsonl

    official = args.format == "official"
    mode = args.mode or ("gold" if official else "flat")
    cfg = ExpertConfig(mode=mode)
    try:
        records = list(read_jsonl(args.tasks))
    except FileNotFoundError:
        raise CommandError(f"no such task file: {args.tasks}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.limit is not None:
        records = records[: args.limit]
    for i, rec in enumerate(records):
        try:
            validate_record(rec, f"{args.tasks}:{i + 1}")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
    ids = [rec.get("id", i) for i, rec in enumerate(records)]
    if len(set(ids)) != len(ids):
        raise CommandError(f"{args.tasks}: task ids are not unique")
    checkpoint = JsonlCheckpoint(args.out) if args.out else None
    done = checkpoint.records if checkpoint is not None else {}
    other_modes = {r.get("mode") for r in done.values()} - {mode}
    if other_modes:
        raise CommandError(f"{args.out} holds results of mode {sorted(map(str, other_modes))}; use another --out")
    resumed = sum(1 for i in ids if i in done)
    t0 = time.perf_counter()
    for task_id, rec in tqdm(list(zip(ids, records, strict=True)), desc=f"solve ({mode})", unit="task", file=sys.stderr,
                             mininterval=1.0):
        if task_id in done:
            continue
        row = {**solve_task(rec, book_for_record(rec, official=official), cfg), "id": task_id}
        if checkpoint is not None:
            checkpoint.add(row)
        else:
            done[task_id] = row
    seconds = time.perf_counter() - t0
    rows = [done[i] for i in ids]
    by: dict[str, Counter] = {}
    for row in rows:
        c = by.setdefault(str(row["difficulty"]), Counter())
        c["tasks"] += 1
        c["passed"] += int(row["passed"])
    passed = sum(int(r["passed"]) for r in rows)
    for row in rows:
        if not row["passed"]:
            print(f"FAIL {row['id']}: {row['reason']}")
    return {
        "env": args.env, "format": args.format, "mode": mode, "tasks": len(rows), "passed": passed,
        "success_rate": round(passed / len(rows), 4) if rows else 0.0,
        "by_difficulty": {d: {**by[d], "success_rate": round(by[d]["passed"] / by[d]["tasks"], 4)}
                          for d in sorted(by, key=lambda d: (DIFFICULTIES.index(d) if d in DIFFICULTIES else 99, d))},
        "agents": sum(r["agents"] for r in rows), "steps": sum(r["total_steps"] for r in rows),
        "resumed": resumed, "seconds": round(seconds, 2),
    }


def cmd_world(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.envs.textcraft.world import generate_world

    book = generate_world(_world_config(args))
    book.save(args.out)
    return {"env": args.env, "out": str(args.out), "items": len(book.recipes) + len(book.base_items),
            "crafted": len(book.recipes), "base": len(book.base_items)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sera", description="SERA workbook command line.")
    parser.add_argument("--version", action="version", version=f"sera {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def world_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--env", choices=["textcraft"], default="textcraft", help="benchmark")
        p.add_argument("--world-seed", type=int, default=0, help="seed of the recipe world")
        p.add_argument("--items-per-tier", type=int, default=25, help="crafted items per domain and tier")

    p = sub.add_parser("tasks", help="write a task split as JSONL")
    world_args(p)
    p.add_argument("--split", choices=["train", "val"], required=True)
    p.add_argument("--seed", type=int, default=0, help="seed of the task draws")
    p.add_argument("--limit", type=int, help="write only the first N tasks")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("solve", help="solve tasks with the expert and check them")
    p.add_argument("--env", choices=["textcraft"], default="textcraft", help="benchmark")
    p.add_argument("--tasks", type=Path, required=True, help="JSONL task file")
    p.add_argument("--format", choices=["native", "official"], default="native",
                   help="official: rebuild recipes from each record's gold plan")
    p.add_argument("--mode", choices=["flat", "delegate", "gold"],
                   help="expert mode (default: gold for --format official, else flat)")
    p.add_argument("--limit", type=int, help="solve only the first N tasks")
    p.add_argument("--out", type=Path,
                   help="result rows (JSONL), appended as tasks finish; rerunning resumes, skipping finished tasks")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("world", help="export the recipe world as JSON")
    world_args(p)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_world)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage message
        if exc.code:
            print(json.dumps({"command": None, "error": "invalid arguments"}))
        return int(exc.code or 0)
    try:
        summary = args.func(args)
    except (CommandError, ValueError) as exc:
        print(json.dumps({"command": args.command, "error": str(exc)}))
        return 2
    print(json.dumps({"command": args.command, **summary}))
    return 0
