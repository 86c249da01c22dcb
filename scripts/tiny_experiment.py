"""The tiny experiment: SERA vs SERA w/o RT, with RAO as the reference, from the embedded warm start (not a test).

Every arm starts from the same embedded policy (SmolLM2-135M-Instruct + its LoRA warm start)
and trains its LoRA matrices with ``sera_core/configs/textcraft/*_tiny.yaml`` (2 root tasks x
4 trees per update, B = 8 counterfactual branches in rubric-generation updates, training
tasks from the train world, never the val world) for ``--updates`` updates:

* ``sera``: ``execution:E,delegation:D,rubric_generation:R`` with ``--ratio E:D:R``
  (default ``8:1:1``, the paper's 16:2:2 halved, so that 30 updates reach the rubric stage 3
  times and the decomposition stage 3 times);
* ``sera_wo_rt``: ``execution:E,delegation:D``: the same without rubric training (rubrics
  are written from the prompt and never trained), the same number of updates;
* ``rao``: children rewarded by the external binary label, one stage (``rao_tiny.yaml``).

``--difficulties`` restricts the training tasks (the tiny configs draw easy and medium).

Before and after training, on held-out material:

* **rubric ranking** on a fixed set of held-out delegation points
  (:mod:`sera_core.eval.points`: the noisy expert's mixed counterfactual groups of B = 8 on
  the last ``--points-tasks`` medium val tasks): the policy writes each rubric at
  temperature 1 and scores the stored branches; pairwise accuracy and ranking loss;
* **root success** at temperature 0 on ``--eval-tasks`` val tasks (split evenly over
  ``--eval-levels``: half easy, half medium by default),
  under the evaluation contract except the per-turn cap ``--eval-max-new-tokens``
  (``sera eval``'s evaluator; resumable);
* from each run's ``metrics.csv``: tokens trained per stage, the share of counterfactual
  groups that were mixed, delegations per tree, and the curves.

Each model (one unit: its training and its measurement) runs in a fresh process
(:func:`isolated`). Each part of a unit (a run's training, a model's measurement) writes its
result file when it ends and is skipped when that file exists; training and evaluation resume inside a unit, so
the script can be killed and restarted at any point. A finished model's record (its measures
and training statistics, a few KB) is also written to ``--keep`` (``figures/tiny_experiment/``,
committed), so that the experiment continues on a fresh machine, where ``runs/`` is gone, from
the models it has not finished: a record is used only when its settings (updates, ratio,
training difficulties, held-out sets) are the run's, and a mismatch stops the script before
any work. Two processes may share the work (``--arms sera`` beside ``--arms sera_wo_rt
--before-seeds``, the second measuring no warm start). ``--report`` only writes the table
(mean ± 95% Student's t half interval over seeds), ``OUT/results.json`` and the
figure ``OUT/tiny_experiment.png`` (``--figures DIR`` copies it there) from what is done.

``--protocol learning`` takes the held-out points' tasks and the evaluated tasks from a frozen
protocol's sets (``--points-set``, ``--eval-set``: by default its ablation dev set and
``textcraft_easy_dev``; report on the test sets once the budget is chosen) instead of
``--points-tasks`` and ``--eval-tasks``: ``OUT/protocol.json`` binds the folder to them (a changed
protocol or other sets are refused before any work), the protocol's hash joins the settings a kept
record must match, and ``results.json`` records it with the command line. ``OUT/start.json`` names
the adapter the arms train from (:func:`~sera_core.tiny.measure.bind_start`: a folder whose
start was replaced since, by ``sera tiny ship``, is refused), ``results.json`` repeats it as
``start``, and under a protocol its weights' sha256 joins the settings a kept record must match.
``--figures DIR`` copies the figure and the table as ``NAME.png`` and ``NAME.md`` (``--name``,
tiny_experiment by default). Over seeds the table gives
mean ± the 95% Student's t half interval.

``--warm-start vllm:FOLDER --arms`` (no arm) measures another adapter (a rebuilt warm start)
on the same held-out sets, for docs/embedded.md's rule on which adapter ships; give it its own
``--out`` (copy ``OUT/points.jsonl`` there to skip rebuilding the points) and ``--keep``.

Run in the background, one process a core (hours; see docs/measurements.md "The tiny experiment"
for the settings of the table in the README)::

    S="--updates 4 --ratio 2:1:1 --difficulties easy --eval-tasks 50 --eval-levels easy"
    OMP_NUM_THREADS=1 nohup .venv/bin/python scripts/tiny_experiment.py $S --arms sera --before-seeds 0 > runs/sera.log 2>&1 &
    OMP_NUM_THREADS=1 nohup .venv/bin/python scripts/tiny_experiment.py $S --arms sera_wo_rt --before-seeds > runs/wo.log 2>&1 &
    .venv/bin/python scripts/tiny_experiment.py $S --before-seeds 0 --report --figures figures
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from statistics import fmean

ARMS = {"sera": "textcraft/sera_tiny.yaml", "sera_wo_rt": "textcraft/sera_tiny.yaml", "rao": "textcraft/rao_tiny.yaml"}
SHIPPED = "tiny"  # the policy spec of the shipped adapter, every arm's starting model
LABELS = {"before": "warm start (no RL)", "sera": "SERA", "sera_wo_rt": "SERA w/o RT", "rao": "RAO"}


def write_json(path: Path, value: dict) -> None:
    """Write ``value`` as indented JSON, atomically."""
    from sera_core.utils.jsonio import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(value, indent=1) + "\n").encode())


def schedule(arm: str, ratio: str) -> str | None:
    """The arm's stage schedule for ``--ratio E:D:R`` (``None``: the config's own, RAO's one stage)."""
    e, d, r = (int(x) for x in ratio.split(":"))
    if arm == "rao":
        return None
    stages = [("execution", e), ("delegation", d)] + ([("rubric_generation", r)] if arm == "sera" else [])
    return ",".join(f"{name}:{n}" for name, n in stages if n)


def settings(args) -> dict:
    """What a kept record must match to be reused: the training budget, the held-out sets and,
    when it is not the shipped adapter, the measured warm start; under a protocol also its hash,
    sets and roles, and the sha256 of the start's adapter weights (``args.start``)."""
    return {"updates": args.updates, "ratio": args.ratio, "difficulties": args.difficulties,
            "points_tasks": args.points_tasks, "eval_tasks": args.eval_tasks, "eval_levels": list(args.eval_levels),
            "eval_max_new_tokens": args.eval_max_new_tokens} | ({"warm_start": args.warm_start} if args.warm_start != SHIPPED else {}) \
        | ({"protocol": [args.protocol_record["hash"], args.protocol_record["set"], args.protocol_record["role"]],
            "start": (args.start["adapter"] or {}).get("adapter_sha256")} if args.protocol_record else {})


def kept(args, name: str) -> dict | None:
    """The committed record of model ``name`` (e.g. ``sera_seed1``) in ``--keep``, if it exists.

    Raises ``SystemExit`` when the record was made with other settings: the table would mix budgets."""
    path = Path(args.keep) / f"{name}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("settings") != settings(args):
        raise SystemExit(f"{path} was made with {record.get('settings')}, not {settings(args)}: "
                         f"pass the same settings, or another --keep folder")
    return record


def held_out(args) -> tuple[list, list[dict]]:
    """The fixed delegation points (built once into ``OUT/points.jsonl``) and the eval tasks."""
    from sera_core.agents.summary import read_points
    from sera_core.course import pick_tasks
    from sera_core.eval.points import heldout_points
    from sera_core.tiny.measure import points_tasks
    from sera_core.utils.jsonio import write_jsonl

    path = Path(args.out) / "points.jsonl"
    if args.protocol:
        from sera_core.eval.protocol import load_protocol, protocol_tasks

        chosen = load_protocol(args.protocol)
        if not path.exists():
            write_jsonl(path, [p.to_json() for p in heldout_points("textcraft", protocol_tasks(chosen, args.points_set))])
        return read_points(path), protocol_tasks(chosen, args.eval_set)
    if not path.exists():
        write_jsonl(path, [p.to_json() for p in heldout_points("textcraft", points_tasks("textcraft", args.points_tasks))])
    levels = tuple(args.eval_levels)
    tasks = pick_tasks("textcraft", "val", difficulty=levels, per_level=-(-args.eval_tasks // len(levels)))
    return read_points(path), tasks[:args.eval_tasks]


def measure(spec: str, name: str, seed: int, points: list, tasks: list[dict], args, method: str | None) -> dict:
    """Rescore the points (runtime seed ``seed``) and evaluate root success, once per file."""
    from sera_core.agents.actors import make_actor
    from sera_core.agents.runtime import Runtime, RuntimeConfig
    from sera_core.eval.evaluator import EvalConfig, evaluate
    from sera_core.eval.points import point_metrics

    out = Path(args.out) / name
    done = out / f"measure_seed{seed}.json"
    if done.exists():
        return json.loads(done.read_text())
    t0, c0 = time.time(), time.process_time()
    actor = make_actor(spec)
    print(f"[{time.strftime('%H:%M:%S')}] {name} seed {seed}: rescoring {len(points)} held-out points", flush=True)
    rescored = Runtime("textcraft", actor, RuntimeConfig(seed=seed)).rescore_all(points, progress=True)
    result = {"points": point_metrics(rescored), "seconds_points": round(time.time() - t0, 1)}
    evaluated = out / "eval_summary.json"  # temperature 0: the same for every seed, evaluated once per model
    if not evaluated.exists():
        cfg = EvalConfig("textcraft", label=f"SmolLM2-135M + LoRA (CPU), tiny experiment: {LABELS.get(name, name)}",
                         method=method, policy=spec, max_new_tokens=args.eval_max_new_tokens)
        print(f"[{time.strftime('%H:%M:%S')}] {name}: evaluating {len(tasks)} val tasks", flush=True)
        write_json(evaluated, evaluate(tasks, actor, out / "eval", cfg, resume=True))
    summary = json.loads(evaluated.read_text())
    result |= {"root_success": summary["average"]["mean"] / 100.0,
               "by_difficulty": {d: v["mean"] for d, v in summary["by_difficulty"].items()},
               "eval_tasks": summary["tasks"], "seconds": round(time.time() - t0, 1),
               "cpu_seconds": round(time.process_time() - c0, 1)}
    write_json(done, result)
    return result


def train(arm: str, seed: int, args) -> Path:
    """Train one arm for one seed (resumes); its run folder."""
    from sera_core.train.config import load_config
    from sera_core.train.trainer import Trainer

    run = Path(args.out) / f"{arm}_seed{seed}"
    # a checkpoint after every update: an update takes minutes to half an hour on a busy CPU core,
    # and a run resumes from its last checkpoint (the tiny configs' checkpoint_every is 5)
    overrides = {"total_updates": args.updates, "seed": seed, "out": str(run), "method": arm, "checkpoint_every": 1}
    if schedule(arm, args.ratio) is not None:
        overrides["schedule"] = schedule(arm, args.ratio)
    if args.difficulties:
        overrides["difficulties"] = args.difficulties
    if (run / "train_done.json").exists():
        return run
    t0, c0 = time.time(), time.process_time()
    print(f"[{time.strftime('%H:%M:%S')}] training {arm} seed {seed}: {args.updates} updates", flush=True)
    Trainer(load_config(ARMS[arm], **overrides)).run(resume=True)
    write_json(run / "train_done.json", {"seconds": round(time.time() - t0, 1), "cpu_seconds": round(time.process_time() - c0, 1)})
    return run


def training_stats(run: Path) -> dict:
    """Tokens trained per stage, mixed counterfactual groups, delegations per tree, curves."""
    import pandas as pd

    m = pd.read_csv(run / "metrics.csv")
    groups = int(m["groups"].fillna(0).sum())
    return {"tokens_by_stage": {s: int(v) for s, v in m.groupby("stage")["tokens_trained"].sum().items()},
            "tokens_trained": int(m["tokens_trained"].sum()),
            "mixed_group_share": round(float(m["groups_valid"].fillna(0).sum()) / groups, 4) if groups else None,
            "delegations_per_tree": round(float(m["delegations"].sum()) / float(m["trees"].sum()), 4),
            "train_pairwise_accuracy": [None if pd.isna(v) else float(v) for v in m["pairwise_accuracy"]],
            "curve_root_success": [float(v) for v in m["root_success"]],
            "curve_tokens": [int(v) for v in m["tokens_trained"]],
            "stages": list(m["stage"]), "seconds_per_update": round(float(m["seconds"].mean()), 1)}


def spread(values: list[float | None]) -> str:
    """A table cell over seeds: ``mean ± half`` of the values that are not None, the half 95%
    interval Student's t (:func:`~sera_core.eval.points.format_interval`)."""
    from sera_core.eval.points import format_interval

    return format_interval(values)


def level(rows: list[dict], difficulty: str) -> str:
    """Root success at one difficulty over seeds (``-`` where it was not evaluated)."""
    if not all(difficulty in r["by_difficulty"] for r in rows):
        return "-"
    return spread([r["by_difficulty"][difficulty] / 100 for r in rows])


def report(results: dict) -> str:
    """The Markdown table of ``results`` (one row per model; mean ± std over seeds)."""
    lines = ["| model | seeds | pairwise accuracy (held-out points) | ranking loss | root success (val) | easy | medium "
             "| tokens trained (exec / deleg / rubric) | mixed groups | delegations / tree | minutes: training / measures |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in results.items():
        if not rows:
            continue
        tokens = "-"
        if any("tokens_by_stage" in r for r in rows):
            by = [r.get("tokens_by_stage", {}) for r in rows]
            tokens = " / ".join(f"{fmean([b.get(s, 0) for b in by]):,.0f}" for s in ("execution", "delegation", "rubric_generation"))
        trained = [r["seconds_per_update"] * len(r["curve_tokens"]) / 60 for r in rows if "curve_tokens" in r]
        minutes = f"{fmean(trained):.0f}" if trained else "-"
        minutes += f" / {fmean([r['seconds'] / 60 for r in rows]):.0f}"
        lines.append(
            f"| {LABELS[name]} | {len(rows)} | {spread([r['points']['pairwise_accuracy'] for r in rows])} | "
            f"{spread([r['points']['ranking_loss'] for r in rows])} | {spread([r['root_success'] for r in rows])} | "
            f"{level(rows, 'easy')} | {level(rows, 'medium')} | {tokens} | "
            f"{spread([r.get('mixed_group_share') for r in rows])} | {spread([r.get('delegations_per_tree') for r in rows])} "
            f"| {minutes} |")
    return "\n".join(lines)


def figure(results: dict, path: Path) -> None:
    """Training curves (root success, tokens trained per update; mean over seeds) and the
    before/after held-out measures per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for k, arm in enumerate(ARMS):
        rows = [r for r in results.get(arm, []) if "curve_root_success" in r]
        if not rows:
            continue
        n = min(len(r["curve_root_success"]) for r in rows)
        for ax, key in ((axes[0], "curve_root_success"), (axes[1], "curve_tokens")):
            ax.plot(range(n), [fmean([r[key][i] for r in rows]) for i in range(n)], label=LABELS[arm], color=f"C{k}")
    axes[0].set(title="root success while training (mean over seeds)", xlabel="update", ylim=(-0.05, 1.05))
    axes[1].set(title="tokens trained per update", xlabel="update")
    names = [n for n in ("before", *ARMS) if results.get(n)]
    for j, metric in enumerate(("pairwise_accuracy", "root_success")):
        means = [fmean([(r["points"][metric] if metric == "pairwise_accuracy" else r[metric]) or 0 for r in results[n]])
                 for n in names]
        axes[2].bar([i + 0.4 * j for i in range(len(names))], means, width=0.4,
                    label="held-out pairwise accuracy" if j == 0 else "val root success")
    axes[2].set_xticks([i + 0.2 for i in range(len(names))], [LABELS[n] for n in names], fontsize=8)
    axes[2].set(title="held-out measures", ylim=(0, 1.05))
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def unit(args, name: str, arm: str | None, seed: int) -> None:
    """One unit of the experiment: train ``arm`` (None: the warm start, untrained) at ``seed``,
    measure the model, keep its record in ``--keep``."""
    points, tasks = held_out(args)
    if arm is None:
        row = measure(args.warm_start, name, seed, points, tasks, args, None)
    else:
        run = train(arm, seed, args)
        row = measure(f"vllm:{run}", f"{arm}_seed{seed}", seed, points, tasks, args, arm) | training_stats(run)
    write_json(Path(args.keep) / f"{name}_seed{seed}.json", {"settings": settings(args), "seed": seed, "start": args.start} | row)


def isolated(fn, *fn_args) -> None:
    """``fn(*fn_args)`` in a fresh (spawned) process, waited for; SystemExit if it failed.

    Each unit gets its own process, so its engines and sandboxes start from a clean slate.
    Why (2026-12-03): with every unit of an arm in one process, 3 of the 5 trainings that
    followed another unit's measurement in that process played every tree in about a second,
    generated no token and trained nothing, while the same units in fresh processes trained normally; the
    cause was not found (a one-update replay of that order in one process did not repeat it).
    The trainer now stops such an update loudly (``RolloutsFailed``), and units no longer share
    a process."""
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(target=fn, args=fn_args)
    process.start()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"{fn.__name__}{fn_args[1:]} failed (exit code {process.exitcode}); "
                         "run the script again to resume it")


def collect(args, run_missing: bool) -> dict:
    """Every model's record, kept ones read from ``--keep``; with ``run_missing`` the others are
    trained and measured (and kept), else skipped. The warm start is measured at ``--before-seeds``."""
    results: dict[str, list[dict]] = {"before": [], **{arm: [] for arm in ARMS}}
    before_seeds = args.seeds if args.before_seeds is None else args.before_seeds
    for name in (f"{n}_seed{s}" for n in ("before", *ARMS) for s in args.seeds):
        kept(args, name)  # every kept record is checked before any work starts
    for seed in args.seeds:
        units = [("before", None)] if seed in before_seeds else []
        for name, arm in units + [(arm, arm) for arm in args.arms]:
            record = kept(args, f"{name}_seed{seed}")
            if record is None and run_missing:
                isolated(unit, args, name, arm, seed)
                record = kept(args, f"{name}_seed{seed}")
            if record is not None:
                results[name].append(record)
    if not run_missing:  # the report also shows what another process has kept
        for name in ("before", *ARMS):
            have = {r["seed"] for r in results[name]}
            results[name] += [r for s in args.seeds if s not in have and (r := kept(args, f"{name}_seed{s}"))]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="*", default=list(ARMS), choices=list(ARMS),
                        help="arms to train (none: only the warm start is measured)")
    parser.add_argument("--warm-start", default=SHIPPED,
                        help="the policy measured as the warm start (default tiny: the shipped adapter on vLLM; "
                             "vllm:FOLDER measures another adapter on the same held-out sets, with its own --out "
                             "and --keep and no --arms: the arms train from the configs' model, the shipped one)")
    parser.add_argument("--updates", type=int, default=30, help="updates per arm and seed")
    parser.add_argument("--ratio", default="8:1:1", help="SERA's execution:delegation:rubric_generation updates (w/o RT drops the third)")
    parser.add_argument("--difficulties", nargs="+", default=None, help="training task levels (default: the config's, easy and medium)")
    parser.add_argument("--before-seeds", type=int, nargs="*", default=None,
                        help="seeds at which the warm start is measured (default: --seeds; none: another process measures it)")
    parser.add_argument("--points-tasks", type=int, default=24, help="medium val tasks whose mixed groups are the held-out points")
    parser.add_argument("--eval-tasks", type=int, default=100, help="val tasks evaluated at temperature 0 (split evenly over --eval-levels)")
    parser.add_argument("--eval-levels", nargs="+", default=["easy", "medium"], help="difficulties of the evaluated val tasks")
    parser.add_argument("--eval-max-new-tokens", type=int, default=256,
                        help="per-turn completion cap in the evaluation (the contract's is 512; the tiny configs train at 256)")
    parser.add_argument("--out", default="runs/tiny_experiment")
    parser.add_argument("--keep", default="figures/tiny_experiment", help="folder of the finished models' records (committed)")
    parser.add_argument("--report", action="store_true", help="only write the table and figure from what is done")
    parser.add_argument("--figures", default=None, help="also copy the figure into this folder (e.g. figures)")
    parser.add_argument("--name", default="tiny_experiment", help="the file name (no suffix) of the copies in --figures")
    parser.add_argument("--protocol", default=None, help="a frozen protocol (docs/protocol.md), e.g. learning")
    parser.add_argument("--points-set", default=None, help="--protocol's set of the held-out points' tasks (default: its ablation dev set)")
    parser.add_argument("--eval-set", default="textcraft_easy_dev", help="--protocol's set of evaluated tasks")
    args = parser.parse_args()
    args.protocol_record = None
    if args.protocol:
        from sera_core.eval.protocol import bind_protocol, load_protocol

        args.points_set = args.points_set or load_protocol(args.protocol)["runs"]["ablation"]["dev"]
        args.protocol_record = bind_protocol(args.out, args.protocol, args.points_set, args.eval_set)  # before any work
    if args.warm_start != SHIPPED and args.arms:
        parser.error("--warm-start measures another adapter only: pass --arms with no arm (the arms train from the shipped one)")
    out = Path(args.out)
    from sera_core.tiny.measure import bind_start, read_start, start_record

    # what the arms train from and the warm start measured is: refused if it was replaced under OUT
    # a report on a machine without OUT/start.json (only --keep committed) reads the start the spec names now
    args.start = (read_start(out) or start_record(args.warm_start)) if args.report else bind_start(out, args.warm_start)
    points, tasks = held_out(args)
    print(f"{len(points)} held-out points, {len(tasks)} eval tasks", flush=True)
    results = collect(args, run_missing=not args.report)
    table = report(results)
    write_json(out / "results.json", {"arms": {a: schedule(a, args.ratio) or "execution:1" for a in ARMS},
                                      "settings": settings(args), "seeds": args.seeds, "points": len(points),
                                      "eval_tasks": len(tasks), "protocol": args.protocol_record, "start": args.start,
                                      "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]), "results": results})
    (out / "table.md").write_text(table + "\n")
    figure(results, out / "tiny_experiment.png")
    if args.figures:
        shutil.copy(out / "tiny_experiment.png", Path(args.figures) / f"{args.name}.png")
        shutil.copy(out / "table.md", Path(args.figures) / f"{args.name}.md")
    print(table)


if __name__ == "__main__":
    main()
