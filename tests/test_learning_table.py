"""The README's learning table is what the committed results JSON give (issue 60: every number has
a file), with Student's t intervals over seeds."""

from __future__ import annotations

import json
import math

import pytest

from sera_core.report.learning import (BEGIN, END, FIGURES, README, interval_reading, learning_rows, learning_table,
                                      readout)


def test_the_readme_table_is_regenerated_from_the_committed_json():
    readme = README.read_text()
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == learning_table(learning_rows()), "python -m sera_core.report.learning --write"
    assert readout(readme, learning_table(learning_rows())) == readme


def test_a_row_is_the_mean_and_t_interval_of_its_seeds_in_the_file():
    """Curve 1's label row by hand: the end-of-run pairwise accuracy of each seed in
    figures/rubric_curve_label.json, mean ± t_{0.975, n-1} s / sqrt(n) (4.303 at 3 seeds)."""
    runs = json.loads((FIGURES / "rubric_curve_label.json").read_text())["results"]["rubric_scorer_label"]
    end = [r["heldout"][-1]["pairwise_accuracy"] for r in runs]
    n, mean = len(end), sum(end) / len(end)
    half = 4.302653 * math.sqrt(sum((x - mean) ** 2 for x in end) / (n - 1)) / math.sqrt(n)
    row = next(r for r in learning_rows() if "label extension" in r["arm"])
    assert n == 3 and row["seeds"] == 3
    assert row["end"] == f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"
    assert all(r["source"] for r in learning_rows())


def test_a_readme_without_the_block_is_an_error():
    with pytest.raises(ValueError, match="no <!-- learning table"):
        readout("# a README\n", "| table |")


def test_the_curves_are_drawn_from_the_committed_json():
    """Notebook 09 draws the curves from the committed files (``sera_core.report.curves``): curve 2
    marks each seed's paired change and the mean over seeds with its Student's t interval, curve 1
    one thick mean line per arm and readout beside each seed's thin one."""
    from sera_core.eval.points import mean_interval
    from sera_core.report.curves import curve1_figure, curve2_figure

    execution = json.loads((FIGURES / "execution_curve_select.json").read_text())
    right = curve2_figure(execution).axes[1]
    bars = [c for c in right.containers]  # errorbar containers: one per seed, then the mean
    assert len(bars) == len(execution["runs"]) + 1
    mean, half = mean_interval([r["change"]["difference"]["rate"] for r in execution["runs"]])
    low, high = bars[-1].lines[2][0].get_segments()[0][:, 1]
    assert (low, high) == pytest.approx((mean - half, mean + half))
    curve = json.loads((FIGURES / "rubric_curve_label.json").read_text())["results"]
    lines = curve1_figure(curve).axes[0].get_lines()
    seeds = len(curve["rubric_scorer_label"])
    assert len([ln for ln in lines if ln.get_linewidth() == 2.5]) == 2  # score and belief means
    assert len([ln for ln in lines if ln.get_alpha() == 0.3]) == 2 * seeds  # each seed thin and pale


def test_an_interval_is_read_against_its_null_in_words():
    """Curve 2's four seeds (+0.10, +0.06, 0, -0.20): mean -0.01, t_{0.975, 3} = 3.182, s = 0.1333,
    half = 0.212 by hand; it holds 0. Three seeds well above chance lie above 0.5; one seed has
    no interval."""
    assert interval_reading([0.10, 0.06, 0.0, -0.20]) == (
        "-0.010 [-0.222, +0.202] over 4 seeds: the interval holds +0.000, so these seeds show no direction")
    assert interval_reading([0.72, 0.69, 0.765], null=0.5).endswith("the interval lies above +0.500")
    assert interval_reading([-0.3, -0.31, -0.29]).endswith("lies below +0.000")
    assert interval_reading([0.1]) == "+0.100 from 1 seed: no interval over seeds"


def test_a_test_runs_file_replaces_the_dev_rows_and_says_its_set_role_and_start(tmp_path):
    """Where the test runs have written their files (``TEST_FILES``, what docs/protocol.md's test
    commands write), the table reads those instead of the dev-era ones, and each row names the
    set and role from the file's protocol record and the adapter its runs started from."""
    import shutil

    from sera_core.report.learning import TEST_FILES, start_cell

    figures = tmp_path / "figures"
    shutil.copytree(FIGURES / "tiny_experiment", figures / "tiny_experiment")
    for name in ("rubric_curve.json", "rubric_curve_label.json", "execution_curve_select.json"):
        shutil.copy(FIGURES / name, figures / name)
    dev = learning_rows(figures)
    assert [r["source"] for r in dev] == [(figures / n).as_posix() for n in ("rubric_curve.json", "rubric_curve_label.json",
                                                                            "execution_curve_select.json")] + \
        [(figures / "tiny_experiment").as_posix() + "/"] * 3
    assert all("dev: before the protocol" in r["set"] and r["from"] == "not recorded" for r in dev)

    adapter = {"recipe_hash": "aee274e1fd1673ee", "adapter_sha256": "c0ffee" + "0" * 58, "base": {}}
    start = {"spec": "vllm:tiny", "adapter": adapter}
    curve1 = {"protocol": {"name": "learning", "set": "points_test", "role": "test"}, "start": start, "results": {
        arm: [{"seed": s, "heldout": [{"points": 30, "pairwise_accuracy": 0.5}, {"points": 30, "pairwise_accuracy": end}]}
              for s, end in enumerate(ends)]
        for arm, ends in (("rubric_scorer", (0.6, 0.7, 0.65)), ("rubric_scorer_label", (0.7, 0.8, 0.75)))}}
    (figures / TEST_FILES["curve1"]).write_text(json.dumps(curve1))
    change = {"before": {"rate": 0.5}, "after": {"rate": 0.6}, "difference": {"rate": 0.1}}
    (figures / TEST_FILES["curve2"]).write_text(json.dumps({
        "tasks": 47, "protocol": {"name": "learning", "set": "textcraft_easy_test", "role": "test"}, "start": start,
        "runs": [{"seed": s, "change": change} for s in range(5)]}))
    (figures / TEST_FILES["ablation"]).mkdir()
    settings = {"protocol": ["h", "points_test+textcraft_easy_test", "test+test"], "start": adapter["adapter_sha256"]}
    (figures / TEST_FILES["ablation"] / "before_seed0.json").write_text(json.dumps(
        {"settings": settings, "seed": 0, "start": start, "points": {"points": 30, "pairwise_accuracy": 0.5},
         "root_success": 0.4, "eval_tasks": 47}))
    assert learning_rows(figures)[3:] == dev[3:]  # a test run with only its warm start measured: the dev rows stay
    for arm in ("sera", "sera_wo_rt"):
        (figures / TEST_FILES["ablation"] / f"{arm}_seed0.json").write_text(json.dumps(
            {"settings": settings, "seed": 0, "start": start, "points": {"points": 30, "pairwise_accuracy": 0.55},
             "root_success": 0.4, "eval_tasks": 47}))
    rows = learning_rows(figures)
    assert [r["arm"] for r in rows[2:]] == ["SERA's execution stage, best held-in checkpoint kept", "SERA",
                                            "SERA w/o RT"]  # RAO: no test run
    assert rows[0]["set"] == "30 held-out points (`points_test`, test)" and rows[0]["end"].startswith("0.650 [")
    assert rows[1]["end"].startswith("0.750 [") and rows[1]["source"] == (figures / TEST_FILES["curve1"]).as_posix()
    assert rows[2]["set"] == "47 easy val tasks (`textcraft_easy_test`, test)" and rows[2]["change"] == "+0.100"
    assert rows[3]["set"] == "30 points / 47 tasks (`points_test+textcraft_easy_test`, test+test)" and rows[3]["seeds"] == 1
    assert {r["from"] for r in rows} == {start_cell(start)} == {"recipe `aee274e1fd1673ee`, weights `c0ffee00`"}
    assert start_cell({"spec": "runs/x/checkpoint", "adapter": None}) == "`runs/x/checkpoint`"
    assert "| from adapter |" in learning_table(rows)
