"""Curve 2 of the tiny experiment: SERA's execution stage on easy TextCraft, before and after (not a test).

One run per seed: ``sera train`` with the tiny config (vLLM's CPU build, 2 root tasks x 4
trees per update at temperature 1), ``schedule: execution:1`` on the *easy* train tasks, for
``--updates`` updates, from ``--start``: the shipped adapter (``tiny``) or a trained checkpoint
(``init_from``, e.g. a ``rubric_scorer_label`` run of ``scripts/rubric_curve.py``, whose scorer
says ``false`` to failed children). Before (the start, once) and after (each seed's checkpoint):
``sera eval`` root success at temperature 0 on the first ``--tasks`` easy *val* tasks, with the
paired difference's 95% interval task by task
(:func:`~sera_core.eval.aggregate.paired_change`); over seeds, mean ± Student's t half interval
(``t_{0.975, n-1} * std / sqrt(n)``).
``--max-craft-steps N`` trains on the easy train tasks of at most ``N`` crafts only (a
curriculum), and ``--val-max-craft-steps N`` measures on the easy val tasks of at most ``N``
crafts (the held-out tasks of that distribution); an ``OUT`` whose task files were written
with other options is refused before any work.

Each seed's ``train/rollouts/`` keeps the trees every update trained on (``save_rollouts``).
Each step is a ``sera`` command in its own process (its engine's memory goes with it) that
resumes (``--resume``), and a finished step is skipped, so the script can be killed and
started again at any point. ``--report`` only writes ``OUT/results.json``, ``OUT/table.md``
and ``OUT/execution_curve.png`` (``--figures DIR`` copies the figure and the results there as
``NAME.{png,json}``, ``--name`` execution_curve by default). ``OUT/start.json`` names the adapter
the runs start from (None for a checkpoint start), repeated in ``results.json`` as ``start``
(:func:`~sera_core.tiny.measure.bind_start`: a folder whose start was replaced since is refused). ``--before DIR`` reuses a finished
"before" of the same start and tasks (another OUT's ``before/``, checked against its
``plan.json``) instead of measuring it again.

``--select-every N`` keeps the best checkpoint instead of the last (early stopping on the
training distribution, never on the val tasks): training stops every ``N`` updates (and at the
last); each stop's checkpoint is copied to ``seedS/vNNN/`` and measured at temperature 0 on
``--select-tasks`` *train* tasks (``OUT/select_tasks.jsonl``, spread evenly over the training
tasks), as is the start once (``OUT/select_start/``). The "after" evaluates the candidate that
solved the most of them, the start included, a tie going to the later one (more training at the
same held-in success); :func:`best_version`. ``--val-curve`` then also measures every kept
checkpoint on the val tasks (``seedS/val/vNNN/``), a diagnostic of the choice that chooses
nothing. A run that is resumed trains on where it stopped: the trainer's constant step makes
``--total-updates 4`` then ``8`` the same run as ``8`` at once.

``--protocol learning --measure SET`` measures before and after on a set of a frozen protocol
(docs/protocol.md) instead of the first ``--tasks`` val tasks: ``OUT/protocol.json`` binds the
folder to that protocol's hash and set (a changed protocol or another set is refused before any
work, :func:`~sera_core.eval.protocol.bind_protocol`), and ``results.json`` records it with the
command line. Choose the recipe on the protocol's dev set, then report on its test set once.
Over seeds the interval is Student's t (:func:`~sera_core.eval.points.mean_interval`); within a
seed the table gives the exact McNemar p-value of the gained and lost tasks.

``nohup .venv/bin/python scripts/execution_curve.py --out runs/curve2 --start runs/rubric_curve_label5/rubric_scorer_label_seed0 > runs/curve2.log 2>&1 &``
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

from sera_core.report.curves import curve2_figure
from sera_core.report.plots import render

CONFIG = "textcraft/sera_tiny.yaml"


def sera(*args: str) -> None:
    """Run one ``sera`` command (the package's CLI, this interpreter) and stop on its failure."""
    subprocess.run([sys.executable, "-m", "sera_core", *args], check=True)


def stops(updates: int, every: int | None) -> list[int]:
    """The versions at which training stops to keep and measure a checkpoint: every ``every``
    updates and the last (only the last when ``every`` is None or 0)."""
    return sorted({*range(every, updates, every), updates}) if every else [updates]


def best_version(solved: dict[int, int]) -> int:
    """The candidate (a version; 0 is the start) with the most held-in tasks solved, a tie going
    to the later version."""
    return max(solved, key=lambda version: (solved[version], version))


def count_solved(folder: Path) -> int:
    """The tasks a finished evaluation ``folder`` solved (a row with an error is a failure)."""
    from sera_core.eval.aggregate import succeeded
    from sera_core.utils.jsonio import read_jsonl

    return sum(map(succeeded, read_jsonl(folder / "seed0.jsonl")))


def kept_run(run: Path, version: int) -> Path:
    """The run folder that keeps seed run ``run``'s checkpoint of update ``version``."""
    return run / f"v{version:03d}"


def held_in_eval(run: Path, version: int) -> Path:
    """The held-in evaluation of seed run ``run``'s checkpoint of update ``version``."""
    return run / "select" / f"v{version:03d}"


def val_eval(run: Path, version: int) -> Path:
    """The val evaluation of seed run ``run``'s kept checkpoint of update ``version`` (``--val-curve``)."""
    return run / "val" / f"v{version:03d}"


def measured_so_far(found: dict[int, Path]) -> dict[int, int]:
    """The tasks solved in each finished evaluation of ``found`` (version -> folder)."""
    return {v: count_solved(folder) for v, folder in found.items() if (folder / "summary.json").exists()}


def selection(out: Path, seed: int, versions: list[int]) -> dict[int, int]:
    """Held-in tasks solved by the start (version 0) and by each of seed ``seed``'s kept
    checkpoints measured so far."""
    run = out / f"seed{seed}"
    return measured_so_far({0: out / "select_start"} | {v: held_in_eval(run, v) for v in versions})


def val_curve(out: Path, seed: int, versions: list[int], kept: int) -> dict[int, int]:
    """Val tasks solved by the start (its "before", version 0), by each kept checkpoint that
    ``--val-curve`` measured, and by the one kept (its "after": the same checkpoint on the same
    tasks, not measured twice)."""
    run = out / f"seed{seed}"
    return measured_so_far({0: out / "before"} | {v: val_eval(run, v) for v in versions} | {kept: run / "after"})


def keep_checkpoint(run: Path, version: int) -> Path:
    """Copy ``run/train/checkpoint`` (which must be at ``version``) to ``run/vNNN/checkpoint``
    (whole, then renamed, so an interruption leaves no partial copy); the run folder kept."""
    from sera_core.policy.checkpoints import read_checkpoint

    kept = kept_run(run, version)
    if (kept / "checkpoint" / "state.json").exists():
        return kept
    found = read_checkpoint(run / "train" / "checkpoint")["version"]
    if found != version:
        raise SystemExit(f"{run / 'train'} is at update {found}, not {version}: its checkpoint {version} was not kept")
    shutil.rmtree(kept / "partial", ignore_errors=True)
    shutil.copytree(run / "train" / "checkpoint", kept / "partial")
    (kept / "partial").rename(kept / "checkpoint")
    return kept


def trained_to(run: Path) -> int:
    """The version of ``run/train``'s checkpoint (0 when none is written yet)."""
    state = run / "train" / "checkpoint" / "state.json"
    return json.loads(state.read_text())["version"] if state.exists() else 0


def run_seed(args, out: Path, seed: int, tasks: Path) -> None:
    """Train seed ``seed`` and evaluate its checkpoint (each step skipped when it is done); with
    ``--select-every``, stop at each of :func:`stops`, keep and measure the checkpoint held-in,
    and evaluate the best (:func:`best_version`)."""
    run = out / f"seed{seed}"
    train = ["train", "--config", CONFIG, "--set", "difficulties=[easy]", "--set", "schedule=execution:1",
             "--set", f"seed={seed}", "--set", "save_rollouts=true",  # the trees each update trained on, to read
             "--out", str(run / "train"), "--resume"]
    if args.max_craft_steps:
        train += ["--set", f"tasks={out / 'train_tasks.jsonl'}"]
    if args.start != "tiny":
        train += ["--set", f"init_from={args.start}"]
    for key_value in args.set:
        train += ["--set", key_value]
    if (done := trained_to(run)) > args.updates:
        raise SystemExit(f"{run / 'train'} has trained {done} updates, more than --updates {args.updates}")
    versions = stops(args.updates, args.select_every)
    policy = f"vllm:{run / 'train'}"
    label = f"execution curve, seed {seed}, after {args.updates} updates"
    for version in versions:
        if trained_to(run) < version:
            sera(*train, "--total-updates", str(version))
        if args.select_every:
            kept, measured = keep_checkpoint(run, version), held_in_eval(run, version)
            if not (measured / "summary.json").exists():
                sera("eval", "--tasks", str(out / "select_tasks.jsonl"), "--policy", f"vllm:{kept}", "--out",
                     str(measured), "--resume", "--label", f"held-in, seed {seed}, update {version}")
    if args.select_every:
        best = best_version(selection(out, seed, versions))
        policy = f"vllm:{args.start}" if best == 0 else f"vllm:{kept_run(run, best)}"
        label = f"execution curve, seed {seed}, update {best} of {args.updates} (the best held-in)"
    summary = run / "after" / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("label") != label:  # a run since continued
        raise SystemExit(f"{summary} is not the evaluation {label!r}: move {run / 'after'} away to evaluate again")
    if not summary.exists():
        sera("eval", "--tasks", str(tasks), "--policy", policy, "--out", str(run / "after"), "--resume", "--label", label)
    for version in versions if args.val_curve else ():  # a diagnostic after the choice: it chooses nothing
        measured = val_eval(run, version)
        if version != best and not (measured / "summary.json").exists():
            sera("eval", "--tasks", str(tasks), "--policy", f"vllm:{kept_run(run, version)}", "--out", str(measured),
                 "--resume", "--label", f"val curve, seed {seed}, update {version}")


def reuse_before(source: Path, out: Path, policy: str, tasks: Path, start: dict) -> None:
    """Copy a finished evaluation ``source`` into ``out/before`` after checking that it is the one
    this script would run: the plan ``sera eval`` writes for ``policy`` on the tasks of ``tasks``
    with the contract's settings, compared by the evaluator's own plan check (any label), from
    the same start (``start``, this folder's :func:`~sera_core.tiny.measure.bind_start` record,
    against the one beside ``source``: the same policy spec may name other weights after a ship)."""
    from sera_core.eval.evaluator import EvalConfig, EvalError, eval_plan, plan_differences, read_plan
    from sera_core.tiny.measure import read_start, same_start, start_words
    from sera_core.utils.jsonio import read_jsonl

    if not (source / "summary.json").exists():
        raise SystemExit(f"--before {source} is unfinished (no summary.json)")
    theirs = read_start(source.parent)
    if not same_start(theirs, start):
        raise SystemExit(f"--before {source} was measured from {start_words(theirs)}, not this folder's {start_words(start)}")
    try:
        old = read_plan(source)
        cfg = EvalConfig("textcraft", policy=policy, label=old["label"])
        diff = plan_differences(old, eval_plan(cfg, [t["id"] for t in read_jsonl(tasks)], 1))
    except EvalError as exc:
        raise SystemExit(f"--before: {exc}") from None
    if diff:
        raise SystemExit(f"--before {source} is an evaluation with other {', '.join(diff)} than this script's "
                         f"before ({policy} on {tasks})")
    shutil.copytree(source, out / "before")


def easy_tasks(split: str, max_craft_steps: int | None) -> list[dict]:
    """The easy tasks of ``split`` in file order, of at most ``max_craft_steps`` crafts when given
    (train: a curriculum at the policy's frontier, where at temperature 0 it solves 3-craft easy
    tasks and none of 5 or more; val: the held-out tasks of that same distribution)."""
    from sera_core.envs.registry import pick_tasks

    return [t for t in pick_tasks("textcraft", split, difficulty="easy")
            if max_craft_steps is None or t["misc"]["num_craft_steps"] <= max_craft_steps]


def write_tasks(path: Path, tasks: list[dict], what: str) -> None:
    """Write ``tasks`` to ``path``, or check that the file already there holds the same task ids
    (a rerun with other task options would otherwise mix two measures in one folder)."""
    from sera_core.utils.jsonio import read_jsonl, write_jsonl

    if not path.exists():
        write_jsonl(path, tasks)
    elif [t["id"] for t in read_jsonl(path)] != [t["id"] for t in tasks]:
        raise SystemExit(f"{path} holds other {what} than these options select: use another --out")


def write_select_tasks(path: Path, tasks: list[dict], count: int) -> None:
    """``count`` of the training ``tasks``, spread evenly over them (``tasks[i * n // count]``), as
    the held-in task file of ``--select-every``."""
    from sera_core.utils.jsonio import write_jsonl

    if not 0 < count <= len(tasks):
        raise SystemExit(f"--select-tasks must be between 1 and the {len(tasks)} training tasks")
    write_jsonl(path, [tasks[i * len(tasks) // count] for i in range(count)])


def collect(out: Path, seeds: list[int], versions: list[int] = ()) -> dict:
    """The paired before/after of every finished seed and its training rows (``metrics.csv``);
    with ``versions`` (``--select-every``'s :func:`stops`), also the held-in tasks each candidate
    solved (:func:`selection`, 0 the start) and the version kept."""
    from sera_core.eval.aggregate import paired_change
    from sera_core.utils.jsonio import read_jsonl

    if not (out / "before" / "summary.json").exists():  # nothing measured yet (--report on a new folder)
        return {"tasks": 0, "runs": []}
    before = list(read_jsonl(out / "before" / "seed0.jsonl"))
    keep = ("version", "trees", "root_success", "agents", "delegations", "datums", "tokens_trained",
            "seconds_generation", "seconds_environment", "seconds_update", "seconds")
    runs = []
    for seed in seeds:
        run = out / f"seed{seed}"
        if not (run / "after" / "summary.json").exists():
            continue
        with (run / "train" / "metrics.csv").open(newline="") as f:
            metrics = list(csv.DictReader(f))
        runs.append({"seed": seed, "change": paired_change(before, read_jsonl(run / "after" / "seed0.jsonl")),
                     "updates": [{k: row[k] for k in keep if k in row} for row in metrics]})
        if versions:
            solved = selection(out, seed, versions)
            runs[-1] |= {"held_in": solved, "kept": best_version(solved)}
            if (run / "val").exists():
                runs[-1]["val_curve"] = val_curve(out, seed, versions, runs[-1]["kept"])
    selected = {"select_tasks": sum(1 for _ in read_jsonl(out / "select_tasks.jsonl"))} if versions else {}
    return {"tasks": len(before), "runs": runs} | selected


def interval(values: list[float]) -> str:
    """The signed mean ± its 95% Student's t half interval over seeds (:func:`~sera_core.eval.points.mean_interval`)."""
    from sera_core.eval.points import mean_interval

    mean, half = mean_interval(values)
    return f"{mean:+.3f}" if half is None else f"{mean:+.3f} ± {half:.3f}"


def report(results: dict) -> str:
    from sera_core.eval.aggregate import mcnemar_exact

    lines = ["| seed | before | after | paired difference (95% interval) | gained / lost (McNemar p) | tokens trained | "
             "minutes: generation / update / all |", "|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        c, ups = r["change"], r["updates"]
        minutes = [sum(float(u[k]) for u in ups) / 60 for k in ("seconds_generation", "seconds_update", "seconds")]
        lines.append(f"| {r['seed']} | {c['before']['rate']:.0%} | {c['after']['rate']:.0%} | "
                     f"{c['difference']['rate']:+.3f} ± {c['difference']['ci']:.3f} | {c['gained']} / {c['lost']} "
                     f"({mcnemar_exact(c['gained'], c['lost']):.3g}) | "
                     f"{sum(int(u['tokens_trained']) for u in ups):,} | {minutes[0]:.0f} / {minutes[1]:.0f} / {minutes[2]:.0f} |")
    if results["runs"]:
        lines.append(f"| mean over {len(results['runs'])} seeds (Student's t) | | | "
                     f"{interval([r['change']['difference']['rate'] for r in results['runs']])} | | | |")
        lines += ["", moved(results)]
    selected = [r for r in results["runs"] if "held_in" in r]
    if selected:
        lines += ["", version_table(selected, "held_in", f"held-in solved of {results['select_tasks']}")]
    if curves := [r for r in results["runs"] if "val_curve" in r]:
        lines += ["", version_table(curves, "val_curve", f"val solved of {results['tasks']} (chooses nothing)")]
    return "\n".join(lines)


def version_table(runs: list[dict], key: str, title: str) -> str:
    """Each seed's tasks solved (``run[key]``: version -> count) by the start and by each kept
    checkpoint, and the one kept."""
    versions = sorted({v for r in runs for v in r[key]} - {0})
    lines = [f"| seed | {title}: the start | " + " | ".join(f"update {v}" for v in versions) + " | kept |",
             "|---" * (len(versions) + 3) + "|"]
    for r in runs:
        cells = [str(r[key].get(v, "")) for v in versions]
        lines.append(f"| {r['seed']} | {r[key][0]} | " + " | ".join(cells) + f" | update {r['kept']} |")
    return "\n".join(lines)


def moved(results: dict) -> str:
    """The tasks whose result changed in at least one seed, most often moved first
    (:func:`~sera_core.eval.aggregate.task_moves`): whether the start solved each, and the seeds
    that flipped it."""
    from sera_core.eval.aggregate import task_moves

    lines = [f"| task | the start | changed in (of {len(results['runs'])} seeds) | seeds |", "|---|---|---|---|"]
    for task, seeds in task_moves({r["seed"]: r["change"] for r in results["runs"]}).items():
        start = "solved" if "lost" in seeds.values() else "failed"
        lines.append(f"| {task} | {start} | {len(seeds)} | {' '.join(map(str, seeds))} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", default="tiny", help="tiny (the shipped adapter) or a trained run/checkpoint folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=50, help="easy val tasks measured before and after")
    parser.add_argument("--protocol", default=None, help="a frozen protocol (docs/protocol.md), e.g. learning")
    parser.add_argument("--measure", default=None, help="--protocol's set measured before and after (default: its curve2 dev set)")
    parser.add_argument("--max-craft-steps", type=int, default=None,
                        help="train only on easy tasks of at most this many crafts (default: every easy train task)")
    parser.add_argument("--val-max-craft-steps", type=int, default=None,
                        help="measure on the easy val tasks of at most this many crafts (default: every easy val task)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="another training config override")
    parser.add_argument("--out", default="runs/execution_curve")
    parser.add_argument("--before", default=None, help="reuse this finished evaluation of the start (another OUT's before/)")
    parser.add_argument("--select-every", type=int, default=None, metavar="N",
                        help="keep a checkpoint every N updates and evaluate the best held-in one (default: the last)")
    parser.add_argument("--select-tasks", type=int, default=16, help="training tasks of the held-in measure")
    parser.add_argument("--val-curve", action="store_true",
                        help="after the choice, also measure every kept checkpoint on the val tasks (a diagnostic)")
    parser.add_argument("--report", action="store_true", help="only write the table and figure from what is done")
    parser.add_argument("--figures", default=None, help="also copy the figure and results into this folder")
    parser.add_argument("--name", default="execution_curve", help="the file name (no suffix) of the copies in --figures")
    args = parser.parse_args()
    if args.select_every is not None and not 0 < args.select_every <= args.updates:
        parser.error(f"--select-every must be between 1 and --updates ({args.updates})")
    if args.val_curve and args.select_every is None:
        parser.error("--val-curve measures the checkpoints that --select-every keeps: give --select-every")
    if args.protocol and args.val_max_craft_steps:
        parser.error("--val-max-craft-steps chooses val tasks; a --protocol set names its own")
    out = Path(args.out)
    tasks = out / "easy_val.jsonl"
    protocol = None
    if args.protocol:
        from sera_core.eval.protocol import bind_protocol, load_protocol, protocol_tasks

        chosen = load_protocol(args.protocol)
        measure = args.measure or chosen["runs"]["curve2"]["dev"]
        protocol = bind_protocol(out, args.protocol, measure)  # refused here, before any work, if it changed
        tasks = out / f"{measure}.jsonl"
    from sera_core.tiny.measure import bind_start, read_start

    start_record = read_start(out)
    if not args.report:
        if protocol:
            write_tasks(tasks, protocol_tasks(chosen, measure), f"{protocol['name']}/{measure} tasks")
        else:
            val = easy_tasks("val", args.val_max_craft_steps)
            if len(val) < args.tasks:
                raise SystemExit(f"--tasks {args.tasks}: the val split has {len(val)} easy tasks of these crafts")
            write_tasks(tasks, val[:args.tasks], "val tasks")
        start = f"vllm:{args.start}"
        start_record = bind_start(out, start)  # refused before any run if the start changed
        train = easy_tasks("train", args.max_craft_steps) if args.max_craft_steps or args.select_every else []
        if args.max_craft_steps:
            write_tasks(out / "train_tasks.jsonl", train, "training tasks")
        if args.before and not (out / "before").exists():
            reuse_before(Path(args.before), out, start, tasks, start_record)
        if not (out / "before" / "summary.json").exists():
            sera("eval", "--tasks", str(tasks), "--policy", start, "--out", str(out / "before"), "--resume",
                 "--label", f"execution curve, before ({args.start})")
        if args.select_every:
            if not (out / "select_tasks.jsonl").exists():
                write_select_tasks(out / "select_tasks.jsonl", train, args.select_tasks)
            if not (out / "select_start" / "summary.json").exists():
                sera("eval", "--tasks", str(out / "select_tasks.jsonl"), "--policy", start, "--out",
                     str(out / "select_start"), "--resume", "--label", f"held-in, the start ({args.start})")
        for seed in args.seeds:
            run_seed(args, out, seed, tasks)
    results = collect(out, args.seeds, stops(args.updates, args.select_every) if args.select_every else []) | {
        "args": vars(args), "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "protocol": protocol,
        "start": start_record}
    table = report(results)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if results["runs"]:
        (out / "execution_curve.png").write_bytes(render(curve2_figure(results)))
        if args.figures:
            shutil.copy(out / "execution_curve.png", Path(args.figures) / f"{args.name}.png")
            shutil.copy(out / "results.json", Path(args.figures) / f"{args.name}.json")
    print(table)


if __name__ == "__main__":
    main()
