"""The published numbers, their consistency checks, and the report built from them (SPEC 7)."""

from __future__ import annotations

import csv
import dataclasses
import json
import time
from pathlib import Path

import pytest

from sera_core.eval.aggregate import summarize_runs
from sera_core.report.build import build_report
from sera_core.report.checks import ReportError, check_published
from sera_core.report.published import PUBLISHED, RELATIONS, get, index
from sera_core.report.runs import load_runs
from sera_core.report.tables import YOURS_NOTE
from sera_core.utils.errors import UserInputError

B = "Qwen3-4B-Instruct (no SERA training)"

# (table, row, column, value, std): every number of SPEC 7, copied from it by hand.
SPEC7 = [
    ("table1", "RAO", "textcraft_avg", 68.93, 0.78), ("table1", "RAO", "textworld_avg", 51.93, 1.42),
    ("table1", "RAO + RT", "textcraft_avg", 72.47, None), ("table1", "RAO + RT", "textworld_avg", 45.62, None),
    ("table1", "SERA w/o D & RT", "textcraft_avg", 72.26, 0.18),
    ("table1", "SERA w/o D & RT", "textworld_avg", 51.10, 0.15),
    ("table1", "SERA w/o D", "textcraft_avg", 74.84, 1.41), ("table1", "SERA w/o D", "textworld_avg", 60.26, 1.16),
    ("table1", "SERA", "textcraft_avg", 74.31, 0.90), ("table1", "SERA", "textworld_avg", 65.07, 3.48),
    ("table1", "RAO over GRPO", "textcraft_avg", 39.97, None), ("table1", "RAO over GRPO", "textworld_avg", 12.64, None),
    ("table1", "RAO over CISPO", "textcraft_avg", 35.86, None),
    ("table1", "RAO over CISPO", "textworld_avg", 13.07, None),
    ("table1", "multi-agent prompted over single-agent prompted", "textcraft_avg", 3.27, None),
    ("table1", "multi-agent prompted over single-agent prompted", "textworld_avg", 3.79, None),
    ("table1", "SERA", "textcraft_easy", 99.09, None), ("table1", "SERA", "textcraft_medium", 97.81, None),
    ("table1", "SERA", "textcraft_hard", 78.92, None), ("table1", "SERA", "textcraft_extreme", 6.13, None),
    ("table1", "SERA", "textworld_hard", 54.29, None), ("table1", "RAO", "textworld_hard", 20.19, None),
    ("table1", "SERA", "textworld_extreme", 22.86, None), ("table1", "RAO", "textworld_extreme", 2.95, None),
    ("table1", "RAO", "textcraft_hard", 70.34, None),
    ("table1", "SERA w/o D over SERA w/o D & RT", "textcraft_avg", 2.58, None),
    ("table1", "SERA w/o D over SERA w/o D & RT", "textcraft_hard", 6.62, None),
    ("table1", "SERA w/o D over SERA w/o D & RT", "textcraft_extreme", 7.60, None),
    ("table1", "SERA w/o D over SERA w/o D & RT", "textworld_avg", 9.16, None),
    ("table1", "SERA over SERA w/o D", "textworld_avg", 4.81, None),
    ("table1", "SERA over SERA w/o D", "textworld_hard", 8.58, None),
    ("table1", "SERA over SERA w/o D", "textworld_extreme", 17.43, None),
    ("table1", "SERA over SERA w/o D", "textcraft_avg", -0.53, None),
    ("table2", "RAO", "textcraft_verifier_calls", 550.94, None),
    ("table2", "SERA", "textcraft_verifier_calls", 257.96, None),
    ("table2", "RAO", "textworld_judge_calls", 147.80, None), ("table2", "SERA", "textworld_judge_calls", 35.79, None),
    ("table2", "RAO", "textworld_judge_input_tokens", 633.80, None),
    ("table2", "SERA", "textworld_judge_input_tokens", 125.32, None),
    ("table2", "SERA w/o D & RT", "textcraft_verifier_calls", 0.0, None),
    ("table2", "SERA w/o D & RT", "textworld_judge_calls", 0.0, None),
    ("table3", "policy writes + scores, untrained", "avg", 72.26, None),
    ("table3", "external model writes + scores", "avg", 73.10, None),
    ("table3", "policy writes + scores, trained (ranking)", "avg", 74.84, None),
    ("table3", "policy writes + scores, trained (ranking)", "hard", 79.90, None),
    ("table3", "external model writes + scores", "hard", 77.45, None),
    ("table3", "policy writes + scores, trained (ranking)", "extreme", 11.52, None),
    ("table3", "external model writes + scores", "extreme", 4.17, None),
    ("table3", "one global rubric", "avg", 67.77, None), ("table3", "ranking + discriminativeness", "avg", 65.77, None),
    ("table4", "SERA, N=1", "avg", 65.07, None), ("table4", "SERA, N=2, policy judge", "avg", 67.50, None),
    ("table4", "SERA, N=1", "extreme", 22.86, None), ("table4", "SERA, N=2, policy judge", "extreme", 28.95, None),
    ("table4", "SERA, N=2, external judge", "avg", 67.29, None),
    ("table4", f"{B}, N=2, policy judge", "avg_gain", -0.22, None),
    ("table4", f"{B}, N=2, external judge", "avg_gain", 1.21, None),
    *(("table4", f"{B}, {sel}", level, 0.0, None) for sel in ("N=1", "N=2, policy judge", "N=2, external judge")
      for level in ("hard", "extreme")),
    ("table7", "SERA", "textcraft", 24 + 6 / 60, None), ("table7", "RAO", "textcraft", 29 + 36 / 60, None),
    ("table7", "SERA w/o D & RT", "textcraft", 47 + 2 / 60, None), ("table7", "RAO", "textworld", 13 + 8 / 60, None),
    ("table7", "SERA", "textworld", 24 + 14 / 60, None),
]
# (table, row, column, value): numbers SPEC 7 implies (the GRPO / CISPO ones it names).
DERIVED = [
    ("table1", "GRPO", "textcraft_avg", 28.96), ("table1", "GRPO", "textworld_avg", 39.29),
    ("table1", "CISPO", "textcraft_avg", 33.07), ("table1", "CISPO", "textworld_avg", 38.86),
    ("table1", "SERA w/o D", "textworld_hard", 45.71), ("table1", "SERA w/o D", "textworld_extreme", 5.43),
    ("table2", "SERA w/o D & RT", "textworld_judge_input_tokens", 0.0),
    ("table3", "external model writes + scores over policy writes + scores, untrained", "avg", 0.84),
    ("table3", "policy writes + scores, trained (ranking) over external model writes + scores", "avg", 1.74),
    ("table3", "one global rubric over policy writes + scores, untrained", "avg", -4.49),
    ("table3", "ranking + discriminativeness over policy writes + scores, trained (ranking)", "avg", -9.07),
    ("table4", "SERA, N=2, policy judge", "avg_gain", 2.43), ("table4", "SERA, N=2, policy judge", "extreme_gain", 6.09),
    ("table4", "SERA, N=2, external judge", "avg_gain", 2.22),
]


def perturbed(key: tuple[str, str, str], delta: float) -> list:
    """A copy of PUBLISHED with one value moved by ``delta``."""
    return [dataclasses.replace(n, value=n.value + delta) if n.key == key else n for n in PUBLISHED]


@pytest.mark.parametrize("table,row,column,value,std", SPEC7)
def test_every_spec7_number_is_published(table, row, column, value, std):
    number = get(table, row, column)
    assert number.value == pytest.approx(value, abs=1e-9)
    assert number.std == std
    assert not number.derived and number.source.startswith("SPEC 7")


def test_derived_numbers_are_marked_with_their_formula():
    for table, row, column, value in DERIVED:
        number = get(table, row, column)
        assert number.derived and number.note and number.value == pytest.approx(value)


def test_nothing_else_is_published():
    expected = {k[:3] for k in SPEC7} | {k[:3] for k in DERIVED}
    assert set(index()) == expected
    assert len(PUBLISHED) == len(expected)
    with pytest.raises(KeyError, match="no published number table1/SERA/textworld_easy"):
        get("table1", "SERA", "textworld_easy")


def test_check_published_passes():
    assert check_published() == len(RELATIONS) >= 20


@pytest.mark.parametrize("key,named", [
    (("table1", "SERA", "textcraft_easy"), "table1/SERA/textcraft_avg"),  # the 632-task weighted average
    (("table1", "GRPO", "textworld_avg"), "table1/GRPO/textworld_avg"),
    (("table1", "RAO over CISPO", "textcraft_avg"), "table1/CISPO/textcraft_avg"),
    (("table1", "SERA w/o D", "textworld_avg"), "table1/SERA w/o D over SERA w/o D & RT/textworld_avg"),
    (("table1", "SERA over SERA w/o D", "textcraft_avg"), "table1/SERA over SERA w/o D/textcraft_avg"),
    (("table3", "ranking + discriminativeness", "avg"), "ranking + discriminativeness over"),
    (("table4", "SERA, N=2, policy judge", "extreme"), "table4/SERA, N=2, policy judge/extreme_gain"),
    (("table4", "SERA, N=1", "avg"), "table4/SERA, N=1/avg"),
])
def test_check_published_fails_on_a_perturbed_number(key, named):
    with pytest.raises(ReportError, match="published") as err:
        check_published(perturbed(key, 0.5))
    assert named in str(err.value)


def test_check_published_tolerates_one_unit_of_the_last_digit():
    key = ("table1", "SERA", "textcraft_avg")  # recomputed 74.314 -> 74.31
    check_published(perturbed(key, 0.01))
    with pytest.raises(ReportError, match="table1/SERA/textcraft_avg"):
        check_published(perturbed(key, 0.02))
    easy = ("table1", "SERA", "textcraft_easy")  # a changed input: the message shows the value it was given
    with pytest.raises(ReportError, match=r"x table1/SERA/textcraft_easy \(90\.09\)"):
        check_published(perturbed(easy, -9.0))


def test_check_published_rejects_duplicates_and_unchecked_derived_numbers():
    with pytest.raises(ReportError, match="given twice"):
        check_published([*PUBLISHED, PUBLISHED[0]])
    extra = dataclasses.replace(PUBLISHED[0], row="made up", derived=True, note="?")
    with pytest.raises(ReportError, match="table1/made up/textcraft_avg has no relation"):
        check_published([*PUBLISHED, extra])


def write_summary(folder: Path, label: str, env: str = "textcraft", method: str | None = "sera") -> Path:
    rows = [{"task_id": f"{d}-{k}", "difficulty": d, "success": k < 2, "error": None}
            for d in ("easy", "medium", "hard", "extreme") for k in range(4)]
    summary = summarize_runs({0: rows, 1: rows[:-1] + [{**rows[-1], "error": "crash"}]}, env, label=label, method=method)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "summary.json"
    path.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return path


def read(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_build_report_writes_every_table_and_plot_identically_twice(tmp_path):
    start = time.perf_counter()
    result = build_report(tmp_path / "a")
    assert time.perf_counter() - start < 30
    first = read(tmp_path / "a")
    assert result["runs"] == []
    assert sorted(Path(f).name for f in result["files"]) == sorted(first)
    for name in ("table1", "table1_gains", "table2", "table3", "table3_gains", "table4", "table7", "checks", "published"):
        assert f"{name}.csv" in first and f"{name}.md" in first
    for name in ("success_by_difficulty", "ablation_ladder", "supervision_cost", "test_time_gain"):
        assert first[f"{name}.png"].startswith(b"\x89PNG")
    build_report(tmp_path / "a")
    build_report(tmp_path / "b")
    assert read(tmp_path / "a") == first == read(tmp_path / "b")
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]


def test_tables_show_the_published_numbers(tmp_path):
    build_report(tmp_path)
    with open(tmp_path / "table1.csv", newline="") as fh:
        table1 = {row["method"]: row for row in csv.DictReader(fh)}
    assert table1["SERA"]["textcraft_easy"] == "99.09" and table1["SERA"]["textcraft_avg_std"] == "0.90"
    assert table1["RAO + RT"]["textworld_avg"] == "45.62" and table1["RAO + RT"]["textworld_avg_std"] == ""
    assert table1["GRPO"]["group"] == "single-agent"
    md = (tmp_path / "table1.md").read_text()
    assert "| 28.96† |" in md and "Your runs" not in md
    assert "| SERA w/o D & RT | 47h02m | - |" in (tmp_path / "table7.md").read_text()
    assert "+2.43†" in (tmp_path / "table4.md").read_text()
    assert "550.94" in (tmp_path / "table2.csv").read_text()


def test_your_runs_appear_as_labelled_rows(tmp_path):
    runs = tmp_path / "runs"
    write_summary(runs / "tc" / "sera_tiny", "tiny (1.04M params, CPU) - SERA tiny run")
    write_summary(runs / "tw", "tiny | TextWorld", env="textworld", method=None)
    (runs / "other").mkdir()
    (runs / "other" / "summary.json").write_text(json.dumps({"format": "sera.train/1", "steps": 3}))
    loaded = load_runs(runs)
    assert [r.path for r in loaded] == ["tc/sera_tiny/summary.json", "tw/summary.json"]
    assert loaded[0].average.n == 2 and loaded[0].by_difficulty["easy"].mean == 50.0

    result = build_report(tmp_path / "out", runs)
    assert result["runs"] == ["tc/sera_tiny/summary.json", "tw/summary.json"]
    with open(tmp_path / "out" / "table1.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    yours = [r for r in rows if r["group"] == "yours"]
    assert [r["method"] for r in yours] == ["yours: tiny (1.04M params, CPU) - SERA tiny run (method: sera, 2 seeds)",
                                            "yours: tiny | TextWorld (2 seeds)"]
    assert rows[-2:] == yours  # after every published row
    assert yours[0]["textcraft_easy"] == "50.00" and yours[0]["textworld_avg"] == ""
    assert yours[1]["textworld_avg"] == "50.00" and yours[1]["textcraft_avg"] == ""
    md = (tmp_path / "out" / "table1.md").read_text()
    published_part, yours_part = md.split("## Your runs")
    assert "yours:" not in published_part
    assert YOURS_NOTE in yours_part and "yours: tiny \\| TextWorld" in yours_part
    # the plots change with your runs, and stay reproducible
    plain = build_report(tmp_path / "plain")
    assert read(tmp_path / "plain")["success_by_difficulty.png"] != read(tmp_path / "out")["success_by_difficulty.png"]
    assert plain["runs"] == []
    build_report(tmp_path / "again", runs)
    assert read(tmp_path / "again") == read(tmp_path / "out")


@pytest.mark.parametrize("change,field", [
    (lambda s: s.pop("label"), "label"),
    (lambda s: s.update(env="alfworld"), "env"),
    (lambda s: s["average"].update(mean=0.5 * 300), "average.mean"),
    (lambda s: s["average"].update(n=0), "average.n"),
    (lambda s: s["by_difficulty"]["hard"].update(std=-1.0), "by_difficulty.hard.std"),
    (lambda s: s["by_difficulty"].update(trivial={"mean": 1.0, "std": 0.0, "n": 1}), "unknown difficulties"),
    (lambda s: s.update(method=3), "method"),
])
def test_a_malformed_summary_raises_naming_the_file(tmp_path, change, field):
    path = write_summary(tmp_path / "runs" / "bad", "tiny")
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary))
    with pytest.raises(UserInputError, match=field) as err:
        build_report(tmp_path / "out", tmp_path / "runs")
    assert str(path) in str(err.value)


def test_a_summary_that_is_not_json_or_a_missing_folder_raises(tmp_path):
    path = tmp_path / "runs" / "summary.json"
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(UserInputError, match="not a readable JSON file") as err:
        load_runs(tmp_path / "runs")
    assert str(path) in str(err.value)
    with pytest.raises(UserInputError, match="does not exist"):
        load_runs(tmp_path / "nowhere")


def test_the_ladder_reads_each_rung_its_change_and_its_cost(tmp_path):
    """RAO -> SERA w/o D & RT -> SERA w/o D -> SERA: each change is the published average
    minus the rung below's (the stated gains where the paper states them), with the shipped
    configs' schedules; your run with a rung's method follows that rung."""
    from sera_core.report.published import LADDER, get
    from sera_core.report.tables import ladder

    rows = ladder(index())
    assert [r["rung"] for r in rows] == list(LADDER)
    rao, untrained, trained, sera = rows
    assert rao["textcraft_change"] is None and untrained["textcraft_change"] == round(72.26 - 68.93, 2)
    for env in ("textcraft", "textworld"):
        assert trained[f"{env}_change"] == get("table1", "SERA w/o D over SERA w/o D & RT", f"{env}_avg").value
        assert sera[f"{env}_change"] == get("table1", "SERA over SERA w/o D", f"{env}_avg").value
    assert [r["schedule"] for r in rows] == ["execution:1", "execution:1", "execution:16,rubric_generation:2",
                                            "execution:16,delegation:2,rubric_generation:2"]
    assert untrained["textcraft_verifier_calls"] == 0.0 and trained["textcraft_verifier_calls"] is None
    assert sera["textcraft_hours"] == 24.1 and untrained["textworld_hours"] is None
    write_summary(tmp_path / "a", "tiny - SERA w/o D run", method="sera_wo_d")
    write_summary(tmp_path / "b", "tiny - no method", method=None)
    mine = ladder(index(), load_runs(tmp_path))
    assert [r["rung"] for r in mine] == [*LADDER[:3], "yours: tiny - SERA w/o D run", LADDER[3]]
    assert mine[3]["textcraft_avg"] == 50.0 and "textworld_avg" not in mine[3]
