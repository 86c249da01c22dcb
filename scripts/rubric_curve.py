"""Curve 1 of the tiny experiment: the rubric stage on fixed branches, arms x seeds (not a test).

Each (arm, seed) is one :class:`~sera_core.tiny.rubric_stage.RubricStage` run from the
shipped embedded policy (SmolLM2-135M-Instruct + its LoRA warm start) in ``OUT/<arm>_seed<s>``:
the noisy expert's mixed counterfactual groups on medium *train*-world tasks are the training
points, the policy writes each rubric and scores the 8 branches, and the held-out points (the
34 mixed groups of the last 24 medium *val* tasks) are measured before, during and after:
pairwise accuracy of the greedy scores (the official readout) and the belief accuracy (the same
greedy calls ranked by the probability they put on ``success: true``,
:func:`~sera_core.eval.points.success_belief`).
Arms (:data:`~sera_core.tiny.rubric_stage.ARMS`): ``rubric`` trains the rubric writer only
(SERA's rubric stage as specified), ``rubric_scorer`` also the scoring calls (the workbook's
extension; the module docstring says why), ``rubric_scorer_order`` the same with each scoring
call credited by its share of the pairwise order instead of the hinge, ``rubric_scorer_label``
the writer and, by cross-entropy, the scoring calls' success gate toward the judge's label, ``rubric_belief`` the writer only, rewarded by the
ranking of the greedy scorer's belief in success (the second extension, docs/fidelity.md).

Every run resumes from its last update and measurement, so the script can be killed and
started again at any point; ``--report`` only writes ``OUT/table.md``, ``OUT/results.json``
and ``OUT/rubric_curve.png`` from what is done (``--figures DIR`` copies the figure and the
results there as ``NAME.png`` and ``NAME.json``, ``--name`` rubric_curve by default, which
notebook 09 reads). ``OUT/start.json`` names the adapter every run starts from, and
``results.json`` repeats it as ``start`` (:func:`~sera_core.tiny.measure.bind_start`: a folder
whose start was replaced since, by ``sera tiny ship``, is refused before any work).
A run that is not in ``OUT`` (another machine's, a session ago) enters the table from the
committed record, ``--keep`` (``figures/rubric_curve.json``), when that was made with the
same settings and from the same start; a record from before starts were recorded (the committed
one) enters only a ``--report`` on a folder that records none, and a new run refuses it before
any work (``--keep ''`` for none).
Means ± 95% intervals over seeds (Student's t: ``t_{0.975, n-1} * s / sqrt(n)``).

``--protocol learning`` measures the held-out points of a frozen protocol's set (``--measure``,
default its curve-1 dev set, ``points_dev``; report on ``points_test`` once the arm and length
are chosen): ``OUT/protocol.json`` binds the folder to that protocol's hash and set (a changed
protocol or another set is refused before any work), and ``results.json`` records it, the
command line, and how many held-out points delegate a subtask that a training point delegates
too (:func:`~sera_core.tiny.rubric_stage.subtask_overlap`). A kept record enters the table only
when it was made under the same protocol and set.

``nohup .venv/bin/python scripts/rubric_curve.py --out runs/rubric_curve > runs/rubric_curve.log 2>&1 &``
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import fmean

from sera_core.report.curves import CURVE1_LABELS, curve1_figure
from sera_core.report.plots import render


def read_csv(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def number(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


SETTINGS = ("updates", "points_per_update", "eval_every", "score_calls", "lr", "config")
"""The arguments a kept run must share with this invocation to enter its table."""


def kept_runs(path: Path, args: argparse.Namespace, protocol: dict | None = None,
              start: dict | None = None) -> dict[tuple[str, int], dict]:
    """The finished runs recorded in an earlier ``results.json`` (``--keep``), by (arm, seed):
    ``runs/`` does not outlive a machine, the committed record does. Raises ``SystemExit``
    when the record was made with other settings (the table would mix budgets), under
    another protocol (``protocol``: this run's :func:`~sera_core.eval.protocol.bind_protocol` record)
    or from another start (``start``: this folder's :func:`~sera_core.tiny.measure.bind_start`
    record; None on both sides for runs made before starts were recorded)."""
    from sera_core.tiny.measure import same_start, start_words

    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    if not same_start(record.get("start"), start):
        raise SystemExit(f"{path} holds runs from {start_words(record.get('start'))}, not this folder's "
                         f"{start_words(start)}: another --keep ('' for none)")
    theirs, ours = ({k: a.get(k) for k in SETTINGS} for a in (record["args"], vars(args)))
    if theirs != ours:
        raise SystemExit(f"{path} was made with {theirs}, not {ours}: pass the same settings, or another --keep")
    if record.get("protocol") != protocol:
        raise SystemExit(f"{path} was measured under protocol {record.get('protocol')}, not {protocol}: another --keep")
    return {(arm, r["seed"]): r for arm, runs in record["results"].items() for r in runs}


def collect(out: Path, arms: list[str], seeds: list[int], updates: int, kept: dict[tuple[str, int], dict]) -> dict:
    """Per arm, the finished runs' held-out rows (start and end) and update rows: a run in
    ``out`` where it finished there, else its ``kept`` record, if any."""
    results: dict[str, list[dict]] = {}
    for arm in arms:
        for seed in seeds:
            run = out / f"{arm}_seed{seed}"
            held = read_csv(run / "heldout.csv")
            ups = read_csv(run / "updates.csv")
            if not held or int(held[-1]["version"]) != updates:
                if (arm, seed) in kept:
                    results.setdefault(arm, []).append(kept[arm, seed])
                continue
            results.setdefault(arm, []).append({
                "seed": seed, "heldout": [{k: number(v) for k, v in r.items()} for r in held],
                "updates": [{k: number(v) for k, v in r.items()} for r in ups],
                "seconds": sum(number(r["seconds"]) or 0 for r in ups) + sum(number(r["seconds"]) or 0 for r in held[1:])})
    return results


def overlap(out: Path, heldout_ids: tuple[str, ...] | None, config: str) -> dict | None:
    """:func:`~sera_core.tiny.rubric_stage.subtask_overlap` of the held-out points and the
    training pool cached in ``out`` (None before a run has built them)."""
    from sera_core.tiny.rubric_stage import RubricStageConfig, heldout_set, stage_points, subtask_overlap
    from sera_core.train.config import load_config

    cfg = RubricStageConfig(config=config, heldout_ids=heldout_ids, points_dir=str(out))
    env = load_config(config).env
    pool = out / f"pool_{env}_{cfg.pool_tasks}.jsonl"
    if not pool.exists() or not (out / f"heldout_{env}_{cfg.heldout_name}.jsonl").exists():
        return None
    return subtask_overlap(heldout_set(cfg, env), stage_points(env, "train", cfg.pool_tasks, pool))


def report(results: dict) -> str:
    from sera_core.eval.points import format_interval

    lines = ["| arm | seeds | held-out pairwise accuracy: start | end | belief accuracy: start | end | ranking loss: start | end "
             "| score validity (end) | tokens trained per update (rubric / score) | minutes per run |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, runs in results.items():
        start = [r["heldout"][0] for r in runs]
        end = [r["heldout"][-1] for r in runs]
        tokens = " / ".join(f"{fmean(u[k] for r in runs for u in r['updates']):,.0f}" for k in ("tokens_rubric", "tokens_score"))
        lines.append(f"| {CURVE1_LABELS[arm]} | {len(runs)} | {format_interval([h['pairwise_accuracy'] for h in start])} | "
                     f"{format_interval([h['pairwise_accuracy'] for h in end])} | {format_interval([h.get('belief_accuracy') for h in start])} | "
                     f"{format_interval([h.get('belief_accuracy') for h in end])} | {format_interval([h['ranking_loss'] for h in start])} | "
                     f"{format_interval([h['ranking_loss'] for h in end])} | {format_interval([h['score_validity'] for h in end])} | "
                     f"{tokens} | {fmean(r['seconds'] for r in runs) / 60:.0f} |")
    return "\n".join(lines)


def main() -> None:
    from sera_core.tiny.rubric_stage import ARMS, RubricStage, RubricStageConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="+", default=["rubric_scorer"], choices=ARMS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--points-per-update", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=6, help="measure the held-out points every this many updates")
    parser.add_argument("--score-calls", type=int, default=4, help="scoring calls trained per point (rubric_scorer)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the config's)")
    parser.add_argument("--config", default=RubricStageConfig.config,
                        help="training config (model, engine, precision; default: the tiny CPU one, vLLM)")
    parser.add_argument("--out", default="runs/rubric_curve")
    parser.add_argument("--report", action="store_true", help="only write the table and figure from what is done")
    parser.add_argument("--figures", default=None, help="also copy the figure into this folder (e.g. figures)")
    parser.add_argument("--name", default="rubric_curve", help="the file name (no suffix) of the copies in --figures")
    parser.add_argument("--keep", default="figures/rubric_curve.json",
                        help="an earlier results.json whose finished runs fill the table where OUT lacks them ('' for none)")
    parser.add_argument("--protocol", default=None, help="a frozen protocol (docs/protocol.md), e.g. learning")
    parser.add_argument("--measure", default=None, help="--protocol's set of held-out points' tasks (default: its curve1 dev set)")
    parser.add_argument("--one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)  # one run, in a child process
    args = parser.parse_args()
    out = Path(args.out)
    protocol, heldout_ids = None, None
    if args.protocol:
        from sera_core.eval.protocol import bind_protocol, load_protocol

        chosen = load_protocol(args.protocol)
        measure = args.measure or chosen["runs"]["curve1"]["dev"]
        protocol = bind_protocol(out, args.protocol, measure)  # refused here, before any work, if it changed
        heldout_ids = tuple(chosen["sets"][measure]["ids"])
    from sera_core.tiny.measure import bind_start, read_start
    from sera_core.train.config import load_config

    # every run starts from the config's model (the shipped adapter): refused if it changed under OUT
    start = read_start(out) if args.report else bind_start(out, f"vllm:{load_config(args.config).model}")
    if args.one:
        arm, seed = args.one[0], int(args.one[1])
        cfg = RubricStageConfig(arm=arm, seed=seed, updates=args.updates, points_per_update=args.points_per_update,
                                eval_every=args.eval_every, score_calls=args.score_calls, lr=args.lr, config=args.config,
                                heldout_ids=heldout_ids, points_dir=str(out), out=str(out / f"{arm}_seed{seed}"))
        RubricStage(cfg).run()
        return
    kept = kept_runs(Path(args.keep), args, protocol, start) if args.keep else {}  # refused before any run
    if not args.report:
        for arm in args.arms:
            for seed in args.seeds:  # each run in its own process: its engine's memory goes with it
                print(f"[{time.strftime('%H:%M:%S')}] {arm} seed {seed}", flush=True)
                subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", arm, str(seed)], check=True)
    results = collect(out, args.arms, args.seeds, args.updates, kept)
    table = report(results)
    (out / "table.md").write_text(table + "\n")
    record = {"args": vars(args), "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
              "protocol": protocol, "start": start, "overlap": overlap(out, heldout_ids, args.config), "results": results}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    if results:
        (out / "rubric_curve.png").write_bytes(render(curve1_figure(results)))
        if args.figures:  # the figure and the numbers behind it (notebook 09 reads them)
            shutil.copy(out / "rubric_curve.png", Path(args.figures) / f"{args.name}.png")
            shutil.copy(out / "results.json", Path(args.figures) / f"{args.name}.json")
    print(table)


if __name__ == "__main__":
    main()
