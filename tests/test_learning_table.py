"""The README's learning table is what the committed results JSON give (issue 60: every number has
a file), with Student's t intervals over seeds."""

from __future__ import annotations

import json
import math

import pytest

from sera_core.report.learning import BEGIN, END, FIGURES, README, learning_rows, learning_table, readout


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
