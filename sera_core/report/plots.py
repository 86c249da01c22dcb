"""PNG plots of the published numbers (and your runs beside them), byte-for-byte reproducible.

* ``success_by_difficulty.png`` - success % per level and the average, per method, for
  the levels the paper states; your runs as dotted bars.
* ``ablation_ladder.png`` - RAO -> SERA w/o D & RT -> SERA w/o D -> SERA, average ± std on
  both benchmarks; your runs whose ``method`` is one of these rungs as markers.
* ``supervision_cost.png`` - Table 2: external calls and judge tokens over training.
* ``test_time_gain.png`` - Table 4: SERA's TextWorld average with N=2 selection, and the
  gain over N=1 of the untrained base and of SERA.

Derived numbers are hatched. Matplotlib is imported lazily (Agg, no pyplot), under the
default style, with a fixed size and dpi; the PNG carries no ``Software`` tag, so the
same inputs give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sera_core.envs.registry import BENCHMARKS
from sera_core.eval.aggregate import DIFFICULTIES
from sera_core.report import published as P
from sera_core.report.published import Key, Number
from sera_core.report.runs import UserRun

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
"""Dots per inch of every PNG."""
ENVS = tuple((name, BENCHMARKS[name].title) for name in P.ENVS)
"""The paper's benchmarks and their titles (the registry's)."""
LADDER = P.LADDER
"""The ablation ladder, first rung first."""
COLORS = {P.RAO: "#7f7f7f", P.RAO_RT: "#bcbd22", P.WO_D_RT: "#9ecae1", P.WO_D: "#4292c6", P.SERA: "#08519c",
          P.GRPO: "#d62728", P.CISPO: "#ff7f0e", P.BASE: "#bdbdbd"}
"""One colour per published method."""
YOURS_COLORS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
"""Your runs, in turn."""
YOURS_MARKERS = ("D", "o", "s", "^", "v")


def render(fig: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes (fixed ``dpi``, no ``Software`` metadata; a notebook's stored copy
    may take fewer dots to stay small)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _bar(ax: Axes, x: float, number: Number | float, width: float, color: str, hatch: str | None = None,
         std: float | None = None) -> None:
    """One bar with its value printed above it; a derived number is hatched."""
    value = number.value if isinstance(number, Number) else number
    if isinstance(number, Number) and number.derived:
        hatch = "//"
    ax.bar(x, value, width, color=color, hatch=hatch, edgecolor="black", linewidth=0.4,
           yerr=std, capsize=2 if std else 0, error_kw={"linewidth": 0.6})
    ax.annotate(f"{value:.2f}", (x, value + (std or 0)), xytext=(0, 2), textcoords="offset points",
                ha="center", va="bottom", fontsize=5.5, rotation=90)


def success_by_difficulty(numbers: dict[Key, Number], runs: Sequence[UserRun] = ()) -> Figure:
    """Per benchmark, grouped bars over Easy..Extreme and Avg.: every method with a stated
    level, then your runs on that benchmark."""
    from matplotlib.patches import Patch

    fig = _figure(11, 4.2)
    axes = fig.subplots(1, 2, sharey=True)
    groups = (*DIFFICULTIES, "avg")
    for ax, (env, title) in zip(axes, ENVS, strict=True):
        methods = [m for m in (P.RAO, P.WO_D_RT, P.WO_D, P.SERA)
                   if any((P.T1, m, f"{env}_{d}") in numbers for d in DIFFICULTIES)]
        mine = [(k, r) for k, r in enumerate(runs) if r.env == env]
        width = 0.8 / max(1, len(methods) + len(mine))
        handles = []
        for i, method in enumerate(methods):
            for g, group in enumerate(groups):
                number = numbers.get((P.T1, method, f"{env}_{group}"))
                if number is not None:
                    _bar(ax, g + (i + 0.5) * width - 0.4, number, width, COLORS[method], std=number.std)
            handles.append(Patch(facecolor=COLORS[method], edgecolor="black", linewidth=0.4, label=method))
        for j, (k, run) in enumerate(mine):
            x0 = (len(methods) + j + 0.5) * width - 0.4
            color = YOURS_COLORS[k % len(YOURS_COLORS)]
            for g, group in enumerate(groups):
                stat = run.average if group == "avg" else run.by_difficulty.get(group)
                if stat is not None:
                    _bar(ax, g + x0, stat.mean, width, color, hatch="..", std=stat.std)
            handles.append(Patch(facecolor=color, hatch="..", edgecolor="black", linewidth=0.4, label=run.name))
        ax.set_xticks(range(len(groups)), [g.capitalize() if g != "avg" else "Avg." for g in groups])
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 115)
        ax.legend(handles=handles, fontsize=6, loc="upper right")
    axes[0].set_ylabel("success (%)")
    fig.suptitle("Success by difficulty (levels the paper states; hatched: derived)", fontsize=10)
    return fig


def ablation_ladder(numbers: dict[Key, Number], runs: Sequence[UserRun] = ()) -> Figure:
    """Average ± std of each rung of the ladder on both benchmarks; your runs as markers."""
    fig = _figure(10, 4)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (env, title) in zip(axes, ENVS, strict=True):
        for i, method in enumerate(LADDER):
            number = numbers[(P.T1, method, f"{env}_avg")]
            _bar(ax, i, number, 0.6, COLORS[method], std=number.std)
        for k, run in enumerate(runs):
            row = P.METHOD_ROWS.get(run.method or "")
            if run.env == env and row in LADDER:
                ax.errorbar(LADDER.index(row) + 0.38, run.average.mean, yerr=run.average.std or None, fmt=YOURS_MARKERS[k % 5],
                            color=YOURS_COLORS[k % len(YOURS_COLORS)], markersize=5, capsize=2, label=run.name)
        ax.set_xticks(range(len(LADDER)), ["RAO", "SERA\nw/o D & RT", "SERA\nw/o D", "SERA"], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 100)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper left")
    axes[0].set_ylabel("average success (%)")
    fig.suptitle("Ablation ladder: + rubric execution reward, + rubric training, + decomposition reward", fontsize=10)
    return fig


def supervision_cost(numbers: dict[Key, Number]) -> Figure:
    """Table 2: one panel per quantity, a bar per method."""
    fig = _figure(10, 3.6)
    axes = fig.subplots(1, 3)
    methods = (P.RAO, P.SERA, P.WO_D_RT)
    for ax, (field, title) in zip(axes, P.T2_COLUMNS, strict=True):
        values = [numbers[(P.T2, m, field)] for m in methods]
        for i, (method, number) in enumerate(zip(methods, values, strict=True)):
            _bar(ax, i, number, 0.6, COLORS[method])
        ax.set_xticks(range(len(methods)), ["RAO", "SERA", "SERA\nw/o D & RT"], fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, max(n.value for n in values) * 1.3)
    fig.suptitle("External supervision over training (Table 2)", fontsize=10)
    return fig


def selection_gain(numbers: dict[Key, Number]) -> Figure:
    """Table 4: SERA's TextWorld average per selection; the gain over N=1 per policy and judge."""
    fig = _figure(9, 3.8)
    left, right = fig.subplots(1, 2)
    selections = (P.N1, P.N2_POLICY, P.N2_EXTERNAL)
    for i, selection in enumerate(selections):
        _bar(left, i, numbers[(P.T4, P.t4_row(P.SERA, selection), "avg")], 0.6, COLORS[P.SERA])
    left.set_xticks(range(3), ["N=1", "N=2\npolicy judge", "N=2\nexternal judge"], fontsize=8)
    left.set_ylim(0, 100)
    left.set_ylabel("SERA average success (%)")
    left.set_title("SERA on TextWorld-Sync", fontsize=9)
    for p, policy in enumerate((P.BASE, P.SERA)):
        for j, selection in enumerate(selections[1:]):
            number = numbers[(P.T4, P.t4_row(policy, selection), "avg_gain")]
            x = p + (j - 0.5) * 0.35
            right.bar(x, number.value, 0.35, color=COLORS[policy], hatch="//" if number.derived else None,
                      edgecolor="black", linewidth=0.4)
            right.text(x, number.value + (0.1 if number.value >= 0 else -0.1), f"{number.value:+.2f}\n{selection[5:]}",
                       ha="center", va="bottom" if number.value >= 0 else "top", fontsize=6)
    right.axhline(0, color="black", linewidth=0.6)
    right.set_xticks(range(2), ["Qwen3-4B-Instruct\n(no SERA training)", "SERA"], fontsize=8)
    right.set_ylim(-1.5, 3.5)
    right.set_ylabel("Δ average vs N=1 (pp)")
    right.set_title("Gain of N=2 rubric-guided selection", fontsize=9)
    fig.suptitle("Test-time selection (Table 4; hatched: derived)", fontsize=10)
    return fig


def build_plots(runs: Sequence[UserRun] = ()) -> dict[str, bytes]:
    """Every plot as ``{file name: PNG bytes}`` under matplotlib's default style."""
    import matplotlib.style

    numbers = P.index()
    with matplotlib.style.context("default"):
        figures = {
            "success_by_difficulty.png": success_by_difficulty(numbers, runs),
            "ablation_ladder.png": ablation_ladder(numbers, runs),
            "supervision_cost.png": supervision_cost(numbers),
            "test_time_gain.png": selection_gain(numbers),
        }
        return {name: render(fig) for name, fig in figures.items()}
