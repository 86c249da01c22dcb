"""The notebooks are stored clean and read as a course: numbered, a parameters cell with a
smoke switch, a loadable config and a scale, assertions, no bulky outputs, normalised metadata (CI fails when one is not)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CHECK = "# NBVAL_CHECK_OUTPUT"


def _render_course():
    """``scripts/render_course.py`` as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_course", NOTEBOOKS[0].parents[1] / "scripts" / "render_course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_notice_under_the_title_says_what_course_times_records(path):
    """The second cell says which setting produced the stored outputs, their time, machine,
    date and commit: exactly the notebook's ``course_times.json`` entry."""
    render = _render_course()
    entry = json.loads(render.TIMES.read_text())["notebooks"][path.stem]
    cell = json.loads(path.read_text())["cells"][1]
    assert cell["metadata"].get("tags") == [render.NOTICE_TAG], "python scripts/render_course.py --notices"
    assert "".join(cell["source"]) == render.notice(entry)
    assert entry["setting"] in render.SETTINGS and entry["seconds"] > 0


def test_the_course_is_numbered_in_order():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(NOTEBOOKS))) and len(NOTEBOOKS) >= 12
    assert all(re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", p.name) for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean(path):
    nb = json.loads(path.read_text())
    assert set(nb["metadata"]) <= {"kernelspec", "language_info"}, "normalise the notebook metadata"
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith(f"# {path.name[:2]} · ")
    assert "Needs:" in "".join(cells[0]["source"]), "the opening says what the notebook needs"
    code = [c for c in cells if c["cell_type"] == "code"]
    params = [c for c in code if c["metadata"].get("tags") == ["parameters"]]
    assert len(params) == 1 and re.search(r"^SMOKE = False$", "".join(params[0]["source"]), re.M)
    setup = "".join(code[code.index(params[0]) + 1]["source"])  # the set-up cell: one call, the rest where it is used
    assert "course.setup(" in setup and len(setup.strip().splitlines()) <= 6, "the set-up cell is course.setup, <= 6 lines"
    imported = re.findall(r"^from (sera_core[\w.]*) import (.+)$", "\n".join("".join(c["source"]) for c in code), re.M)
    for module, names in imported:  # the public pieces: no private name, nothing from the trainer but Trainer and plan
        names = {n.split(" as ")[0].strip() for n in names.split(",")}
        assert not any(n.startswith("_") for n in names), f"{module}: a private name"
        assert module != "sera_core.train.trainer" or names <= {"Trainer", "plan"}, f"trainer internals: {names}"
    assert any(re.search(r"^\s*assert ", "".join(c["source"]), re.M) for c in code), "a notebook asserts what it shows"
    counts = [cell["execution_count"] for cell in code]
    # stored with outputs by `make course` (scripts/render_course.py), or clean but for the checked cells' outputs
    rendered = any(c["execution_count"] is not None for c in code if not "".join(c["source"]).startswith(CHECK))
    assert not rendered or counts == list(range(1, len(code) + 1)), "render with make course, or clear every output"
    for cell in code:
        assert set(cell["metadata"]) <= {"tags"}
        outputs, checked = cell["outputs"], "".join(cell["source"]).startswith(CHECK)
        assert rendered or checked or outputs == [], "clear the outputs, or render the whole notebook with make course"
        assert not any(o["output_type"] == "stream" and o["name"] == "stderr" for o in outputs), "no stderr kept"
        assert not any(k.startswith("application/vnd.jupyter.widget") for o in outputs for k in o.get("data", {}))
        assert not any(re.search(r"\d%(\||\s+Completed \|)", json.dumps(o.get("data", {}))) for o in outputs), \
            "a progress bar frozen at its first frame (render with make course)"
        assert not any("VBox(children=" in json.dumps(o.get("data", {})) for o in outputs), "a widget with no static form"
        if checked:  # a checked cell keeps a small text output (nbval compares it)
            assert outputs and all(o["output_type"] == "stream" for o in outputs)
            assert len(json.dumps(outputs)) < 2000
    assert path.stat().st_size < 400_000


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_name_a_loadable_config_and_a_scale(path):
    """Each parameters cell sets the smoke switch, the run config (``CONFIG``, or ``CONFIGS``
    one per benchmark) that loads as it stands, and at least one more setting (the scale).
    Notebook 10 reads only published numbers and summaries and says so instead."""
    from sera_core.train.config import load_config

    (cell,) = [c for c in json.loads(path.read_text())["cells"] if "parameters" in c["metadata"].get("tags", [])]
    source, values = "".join(cell["source"]), {}
    exec(source, {}, values)  # assignments only
    if path.name.startswith("10_"):
        assert "No run config" in source
        return
    configs = [values["CONFIG"]] if "CONFIG" in values else values["CONFIGS"]
    assert configs and all(load_config(c) for c in configs)
    assert set(values) - {"SMOKE", "CONFIG", "CONFIGS"}, "a scale setting besides the smoke switch and the config"


def _notebook(path: Path, cells: list[tuple[str, str | None]]) -> Path:
    """A minimal notebook: code cells ``(source, stored output or None)``."""
    code = [{"cell_type": "code", "execution_count": None if out is None else 1, "id": f"c{i}", "metadata": {}, "source": src,
             "outputs": [] if out is None else [{"name": "stdout", "output_type": "stream", "text": out}]}
            for i, (src, out) in enumerate(cells)]
    path.write_text(json.dumps({"cells": code, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                           "language": "python"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


def _nbval(path: Path) -> int:
    import subprocess
    import sys

    sanitize = NOTEBOOKS[0].parent / "nbval_sanitize.cfg"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "--nbval-sanitize-with", str(sanitize), str(path)], cwd=path.parent, capture_output=True).returncode


def test_nbval_fails_on_a_broken_assertion_or_a_changed_checked_output(tmp_path):
    good = _notebook(tmp_path / "good.ipynb", [("x = 2", None), (f"{CHECK}\nprint(x, 'took 1.5 s')", "2 took 9 s\n")])
    assert _nbval(good) == 0  # the duration is sanitised away
    assert _nbval(_notebook(tmp_path / "assert.ipynb", [("assert 1 + 1 == 3", None)])) != 0
    assert _nbval(_notebook(tmp_path / "output.ipynb", [(f"{CHECK}\nprint(3)", "2\n")])) != 0


def test_full_scale_notebook_dry_run_under_papermill(tmp_path):
    import papermill

    path = next(p for p in NOTEBOOKS if p.name.startswith("11_"))
    out = papermill.execute_notebook(str(path), str(tmp_path / "out.ipynb"), cwd=str(path.parent), progress_bar=False,
                                     parameters={"DRY_RUN": True, "OUT": str(tmp_path / "run")}, kernel_name="python3")
    text = json.dumps(out["cells"])
    assert "accelerate launch" in text and "2x8xh200.yaml" in text and "dry run: nothing launched" in text
    assert (tmp_path / "run" / "tables" / "table1.md").is_file()


def test_render_course_keeps_what_a_reader_needs_and_drops_the_rest():
    """``scripts/render_course.py``'s ``clean``: papermill's injected cell, volatile metadata,
    stderr, widget outputs and frozen progress bars go; tables, plots and stdout stay (long text
    cut); counts renumbered."""
    render = _render_course()
    png = {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}
    nb = {"metadata": {"kernelspec": {"name": "python3"}, "papermill": {"duration": 3.2}}, "nbformat": 4, "cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "# title"},
        {"cell_type": "code", "execution_count": 1, "metadata": {"tags": ["parameters"]}, "outputs": [], "source": "SMOKE = False"},
        {"cell_type": "code", "execution_count": 2, "metadata": {"tags": ["injected-parameters"]}, "outputs": [],
         "source": "SMOKE = True"},
        {"cell_type": "code", "execution_count": 3, "metadata": {"papermill": {"duration": 1.0}, "execution": {}},
         "source": "work()", "outputs": [
             {"output_type": "stream", "name": "stderr", "text": "WARNING engine\n"},
             {"output_type": "stream", "name": "stdout", "text": ["x" * 10_000]},
             {"output_type": "stream", "name": "stdout",  # vLLM's log on stdout: dropped, and the output with it
              "text": ["\x1b[0;36m(MainProcess pid=7)\x1b[0;0m INFO 12-03 [core.py:1] init\n", "(EngineCore_0 pid=8) x\n"]},
             {"output_type": "stream", "name": "stdout", "text": ["(MainProcess pid=7) WARNING y\n", "kept\n"]},
             {"output_type": "display_data", "metadata": {}, "data": {"application/vnd.jupyter.widget-view+json": {}}},
             {"output_type": "display_data", "metadata": {}, "data": {  # tqdm's widget: its first frame is all that stays
                 "application/vnd.jupyter.widget-view+json": {}, "text/plain": "train sera:   0%|          | 0/3 [00:00<?, ?it/s]"}},
             {"output_type": "display_data", "metadata": {},
              "data": {"text/plain": "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]\n"}},
             {"output_type": "display_data", "metadata": {}, "data": {"text/plain": "accuracy: 40% | 2/5 tasks"}},
             {"output_type": "display_data", "metadata": {"image/png": {"width": 400}}, "data": png},
             {"output_type": "execute_result", "execution_count": 3, "metadata": {}, "data": {"text/html": "<table/>"}}]},
    ]}
    out = render.clean(nb)
    assert out["metadata"] == {"kernelspec": {"name": "python3"}}
    assert [c["source"] for c in out["cells"]] == ["# title", "SMOKE = False", "work()"]  # the injected cell is gone
    params, work = out["cells"][1], out["cells"][2]
    assert (params["execution_count"], work["execution_count"]) == (1, 2) and work["metadata"] == {}
    kinds = [(o["output_type"], o.get("name")) for o in work["outputs"]]
    assert kinds == [("stream", "stdout"), ("stream", "stdout"), ("display_data", None), ("display_data", None),
                     ("execute_result", None)]  # the frozen progress bars went; a line with a percentage stayed
    assert work["outputs"][2]["data"] == {"text/plain": "accuracy: 40% | 2/5 tasks"}
    work["outputs"].pop(2)
    assert len(work["outputs"][0]["text"]) < 5_000 and "characters cut" in work["outputs"][0]["text"]
    tree = "".join(f"line {i} " + "|" * (i % 50) + "\n" for i in range(400))  # a long tree: cut between lines
    cut = render._cut(tree)
    assert len(cut) <= render.MAX_TEXT and render._cut(cut) == cut  # cleaning a stored notebook again changes nothing
    kept = cut.splitlines()
    marker = next(i for i, line in enumerate(kept) if line.startswith("[..."))
    assert all(line in tree.splitlines() for line in kept[:marker] + kept[marker + 1:])  # whole lines only
    assert kept[marker] == f"[... {400 - len(kept) + 1} lines cut ...]" and kept[0] == "line 0 " and kept[-1].startswith("line 399")
    assert work["outputs"][1]["text"] == "kept\n"  # the engine's line went, the notebook's own stayed
    assert work["outputs"][2]["data"] == png and work["outputs"][3]["execution_count"] == 2
    assert nb["cells"][3]["outputs"][0]["name"] == "stderr"  # the input is not changed


def test_the_readme_course_times_are_what_course_times_records():
    """The README's course table: each notebook's ``time`` cell is its stored render's setting,
    seconds and date, and the line under the table names the machines, all from
    ``course_times.json`` (``python scripts/render_course.py --notices`` rewrites them)."""
    render = _render_course()
    times = json.loads(render.TIMES.read_text())
    readme = render.README.read_text()
    assert render.readme_times(readme, times) == readme, "python scripts/render_course.py --notices"
    for stem, entry in times["notebooks"].items():
        assert f"| `{stem}` |" in readme and readme.split(f"| `{stem}` |", 1)[1].split("\n", 1)[0].endswith(
            f"| {render.readme_time(entry)} |")
    with pytest.raises(ValueError, match="no line starting 'Stored renders"):
        render.readme_times("| `00_quickstart` | a | b | c |\n", times)


def test_a_render_setting_is_named_with_its_parameters():
    """A notebook stored in its render setting (the full setting with parameters changed, such as
    07's ``ROWS = "shortest"``) says so, with the parameters, in its notice and its README time."""
    render = _render_course()
    entry = render.time_entry(12.3, smoke=False, parameters={"ROWS": "shortest"})
    assert entry["setting"] == "render" and entry["parameters"] == {"ROWS": "shortest"}
    assert "the render setting (the full setting with `ROWS = 'shortest'`)" in render.notice(entry)
    assert render.readme_time(entry).startswith("render: 12 s (")
    beside = entry | {"note": "beside the epoch build"}  # what else ran, recorded with the time
    assert "), beside the epoch build, " in render.notice(beside) and render.readme_time(beside).endswith(", beside the epoch build)")
    assert render.time_entry(1.0, smoke=True)["setting"] == "smoke" and "parameters" not in render.time_entry(1.0, smoke=True)
    assert render.RENDER_PARAMETERS["07_advantages_and_cispo"] == {"ROWS": "shortest"}
