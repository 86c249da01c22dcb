"""The learning curves' figures, drawn from the results JSON their scripts commit under ``figures/``.

* :func:`curve1_figure`: curve 1, the rubric stage (``scripts/rubric_curve.py``:
  ``figures/rubric_curve*.json``, ``{"results": {arm: [run, ...]}}``);
* :func:`curve2_figure`: curve 2, SERA's execution stage (``scripts/execution_curve.py``:
  ``figures/execution_curve*.json``, ``{"runs": [run, ...], "tasks": n}``).

The scripts save these figures beside their results, and notebook 09 draws them again from the
committed files: one drawing, so the page and the PNG cannot disagree. Matplotlib is imported
lazily and without pyplot (a :class:`~matplotlib.figure.Figure` of its own, no global state).
Intervals over seeds are Student's t (:func:`~sera_core.eval.points.mean_interval`).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import TYPE_CHECKING, Any

from sera_core.eval.points import mean_interval

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CURVE1_LABELS = {"rubric": "SERA's ranking credit, writer only", "rubric_scorer": "SERA's ranking credit, writer + scorer",
                 "rubric_scorer_order": "order credit, writer + scorer (extension)",
                 "rubric_scorer_label": "scorer's gate toward the label (extension)",
                 "rubric_belief": "writer on the scorer's belief (extension)"}
"""Curve 1's arms (:data:`~sera_core.tiny.rubric_stage.ARMS`) in words."""


def _figure(width: float, height: float, columns: int) -> tuple[Figure, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.subplots(1, columns)


def curve1_figure(results: Mapping[str, list[dict[str, Any]]]) -> Figure:
    """Curve 1: held-out pairwise accuracy (solid) and belief accuracy (dashed) against
    updates, each seed thin and the mean over seeds thick, per arm (left); the same two on the
    training points of each update, mean over seeds (right). ``results``: arm -> runs, each run
    with ``heldout`` (measurements, ``version`` and the two accuracies) and ``updates``."""
    fig, axes = _figure(11, 4.4, 2)
    for k, (arm, runs) in enumerate(results.items()):
        versions = [h["version"] for h in runs[0]["heldout"]]
        n = min(len(r["updates"]) for r in runs)
        for key, style, what in (("pairwise_accuracy", "-", "score"), ("belief_accuracy", "--", "belief")):
            if any(h.get(key) is None for r in runs for h in r["heldout"]):
                continue  # a run from before the belief readout
            for r in runs:
                axes[0].plot([h["version"] for h in r["heldout"]], [h[key] for h in r["heldout"]], color=f"C{k}", ls=style,
                             alpha=0.3, lw=1)
            axes[0].plot(versions, [fmean(r["heldout"][i][key] for r in runs) for i in range(len(versions))],
                         color=f"C{k}", ls=style, lw=2.5, marker="o", label=f"{CURVE1_LABELS.get(arm, arm)}: {what}")
            axes[1].plot(range(n), [fmean(r["updates"][i][key] for r in runs) for i in range(n)],
                         color=f"C{k}", ls=style, marker=".")
    axes[0].axhline(0.5, color="grey", ls=":", lw=1)
    axes[0].axhline(0.7, color="grey", ls="--", lw=1)
    axes[0].set(title="held-out points (val world, temperature 0)", xlabel="update", ylabel="pairwise accuracy",
                ylim=(0.3, 1.0))
    axes[1].set(title="training points (sampled calls)", xlabel="update", ylabel="pairwise accuracy", ylim=(0.3, 1.0))
    fig.legend(loc="outside lower center", ncol=2, fontsize=8)  # one legend for both panels, below them
    return fig


def measured(results: Mapping[str, Any]) -> str:
    """What curve 2's before and after are measured on, in words: ``50 easy val tasks`` (of at
    most N crafts), or the protocol set's name."""
    if protocol := results.get("protocol"):
        return f"{results['tasks']} tasks of {protocol['name']}/{protocol['set']} ({protocol['role']})"
    crafts = results.get("args", {}).get("val_max_craft_steps")
    return f"{results['tasks']} easy val tasks" + (f" of <= {crafts} crafts" if crafts else "")


def curve2_figure(results: Mapping[str, Any]) -> Figure:
    """Curve 2: each seed's training trees' root success per update (T=1), with its held-in
    checkpoints and the one kept where it chose one (left); each seed's paired change
    after - before with its 95% interval over tasks, and the mean over seeds with its Student's
    t interval (right)."""
    fig, axes = _figure(12, 3.8, 2)
    runs = results["runs"]
    for k, r in enumerate(runs):
        ups = r["updates"]
        axes[0].plot([int(u["version"]) + 1 for u in ups], [float(u["root_success"] or 0) for u in ups], "o-",
                     color=f"C{k}", label=f"seed {r['seed']}")
        if "held_in" in r:  # the kept checkpoints' held-in success at T=0, the one kept filled
            held = {int(v): n for v, n in r["held_in"].items()}  # JSON keys are text
            versions = sorted(held)
            axes[0].plot(versions, [held[v] / results["select_tasks"] for v in versions], "s--", color=f"C{k}",
                         mfc="none", label=f"seed {r['seed']}: held-in (T=0), kept update {r['kept']}")
            axes[0].plot([int(r["kept"])], [held[int(r["kept"])] / results["select_tasks"]], "s", color=f"C{k}", ms=9)
        if "val_curve" in r:  # --val-curve: every kept checkpoint on the val tasks, a diagnostic
            val = {int(v): n for v, n in r["val_curve"].items()}
            versions = sorted(val)
            axes[0].plot(versions, [val[v] / results["tasks"] for v in versions], "^:", color=f"C{k}",
                         label=f"seed {r['seed']}: val (T=0), chooses nothing")
        d = r["change"]["difference"]
        axes[1].errorbar([k], [d["rate"]], yerr=[d["ci"]], fmt="o", color=f"C{k}", capsize=4)
    labels = [f"seed {r['seed']}\n{r['change']['before']['rate']:.0%} -> {r['change']['after']['rate']:.0%}" for r in runs]
    if len(runs) > 1:
        mean, half = mean_interval([r["change"]["difference"]["rate"] for r in runs])
        axes[1].errorbar([len(runs)], [mean], yerr=[half], fmt="s", color="k", capsize=4)
        labels.append(f"mean of {len(runs)}")
    axes[1].axhline(0, color="grey", lw=0.8)
    axes[1].axhline(0.10, color="grey", lw=0.8, ls="--", label="target +0.10")
    held = (", held-in" + (", val" if any("val_curve" in r for r in runs) else "") + " (T=0)"
            if any("held_in" in r for r in runs) else "")
    axes[0].set(xlabel="update", ylabel="root success of the update's trees (T=1)" + held,
                title=f"training trees ({runs[0]['updates'][0].get('trees', '?')} an update)")
    axes[0].legend(fontsize=8)
    axes[1].set(xticks=range(len(labels)), xticklabels=labels, xlim=(-0.5, len(labels) - 0.5),
                ylabel=f"after - before, {measured(results)} (T=0)",
                title="paired change, 95% intervals (mean: Student's t)")
    axes[1].legend(fontsize=8)
    return fig
