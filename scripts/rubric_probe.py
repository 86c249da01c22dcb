"""How much the rubric moves the scorer's belief, on curve 1's held-out points (not a test).

The shipped policy writes ``--rubrics`` rubrics per held-out point at temperature 1 (each
draw its own runtime seed), and scores the same 8 stored branches against each at
temperature 0, the official setting. Each branch's belief ``q = P("success": true)`` of its
greedy call (:func:`~sera_core.eval.points.branch_beliefs`) then varies across rubrics and
across branches; :func:`~sera_core.eval.points.rubric_spread` compares the two and gives the
belief accuracy of a drawn rubric, of the best draw and of the worst, per point. ``best -
mean`` bounds what training the writer (the ``rubric`` and ``rubric_belief`` arms) could gain
by choosing among what it already writes. Each draw's :func:`~sera_core.eval.points.point_metrics`
(gate ceiling included) is kept too.

Each draw is saved as it finishes (``OUT/draw<r>.json``) and skipped on a rerun, so the
script resumes; the summary goes to ``OUT/probe.json`` (``--figures DIR``: copied there as
``rubric_probe.json``). About 6 minutes a draw alone on 2 cores (306 calls).

``nohup .venv/bin/python scripts/rubric_probe.py --out runs/rubric_probe --figures figures > runs/rubric_probe.log 2>&1 &``
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


def main() -> None:
    from sera_core.eval.points import branch_beliefs, point_metrics, rubric_spread
    from sera_core.tiny.rubric_stage import RubricStage, RubricStageConfig, heldout_set
    from sera_core.train.config import load_config
    from sera_core.utils.seeding import derive_seed

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rubrics", type=int, default=4, help="rubrics drawn per held-out point (>= 2)")
    parser.add_argument("--out", default="runs/rubric_probe")
    parser.add_argument("--points-dir", default="runs/rubric_curve", help="where curve 1 caches its held-out points")
    parser.add_argument("--figures", default=None, help="also copy probe.json into this folder as rubric_probe.json")
    args = parser.parse_args()
    if args.rubrics < 2:
        parser.error("--rubrics must be at least 2")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = RubricStageConfig(arm="rubric_belief", updates=1, points_dir=args.points_dir, out=str(out / "stage"))
    heldout = heldout_set(cfg, load_config(cfg.config).env)  # the points RubricStage(cfg) measures, without its engine
    stage = None
    beliefs, metrics = [], []
    for r in range(args.rubrics):
        path = out / f"draw{r}.json"
        if not path.exists():
            # the stage gives the policy and its engine settings; it trains nothing here (its config
            # counts one update because a training config must have one), and loads only for a missing draw
            stage = stage or RubricStage(cfg)
            t0 = time.perf_counter()
            print(f"[{time.strftime('%H:%M:%S')}] draw {r}: {len(heldout)} rubrics at temperature 1, branches scored greedily", flush=True)
            points = stage.rescored(heldout, derive_seed(0, "rubric_probe", r), 1.0, 0.0, progress=True)
            record = {"beliefs": [branch_beliefs(p, stage.policy.decode) for p in points],
                      "metrics": point_metrics(points, stage.policy.decode) | {"seconds": round(time.perf_counter() - t0, 1)}}
            path.write_text(json.dumps(record) + "\n")
        record = json.loads(path.read_text())
        beliefs.append(record["beliefs"])
        metrics.append(record["metrics"])
    summary = {"rubrics": args.rubrics, "spread": rubric_spread(heldout, beliefs), "draws": metrics}
    (out / "probe.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.figures:
        shutil.copy(out / "probe.json", Path(args.figures) / "rubric_probe.json")
    print(json.dumps(summary["spread"], indent=1))


if __name__ == "__main__":
    main()
