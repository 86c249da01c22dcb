"""Run output: trees and delegation points on disk, and the summary of a batch of rollouts.

``write_rollouts(out_dir, rollouts)`` writes, atomically:

* ``trees.jsonl``: one :class:`~sera_core.agents.tree.Tree` per line (lossless);
* ``delegation_points.jsonl``: one counterfactual group per line
  (:class:`~sera_core.agents.points.DelegationPoint`);
* ``summary.json``: :func:`summarize`.

:func:`summarize` defines the numbers ``sera rollout`` prints:

* ``root_success_rate``: mean R_i over trees (errors count as failures);
* ``delegations``: delegation events (parent steps that launched children) and ``children``;
* ``rubrics``: rubrics written, valid (parsed 4-8 items), ``validity`` = valid / written;
* ``scores``: children scored by a call, forced zeros (unfinished), malformed, mean s over scored;
* ``labels``: children and branches labelled by the judge, and how many passed;
* ``groups``: counterfactual groups, ``valid`` (mixed labels) and ``skipped`` (homogeneous),
  ``mean_ranking_loss`` and ``mean_pairwise_accuracy`` over valid groups;
* ``tokens``: completion tokens per role over the trees (branches 1..B-1 excluded);
* ``forks``, ``errors`` (rollouts that raised), ``dropped_rollouts`` (``drop_rollout`` policy), ``seconds``;
* ``judge``: the judge's call and token counters (Table 2's supervision cost).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from sera_core.agents.points import DelegationPoint
from sera_core.agents.tree import ROLES, write_trees
from sera_core.utils.jsonio import read_jsonl, write_jsonl


def summarize(rollouts: Sequence[Any], judge: Any = None, seconds: float | None = None) -> dict[str, Any]:
    """The batch summary (see the module docstring); ``seconds`` is the wall time when given,
    else the sum of the rollouts' own times (they overlap when run concurrently)."""
    trees = [r.tree for r in rollouts]
    children = [n for t in trees for n in t.nodes.values() if n.parent_id is not None]
    written = [n for n in children if n.rubric is not None or n.rubric_error is not None]
    scored = [n for n in children if n.score is not None and not n.score.get("forced")]
    points = [p for r in rollouts for p in r.points]
    valid = [p for p in points if not p.ranking.skipped]
    labels = [n.label for n in children if n.label is not None]
    labels += [lab for p in points for lab in p.labels[1:] if lab is not None]
    out = {
        "trees": len(trees),
        "root_success_rate": round(fmean([t.root_reward or 0.0 for t in trees]), 4) if trees else 0.0,
        "errors": sum(1 for t in trees if "error" in t.meta),
        "dropped_rollouts": sum(1 for t in trees if t.dropped),
        "agents": sum(len(t.nodes) for t in trees),
        "delegations": sum(len(t.delegation_events()) for t in trees),
        "children": len(children),
        "rubrics": {"written": len(written), "valid": sum(1 for n in written if n.rubric is not None),
                    "validity": round(sum(1 for n in written if n.rubric is not None) / len(written), 4) if written else None},
        "scores": {"scored": len(scored), "forced_zero": sum(1 for n in children if (n.score or {}).get("forced")),
                   "malformed": sum(1 for n in children if n.score_error is not None and n.rubric is not None),
                   "mean": round(fmean([n.score["final_score"] for n in scored]), 4) if scored else None},
        "labels": {"labelled": len(labels), "passed": sum(labels)},
        "groups": {"total": len(points), "valid": len(valid), "skipped": len(points) - len(valid)},
        "mean_ranking_loss": round(fmean([p.ranking.loss for p in valid]), 4) if valid else None,
        "mean_pairwise_accuracy": round(fmean([p.ranking.accuracy for p in valid]), 4) if valid else None,
        "forks": sum(t.meta.get("forks", 0) for t in trees),
        "tokens": {role: sum(t.token_count(role) for t in trees) for role in ROLES},
        "seconds": round(seconds if seconds is not None else sum(r.seconds for r in rollouts), 2),
    }
    if judge is not None and hasattr(judge, "stats_snapshot"):
        out["judge"] = judge.stats_snapshot()
    return out


def write_rollouts(out_dir: str | os.PathLike, rollouts: Sequence[Any], summary: dict[str, Any] | None = None) -> Path:
    """Write ``trees.jsonl``, ``delegation_points.jsonl`` and ``summary.json`` under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_trees(out / "trees.jsonl", [r.tree for r in rollouts])
    write_jsonl(out / "delegation_points.jsonl", [p.to_json() for r in rollouts for p in r.points])
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary if summary is not None else summarize(rollouts), indent=1) + "\n")
    os.replace(tmp, out / "summary.json")
    return out


def read_points(path: str | os.PathLike) -> list[DelegationPoint]:
    """The delegation points written by :func:`write_rollouts`."""
    return [DelegationPoint.from_json(rec) for rec in read_jsonl(path)]
