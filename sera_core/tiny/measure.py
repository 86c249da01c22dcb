"""What a (tiny) model does through the real runtime: the figures its manifest reports.

:func:`measure` plays tasks at temperature 0 (the evaluation contract) and counts:

* ``well_formed``: share of act turns in the benchmark's format (TextCraft: a
  ``<python>`` block whose code parses; TextWorld: exactly one valid block);
* ``rubric_validity`` / ``score_validity``: rubrics that parse (4-8 items, ...) over
  rubrics written; scores that parse over scoring calls made;
* ``success``: root success per benchmark and difficulty.

With ``groups > 0`` it also plays that many tasks at temperature 1 with counterfactual
groups of 8 and reports ``mixed_groups`` (the share of groups with both outcomes: the
branches really differ) and the scorer's ``pairwise_accuracy`` on them against the
checker's labels.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict
from statistics import fmean
from typing import Any

from sera_core.agents.actors import PolicyActor
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.envs.textcraft.env import extract_code
from sera_core.envs.textworld.protocol import parse_reply
from sera_core.policy.hf import HFPolicy


def well_formed(text: str, env: str) -> bool:
    """Whether one act reply is in the benchmark's format."""
    if env == "textworld":
        return parse_reply(text).kind != "invalid"
    code = extract_code(text)
    if code is None:
        return False
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _figures(rollouts: list, env: str) -> dict[str, Any]:
    acts = [t for r in rollouts for n in r.tree.nodes.values() for t in n.turns if t.kind == "act"]
    children = [n for r in rollouts for n in r.tree.nodes.values() if n.parent_id is not None]
    written = [n for n in children if n.rubric is not None or n.rubric_error is not None]
    scored = [n for n in children if (n.score is not None and not n.score.get("forced")) or
              (n.score_error is not None and n.rubric is not None)]
    by: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        by[str(r.tree.meta.get("difficulty"))].append(r.tree.root_reward or 0.0)
    return {
        "tasks": len(rollouts),
        "well_formed": round(fmean([well_formed(t.text, env) for t in acts]), 4) if acts else None,
        "delegations": sum(len(r.tree.delegation_events()) for r in rollouts),
        "rubric_validity": round(sum(n.rubric is not None for n in written) / len(written), 4) if written else None,
        "score_validity": round(sum(n.score is not None for n in scored) / len(scored), 4) if scored else None,
        "success": {d: round(fmean(v), 4) for d, v in sorted(by.items())},
    }


def measure(model: str | os.PathLike, tasks: dict[str, list[dict]], *, groups: int = 0, seed: int = 0,
            max_batch: int = 64) -> dict[str, Any]:
    """Figures of ``model`` on ``tasks`` (``{"textcraft": [...], "textworld": [...]}``)."""
    policy = HFPolicy(model)
    out: dict[str, Any] = {}
    for env, env_tasks in tasks.items():
        greedy = RuntimeConfig(temperature=0.0, rubric_temperature=0.0, seed=seed)
        rollouts = Runtime(env, PolicyActor(policy, max_batch=max_batch), greedy).run(env_tasks)
        out[env] = _figures(rollouts, env)
        if groups:
            sampled = RuntimeConfig(temperature=1.0, counterfactual=8, seed=seed)
            points = [p for r in Runtime(env, PolicyActor(policy, max_batch=max_batch), sampled).run(env_tasks[:groups])
                      for p in r.points]
            mixed = [p for p in points if not p["ranking"]["skipped"]]
            out[env]["groups"] = len(points)
            out[env]["mixed_groups"] = round(len(mixed) / len(points), 4) if points else None
            out[env]["pairwise_accuracy"] = round(fmean([p["ranking"]["accuracy"] for p in mixed]), 4) if mixed else None
    return out
