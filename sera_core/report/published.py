"""Every number of SPEC 7 as data, keyed by (table, row, column).

A :class:`Number` is one cell of one of the paper's tables (or a gain the paper's text
states). Units: ``%`` success rate, ``pp`` a difference of success rates in percentage
points, ``K`` thousands of calls, ``M`` millions of tokens, ``h`` hours.

``derived`` numbers are not printed in SPEC 7 but follow from it by arithmetic (the
GRPO / CISPO averages, Table 3 and 4 gains, two TextWorld levels of SERA w/o D); their
``note`` gives the formula, and a :class:`Relation` in :data:`RELATIONS` recomputes
each of them. The relations also tie stated numbers together (the task-weighted
TextCraft average, the stated gains, cells that two tables share);
:func:`sera_core.report.checks.check_published` evaluates them all.

Columns: Table 1 ``<env>_<difficulty>`` and ``<env>_avg``; Table 2
``textcraft_verifier_calls``, ``textworld_judge_calls``, ``textworld_judge_input_tokens``;
Table 3 ``hard``, ``extreme``, ``avg``; Table 4 ``hard``, ``extreme``, ``avg``,
``avg_gain``, ``extreme_gain`` (gains over the same policy's N=1); Table 7
``textcraft``, ``textworld``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sera_core.envs.registry import BENCHMARKS

Key = tuple[str, str, str]
"""(table, row, column)."""


@dataclass(frozen=True)
class Number:
    """One published number."""

    table: str
    """``table1``, ``table2``, ``table3``, ``table4`` or ``table7``."""
    row: str
    """The method or configuration (a gain row reads ``A over B``)."""
    column: str
    """The measured quantity (module docstring)."""
    value: float
    """The number as published (``h``: hours as a fraction, 24h06m = 24.1)."""
    std: float | None
    """The std over 3 seeds where the paper gives one."""
    source: str
    """Where it is stated."""
    derived: bool = False
    """Not printed in SPEC 7; computed from numbers that are (``note`` has the formula)."""
    note: str = ""
    """The formula of a derived number, or context."""
    unit: str = "%"
    """``%``, ``pp``, ``K``, ``M`` or ``h``."""

    @property
    def key(self) -> Key:
        """(table, row, column)."""
        return (self.table, self.row, self.column)


@dataclass(frozen=True)
class Relation:
    """``target == sum_k coef_k * value(key_k)``, to 2 decimals."""

    target: Key
    """The number the relation recomputes."""
    terms: tuple[tuple[float, Key], ...]
    """(coefficient, key) pairs."""
    formula: str
    """The relation as a reader would write it."""


T1, T2, T3, T4, T7 = "table1", "table2", "table3", "table4", "table7"
ENVS = ("textcraft", "textworld")
"""The paper's benchmarks, in its tables' order (the names its columns start with)."""
T2_COLUMNS = (("textcraft_verifier_calls", "TextCraft verifier calls (K)"),
              ("textworld_judge_calls", "TextWorld judge calls (K)"),
              ("textworld_judge_input_tokens", "TextWorld judge input tokens (M)"))
"""Table 2's columns and their headings."""
S1 = "SPEC 7; paper Table 1"
S1_TEXT = "SPEC 7; paper text on Table 1"
S2, S3, S4, S7 = "SPEC 7; paper Table 2", "SPEC 7; paper Table 3", "SPEC 7; paper Table 4", "SPEC 7; paper Table 7"
DERIVED = "derived from SPEC 7"

RAO, RAO_RT, GRPO, CISPO = "RAO", "RAO + RT", "GRPO", "CISPO"
WO_D_RT, WO_D, SERA = "SERA w/o D & RT", "SERA w/o D", "SERA"
RAO_OVER_GRPO, RAO_OVER_CISPO = "RAO over GRPO", "RAO over CISPO"
MULTI_OVER_SINGLE = "multi-agent prompted over single-agent prompted"
WO_D_OVER_WO_D_RT, SERA_OVER_WO_D = "SERA w/o D over SERA w/o D & RT", "SERA over SERA w/o D"

T3_UNTRAINED = "policy writes + scores, untrained"
T3_EXTERNAL = "external model writes + scores"
T3_TRAINED = "policy writes + scores, trained (ranking)"
T3_GLOBAL = "one global rubric"
T3_DISC = "ranking + discriminativeness"
T3_EXTERNAL_OVER_UNTRAINED = f"{T3_EXTERNAL} over {T3_UNTRAINED}"
T3_TRAINED_OVER_EXTERNAL = f"{T3_TRAINED} over {T3_EXTERNAL}"
T3_GLOBAL_OVER_UNTRAINED = f"{T3_GLOBAL} over {T3_UNTRAINED}"
T3_DISC_OVER_TRAINED = f"{T3_DISC} over {T3_TRAINED}"

BASE = "Qwen3-4B-Instruct (no SERA training)"
N1, N2_POLICY, N2_EXTERNAL = "N=1", "N=2, policy judge", "N=2, external judge"


LADDER = (RAO, WO_D_RT, WO_D, SERA)
"""The ablation ladder, first rung first: each rung changes one thing of the rung below (SPEC 6)."""

METHOD_ROWS = {"grpo": GRPO, "cispo": CISPO, "rao": RAO, "rao_rt": RAO_RT, "sera_wo_d_rt": WO_D_RT,
               "sera_wo_d": WO_D, "sera": SERA}
"""Method config names (``sera_core/configs/<env>/<method>_<scale>.yaml``) and their Table 1 rows."""


def t4_row(policy: str, selection: str) -> str:
    """A Table 4 row name: ``<policy>, <selection>``."""
    return f"{policy}, {selection}"


def _n(table: str, row: str, column: str, value: float, std: float | None = None, source: str = S1,
       unit: str = "%", note: str = "") -> Number:
    return Number(table, row, column, value, std, source, False, note, unit)


def _d(table: str, row: str, column: str, value: float, formula: str, unit: str = "%") -> Number:
    return Number(table, row, column, value, None, DERIVED, True, formula, unit)


PUBLISHED: tuple[Number, ...] = (
    # Table 1: averages (3-seed mean +- std; RAO + RT without std).
    _n(T1, RAO, "textcraft_avg", 68.93, 0.78), _n(T1, RAO, "textworld_avg", 51.93, 1.42),
    _n(T1, RAO_RT, "textcraft_avg", 72.47), _n(T1, RAO_RT, "textworld_avg", 45.62),
    _n(T1, WO_D_RT, "textcraft_avg", 72.26, 0.18), _n(T1, WO_D_RT, "textworld_avg", 51.10, 0.15),
    _n(T1, WO_D, "textcraft_avg", 74.84, 1.41), _n(T1, WO_D, "textworld_avg", 60.26, 1.16),
    _n(T1, SERA, "textcraft_avg", 74.31, 0.90), _n(T1, SERA, "textworld_avg", 65.07, 3.48),
    # Table 1: single-agent RL rows, from the stated gaps of RAO over them.
    _d(T1, GRPO, "textcraft_avg", 28.96, "RAO textcraft_avg - (RAO over GRPO) = 68.93 - 39.97"),
    _d(T1, GRPO, "textworld_avg", 39.29, "RAO textworld_avg - (RAO over GRPO) = 51.93 - 12.64"),
    _d(T1, CISPO, "textcraft_avg", 33.07, "RAO textcraft_avg - (RAO over CISPO) = 68.93 - 35.86"),
    _d(T1, CISPO, "textworld_avg", 38.86, "RAO textworld_avg - (RAO over CISPO) = 51.93 - 13.07"),
    # Table 1: the levels the paper states.
    _n(T1, SERA, "textcraft_easy", 99.09), _n(T1, SERA, "textcraft_medium", 97.81),
    _n(T1, SERA, "textcraft_hard", 78.92), _n(T1, SERA, "textcraft_extreme", 6.13),
    _n(T1, RAO, "textcraft_hard", 70.34),
    _n(T1, SERA, "textworld_hard", 54.29), _n(T1, SERA, "textworld_extreme", 22.86),
    _n(T1, RAO, "textworld_hard", 20.19), _n(T1, RAO, "textworld_extreme", 2.95),
    _d(T1, WO_D, "textworld_hard", 45.71, "SERA textworld_hard - (SERA over SERA w/o D) = 54.29 - 8.58"),
    _d(T1, WO_D, "textworld_extreme", 5.43, "SERA textworld_extreme - (SERA over SERA w/o D) = 22.86 - 17.43"),
    # Gains the paper's text states (percentage points).
    _n(T1, RAO_OVER_GRPO, "textcraft_avg", 39.97, source=S1_TEXT, unit="pp"),
    _n(T1, RAO_OVER_GRPO, "textworld_avg", 12.64, source=S1_TEXT, unit="pp"),
    _n(T1, RAO_OVER_CISPO, "textcraft_avg", 35.86, source=S1_TEXT, unit="pp"),
    _n(T1, RAO_OVER_CISPO, "textworld_avg", 13.07, source=S1_TEXT, unit="pp"),
    _n(T1, MULTI_OVER_SINGLE, "textcraft_avg", 3.27, source=S1_TEXT, unit="pp"),
    _n(T1, MULTI_OVER_SINGLE, "textworld_avg", 3.79, source=S1_TEXT, unit="pp"),
    _n(T1, WO_D_OVER_WO_D_RT, "textcraft_avg", 2.58, source=S1_TEXT, unit="pp"),
    _n(T1, WO_D_OVER_WO_D_RT, "textcraft_hard", 6.62, source=S1_TEXT, unit="pp"),
    _n(T1, WO_D_OVER_WO_D_RT, "textcraft_extreme", 7.60, source=S1_TEXT, unit="pp"),
    _n(T1, WO_D_OVER_WO_D_RT, "textworld_avg", 9.16, source=S1_TEXT, unit="pp"),
    _n(T1, SERA_OVER_WO_D, "textcraft_avg", -0.53, source=S1_TEXT, unit="pp"),
    _n(T1, SERA_OVER_WO_D, "textworld_avg", 4.81, source=S1_TEXT, unit="pp"),
    _n(T1, SERA_OVER_WO_D, "textworld_hard", 8.58, source=S1_TEXT, unit="pp"),
    _n(T1, SERA_OVER_WO_D, "textworld_extreme", 17.43, source=S1_TEXT, unit="pp"),
    # Table 2: external supervision accumulated over training.
    _n(T2, RAO, "textcraft_verifier_calls", 550.94, source=S2, unit="K"),
    _n(T2, SERA, "textcraft_verifier_calls", 257.96, source=S2, unit="K"),
    _n(T2, RAO, "textworld_judge_calls", 147.80, source=S2, unit="K"),
    _n(T2, SERA, "textworld_judge_calls", 35.79, source=S2, unit="K"),
    _n(T2, RAO, "textworld_judge_input_tokens", 633.80, source=S2, unit="M"),
    _n(T2, SERA, "textworld_judge_input_tokens", 125.32, source=S2, unit="M"),
    _n(T2, WO_D_RT, "textcraft_verifier_calls", 0.0, source=S2, unit="K",
       note="without rubric training there are no external calls"),
    _n(T2, WO_D_RT, "textworld_judge_calls", 0.0, source=S2, unit="K",
       note="without rubric training there are no external calls"),
    _d(T2, WO_D_RT, "textworld_judge_input_tokens", 0.0, "no judge calls, so no judge input tokens", unit="M"),
    # Table 3 (TextCraft): rubric design ablations.
    _n(T3, T3_UNTRAINED, "avg", 72.26, source=S3),
    _n(T3, T3_EXTERNAL, "avg", 73.10, source=S3),
    _n(T3, T3_EXTERNAL, "hard", 77.45, source=S3),
    _n(T3, T3_EXTERNAL, "extreme", 4.17, source=S3),
    _n(T3, T3_TRAINED, "avg", 74.84, source=S3),
    _n(T3, T3_TRAINED, "hard", 79.90, source=S3),
    _n(T3, T3_TRAINED, "extreme", 11.52, source=S3),
    _n(T3, T3_GLOBAL, "avg", 67.77, source=S3),
    _n(T3, T3_DISC, "avg", 65.77, source=S3),
    _d(T3, T3_EXTERNAL_OVER_UNTRAINED, "avg", 0.84, "73.10 - 72.26", unit="pp"),
    _d(T3, T3_TRAINED_OVER_EXTERNAL, "avg", 1.74, "74.84 - 73.10", unit="pp"),
    _d(T3, T3_GLOBAL_OVER_UNTRAINED, "avg", -4.49, "67.77 - 72.26", unit="pp"),
    _d(T3, T3_DISC_OVER_TRAINED, "avg", -9.07, "65.77 - 74.84", unit="pp"),
    # Table 4 (TextWorld): test-time rubric-guided selection.
    _n(T4, t4_row(SERA, N1), "avg", 65.07, source=S4),
    _n(T4, t4_row(SERA, N1), "extreme", 22.86, source=S4),
    _n(T4, t4_row(SERA, N2_POLICY), "avg", 67.50, source=S4),
    _n(T4, t4_row(SERA, N2_POLICY), "extreme", 28.95, source=S4),
    _n(T4, t4_row(SERA, N2_EXTERNAL), "avg", 67.29, source=S4, note="external judge: Kimi-K3"),
    _d(T4, t4_row(SERA, N2_POLICY), "avg_gain", 2.43, "67.50 - 65.07", unit="pp"),
    _d(T4, t4_row(SERA, N2_POLICY), "extreme_gain", 6.09, "28.95 - 22.86", unit="pp"),
    _d(T4, t4_row(SERA, N2_EXTERNAL), "avg_gain", 2.22, "67.29 - 65.07", unit="pp"),
    _n(T4, t4_row(BASE, N2_POLICY), "avg_gain", -0.22, source=S4, unit="pp"),
    _n(T4, t4_row(BASE, N2_EXTERNAL), "avg_gain", 1.21, source=S4, unit="pp", note="external judge: Kimi-K3"),
    *(_n(T4, t4_row(BASE, sel), level, 0.0, source=S4, note="Hard/Extreme stay 0")
      for sel in (N1, N2_POLICY, N2_EXTERNAL) for level in ("hard", "extreme")),
    # Table 7: training wall clock to the evaluated checkpoint, 2 x 8 H200.
    _n(T7, SERA, "textcraft", 24 + 6 / 60, source=S7, unit="h", note="24h06m"),
    _n(T7, RAO, "textcraft", 29 + 36 / 60, source=S7, unit="h", note="29h36m"),
    _n(T7, WO_D_RT, "textcraft", 47 + 2 / 60, source=S7, unit="h", note="47h02m"),
    _n(T7, RAO, "textworld", 13 + 8 / 60, source=S7, unit="h", note="13h08m"),
    _n(T7, SERA, "textworld", 24 + 14 / 60, source=S7, unit="h", note="24h14m"),
)
"""Every number of SPEC 7, plus the derived ones (``derived=True``)."""


def _diff(target: Key, a: Key, b: Key) -> Relation:
    """``target = a - b``."""
    return Relation(target, ((1.0, a), (-1.0, b)), f"{'/'.join(target)} = {'/'.join(a)} - {'/'.join(b)}")


def _same(target: Key, other: Key, why: str) -> Relation:
    """``target = other`` (one cell printed in two tables)."""
    return Relation(target, ((1.0, other),), f"{'/'.join(target)} = {'/'.join(other)} ({why})")


_TEXTCRAFT_COUNTS = BENCHMARKS["textcraft"].eval_counts
_POOL = sum(_TEXTCRAFT_COUNTS.values())

RELATIONS: tuple[Relation, ...] = (
    Relation((T1, SERA, "textcraft_avg"),
             tuple((n / _POOL, (T1, SERA, f"textcraft_{d}")) for d, n in _TEXTCRAFT_COUNTS.items()),
             "SERA textcraft_avg = (99.09 x 147 + 97.81 x 213 + 78.92 x 136 + 6.13 x 136) / 632"),
    *(_diff((T1, method, f"{env}_avg"), (T1, RAO, f"{env}_avg"), (T1, gap, f"{env}_avg"))
      for method, gap in ((GRPO, RAO_OVER_GRPO), (CISPO, RAO_OVER_CISPO)) for env in ("textcraft", "textworld")),
    *(_diff((T1, WO_D_OVER_WO_D_RT, f"{env}_avg"), (T1, WO_D, f"{env}_avg"), (T1, WO_D_RT, f"{env}_avg"))
      for env in ("textcraft", "textworld")),
    *(_diff((T1, SERA_OVER_WO_D, f"{env}_avg"), (T1, SERA, f"{env}_avg"), (T1, WO_D, f"{env}_avg"))
      for env in ("textcraft", "textworld")),
    *(_diff((T1, WO_D, f"textworld_{level}"), (T1, SERA, f"textworld_{level}"), (T1, SERA_OVER_WO_D, f"textworld_{level}"))
      for level in ("hard", "extreme")),
    _same((T3, T3_UNTRAINED, "avg"), (T1, WO_D_RT, "textcraft_avg"), "the configuration of SERA w/o D & RT"),
    _same((T3, T3_TRAINED, "avg"), (T1, WO_D, "textcraft_avg"), "the configuration of SERA w/o D"),
    _diff((T3, T3_EXTERNAL_OVER_UNTRAINED, "avg"), (T3, T3_EXTERNAL, "avg"), (T3, T3_UNTRAINED, "avg")),
    _diff((T3, T3_TRAINED_OVER_EXTERNAL, "avg"), (T3, T3_TRAINED, "avg"), (T3, T3_EXTERNAL, "avg")),
    _diff((T3, T3_GLOBAL_OVER_UNTRAINED, "avg"), (T3, T3_GLOBAL, "avg"), (T3, T3_UNTRAINED, "avg")),
    _diff((T3, T3_DISC_OVER_TRAINED, "avg"), (T3, T3_DISC, "avg"), (T3, T3_TRAINED, "avg")),
    _same((T4, t4_row(SERA, N1), "avg"), (T1, SERA, "textworld_avg"), "N=1 is the Table 1 SERA run"),
    _same((T4, t4_row(SERA, N1), "extreme"), (T1, SERA, "textworld_extreme"), "N=1 is the Table 1 SERA run"),
    _diff((T4, t4_row(SERA, N2_POLICY), "avg_gain"), (T4, t4_row(SERA, N2_POLICY), "avg"), (T4, t4_row(SERA, N1), "avg")),
    _diff((T4, t4_row(SERA, N2_POLICY), "extreme_gain"), (T4, t4_row(SERA, N2_POLICY), "extreme"),
          (T4, t4_row(SERA, N1), "extreme")),
    _diff((T4, t4_row(SERA, N2_EXTERNAL), "avg_gain"), (T4, t4_row(SERA, N2_EXTERNAL), "avg"), (T4, t4_row(SERA, N1), "avg")),
    Relation((T2, WO_D_RT, "textworld_judge_input_tokens"), (), "no judge calls, so 0 judge input tokens"),
)
"""Every relation among the published numbers that arithmetic can check."""


def index(numbers: Iterable[Number] = PUBLISHED) -> dict[Key, Number]:
    """The numbers by key; raises ``ValueError`` on a key given twice."""
    out: dict[Key, Number] = {}
    for number in numbers:
        if number.key in out:
            raise ValueError(f"published number {'/'.join(number.key)} is given twice")
        out[number.key] = number
    return out


_INDEX = index()


def get(table: str, row: str, column: str) -> Number:
    """The published number at (table, row, column); ``KeyError`` naming it when absent."""
    try:
        return _INDEX[(table, row, column)]
    except KeyError:
        raise KeyError(f"no published number {table}/{row}/{column}") from None
