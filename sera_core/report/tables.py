"""The paper's Tables 1, 2, 3, 4 and 7 (what SPEC 7 states), as CSV and Markdown.

Each builder returns a :class:`Table`: published rows (from
:data:`~sera_core.report.published.PUBLISHED`) and, for Table 1, rows of your own runs
(:func:`~sera_core.report.runs.load_runs`) kept apart: in the CSV they follow the
published rows with group ``yours``; in the Markdown they form their own table under
a note that they are not reproductions of the paper's 4B results unless their label
says so. A cell the paper does not state is empty in the CSV and ``-`` in Markdown;
a derived number is marked ``†`` in Markdown (``published.csv`` gives its formula).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

from sera_core.envs.registry import BENCHMARKS
from sera_core.eval.aggregate import DIFFICULTIES
from sera_core.report import published as P
from sera_core.report.checks import check_published, recompute
from sera_core.report.published import Key, Number
from sera_core.report.runs import UserRun

Cell = str | Number | float | None
"""Text, a published number, a number of yours, or nothing."""

ENVS = tuple((name, BENCHMARKS[name].short_title) for name in P.ENVS)
"""The paper's benchmarks and their names in headings (the registry's)."""
YOURS_NOTE = ("Rows marked \"yours:\" are your own evaluation runs (summary.json files), not the paper's; "
              "they are not reproductions of the paper's Qwen3-4B results unless their label says so.")
DERIVED_NOTE = "† derived from SPEC 7 by arithmetic; published.csv gives each formula."


@dataclass(frozen=True)
class Table:
    """One table, rendered to CSV and Markdown."""

    name: str
    """File stem (``table1`` writes ``table1.csv`` and ``table1.md``)."""
    title: str
    """The Markdown heading."""
    columns: tuple[tuple[str, str], ...]
    """(CSV header, Markdown header) of each column."""
    rows: tuple[tuple[Cell, ...], ...]
    """The published rows."""
    yours: tuple[tuple[Cell, ...], ...] = ()
    """Rows of your runs (Table 1 only)."""
    notes: tuple[str, ...] = ()
    """Lines under the Markdown table."""


def fmt(cell: Cell, markdown: bool = False) -> str:
    """A cell as text: numbers to 2 decimals (``pp`` signed, ``h`` as ``24h06m``); in
    Markdown a derived number gets ``†``, an empty cell ``-`` and ``|`` is escaped."""
    if cell is None:
        return "-" if markdown else ""
    if isinstance(cell, str):
        return cell.replace("|", "\\|") if markdown else cell
    if isinstance(cell, float):
        return f"{cell:.2f}"
    if cell.unit == "h":
        minutes = round(cell.value * 60)
        text = f"{minutes // 60}h{minutes % 60:02d}m"
    else:
        text = f"{cell.value:+.2f}" if cell.unit == "pp" else f"{cell.value:.2f}"
    return text + ("†" if markdown and cell.derived else "")


def to_csv(table: Table) -> str:
    """Header then published rows then yours, comma-separated, ``\\n`` line ends."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c for c, _ in table.columns])
    for row in (*table.rows, *table.yours):
        writer.writerow([fmt(cell) for cell in row])
    return buf.getvalue()


def to_markdown(table: Table) -> str:
    """The title, the published rows, the notes, and a separate table of yours after a note."""
    lines = [f"# {table.title}", "", *_md_rows(table, table.rows), ""]
    if any(isinstance(cell, Number) and cell.derived for row in table.rows for cell in row):
        lines += [DERIVED_NOTE, ""]
    for note in table.notes:
        lines += [note, ""]
    if table.yours:
        lines += ["## Your runs", "", YOURS_NOTE, "", *_md_rows(table, table.yours), ""]
    return "\n".join(lines)


def _md_rows(table: Table, rows: Sequence[tuple[Cell, ...]]) -> list[str]:
    """A Markdown table of ``rows`` under the table's headers."""
    out = ["| " + " | ".join(h for _, h in table.columns) + " |", "|" + "---|" * len(table.columns)]
    return out + ["| " + " | ".join(fmt(cell, markdown=True) for cell in row) + " |" for row in rows]


def _cell(numbers: dict[Key, Number], table: str, row: str, column: str) -> Number | None:
    return numbers.get((table, row, column))


def _std(number: Number | None) -> float | None:
    return None if number is None else number.std


def table1(numbers: dict[Key, Number], runs: Sequence[UserRun] = ()) -> Table:
    """Table 1: success % per level and the average (3-seed mean, std) of each method on
    both benchmarks; the levels are those the paper states. Your runs fill their env's columns."""
    columns = [("group", "group"), ("method", "method")]
    for env, name in ENVS:
        columns += [(f"{env}_{d}", f"{name} {d.capitalize()}") for d in DIFFICULTIES]
        columns += [(f"{env}_avg", f"{name} Avg."), (f"{env}_avg_std", "± std")]
    groups = (("single-agent", (P.GRPO, P.CISPO)),
              ("multi-agent", (P.RAO, P.RAO_RT, P.WO_D_RT, P.WO_D, P.SERA)))
    rows = []
    for group, methods in groups:
        for method in methods:
            row: list[Cell] = [group, method]
            for env, _ in ENVS:
                row += [_cell(numbers, P.T1, method, f"{env}_{d}") for d in DIFFICULTIES]
                avg = _cell(numbers, P.T1, method, f"{env}_avg")
                row += [avg, _std(avg)]
            rows.append(tuple(row))
    yours = []
    for run in runs:
        seeds = f"{run.average.n} seed" + ("s" if run.average.n != 1 else "")
        row = ["yours", f"{run.name} ({'method: ' + run.method + ', ' if run.method else ''}{seeds})"]
        for env, _ in ENVS:
            if env == run.env:
                levels = [run.by_difficulty[d].mean if d in run.by_difficulty else None for d in DIFFICULTIES]
                row += [*levels, run.average.mean, run.average.std]
            else:
                row += [None] * (len(DIFFICULTIES) + 2)
        yours.append(tuple(row))
    notes = (("TextCraft Avg. weights the levels by their task counts in the 632-task pool (147 / 213 / 136 / 136); "
              "TextWorld has 350 test tasks per level, so its Avg. is the macro average. "
              "A level the paper's text does not state is left empty."),)
    return Table("table1", "Table 1: success rate (%) by level and average, 3 seeds (mean ± std)",
                 tuple(columns), tuple(rows), tuple(yours), notes)


def table1_gains(numbers: dict[Key, Number]) -> Table:
    """The gains (percentage points) between Table 1 rows that the paper's text states."""
    columns = [("comparison", "comparison")]
    for env, name in ENVS:
        columns += [(f"{env}_{d}", f"{name} {d.capitalize()}") for d in DIFFICULTIES]
        columns.append((f"{env}_avg", f"{name} Avg."))
    comparisons = (P.RAO_OVER_GRPO, P.RAO_OVER_CISPO, P.MULTI_OVER_SINGLE, P.WO_D_OVER_WO_D_RT, P.SERA_OVER_WO_D)
    rows = []
    for comparison in comparisons:
        row: list[Cell] = [comparison]
        for env, _ in ENVS:
            row += [_cell(numbers, P.T1, comparison, f"{env}_{d}") for d in (*DIFFICULTIES, "avg")]
        rows.append(tuple(row))
    return Table("table1_gains", "Table 1 gains stated in the paper's text (percentage points)",
                 tuple(columns), tuple(rows))


def table2(numbers: dict[Key, Number]) -> Table:
    """Table 2: external supervision accumulated over training."""
    rows = tuple((method, *(_cell(numbers, P.T2, method, f) for f, _ in P.T2_COLUMNS))
                 for method in (P.RAO, P.SERA, P.WO_D_RT))
    return Table("table2", "Table 2: external supervision over training", (("method", "method"), *P.T2_COLUMNS), rows,
                 notes=(("Calls in thousands (K), tokens in millions (M). Without rubric training there are no "
                         "external calls."),))


def table3(numbers: dict[Key, Number]) -> Table:
    """Table 3 (TextCraft): rubric design ablations, success % (3-seed mean)."""
    configs = (P.T3_UNTRAINED, P.T3_EXTERNAL, P.T3_TRAINED, P.T3_GLOBAL, P.T3_DISC)
    rows = tuple((c, *(_cell(numbers, P.T3, c, f) for f in ("hard", "extreme", "avg"))) for c in configs)
    return Table("table3", "Table 3: rubric design ablations on TextCraft, success rate (%)",
                 (("configuration", "configuration"), ("hard", "Hard"), ("extreme", "Extreme"), ("avg", "Avg.")),
                 rows, notes=(("The policy-written rows are the configurations of Table 1's SERA w/o D & RT "
                               "(untrained) and SERA w/o D (trained), with the same averages."),))


def table3_gains(numbers: dict[Key, Number]) -> Table:
    """The differences between Table 3 rows the paper's text states (percentage points)."""
    comparisons = (P.T3_EXTERNAL_OVER_UNTRAINED, P.T3_TRAINED_OVER_EXTERNAL, P.T3_GLOBAL_OVER_UNTRAINED,
                   P.T3_DISC_OVER_TRAINED)
    rows = tuple((c, _cell(numbers, P.T3, c, "avg")) for c in comparisons)
    return Table("table3_gains", "Table 3 differences (percentage points)",
                 (("comparison", "comparison"), ("avg", "Avg.")), rows)


def table4(numbers: dict[Key, Number]) -> Table:
    """Table 4 (TextWorld): test-time rubric-guided selection with N candidates per node."""
    fields = (("hard", "Hard"), ("extreme", "Extreme"), ("avg", "Avg."), ("avg_gain", "Δ Avg. vs N=1"),
              ("extreme_gain", "Δ Extreme vs N=1"))
    rows = tuple((policy, selection, *(_cell(numbers, P.T4, P.t4_row(policy, selection), f) for f, _ in fields))
                 for policy in (P.BASE, P.SERA) for selection in (P.N1, P.N2_POLICY, P.N2_EXTERNAL))
    return Table("table4", "Table 4: test-time rubric-guided selection on TextWorld, success rate (%)",
                 (("policy", "policy"), ("selection", "selection"), *fields), rows,
                 notes=("External judge: Kimi-K3. Gains in percentage points.",))


def table7(numbers: dict[Key, Number]) -> Table:
    """Table 7: training wall clock to the evaluated checkpoint on 2 x 8 H200."""
    rows = tuple((m, *(_cell(numbers, P.T7, m, env) for env, _ in ENVS)) for m in (P.SERA, P.RAO, P.WO_D_RT))
    return Table("table7", "Table 7: training wall clock to the evaluated checkpoint (2 x 8 H200)",
                 (("method", "method"), *ENVS), rows,
                 notes=("Implementation- and hardware-dependent; comparable only within a benchmark.",))


LADDER_CHANGES = {
    P.RAO: "baseline: each child rewarded by the external label (checker or judge); nothing but execution trained",
    P.WO_D_RT: "the child's reward is the parent's own rubric score instead of the label (rubrics untrained)",
    P.WO_D: "+ rubric training: rubric writing trained by ranking 8 counterfactual branches",
    P.SERA: "+ decomposition reward: the launch tokens trained by leaf coverage",
}
"""What each rung of :data:`~sera_core.report.published.LADDER` changes from the rung below (SPEC 6)."""


def ladder(numbers: dict[Key, Number], runs: Sequence[UserRun] = ()) -> list[dict[str, str | float | None]]:
    """The ablation ladder as rows, first rung first: what each rung changes
    (:data:`LADDER_CHANGES`), the schedule of its shipped full config, per benchmark its
    published average, std and change over the rung below (``change = avg(rung) - avg(rung
    below)``, percentage points), its external calls over training (Table 2, thousands) and
    its wall clock (Table 7, hours) where published. Each of your ``runs`` whose ``method``
    is a rung follows that rung's row, with its average in its benchmark's columns (and no
    change: it is not the rung below's run)."""
    from sera_core.train.config import CONFIGS, load_config

    config_of = {row: name for name, row in P.METHOD_ROWS.items()}
    value = lambda *key: None if (n := numbers.get(key)) is None else n.value  # noqa: E731
    rows: list[dict[str, str | float | None]] = []
    for i, rung in enumerate(P.LADDER):
        row: dict[str, str | float | None] = {
            "rung": rung, "changes": LADDER_CHANGES[rung],
            "schedule": load_config(CONFIGS / "textcraft" / f"{config_of[rung]}_full.yaml").schedule}
        for env, _ in ENVS:
            avg = numbers[(P.T1, rung, f"{env}_avg")]
            below = numbers[(P.T1, P.LADDER[i - 1], f"{env}_avg")].value if i else None
            row |= {f"{env}_avg": avg.value, f"{env}_std": avg.std,
                    f"{env}_change": None if below is None else round(avg.value - below, 2)}
        row |= {"textcraft_verifier_calls": value(P.T2, rung, "textcraft_verifier_calls"),
                "textworld_judge_calls": value(P.T2, rung, "textworld_judge_calls"),
                **{f"{env}_hours": value(P.T7, rung, env) for env, _ in ENVS}}
        rows.append(row)
        for run in runs:
            if P.METHOD_ROWS.get(run.method or "") == rung:
                rows.append({"rung": run.name, "changes": f"yours: method {run.method}, {run.average.n} seed(s)",
                             f"{run.env}_avg": run.average.mean, f"{run.env}_std": run.average.std})
    return rows


def checks_table(numbers: dict[Key, Number]) -> Table:
    """Every relation :func:`~sera_core.report.checks.check_published` verifies, with both sides."""
    rows = tuple(("/".join(r.target), r.formula, f"{recompute(r, numbers):.4f}", numbers[r.target].value)
                 for r in P.RELATIONS)
    return Table("checks", "Consistency checks of the published numbers (all pass)",
                 (("number", "number"), ("relation", "relation"), ("recomputed", "recomputed"),
                  ("published", "published")), rows,
                 notes=(("A check passes when the recomputed value, rounded to 2 decimals, is within 0.01 of "
                         "the published one."),))


def published_table(numbers: Sequence[Number] = P.PUBLISHED) -> Table:
    """Every published number in long form, with its source and, if derived, its formula."""
    rows = tuple((n.table, n.row, n.column, f"{n.value:.4f}" if n.unit == "h" else f"{n.value:.2f}",
                  None if n.std is None else f"{n.std:.2f}", n.unit,
                  "yes" if n.derived else "no", n.source, n.note) for n in numbers)
    names = ("table", "row", "column", "value", "std", "unit", "derived", "source", "note")
    return Table("published", "Every published number (SPEC 7)", tuple((c, c) for c in names), rows)


def build_tables(runs: Sequence[UserRun] = ()) -> list[Table]:
    """All tables, after :func:`~sera_core.report.checks.check_published` has passed."""
    check_published()
    numbers = P.index()
    return [table1(numbers, runs), table1_gains(numbers), table2(numbers), table3(numbers),
            table3_gains(numbers), table4(numbers), table7(numbers), checks_table(numbers), published_table()]
