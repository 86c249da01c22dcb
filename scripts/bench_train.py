"""Speed of one tiny SERA update per stage (numbers go to docs/benchmarks.md; not a test).

The tiny SERA config on TextCraft (2 root tasks x 4 trees, B = 8 counterfactual branches
in rubric-generation updates) with the schedule shortened to ``execution:1,delegation:1,
rubric_generation:1`` so that each stage's update is timed once: wall time, and its share
in generation (inside the policy's ``generate``), environments (the rest of the rollouts:
sandboxes, checkers, bookkeeping) and the update (forward, backward, optimizer step).

Run: ``.venv/bin/python scripts/bench_train.py [--cycles 1] [--keep-zero-variance] [--out runs/bench_train]``.
"""

from __future__ import annotations

import argparse
import platform

import torch

from sera_core.train.config import CONFIGS, load_config
from sera_core.train.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=1, help="schedule cycles (3 updates each)")
    parser.add_argument("--out", default="runs/bench_train")
    parser.add_argument("--keep-zero-variance", action="store_true",
                        help="train on zero-variance groups too, so the update is timed even when every reward is equal "
                             "(the shipped tiny model solves nothing, so every group is zero-variance)")
    args = parser.parse_args()
    cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", schedule="execution:1,delegation:1,rubric_generation:1",
                      total_updates=3 * args.cycles, checkpoint_every=1000, out=args.out,
                      filter_zero_variance=not args.keep_zero_variance)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = Trainer(cfg, progress=True).run()
    print("\n| stage | seconds | generation | environment | update | trees | agents | trained tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["seconds"]
        print(f"| {r['stage']} | {s:.1f} | {r['seconds_generation'] / s:.0%} | {r['seconds_environment'] / s:.0%} | "
              f"{r['seconds_update'] / s:.0%} | {r['trees']} | {r['agents']} | {r['tokens_trained']} |")


if __name__ == "__main__":
    main()
