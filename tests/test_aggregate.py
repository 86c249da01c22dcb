"""Success rates, benchmark averages and the spread over seeds (SPEC 5, 7)."""

from __future__ import annotations

import json
import math

import pytest

from sera_core.envs.registry import BENCHMARKS
from sera_core.eval.aggregate import (
    DIFFICULTIES,
    SUMMARY_FORMAT,
    benchmark_average,
    macro_average,
    over_seeds,
    paired_change,
    success_rates,
    summarize_runs,
    task_moves,
    weighted_average,
)

TEXTCRAFT_COUNTS = BENCHMARKS["textcraft"].eval_counts
TEXTWORLD_COUNTS = BENCHMARKS["textworld"].eval_counts


def rows(spec: dict[str, tuple[int, int]], family_of=None, errors: int = 0) -> list[dict]:
    """``spec``: difficulty -> (tasks, successes); the first ``errors`` successes of each
    difficulty also carry an error (so they must count as failures)."""
    out = []
    for d, (n, wins) in spec.items():
        for k in range(n):
            row = {"task_id": f"{d}-{k}", "difficulty": d, "success": k < wins,
                   "error": "timeout" if k < errors else None}
            if family_of is not None:
                row["family"] = family_of(k)
            out.append(row)
    return out


def test_counts_match_spec():
    assert sum(TEXTCRAFT_COUNTS.values()) == 632
    assert TEXTCRAFT_COUNTS == {"easy": 147, "medium": 213, "hard": 136, "extreme": 136}
    assert sum(TEXTWORLD_COUNTS.values()) == 1400 and set(TEXTWORLD_COUNTS.values()) == {350}
    assert tuple(TEXTCRAFT_COUNTS) == DIFFICULTIES


def test_weighted_average_reproduces_the_papers_textcraft_sera_average():
    rates = {"easy": 99.09, "medium": 97.81, "hard": 78.92, "extreme": 6.13}
    assert weighted_average(rates, TEXTCRAFT_COUNTS) == pytest.approx(74.3142, abs=1e-4)
    assert round(benchmark_average("textcraft", rates), 2) == 74.31
    # the macro average differs: the levels are not equally large on TextCraft
    assert macro_average(rates) == pytest.approx(70.4875)


def test_weighted_equals_macro_with_equal_counts():
    rates = {"easy": 90.0, "medium": 70.0, "hard": 54.29, "extreme": 22.86}
    assert weighted_average(rates, TEXTWORLD_COUNTS) == pytest.approx(macro_average(rates))
    assert benchmark_average("textworld", rates) == pytest.approx(59.2875)


def test_weighted_vs_macro_on_synthetic_results():
    # 10 easy tasks all solved, 30 extreme tasks one third solved
    results = rows({"easy": (10, 10), "extreme": (30, 10)})
    rates = success_rates(results)
    assert rates == {"easy": 100.0, "extreme": pytest.approx(100 / 3)}
    assert weighted_average(rates, {"easy": 10, "extreme": 30}) == pytest.approx(50.0)  # 20 / 40 tasks
    assert macro_average(rates) == pytest.approx(200 / 3)
    # the benchmark average uses the pool's counts (147 easy, 136 extreme), not the run's
    assert benchmark_average("textcraft", rates) == pytest.approx((100 * 147 + 100 / 3 * 136) / 283)


def test_benchmark_average_rejects_unknown_benchmark_and_difficulty():
    with pytest.raises(ValueError, match="benchmark must be one of"):
        benchmark_average("alfworld", {"easy": 1.0})
    with pytest.raises(ValueError, match="unknown difficulties"):
        benchmark_average("textcraft", {"trivial": 1.0})
    with pytest.raises(ValueError, match="no rates"):
        macro_average({})


def test_errors_count_as_failures():
    results = rows({"hard": (4, 4)}, errors=2)  # 4 successes claimed, 2 of them errored
    assert success_rates(results) == {"hard": 50.0}


def test_success_rates_rejects_duplicates_and_missing_key():
    results = rows({"easy": (2, 1)})
    with pytest.raises(ValueError, match="appears twice"):
        success_rates(results + results[:1])
    with pytest.raises(ValueError, match="no 'family'"):
        success_rates(results, key="family")


def test_over_seeds_is_the_population_std():
    stats = over_seeds([70.0, 72.0, 74.0])
    assert stats["mean"] == pytest.approx(72.0)
    assert stats["std"] == pytest.approx(math.sqrt(8 / 3))  # ddof 0, not sqrt(8 / 2)
    assert stats["n"] == 3
    assert over_seeds([5.0]) == {"mean": 5.0, "std": 0.0, "n": 1}
    with pytest.raises(ValueError):
        over_seeds([])


def test_summarize_runs_two_seeds_with_families():
    def family(k: int) -> str:
        return ("conflict", "critical_path")[k % 2]

    seed0 = rows({"easy": (4, 4), "medium": (4, 2), "hard": (4, 1), "extreme": (4, 0)}, family)
    seed1 = rows({"easy": (4, 3), "medium": (4, 2), "hard": (4, 2), "extreme": (4, 1)}, family, errors=1)
    summary = summarize_runs({1: seed1, 0: seed0}, "textworld", label="tiny (CPU) test", method="sera")
    assert summary["format"] == SUMMARY_FORMAT and summary["env"] == "textworld"
    assert summary["label"] == "tiny (CPU) test" and summary["method"] == "sera"
    assert summary["seeds"] == [0, 1]
    # seed 1: each level's first task errored (its success does not count)
    assert summary["per_seed"]["0"]["by_difficulty"] == {"easy": 100.0, "medium": 50.0, "hard": 25.0, "extreme": 0.0}
    assert summary["per_seed"]["1"]["by_difficulty"] == {"easy": 50.0, "medium": 25.0, "hard": 25.0, "extreme": 0.0}
    assert summary["per_seed"]["0"]["average"] == pytest.approx(43.75)
    assert summary["per_seed"]["1"]["average"] == pytest.approx(25.0)
    assert summary["average"]["mean"] == pytest.approx(34.375)
    assert summary["average"]["std"] == pytest.approx(9.375)
    assert summary["average"]["n"] == 2
    assert summary["by_difficulty"]["easy"] == {"mean": 75.0, "std": 25.0, "n": 2}
    # families: conflict holds tasks 0 and 2 of each level, critical_path tasks 1 and 3
    assert summary["per_seed"]["0"]["by_family"] == {"conflict": 50.0, "critical_path": pytest.approx(37.5)}
    assert summary["per_seed"]["1"]["by_family"] == {"conflict": 12.5, "critical_path": pytest.approx(37.5)}
    assert summary["by_family"]["conflict"]["mean"] == pytest.approx(31.25)
    assert summary["by_family"]["critical_path"]["std"] == pytest.approx(0.0)
    assert summary["tasks"] == {"easy": 4, "medium": 4, "hard": 4, "extreme": 4}
    assert summary["errors"] == 4 and summary["per_seed"]["1"]["errors"] == 4
    assert summary["std_ddof"] == 0
    json.dumps(summary)  # JSON-ready


def test_summarize_runs_textcraft_without_families_uses_pool_weights():
    seed = rows({"easy": (2, 2), "hard": (2, 0)})
    summary = summarize_runs({0: seed}, "textcraft")
    assert summary["by_family"] == {}
    assert summary["average"]["mean"] == pytest.approx(100 * 147 / (147 + 136))
    assert summary["label"] is None


def test_summarize_runs_requires_the_same_tasks_in_every_seed():
    with pytest.raises(ValueError, match="same tasks"):
        summarize_runs({0: rows({"easy": (2, 1)}), 1: rows({"easy": (3, 1)})}, "textcraft")
    with pytest.raises(ValueError, match="benchmark must be one of"):
        summarize_runs({0: rows({"easy": (2, 1)})}, "webshop")


def test_paired_change_counts_the_same_tasks_and_its_interval_by_hand():
    """Six tasks: before solves 1, 2, 3; after solves 2, 3, 4, 5 (one lost, two gained), one
    after-row errored (a failure whatever it says)."""
    before = [{"task_id": f"t{i}", "success": i in (1, 2, 3), "error": None} for i in range(6)]
    after = [{"task_id": f"t{i}", "success": i in (2, 3, 4, 5, 0), "error": "boom" if i == 0 else None} for i in range(6)]
    out = paired_change(before, reversed(after))  # order does not matter: tasks are paired by id
    assert (out["tasks"], out["gained"], out["lost"]) == (6, 2, 1)
    assert (out["gained_tasks"], out["lost_tasks"]) == (["t4", "t5"], ["t1"])
    assert out["before"]["rate"] == 0.5 and out["after"]["rate"] == pytest.approx(4 / 6)
    assert out["before"]["ci"] == pytest.approx(1.96 * math.sqrt(0.25 / 6))
    diffs = [0, -1, 0, 0, 1, 1]
    mean = sum(diffs) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in diffs) / 5)
    assert out["difference"]["rate"] == pytest.approx(1 / 6) and out["difference"]["ci"] == pytest.approx(1.96 * sd / math.sqrt(6))
    with pytest.raises(ValueError, match="same tasks"):
        paired_change(before, after[:5])


def test_task_moves_reads_each_runs_flips_across_runs_most_often_moved_first():
    before = [{"task_id": f"t{i}", "success": i < 2, "error": None} for i in range(4)]  # t0, t1 solved

    def after(solved):
        return [{"task_id": f"t{i}", "success": i in solved, "error": None} for i in range(4)]

    changes = {0: paired_change(before, after({0, 2, 3})), 1: paired_change(before, after({0, 1, 3}))}
    assert task_moves(changes) == {"t3": {0: "gained", 1: "gained"}, "t1": {0: "lost"}, "t2": {0: "gained"}}
    assert list(task_moves(changes)) == ["t3", "t1", "t2"]  # twice, then once by task id


def test_student_t_quantiles_and_intervals_match_hand_computed_values():
    """Quantiles against the table (t_{0.975, df}); the intervals of two numbers the README
    gave with a normal 1.96 (issue 60): curve 1's three seeds and the guarded recipe's four."""
    from sera_core.eval.aggregate import t_interval, t_quantile

    for df, table in ((1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423)):
        assert t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.975, 100000) == pytest.approx(1.95997, abs=1e-4)
    curve1 = t_interval([0.720, 0.692, 0.765])
    assert curve1["mean"] == pytest.approx(0.72567, abs=1e-5) and curve1["half"] == pytest.approx(0.0915, abs=5e-4)
    guarded = t_interval([-0.020, 0.100, 0.080, 0.060])
    assert (guarded["low"], guarded["high"]) == (pytest.approx(-0.0287, abs=5e-4), pytest.approx(0.1387, abs=5e-4))
    assert t_interval([0.5])["half"] is None
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


def test_mcnemar_exact_and_the_bootstrap_interval():
    from sera_core.eval.aggregate import bootstrap_interval, mcnemar_exact

    assert mcnemar_exact(5, 0) == pytest.approx(0.0625)  # a per-seed "+0.100" of 5 gained and 0 lost
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(3, 3) == 1.0
    assert mcnemar_exact(7, 1) == pytest.approx(2 * (1 + 8) / 256)
    values = [1.0] * 30 + [0.0] * 20
    a, b = bootstrap_interval(values, reps=4000), bootstrap_interval(values, reps=4000)
    assert a == b and a["mean"] == 0.6  # seeded: the same interval every time
    assert a["low"] < 0.6 < a["high"] and a["high"] - a["low"] == pytest.approx(2 * 1.96 * (0.6 * 0.4 / 50) ** 0.5, rel=0.15)
