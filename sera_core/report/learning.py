"""The README's learning table, generated from the experiments' committed results JSON.

Each row is one arm, read from the file its experiment script wrote under ``figures/``
(``scripts/rubric_curve.py``, ``scripts/execution_curve.py``, ``scripts/tiny_experiment.py``):
the held-out measure at the start and at the end, and the change, over seeds, as a mean with its
95% Student's t interval (:func:`~sera_core.eval.aggregate.t_interval`). Nothing in the table is
typed by hand: ``python -m sera_core.report.learning --write`` rewrites the README's block between
:data:`BEGIN` and :data:`END`, and a test checks that the committed README holds what the files give.

Which set each row was measured on is named with its role, read from the protocol record its
file carries (``learning``, docs/protocol.md); a file from before the protocols was measured on
the sets that chose the recipes, so its rows are dev. Where a test run's file exists
(:data:`TEST_FILES`: what docs/protocol.md's test commands write), its rows replace the dev ones:
the table is one row per arm on test once the test runs are done. The "from adapter" column names
the adapter the runs started from, as the file records it (:func:`~sera_core.tiny.measure.bind_start`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import fmean
from typing import Any

from sera_core.eval.aggregate import t_interval

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "figures"
README = ROOT / "README.md"
BEGIN = "<!-- learning table: python -m sera_core.report.learning --write -->"
END = "<!-- /learning table -->"


def _interval(values: list[float], signed: bool = False) -> str:
    """``mean [low, high]`` (95% Student's t over seeds, 3 places); the mean alone for one value."""
    t = t_interval(values)
    fmt = "{:+.3f}" if signed else "{:.3f}"
    mean = fmt.format(t["mean"])
    return mean if not t["half"] else f"{mean} [{fmt.format(t['low'])}, {fmt.format(t['high'])}]"


def interval_reading(values: list[float], null: float = 0.0) -> str:
    """In words, what a mean over seeds and its 95% Student's t interval say against ``null``
    (no change: 0; chance: 0.5): ``+0.055 [-0.029, +0.139] over 4 seeds: the interval holds
    +0.000, so these seeds show no direction``, or that it lies above or below ``null``. One seed
    has no interval, and says so."""
    t = t_interval(values)
    n = t["n"]
    if n < 2:
        return f"{t['mean']:+.3f} from 1 seed: no interval over seeds"
    head = f"{t['mean']:+.3f} [{t['low']:+.3f}, {t['high']:+.3f}] over {n} seeds"
    if t["low"] > null:
        return f"{head}: the interval lies above {null:+.3f}"
    if t["high"] < null:
        return f"{head}: the interval lies below {null:+.3f}"
    return f"{head}: the interval holds {null:+.3f}, so these seeds show no direction"


TEST_FILES = {"curve1": "rubric_curve_test.json", "curve2": "execution_curve_test.json", "ablation": "ablation_test"}
"""The files and folder under ``figures/`` that the test runs write (docs/protocol.md, ``learning``)."""


def _source(path: Path) -> str:
    """A file's link in the table: relative to the repository where it lies in it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def _role(protocol: dict | None, fallback: str) -> str:
    """``(`set`, role)`` from a file's protocol record; ``(fallback, dev)`` for a file made before it."""
    if not protocol:
        return f"({fallback}, dev: before the protocol)"
    return f"(`{protocol['set']}`, {protocol['role']})"


def start_cell(start: dict | None) -> str:
    """The table cell of the adapter a file's runs started from, as :func:`~sera_core.tiny.measure.bind_start`
    recorded it: its recipe and the head of its weights' sha256, the spec where it is no adapter
    (a checkpoint), or "not recorded" for runs made before starts were recorded."""
    if not start:
        return "not recorded"
    adapter = start.get("adapter")
    if not adapter:
        return f"`{start.get('spec')}`"
    return f"recipe `{adapter['recipe_hash']}`, weights `{adapter['adapter_sha256'][:8]}`"


def _curve1(path: Path, arm: str, label: str) -> dict[str, Any]:
    record = json.loads(path.read_text())
    runs = record["results"][arm]
    start = [r["heldout"][0]["pairwise_accuracy"] for r in runs]
    end = [r["heldout"][-1]["pairwise_accuracy"] for r in runs]
    points = int(runs[0]["heldout"][0]["points"])
    return {"curve": "1", "arm": label, "set": f"{points} held-out points {_role(record.get('protocol'), 'the curve-1 points')}",
            "seeds": len(runs), "from": start_cell(record.get("start")),
            "measure": "greedy pairwise accuracy", "start": _interval(start), "end": _interval(end),
            "change": _interval([b - a for a, b in zip(start, end, strict=True)], signed=True),
            "source": _source(path)}


def _curve2(path: Path, label: str) -> dict[str, Any]:
    record = json.loads(path.read_text())
    changes = [r["change"] for r in record["runs"]]
    return {"curve": "2", "arm": label,
            "set": f"{record['tasks']} easy val tasks {_role(record.get('protocol'), 'the first 50')}",
            "seeds": len(changes), "from": start_cell(record.get("start")),
            "measure": "root success, T=0", "start": _interval([c["before"]["rate"] for c in changes]),
            "end": _interval([c["after"]["rate"] for c in changes]),
            "change": _interval([c["difference"]["rate"] for c in changes], signed=True),
            "source": _source(path)}


def _ablation(folder: Path) -> list[dict[str, Any]]:
    records = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    before = [r for name, r in records.items() if name.startswith("before_seed")]
    rows = []
    for arm, label in (("sera", "SERA"), ("sera_wo_rt", "SERA w/o RT"), ("rao", "RAO (the reference)")):
        runs = [r for name, r in records.items() if name.rsplit("_seed", 1)[0] == arm]
        if not runs:
            continue
        start = (f"{fmean(r['points']['pairwise_accuracy'] for r in before):.3f} / "
                 f"{fmean(r['root_success'] for r in before):.0%}") if before else "-"
        protocol = runs[0]["settings"].get("protocol")  # [hash, "points set+eval set", "role+role"] under one
        measured = (f"{runs[0]['points']['points']} points / {runs[0]['eval_tasks']} tasks (`{protocol[1]}`, {protocol[2]})"
                    if protocol else "34 points / 50 easy val tasks (dev: before the protocol)")
        rows.append({"curve": "ablation", "arm": label, "set": measured, "seeds": len(runs),
                     "from": start_cell(runs[0].get("start")),
                     "measure": "pairwise accuracy / root success", "start": start,
                     "end": f"{_interval([r['points']['pairwise_accuracy'] for r in runs])} / "
                            f"{_interval([r['root_success'] for r in runs])}",
                     "change": "-", "source": _source(folder) + "/"})
    return rows


def learning_rows(figures: Path = FIGURES) -> list[dict[str, Any]]:
    """One row per arm, from the committed results in ``figures``: a test run's file where it
    exists (:data:`TEST_FILES`), else the dev-era file of that curve (module docstring)."""
    curve1 = figures / TEST_FILES["curve1"]
    curve2 = figures / TEST_FILES["curve2"]
    ablation = figures / TEST_FILES["ablation"]
    return [_curve1(curve1 if curve1.exists() else figures / "rubric_curve.json", "rubric_scorer",
                    "SERA's own ranking credit (writer + scorer)"),
            _curve1(curve1 if curve1.exists() else figures / "rubric_curve_label.json", "rubric_scorer_label",
                    "the label extension (the scorer's gate toward the judge's label)"),
            _curve2(curve2 if curve2.exists() else figures / "execution_curve_select.json",
                    "SERA's execution stage, best held-in checkpoint kept"),
            *_ablation(ablation if any(ablation.glob("sera*_seed*.json")) else figures / "tiny_experiment")]


def learning_table(rows: list[dict[str, Any]]) -> str:
    """The rows as the README's markdown table."""
    lines = ["| curve | arm | measured on (set, role) | seeds | from adapter | measure | start | end | change |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['curve']} | {r['arm']} ([data]({r['source']})) | {r['set']} | {r['seeds']} | {r['from']} | "
              f"{r['measure']} | {r['start']} | {r['end']} | {r['change']} |" for r in rows]
    return "\n".join(lines)


def readout(readme: str, table: str) -> str:
    """``readme`` with the block between :data:`BEGIN` and :data:`END` replaced by ``table``."""
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    head, rest = readme.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{rest.split(END, 1)[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the README's block (default: print the table)")
    args = parser.parse_args()
    table = learning_table(learning_rows())
    if args.write:
        README.write_text(readout(README.read_text(), table))
    print(table)


if __name__ == "__main__":
    main()
