"""The ``sera`` command. Every subcommand prints a one-line JSON summary last.

Subcommands (later issues add more):

* ``sera tasks --env textcraft|textworld --split SPLIT --out FILE``: write a task split
  (JSONL); identical bytes on every run and under any PYTHONHASHSEED.
* ``sera solve --env textcraft|textworld --tasks FILE [--format native|official]
  [--mode flat|delegate|gold]``: play tasks with the expert and report the checker's
  verdicts (``tasks``, ``passed``, ``success_rate``, ``by_difficulty``, and for
  TextWorld ``by_family``). ``--out`` appends result rows as tasks finish, and a rerun
  resumes from them.
* ``sera world --env textcraft --out FILE``: export the recipe book as JSON.
* ``sera export --run RUN --out DIR``: a training checkpoint's model as a Hugging Face folder.
* ``sera rollout ...``: play tasks through the recursive runtime (see ``--help``).
* ``sera tiny build|measure|compare``: build or measure the embedded tiny model, or apply the
  warm-start protocol's rule to two measurements.
* ``sera eval --env E --tasks FILE --policy P [--seeds 3] [--select N] [--resume]
  [--shard i/n] [--merge] --out DIR``: evaluate under the paper's contract
  (:mod:`sera_core.eval.evaluator`); prints the summary (and tasks per minute).
* ``sera tables [--runs DIR] [--out figures]``: the paper's tables (CSV, Markdown) and
  plots from the published numbers, your evaluations beside them (:mod:`sera_core.report`).
* ``sera course record [--out notebooks/fixture] [--config FILE] [--set KEY=VALUE ...]``: record the
  course's shared fixture, the rollouts notebooks 04-07 read (:func:`sera_core.course.record_fixture`).
* ``sera train --config FILE [--dry-run] [--resume] [--total-updates N] [--out DIR] [--set KEY=VALUE ...]``: train
  a method (``sera_core/configs/<env>/<method>_<scale>.yaml``); ``--dry-run`` validates
  the config and prints the plan without loading a model.

On a usage or input error (:class:`~sera_core.utils.errors.UserInputError`: a config key,
a task file, an argument, a run or evaluation folder, named in the message) the last line
is ``{"command": ..., "error": ...}`` and the exit status is 2. Any other error is a bug:
its traceback goes to stderr, the last line is ``{"command": ..., "error": "internal
error: ..."}`` and the exit status is 1.

One parser and one small function per command; the work itself lives in the library, so
it stays one module.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sera_core import __version__
from sera_core.utils.errors import UserInputError


def _benchmark(args: argparse.Namespace):
    """The benchmark ``--env`` names (``--format official``: official task records)."""
    from sera_core.envs.registry import benchmark

    return benchmark(args.env, official=getattr(args, "format", "native") == "official")


def cmd_tasks(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.utils.jsonio import write_jsonl

    bench = _benchmark(args)
    if args.split not in bench.splits:
        raise UserInputError(f"{args.env} has splits {', '.join(bench.splits)}, not {args.split!r}")
    records = bench.generate_split(args.split, progress=True, world_seed=args.world_seed,
                                   items_per_tier=args.items_per_tier, seed=args.seed)
    from sera_core.envs.registry import select_tasks

    records = select_tasks(args.env, records, difficulty=args.difficulty or None, count=args.limit,
                           source=f"{args.env} {args.split}")
    write_jsonl(args.out, records, sort_keys=bench.sorted_keys)
    digest = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()
    return {"env": args.env, "split": args.split, "tasks": len(records), "out": str(args.out),
            "sha256": digest, "stats": bench.split_stats(records)}


def _breakdown(rows: list[dict], key: str) -> dict[str, dict]:
    """Tasks, passed and success rate per value of ``key`` (difficulties in their order)."""
    from sera_core.envs import DIFFICULTIES

    by: dict[str, Counter] = {}
    for row in rows:
        c = by.setdefault(str(row[key]), Counter())
        c["tasks"] += 1
        c["passed"] += int(row["passed"])
    order = sorted(by, key=lambda v: (DIFFICULTIES.index(v) if v in DIFFICULTIES else 99, v))
    return {v: {**by[v], "success_rate": round(by[v]["passed"] / by[v]["tasks"], 4)} for v in order}


def _read_tasks(args: argparse.Namespace, validate) -> tuple[list[dict], list]:
    """The task records of ``--tasks`` (first ``--limit``), validated, with their unique ids."""
    from sera_core.utils.jsonio import read_jsonl

    records = list(read_jsonl(args.tasks))
    if args.limit is not None:
        records = records[: args.limit]
    for i, rec in enumerate(records):
        validate(rec, f"{args.tasks}:{i + 1}")
    ids = [rec.get("id", rec.get("task_id", i)) for i, rec in enumerate(records)]
    if len(set(ids)) != len(ids):
        raise UserInputError(f"{args.tasks}: task ids are not unique")
    return records, ids


def cmd_solve(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.utils.jsonio import JsonlCheckpoint

    bench = _benchmark(args)
    mode = args.mode or ("gold" if bench.official and "gold" in bench.expert_modes else "flat")
    if mode not in bench.expert_modes:
        raise UserInputError(f"{args.env} has expert modes {', '.join(bench.expert_modes)}, not {mode!r}")
    solve, keys = bench.solver(mode)
    records, ids = _read_tasks(args, bench.validate_record)
    checkpoint = JsonlCheckpoint(args.out) if args.out else None
    done = checkpoint.records if checkpoint is not None else {}
    other_modes = {r.get("mode") for r in done.values()} - {mode}
    if other_modes:
        raise UserInputError(f"{args.out} holds results of mode {sorted(map(str, other_modes))}; use another --out")
    resumed = sum(1 for i in ids if i in done)
    t0 = time.perf_counter()
    for task_id, rec in tqdm(list(zip(ids, records, strict=True)), desc=f"solve ({mode})", unit="task",
                             file=sys.stderr, mininterval=1.0):
        if task_id in done:
            continue
        row = {**solve(rec), "id": task_id}
        if checkpoint is not None:
            checkpoint.add(row)
        else:
            done[task_id] = row
    seconds = time.perf_counter() - t0
    rows = [done[i] for i in ids]
    passed = sum(int(r["passed"]) for r in rows)
    for row in rows:
        if not row["passed"]:
            print(f"FAIL {row['id']}: {row['reason']}")
    return {
        "env": args.env, "format": args.format, "mode": mode, "tasks": len(rows), "passed": passed,
        "success_rate": round(passed / len(rows), 4) if rows else 0.0,
        **{f"by_{k}": _breakdown(rows, k) for k in keys},
        "agents": sum(r["agents"] for r in rows), "steps": sum(r["total_steps"] for r in rows),
        "resumed": resumed, "seconds": round(seconds, 2),
    }


def _actor(args: argparse.Namespace):
    """The actor named by ``--policy`` (:func:`sera_core.agents.actors.make_actor`), the expert's
    mistakes at the rate ``--noise``."""
    from sera_core.agents.actors import make_actor

    if not 0.0 <= args.noise <= 1.0:
        raise UserInputError("--noise is a probability in [0, 1]")
    try:
        return make_actor(args.policy, max_batch=args.max_batch, noise=args.noise, tokenizer=args.tokenizer)
    except UserInputError as exc:
        raise UserInputError(f"--policy: {exc}") from None


def _external(args: argparse.Namespace):
    """The external rubric writer/scorer (an OpenAI-compatible endpoint), when one is asked for."""
    from sera_core.agents.actors import external_actor

    try:
        return external_actor(args.rubric_writer, args.scorer, args.external_url, args.external_model)
    except UserInputError:
        raise UserInputError("--rubric-writer/--scorer external needs --external-url (and --external-model)") from None


def cmd_rollout(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.agents.runtime import Runtime, RuntimeConfig
    from sera_core.agents.summary import summarize, write_rollouts

    cfg = RuntimeConfig(counterfactual=args.counterfactual, temperature=args.temperature, seed=args.seed,
                        rubric_writer=args.rubric_writer, scorer=args.scorer, malformed_policy=args.malformed_policy)
    external = _external(args)
    records, _ = _read_tasks(args, _benchmark(args).validate_record)
    runtime = Runtime(args.env, _actor(args), cfg, external=external, official=args.format == "official")
    t0 = time.perf_counter()
    rollouts = runtime.run(records, trees=args.trees, progress=True)
    summary = {"env": args.env, "policy": args.policy, "counterfactual": args.counterfactual,
               **summarize(rollouts, runtime.judge, time.perf_counter() - t0), "out": str(args.out)}
    if external is not None:
        summary["external"] = external.stats.as_dict()
    write_rollouts(args.out, rollouts, summary)
    return summary


def cmd_eval(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.eval.evaluator import EvalConfig, evaluate, merge

    if args.merge:
        return merge(args.out)
    if args.tasks is None:
        raise UserInputError("--tasks FILE is required (write one with `sera tasks`)")
    try:
        i, n = (int(x) for x in args.shard.split("/"))
    except ValueError:
        raise UserInputError(f"--shard must be i/n (e.g. 0/4), got {args.shard!r}") from None
    cfg = EvalConfig(args.env, seeds=args.seeds, select=args.select, select_temperature=args.select_temperature,
                     scorer=args.scorer, concurrency=args.concurrency, label=args.label or args.policy,
                     method=args.method, policy=args.policy, judge=args.judge,
                     judge_model=args.judge_model if args.judge == "llm" else None)
    judge = None
    if args.judge == "llm":
        from sera_core.envs.registry import benchmark

        if not (args.judge_url and args.judge_model):
            raise UserInputError("--judge llm needs the endpoint's base URL (--judge-url) and a model name "
                                 "(--judge-model)")
        judge = benchmark(args.env).make_judge("llm", url=args.judge_url, model=args.judge_model, cache=args.judge_cache)
    records, _ = _read_tasks(args, _benchmark(args).validate_record)
    t0 = time.perf_counter()
    summary = evaluate(records, _actor(args), args.out, cfg, shard=(i, n), resume=args.resume,
                       external=_external(args), judge=judge, official=args.format == "official")
    minutes = (time.perf_counter() - t0) / 60
    return {**summary, "tasks_per_minute": round(summary["played"] / minutes, 2) if minutes else None}


def cmd_tables(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.report.build import build_report

    result = build_report(args.out, args.runs)
    if args.runs is not None and not result["runs"]:
        print(f"note: no evaluation summary (summary.json, format sera.eval/1) under {args.runs}", file=sys.stderr)
    return {"out": str(args.out), "files": len(result["files"]), "runs": result["runs"]}


def cmd_tiny(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    from sera_core.policy.models import EMBEDDED, is_adapter
    from sera_core.tiny.warmstart import (EPOCH_WARMSTART, SMALL_WARMSTART, build_adapter, built_folder,
                                          plan_build, read_manifest, shipped_recipe, write_manifest)

    if args.action == "build":
        if args.small and args.epoch:
            raise UserInputError("--small and --epoch name two recipes: pass one")
        recipe = SMALL_WARMSTART if args.small else EPOCH_WARMSTART if args.epoch else shipped_recipe()
        demos = {k: v for k, v in (("perturb", args.perturb), ("explain", args.explain or None),
                                   ("oversample", args.oversample), ("textworld_easy", args.textworld_easy)) if v is not None}
        recipe = replace(recipe, demos=replace(recipe.demos, **demos))
        if args.plan:
            return {"action": "plan", **plan_build(recipe, progress=True)}
        out = args.out or built_folder(recipe)
        manifest = build_adapter(recipe, out, progress=True, recompute=not args.no_recompute, carry=args.carry)
        return {"action": "build", "out": str(out), "recipe_hash": manifest["recipe_hash"],
                "parameters": manifest["parameters"], "build_seconds": manifest["build_seconds"],
                "final_loss": manifest["training"]["final_loss"], "adapter_sha256": manifest["adapter_sha256"]}
    if args.action == "ship":  # the rule, then the candidate's adapter in the shipped one's place if it ships
        from sera_core.tiny.verdict import ship, verdict_table

        if args.save is None or args.against is None:
            raise UserInputError("ship reads two measurement folders: --save CANDIDATE --against SHIPPED")
        verdict = ship(args.save, args.against, args.protocol or "warmstart", to=args.out)
        print(verdict_table(verdict), file=sys.stderr)
        return {"action": "ship", "shipped": verdict["shipped"], "beaten": verdict["beaten"], "of": verdict["of"],
                **{k: verdict[k] for k in ("to", "recipe_hash") if k in verdict}}
    if args.action == "compare":  # the protocol's rule on two measurements (sera_core.tiny.verdict)
        from sera_core.tiny.verdict import compare_measurements, verdict_table

        if args.save is None or args.against is None:
            raise UserInputError("compare reads two measurement folders: --save CANDIDATE --against SHIPPED")
        verdict = compare_measurements(args.against, args.save, args.protocol or "warmstart")
        if args.write:
            from sera_core.utils.jsonio import write_atomic

            record = verdict | {"command": "sera tiny compare --save {} --against {}".format(args.save, args.against)}
            args.write.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(args.write, (json.dumps(record, indent=1) + "\n").encode())
        print(verdict_table(verdict), file=sys.stderr)
        return {"action": "compare", **verdict}
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.tiny.measure import measure, measured_tasks

    model = args.out or (built_folder(EPOCH_WARMSTART) if args.epoch else EMBEDDED)
    if not is_adapter(model):
        raise UserInputError(f"{model} holds no adapter (run `sera tiny build` first)")
    if args.protocol:  # the frozen protocol's sets (docs/protocol.md), resumable in --save (a folder)
        from sera_core.tiny.measure import measure_protocol

        if args.save is None:
            raise UserInputError("measure --protocol keeps its trees and results in a folder: pass --save FOLDER")
        from sera_core.policy.vllm_backend import EngineConfig

        if args.kv_cache_gib is not None and not args.kv_cache_gib > 0:
            raise UserInputError(f"--kv-cache-gib: a size in GiB above 0, not {args.kv_cache_gib}")
        engine = EngineConfig(kv_cache_gib=args.kv_cache_gib) if args.kv_cache_gib is not None else None
        results = measure_protocol(f"vllm:{model}", args.protocol, args.sets, out=args.save, progress=True,
                                   trees_in_flight=args.trees_in_flight, engine=engine)
        return {"action": "measure", "model": str(model), **results}
    tasks = {env: measured_tasks(env, args.tasks) for env in (BENCHMARKS if args.env == "both" else (args.env,))}
    results = measure(model, tasks, groups=args.groups, points=args.points, progress=True, save=args.save)
    if args.record:  # per benchmark: a measurement of one benchmark keeps the others' recorded figures
        manifest = read_manifest(model)
        manifest["results"] = {k: v for k, v in manifest.get("results", {}).items() if k in BENCHMARKS} | results
        write_manifest(Path(model), manifest)
    return {"action": "measure", "model": str(model), **results}


def _setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--set``: the value read as YAML (``[easy]`` is a list, ``8`` an int),
    and a plain word that Python reads as a number is that number (YAML 1.1 reads ``2e-4`` as text)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserInputError(f"--set takes KEY=VALUE, got {text!r}")
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise UserInputError(f"--set {key.strip()}: the value is not YAML ({exc})") from None
    if isinstance(parsed, str):
        with contextlib.suppress(ValueError):
            parsed = float(parsed)
    return key.strip(), parsed


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.train.config import load_config
    from sera_core.train.trainer import Trainer, leave_on_failure, plan

    overrides = dict(_setting(text) for text in args.set or [])
    if args.out:
        overrides["out"] = str(args.out)
    cfg = load_config(args.config, **overrides)
    if args.total_updates is not None:
        if args.total_updates < 1:
            raise UserInputError("--total-updates must be >= 1")
        cfg = cfg.replace(total_updates=args.total_updates)
    if args.dry_run:
        return {"action": "plan", **plan(cfg)}
    with leave_on_failure():  # a failing process of a multi-process launch exits at once, so the launcher stops the rest
        trainer = Trainer(cfg)
        rows = trainer.run(resume=args.resume)
        trainer.close()  # a multi-process launch ends its process group before it exits
    last = rows[-1] if rows else {}
    return {"action": "train", "method": cfg.method, "out": cfg.out, "version": trainer.updates_done,
            "updates": len(rows), "root_success": last.get("root_success"), "stage": last.get("stage"),
            "tokens_trained": trainer.counters["tokens_trained"]}  # since the run began (resumes included)


def cmd_course(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core import course

    recording = dict(overrides=dict(_setting(text) for text in args.set or []), expert_tasks=args.expert_tasks,
                     points=args.points, policy_tasks=args.policy_tasks, seed=args.seed, policy_seed=args.policy_seed,
                     policy_max_steps=args.policy_max_steps or None, policy_split=args.policy_split,
                     delegating_tasks=args.delegating_tasks, seed_tries=args.policy_seed_tries)
    if args.unless_current:
        why = course.stale_fixture(args.out, args.config, **recording)
        if why is None:
            return {"action": "record", "out": str(args.out), "recorded": False,
                    "why": "current: recorded with these arguments by the adapter shipped now"}
        print(f"recording: {why}", file=sys.stderr)
    manifest = course.record_fixture(args.out, args.config, **recording, progress=True)
    return {"action": "record", "out": str(args.out), "recorded": True, "config_hash": manifest["config"]["hash"],
            "points": manifest["expert"]["groups"], "policy_root_rewards": manifest["policy"]["root_rewards"],
            "bytes": manifest["bytes"], "seconds": manifest["seconds"]}


def cmd_export(args: argparse.Namespace) -> dict[str, Any]:
    from sera_core.policy.checkpoints import export_checkpoint

    return {"out": str(export_checkpoint(args.run, args.out))}


def cmd_world(args: argparse.Namespace) -> dict[str, Any]:
    counts = _benchmark(args).export_world(args.out, world_seed=args.world_seed, items_per_tier=args.items_per_tier)
    return {"env": args.env, "out": str(args.out), **counts}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sera", description="SERA workbook command line.")
    parser.add_argument("--version", action="version", version=f"sera {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from sera_core.envs import DIFFICULTIES
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.rubrics import MalformedPolicy

    envs = list(BENCHMARKS)

    def union(field: str) -> list[str]:
        """Every benchmark's values of the class attribute ``field``, in registry order, once each."""
        return list(dict.fromkeys(v for b in BENCHMARKS.values() for v in getattr(b, field)))

    def world_args(p: argparse.ArgumentParser, envs: Sequence[str] = envs) -> None:
        p.add_argument("--env", choices=list(envs), default="textcraft", help="benchmark")
        p.add_argument("--world-seed", type=int, default=0, help="TextCraft: seed of the recipe world")
        p.add_argument("--items-per-tier", type=int, default=25, help="crafted items per domain and tier")

    p = sub.add_parser("tasks", help="write a task split as JSONL")
    world_args(p)
    p.add_argument("--split", choices=sorted(union("splits")), required=True,
                   help="; ".join(f"{name}: {'|'.join(b.splits)}" for name, b in BENCHMARKS.items()))
    p.add_argument("--seed", type=int, default=0, help="TextCraft: seed of the task draws")
    p.add_argument("--difficulty", action="append", choices=list(DIFFICULTIES),
                   help="write only tasks of this level (repeatable; before --limit)")
    p.add_argument("--limit", type=int, help="write only the first N tasks")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("solve", help="solve tasks with the expert and check them")
    p.add_argument("--env", choices=envs, default="textcraft", help="benchmark")
    p.add_argument("--tasks", type=Path, required=True, help="JSONL task file")
    p.add_argument("--format", choices=["native", "official"], default="native",
                   help="official task records (TextCraft: recipes rebuilt from each gold plan)")
    p.add_argument("--mode", choices=union("expert_modes"),
                   help="expert mode (default: gold for official TextCraft records, else flat; gold is TextCraft only)")
    p.add_argument("--limit", type=int, help="solve only the first N tasks")
    p.add_argument("--out", type=Path,
                   help="result rows (JSONL), appended as tasks finish; rerunning resumes, skipping finished tasks")
    p.set_defaults(func=cmd_solve)

    p = sub.add_parser("rollout", help="play tasks as recursive agent trees; write trees and delegation points")
    p.add_argument("--env", choices=envs, default="textcraft", help="benchmark")
    p.add_argument("--tasks", type=Path, required=True, help="JSONL task file")
    p.add_argument("--format", choices=["native", "official"], default="native", help="official task records")
    p.add_argument("--policy", default="expert",
                   help="expert, tiny (the embedded SmolLM2-135M + LoRA policy), hf:PATH (a local model or adapter folder) or vllm:PATH (GPU, [gpu] extra)")
    p.add_argument("--counterfactual", type=int, default=0, metavar="B",
                   help="branches per counterfactual group at delegation points (0: off; the paper uses 8)")
    p.add_argument("--trees", type=int, default=1, help="rollouts per task")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of agent turns")
    p.add_argument("--seed", type=int, default=0, help="base seed of every derived seed")
    p.add_argument("--noise", type=float, default=0.0,
                   help="expert: chance of a wasted craft / wrong preparation (and half of it of finishing early)")
    p.add_argument("--rubric-writer", choices=["policy", "global", "external"], default="policy",
                   help="who writes rubrics (global: one fixed rubric; external: --external-url)")
    p.add_argument("--scorer", choices=["policy", "external"], default="policy", help="who scores children")
    p.add_argument("--external-url", help="OpenAI-compatible endpoint of the external model (key: $SERA_EXTERNAL_API_KEY)")
    p.add_argument("--external-model", default="external", help="model name sent to the external endpoint")
    p.add_argument("--malformed-policy", choices=[p.value for p in MalformedPolicy],
                   default="drop_trajectory", help="what a malformed rubric or score does to the child's reward")
    p.add_argument("--tokenizer", type=Path, help="expert: tokenizer folder (default: a built-in byte-level BPE)")
    p.add_argument("--max-batch", type=int, default=64, help="hf: most sequences per generation batch")
    p.add_argument("--out", type=Path, required=True, help="output folder (trees.jsonl, delegation_points.jsonl, summary.json)")
    p.set_defaults(func=cmd_rollout)

    p = sub.add_parser("eval", help="evaluate a policy under the paper's contract (resumable, shardable)")
    p.add_argument("--env", choices=envs, default="textcraft", help="benchmark")
    p.add_argument("--tasks", type=Path, help="JSONL task file (e.g. `sera tasks --split val`)")
    p.add_argument("--format", choices=["native", "official"], default="native", help="official task records")
    p.add_argument("--policy", default="expert",
                   help="expert, tiny (the embedded policy), hf:PATH (a model or adapter folder, or a `sera train` run/checkpoint) or vllm:PATH")
    p.add_argument("--seeds", type=int, default=1, help="runs over the tasks (seeds 0..N-1); mean and std over them")
    p.add_argument("--select", type=int, default=1, metavar="N", help="test-time selection: candidates per delegation")
    p.add_argument("--select-temperature", type=float, default=1.0, help="sampling temperature of selection candidates")
    p.add_argument("--scorer", choices=["policy", "external"], default="policy", help="who scores selection candidates")
    p.add_argument("--external-url", help="OpenAI-compatible endpoint of the external judge (key: $SERA_EXTERNAL_API_KEY)")
    p.add_argument("--external-model", default="external", help="model name sent to the external endpoint")
    p.add_argument("--judge", choices=union("judges"), default="program",
                   help="who labels the children (rows' children_passed): the checkers, or for TextWorld an LLM judge "
                        "for free-form subgoals (key: $SERA_JUDGE_API_KEY)")
    p.add_argument("--judge-url", help="--judge llm: OpenAI-compatible base URL")
    p.add_argument("--judge-model", help="--judge llm: model name")
    p.add_argument("--judge-cache", help="--judge llm: JSONL file of cached verdicts (reused across runs)")
    p.add_argument("--resume", action="store_true", help="skip finished tasks, rerun errored ones")
    p.add_argument("--shard", default="0/1", help="i/n: play the tasks whose index is i mod n")
    p.add_argument("--merge", action="store_true", help="combine the shards of --out into seed*.jsonl and summary.json")
    p.add_argument("--concurrency", type=int, default=16, help="tasks played at once")
    p.add_argument("--label", help="row name in reports: model and scale (default: the policy)")
    p.add_argument("--method", help="the method row this stands for (sera, rao, ...)")
    p.add_argument("--limit", type=int, help="only the first N tasks")
    p.add_argument("--noise", type=float, default=0.0, help="expert: chance of a mistake")
    p.add_argument("--tokenizer", type=Path, help="expert: tokenizer folder")
    p.add_argument("--max-batch", type=int, default=64, help="hf: most sequences per generation batch")
    p.add_argument("--out", type=Path, required=True, help="output folder (plan.json, per-seed rows, summary.json)")
    p.set_defaults(func=cmd_eval, rubric_writer="policy")

    p = sub.add_parser("tables", help="rebuild the paper's tables and figures (with your runs beside them)")
    p.add_argument("--runs", type=Path, help="a folder searched for your evaluation summaries (summary.json)")
    p.add_argument("--out", type=Path, default=Path("figures"), help="output folder")
    p.set_defaults(func=cmd_tables)

    p = sub.add_parser("tiny", help="build, measure, compare or ship the embedded policy (SmolLM2-135M-Instruct + LoRA warm start)")
    p.add_argument("action", choices=["build", "measure", "compare", "ship"])
    p.add_argument("--small", action="store_true", help="build: the small test recipe (a minute)")
    p.add_argument("--epoch", action="store_true",
                   help="build: the one-epoch recipe (EPOCH_WARMSTART: every demonstration once, whole, in packed steps; "
                        "hours on 2 cores, resumes: docs/embedded.md); measure: its adapter (the build's default folder)")
    p.add_argument("--plan", action="store_true",
                   help="build: play the demonstrations and print what the build would train (table by benchmark and "
                        "role, positions, steps), without training")
    p.add_argument("--no-recompute", action="store_true",
                   help="build: keep activations instead of recomputing them in the backward pass (faster, more memory; "
                        "the same adapter)")
    p.add_argument("--carry", type=Path, default=None,
                   help="build: mirror each checkpoint into CARRY/<recipe hash>/sft and resume from there where it is "
                        "further on than the work folder (commit CARRY to carry a build of hours to another machine); "
                        "the finished adapter is left in CARRY/<recipe hash>/adapter")
    p.add_argument("--perturb", type=float, default=None,
                   help="build: share of the expert's turns replaced by harmless mistakes it recovers from (recovery "
                        "demonstrations; 0: the shipped recipe)")
    p.add_argument("--explain", action="store_true",
                   help="build: the expert spells out its delegation decision, crafting arithmetic and gate check "
                        "(DemoConfig.explain; off: the shipped recipe)")
    p.add_argument("--oversample", type=int, default=None,
                   help="build: repeat samples that delegate or score a failed child this many times (1: the shipped recipe)")
    p.add_argument("--textworld-easy", type=int, default=None,
                   help="build: easy 2-dish TextWorld demonstrations from train-fold foods (DemoConfig.textworld_easy; "
                        "0: the shipped recipe)")
    p.add_argument("--out", type=Path,
                   help="build: output folder (default ~/.cache/sera/embedded/<recipe hash>); measure: the adapter "
                        "folder (default: the shipped one); ship: where the adapter goes (default: the shipped one's folder)")
    p.add_argument("--tasks", type=int, default=20,
                   help="measure: tasks per level (TextCraft val easy and medium, TextWorld test easy)")
    p.add_argument("--groups", type=int, default=8, help="measure: tasks played with counterfactual groups at temperature 1")
    p.add_argument("--points", type=int, default=0,
                   help="measure: the scorer on the held-out delegation points of this many of the hardest level's last tasks")
    p.add_argument("--env", choices=["both", *envs], default="both",
                   help="measure: one benchmark only, or every one (both; two processes can measure two "
                        "benchmarks side by side)")
    p.add_argument("--record", action="store_true", help="measure: write the results into the model's manifest")
    p.add_argument("--save", type=Path, help="measure: keep partial figures in this JSON file; a rerun with it resumes "
                                                "(with --protocol: a folder)")
    p.add_argument("--protocol", default=None,
                   help="measure: the sets of a frozen protocol instead (docs/protocol.md, e.g. warmstart; vLLM engine)")
    p.add_argument("--sets", nargs="+", default=None, help="measure --protocol: these sets (default: its test sets and the sets its measures read)")
    p.add_argument("--trees-in-flight", type=int, default=None,
                   help="measure --protocol: trees played at a time across the sets (default: "
                        "sera_core.tiny.measure.TREES_IN_FLIGHT)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="measure --protocol: GiB of KV cache the vLLM engine reserves on CPUs (default: "
                        "EngineConfig.kv_cache_gib's)")
    p.add_argument("--against", type=Path, default=None,
                   help="compare, ship: the shipped adapter's measurement folder (--save names the candidate's)")
    p.add_argument("--write", type=Path, default=None, help="compare: write the verdict to this JSON file (figures/warmstart.json)")
    p.set_defaults(func=cmd_tiny)

    p = sub.add_parser("train", help="train a method from a config file (SERA, RAO, ablations)")
    p.add_argument("--config", type=Path, required=True, help="a YAML file, or a shipped config named relative to sera_core/configs (textcraft/sera_tiny.yaml)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; load no model")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument("--total-updates", "--max-steps", type=int, dest="total_updates",
                   help="override the config's number of optimizer updates (--max-steps: its former name)")
    p.add_argument("--out", type=Path, help="override the config's run folder")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override any config key (repeatable; the value is read as YAML, e.g. --set difficulties=[easy]); "
                        "checked like the file's keys before any work")
    p.set_defaults(func=cmd_train)

    from sera_core.course import FIXTURE_CONFIG, FIXTURE_DELEGATING_TASKS, FIXTURE_POLICY_SEED, FIXTURE_POLICY_STEPS

    p = sub.add_parser("course", help="record the course's shared fixture: the rollouts notebooks 04-07 read")
    p.add_argument("action", choices=["record"])
    p.add_argument("--out", type=Path, default=Path("notebooks/fixture"), help="the fixture folder (replaced whole)")
    p.add_argument("--config", default=FIXTURE_CONFIG, help="the run config (its rollout settings, model and K trees per task)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.add_argument("--expert-tasks", type=int, default=2, help="medium evaluation tasks the noisy expert plays (K trees each)")
    p.add_argument("--points", type=int, default=4, help="mixed delegation points kept (the smallest) and rescored by the policy")
    p.add_argument("--policy-tasks", type=int, default=2, help="easy tasks the policy plays (K trees each)")
    p.add_argument("--policy-split", default="train", help="the split of the policy's tasks (the trainer's: train)")
    p.add_argument("--seed", type=int, help="runtime seed of the expert's trees and the rescoring (default: the config's)")
    p.add_argument("--policy-seed", type=int, default=FIXTURE_POLICY_SEED,
                   help="runtime seed of the policy's trees (one at which a task's trees end differently)")
    p.add_argument("--policy-max-steps", type=int, default=FIXTURE_POLICY_STEPS,
                   help="steps per agent of the policy's trees (0: the config's)")
    p.add_argument("--delegating-tasks", type=int, default=FIXTURE_DELEGATING_TASKS,
                   help="medium tasks the policy plays greedily for a tree whose root delegates (0: none)")
    p.add_argument("--policy-seed-tries", type=int, default=1,
                   help="policy seeds tried from --policy-seed on, until a task's trees end differently (the "
                        "manifest's command names the seed kept)")
    p.add_argument("--unless-current", action="store_true",
                   help="record nothing when the fixture at --out was recorded with these arguments by the adapter "
                        "shipped now (make course-fixture, after `sera tiny ship`)")
    p.set_defaults(func=cmd_course)

    p = sub.add_parser("export", help="write a training checkpoint's model as a Hugging Face folder")
    p.add_argument("--run", type=Path, required=True, help="a `sera train` run folder or its checkpoint/")
    p.add_argument("--out", type=Path, required=True, help="the Hugging Face folder to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("world", help="export a benchmark's generated world as JSON (TextCraft: its recipe world)")
    world_args(p, [name for name, b in BENCHMARKS.items() if b.export_world is not None])
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_world)
    return parser


QUIET_VLLM = "ERROR"
"""vLLM's log level under the ``sera`` command unless ``VLLM_LOGGING_LEVEL`` is set (as in the
notebooks, ``course.setup``): its INFO lines (engine arguments, memory, compile notes) would bury
the command's own output. ``VLLM_LOGGING_LEVEL=INFO sera ...`` shows them."""


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", QUIET_VLLM)  # read when vLLM is first imported, after this
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage message
        if exc.code:
            print(json.dumps({"command": None, "error": "invalid arguments"}))
        return int(exc.code or 0)
    try:
        summary = args.func(args)
    except UserInputError as exc:  # the user's to fix: the message names the file, key or argument
        print(json.dumps({"command": args.command, "error": str(exc)}))
        return 2
    except Exception as exc:  # a bug: its traceback, and exit 1
        traceback.print_exc()
        print(json.dumps({"command": args.command, "error": f"internal error: {type(exc).__name__}: {exc}"}))
        return 1
    print(json.dumps({"command": args.command, **summary}))
    return 0


if __name__ == "__main__":  # ``python -m sera_core.cli`` is the ``sera`` command too (``python -m sera_core`` as well)
    raise SystemExit(main())
