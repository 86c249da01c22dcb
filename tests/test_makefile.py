"""The Makefile's `sera` commands are ones the CLI accepts (a typo in a flag fails here,
not on a learner's first `make demo`); each target that runs the tiny path names it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from sera_core.cli import build_parser

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def _targets() -> dict[str, list[str]]:
    """Each target's recipe lines, continuation lines joined."""
    targets: dict[str, list[str]] = {}
    current = None
    for line in MAKEFILE.read_text().replace("\\\n", " ").splitlines():
        if m := re.match(r"^([a-z][a-z0-9-]*):", line):
            current = targets.setdefault(m.group(1), [])
        elif line.startswith("\t") and current is not None:
            current.append(line.strip())
    return targets


def _command(line: str) -> str:
    """A recipe line without its leading ``NAME=value`` settings and its trailing redirections
    (``OMP_NUM_THREADS=1 $(BIN)/sera ... > log 2>&1`` is the ``sera`` command it runs)."""
    line = re.sub(r"^(?:[A-Z_]+=\S*\s+)+", "", line)
    return re.sub(r"\s+(?:\d?>>?&?\s*\S+\s*)+$", "", line)


SERA_LINES = [(name, _command(line)) for name, lines in _targets().items() for line in lines
              if _command(line).startswith("$(BIN)/sera ")]


def test_recipe_lines_are_read_as_the_commands_they_run():
    assert _command("OMP_NUM_THREADS=1 $(BIN)/sera tiny measure --save runs/x > runs/x.log 2>&1") == \
        "$(BIN)/sera tiny measure --save runs/x"
    assert _command("OMP_NUM_THREADS=1 $(BIN)/sera tiny measure --save runs/x >> runs/x.log 2>&1") == \
        "$(BIN)/sera tiny measure --save runs/x"
    assert _command("$(BIN)/sera tables --out figures") == "$(BIN)/sera tables --out figures"
    assert any(t == "warmstart-epoch" and "--epoch" in line for t, line in SERA_LINES)  # a one-core measure is checked too


@pytest.mark.parametrize(("target", "line"), SERA_LINES, ids=[f"{t}:{i}" for i, (t, _) in enumerate(SERA_LINES)])
def test_every_sera_command_of_the_makefile_parses(target, line):
    argv = shlex.split(line)[1:]
    args = build_parser().parse_args(argv)
    assert callable(args.func)


def test_demo_runs_both_benchmarks_and_the_tiny_path():
    demo = " ".join(_targets()["demo"])
    for step in ("sera solve --env textcraft", "sera solve --env textworld", "sera train --config textcraft/sera_tiny.yaml",
                 "sera eval", "--policy vllm:runs/demo/tiny_sera", "sera tables --runs runs/demo/eval_tiny"):
        assert step in demo.replace("$(BIN)/", ""), step
    assert demo.count("--resume") == 2  # a second `make demo` resumes instead of refusing
