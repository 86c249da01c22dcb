"""The tiny experiment: SERA vs SERA w/o RT from the same warm start, over seeds (not a test).

For each seed and each arm (``sera``: 16:2:2; ``sera_wo_rt``: ``execution:16,delegation:2``,
rubric generation never trained) the shipped tiny model is trained with
``sera_core/configs/textcraft/sera_tiny.yaml`` for ``--steps`` updates, then measured:

* **held-out delegation points**: ``--points-tasks`` medium val tasks played at temperature
  1 with counterfactual groups of 8 (the rubric written, the branches labelled by the
  checker and scored against the rubric): the mean pairwise ranking accuracy over mixed
  groups (SPEC 3), and how many mixed groups there were;
* **root success** at temperature 0 on ``--eval-tasks`` easy val tasks;
* **tokens trained** over the arm's updates (0 means the weights never moved: every group
  had equal rewards and zero-variance filtering dropped it).

The same measurement of the untrained model is the "before" row. Results are printed as a
Markdown table with means and 95% confidence intervals over seeds (normal approximation,
``1.96 * std / sqrt(n)``) and written to ``OUT/results.json``.

Run (about 30 minutes of CPU per arm and seed at the defaults):
``.venv/bin/python scripts/tiny_experiment.py --seeds 0 1 2 --steps 40 --out runs/tiny_experiment``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from statistics import fmean, stdev

from sera_core.agents.actors import PolicyActor
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.agents.summary import summarize
from sera_core.envs.textcraft.tasks import generate_split
from sera_core.train.config import CONFIGS, load_config
from sera_core.train.trainer import Trainer

ARMS = {"sera": "execution:16,delegation:2,rubric_generation:2", "sera_wo_rt": "execution:16,delegation:2"}


def measure(policy, points_tasks: list[dict], eval_tasks: list[dict], seed: int) -> dict:
    """Pairwise accuracy on held-out delegation points and root success (module docstring)."""
    groups = summarize(Runtime("textcraft", PolicyActor(policy), RuntimeConfig(counterfactual=8, seed=seed)).run(points_tasks))
    greedy = RuntimeConfig(temperature=0.0, rubric_temperature=0.0, seed=seed)
    success = summarize(Runtime("textcraft", PolicyActor(policy), greedy).run(eval_tasks))["root_success_rate"]
    return {"pairwise_accuracy": groups["mean_pairwise_accuracy"], "mixed_groups": groups["groups"]["valid"],
            "delegations": groups["delegations"], "root_success": success}


def interval(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{fmean(values):.3f} ± {1.96 * stdev(values) / math.sqrt(len(values)):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=40, help="updates per arm and seed")
    parser.add_argument("--points-tasks", type=int, default=8, help="medium val tasks played with counterfactual groups")
    parser.add_argument("--eval-tasks", type=int, default=24, help="easy val tasks evaluated at temperature 0")
    parser.add_argument("--out", default="runs/tiny_experiment")
    args = parser.parse_args()
    val = generate_split("val")
    points_tasks = [t for t in val if t["misc"]["difficulty"] == "medium"][:args.points_tasks]
    eval_tasks = [t for t in val if t["misc"]["difficulty"] == "easy"][:args.eval_tasks]
    out = Path(args.out)
    results: dict[str, list[dict]] = {"before": [], **{arm: [] for arm in ARMS}}
    for seed in args.seeds:
        for arm, schedule in ARMS.items():
            cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", schedule=schedule, total_updates=args.steps,
                              seed=seed, out=str(out / f"{arm}_seed{seed}"), method=arm)
            trainer = Trainer(cfg)
            if arm == "sera":  # the warm start both arms share, measured once per seed
                results["before"].append(measure(trainer.policy, points_tasks, eval_tasks, seed))
            trainer.run(resume=True)
            results[arm].append(measure(trainer.policy, points_tasks, eval_tasks, seed)
                                | {"tokens_trained": trainer.counters["tokens_trained"]})
            out.mkdir(parents=True, exist_ok=True)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    print("\n| model | pairwise accuracy (held-out points) | mixed groups | delegations | root success (easy val) "
          "| tokens trained |\n|---|---|---|---|---|---|")
    for name, rows in results.items():
        print(f"| {name} | {interval([r['pairwise_accuracy'] for r in rows])} | "
              f"{interval([r['mixed_groups'] for r in rows])} | {interval([r['delegations'] for r in rows])} | "
              f"{interval([r['root_success'] for r in rows])} | {interval([r.get('tokens_trained') for r in rows])} |")


if __name__ == "__main__":
    main()
