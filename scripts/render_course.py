"""Execute the course's notebooks in order and store them with their outputs (``make course``).

Each notebook runs through papermill in its own kernel from ``notebooks/`` (the working
folder the notebooks assume), in its full setting (its ``parameters`` cell as committed), or
with ``--smoke`` in the smoke setting CI runs (``SMOKE = True`` passed as a parameter). The
executed notebook replaces the committed one after :func:`clean`, which keeps what a reader
needs and drops what would make the file large or unstable:

* papermill's injected-parameters cell (the stored ``parameters`` cell keeps ``SMOKE = False``,
  so the notebook still reads as its full setting; the setting it ran in is recorded below);
* notebook and cell metadata other than ``kernelspec``, ``language_info`` and ``tags``;
* standard-error streams (engine logs, warnings, progress bars) and widget outputs (they do
  not render outside a live kernel), and the ``execution`` timings papermill adds;
* progress bars drawn as widgets (tqdm and vLLM in a notebook): outside a live kernel only their
  first frame remains, a bar frozen at 0% (:data:`PROGRESS`; a widget with an HTML form, such
  as the tree browser, keeps that form);
* vLLM's log lines (it logs to standard output: :data:`ENGINE_LOG`) are dropped;
* stdout and text results longer than :data:`MAX_TEXT` characters are cut in the middle.

Under the title a short notice (a markdown cell tagged ``stored-outputs``, :func:`notice`) says
which setting produced the stored outputs, how long it took on which machine, when, and at which
commit; ``course_times.json`` holds the same entry, and a test checks that the two agree.
``--notices`` rewrites the notices from ``course_times.json`` without executing anything.
The README's course table takes its ``time`` column from the same file (:func:`readme_times`:
the setting, the seconds and the date of each notebook's stored render, and one line below the
table naming the machines), rewritten by every render and by ``--notices``; a test checks it.

Execution counts are renumbered 1, 2, ... in cell order. Tables (HTML and text) and plots
(PNG) stay; a notebook larger than :data:`MAX_BYTES` after cleaning is an error, so that the
committed course stays readable on a repository page.

The seconds each notebook took, the setting and the machine go to
``notebooks/course_times.json`` (``--only`` updates just those entries).

    python scripts/render_course.py            # the whole course, full setting
    python scripts/render_course.py --smoke    # the smoke setting (CI's), minutes
    python scripts/render_course.py --only 05 06
    python scripts/render_course.py --only 07 --full                      # 07's full setting (hours)
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
TIMES = NOTEBOOKS / "course_times.json"
MAX_BYTES = 400_000
"""The largest a committed notebook may be after :func:`clean` (bytes)."""
ENGINE_LOG = re.compile(r"^(\x1b\[[0-9;]*m)*\((MainProcess|EngineCore\w*|Worker\w*) pid=\d+\)")
"""A line of vLLM's log (it writes to standard output); such lines are not kept."""
MAX_TEXT = 4_000
"""The longest a kept text output may be (characters); longer ones are cut in the middle."""
CUT_MARK = re.compile(r"^\[\.\.\. \d+ (lines|characters) cut \.\.\.\]$", re.M)
"""The marker line of a cut text."""
PROGRESS = re.compile(r"\d{1,3}%(\||\s+Completed \|).*\[\d+:\d\d<")
"""A progress bar's text (tqdm's ``label:  40%|####  | 2/5 [00:01<00:02, ...]``, vLLM's ``40% Completed |``)."""
NOTEBOOK_METADATA = ("kernelspec", "language_info")
DROPPED_MIME = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json",
                "application/javascript")


def _cut(text: str) -> str:
    """``text`` with whole lines cut from its middle when it is longer than :data:`MAX_TEXT`:
    the first and the last lines that fit in half of it each, and a marker line saying how many
    lines went (a line longer than half is cut inside). The result is at most :data:`MAX_TEXT`
    long, so cutting again leaves it as it is, as it leaves a text cut by an earlier version
    (:data:`CUT_MARK`)."""
    if len(text) <= MAX_TEXT or CUT_MARK.search(text):
        return text
    lines = text.splitlines(keepends=True)
    budget = (MAX_TEXT - 40) // 2
    head: list[str] = []
    while lines and len("".join(head)) + len(lines[0]) <= budget:
        head.append(lines.pop(0))
    tail: list[str] = []
    while lines and len("".join(tail)) + len(lines[-1]) <= budget:
        tail.insert(0, lines.pop())
    if not head and not tail:  # one long line: cut inside it
        return f"{text[:budget]}\n[... {len(text) - 2 * budget} characters cut ...]\n{text[-budget:]}"
    return "".join(head) + f"[... {len(lines)} lines cut ...]\n" + "".join(tail)


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


def clean(nb: dict) -> dict:
    """An executed notebook as it is committed (module docstring): injected parameters,
    volatile metadata, standard error and widget outputs removed, long texts cut, execution
    counts renumbered."""
    nb = copy.deepcopy(nb)
    nb["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k in NOTEBOOK_METADATA}
    cells, count = [], 0
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "injected-parameters" in tags:
            continue
        cell["metadata"] = {"tags": tags} if tags else {}
        if cell["cell_type"] == "code":
            count += 1
            cell["execution_count"] = count
            outputs = []
            for out in cell.get("outputs", []):
                if out["output_type"] == "stream":
                    text = "".join(line for line in _text(out["text"]).splitlines(keepends=True)
                                   if not ENGINE_LOG.match(line))
                    if out["name"] == "stderr" or not text.strip():
                        continue
                    out["text"] = _cut(text)
                elif out["output_type"] in ("display_data", "execute_result"):
                    out["data"] = {k: v for k, v in out["data"].items() if k not in DROPPED_MIME}
                    if not out["data"] or (set(out["data"]) == {"text/plain"}
                                           and PROGRESS.search(_text(out["data"]["text/plain"]))):
                        continue
                    if "text/plain" in out["data"]:
                        out["data"]["text/plain"] = _cut(_text(out["data"]["text/plain"]))
                    out["metadata"] = {k: v for k, v in out.get("metadata", {}).items() if k == "image/png"}
                    if out["output_type"] == "execute_result":
                        out["execution_count"] = count
                outputs.append(out)
            cell["outputs"] = outputs
        cells.append(cell)
    nb["cells"] = cells
    return nb


NOTICE_TAG = "stored-outputs"
SETTINGS = {"smoke": "the smoke setting (`SMOKE = True`, what CI runs)",
            "full": "the full setting (the parameters cell as it stands)",
            "render": "the render setting (the full setting with {parameters})"}
"""The settings a notebook's stored outputs can come from. ``render`` is the full setting with a
few parameters changed (:data:`RENDER_PARAMETERS`, or ``--param``), for a notebook whose full
setting takes hours on a laptop (07: every row repeated 50 times) but whose lesson needs more
than the smoke setting shows."""
RENDER_PARAMETERS = {"07_advantages_and_cispo": {"ROWS": "shortest"}}
"""The committed course's render settings: what a plain (not ``--smoke``) render of these
notebooks passes over their full setting; ``--full`` passes nothing."""


def notice(entry: dict) -> str:
    """The notice under a notebook's title for its ``course_times.json`` entry."""
    commit = f"commit `{entry['commit']}`" if entry.get("commit") else "commit not recorded"
    parameters = ", ".join(f"`{k} = {v!r}`" for k, v in entry.get("parameters", {}).items())
    setting = SETTINGS[entry["setting"]].format(parameters=parameters)
    note = f", {entry['note']}" if entry.get("note") else ""
    return (f"*Stored outputs: {setting}, {entry['seconds']:.0f} s on {entry['cores']} cores "
            f"({entry['machine']}){note}, {entry['date']}, {commit}. The parameters cell below shows the full setting; "
            f"run it to see the full lesson.*")


def with_notice(nb: dict, entry: dict) -> dict:
    """``nb`` with its notice cell (second cell, after the title) set to :func:`notice` of ``entry``."""
    cell = {"cell_type": "markdown", "metadata": {"tags": [NOTICE_TAG]}, "source": notice(entry)}
    cells = [c for c in nb["cells"] if NOTICE_TAG not in c.get("metadata", {}).get("tags", [])]
    cell["id"] = next((c.get("id") for c in nb["cells"] if NOTICE_TAG in c.get("metadata", {}).get("tags", [])),
                      "stored-outputs")
    nb["cells"] = cells[:1] + [cell] + cells[1:]
    return nb


def commit() -> str | None:
    """The repository's short commit (:func:`~sera_core.course.code_version`), with ``+changes``
    when tracked files differ from it; None outside a checkout."""
    from sera_core.course import code_version

    version = code_version()
    if version["commit"] is None:
        return None
    return version["commit"][:7] + ("+changes" if version["dirty"] else "")


def time_entry(seconds: float, smoke: bool, parameters: dict | None = None, note: str | None = None) -> dict:
    """A notebook's ``course_times.json`` entry for a render that took ``seconds`` now, here
    (``parameters``: the render setting's, over the full setting; ``note``: what ran beside it)."""
    from sera_core.utils.hardware import describe

    here = describe()
    setting = "smoke" if smoke else "render" if parameters else "full"
    return {"seconds": round(seconds, 1), "setting": setting, "date": time.strftime("%Y-%m-%d"),
            "cores": os.cpu_count(), "machine": f"{here['cpu'] or platform.machine()}, torch {here['torch_cpu_capability']}",
            "commit": commit()} | ({"parameters": parameters} if parameters and not smoke else {}) | (
                {"note": note} if note else {})


README = ROOT / "README.md"
TIMES_LINE = re.compile(r"^Stored renders \(`notebooks/course_times.json`\): .*$", re.M)


def readme_time(entry: dict) -> str:
    """A notebook's cell in the README's ``time`` column: ``smoke: 46 s (2026-12-07)``."""
    note = f", {entry['note']}" if entry.get("note") else ""
    return f"{entry['setting']}: {entry['seconds']:.0f} s ({entry['date']}{note})"


def readme_times(readme: str, times: dict) -> str:
    """``readme`` with each course-table row's last cell (``| `NN_name` | ... | time |``) set to
    :func:`readme_time` of the notebook's ``course_times.json`` entry, and the line under the
    table (:data:`TIMES_LINE`) naming the machines and the total of each setting."""
    entries = times["notebooks"]

    def row(match: re.Match) -> str:
        return f"{match[1]}{readme_time(entries[match[2]])} |"

    readme = re.sub(r"^(\| `(\d\d_\w+)` \|.*\| )[^|]*\|$", row, readme, flags=re.M)
    machines = sorted({f"{e['cores']} cores, {e['machine']}" for e in entries.values()})
    totals = {}
    for e in entries.values():
        totals[e["setting"]] = totals.get(e["setting"], 0.0) + e["seconds"]
    total = "; ".join(f"{setting}: {seconds / 60:.1f} min for {sum(e['setting'] == setting for e in entries.values())}"
                      for setting, seconds in sorted(totals.items()))
    line = f"Stored renders (`notebooks/course_times.json`): {total}, on {' and '.join(machines)}."
    if not TIMES_LINE.search(readme):
        raise ValueError("the README has no line starting 'Stored renders (`notebooks/course_times.json`): '")
    return TIMES_LINE.sub(lambda _: line, readme)


def render(path: Path, *, smoke: bool, timeout: int, parameters: dict | None = None, note: str | None = None) -> dict:
    """Execute ``path`` with papermill (module docstring), store it cleaned with its notice;
    its ``course_times.json`` entry."""
    import papermill as pm

    out = Path(tempfile.mkdtemp(prefix="render_course_")) / path.name  # outside notebooks/: never seen as a notebook
    start = time.perf_counter()
    try:
        pm.execute_notebook(str(path), str(out), parameters={"SMOKE": True} if smoke else dict(parameters or {}),
                            cwd=str(NOTEBOOKS),
                            kernel_name="python3", progress_bar=False, execution_timeout=timeout)
        seconds = time.perf_counter() - start
        entry = time_entry(seconds, smoke, parameters, note)
        text = json.dumps(with_notice(clean(json.loads(out.read_text())), entry), indent=1, ensure_ascii=False) + "\n"
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    if len(text.encode()) > MAX_BYTES:
        raise SystemExit(f"{path.name}: {len(text.encode()):,} bytes after cleaning, over {MAX_BYTES:,}: "
                         "show less (smaller figures, shorter tables)")
    path.write_text(text)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="run the smoke setting (CI's) instead of the full one")
    parser.add_argument("--only", nargs="+", default=None, help="notebook numbers to render (e.g. 05 06)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a cell may take")
    parser.add_argument("--notices", action="store_true", help="only rewrite each notice from course_times.json")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="the render setting: the full setting with this parameter changed (a Python literal; repeatable)")
    parser.add_argument("--full", action="store_true", help="the full setting even where RENDER_PARAMETERS names a render one")
    parser.add_argument("--note", default=None, help="what else ran beside the render, recorded with its time (e.g. 'beside a build')")
    args = parser.parse_args()
    parameters = {key: ast.literal_eval(value) for key, _, value in (p.partition("=") for p in args.param)}
    if parameters and (args.smoke or args.full):
        parser.error("--param sets the render setting, over the full one: not with --smoke or --full")
    env_smoke = os.environ.pop("SERA_SMOKE", None)  # the kernel inherits it: the setting is this script's choice
    if env_smoke:
        print("SERA_SMOKE is ignored here; pass --smoke", file=sys.stderr)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        paths = [p for p in paths if p.name[:2] in args.only]
    times = json.loads(TIMES.read_text()) if TIMES.is_file() else {"notebooks": {}}
    for path in paths:
        if args.notices:
            nb = with_notice(json.loads(path.read_text()), times["notebooks"][path.stem])
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            continue
        print(f"{path.name} ...", flush=True)
        chosen = parameters or ({} if args.smoke or args.full else RENDER_PARAMETERS.get(path.stem, {}))
        times["notebooks"][path.stem] = entry = render(path, smoke=args.smoke, timeout=args.timeout, parameters=chosen,
                                                       note=args.note)
        TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
        README.write_text(readme_times(README.read_text(), times))
        print(f"{path.name}: {entry['seconds']:.0f} s, {path.stat().st_size:,} bytes", flush=True)
    if args.notices:  # a render wrote the README beside each entry above
        README.write_text(readme_times(README.read_text(), times))


if __name__ == "__main__":
    main()
