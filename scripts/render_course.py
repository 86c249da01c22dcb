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
* vLLM's log lines (it logs to standard output: :data:`ENGINE_LOG`) are dropped;
* stdout and text results longer than :data:`MAX_TEXT` characters are cut in the middle.

Execution counts are renumbered 1, 2, ... in cell order. Tables (HTML and text) and plots
(PNG) stay; a notebook larger than :data:`MAX_BYTES` after cleaning is an error, so that the
committed course stays readable on a repository page.

The seconds each notebook took, the setting and the machine go to
``notebooks/course_times.json`` (``--only`` updates just those entries).

    python scripts/render_course.py            # the whole course, full setting
    python scripts/render_course.py --smoke    # the smoke setting (CI's), minutes
    python scripts/render_course.py --only 05 06
"""

from __future__ import annotations

import argparse
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
NOTEBOOK_METADATA = ("kernelspec", "language_info")
DROPPED_MIME = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json",
                "application/javascript")


def _cut(text: str) -> str:
    """``text`` with its middle replaced by a marker when it is longer than :data:`MAX_TEXT`."""
    if len(text) <= MAX_TEXT:
        return text
    half = MAX_TEXT // 2
    return f"{text[:half]}\n[... {len(text) - MAX_TEXT} characters cut ...]\n{text[-half:]}"


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
                    if not out["data"]:
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


def render(path: Path, *, smoke: bool, timeout: int) -> float:
    """Execute ``path`` with papermill (module docstring), store it cleaned; the seconds it took."""
    import papermill as pm

    out = Path(tempfile.mkdtemp(prefix="render_course_")) / path.name  # outside notebooks/: never seen as a notebook
    start = time.perf_counter()
    try:
        pm.execute_notebook(str(path), str(out), parameters={"SMOKE": True} if smoke else {}, cwd=str(NOTEBOOKS),
                            kernel_name="python3", progress_bar=False, execution_timeout=timeout)
        seconds = time.perf_counter() - start
        text = json.dumps(clean(json.loads(out.read_text())), indent=1, ensure_ascii=False) + "\n"
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)
    if len(text.encode()) > MAX_BYTES:
        raise SystemExit(f"{path.name}: {len(text.encode()):,} bytes after cleaning, over {MAX_BYTES:,}: "
                         "show less (smaller figures, shorter tables)")
    path.write_text(text)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="run the smoke setting (CI's) instead of the full one")
    parser.add_argument("--only", nargs="+", default=None, help="notebook numbers to render (e.g. 05 06)")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds a cell may take")
    args = parser.parse_args()
    env_smoke = os.environ.pop("SERA_SMOKE", None)  # the kernel inherits it: the setting is this script's choice
    if env_smoke:
        print("SERA_SMOKE is ignored here; pass --smoke", file=sys.stderr)
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if args.only:
        paths = [p for p in paths if p.name[:2] in args.only]
    times = json.loads(TIMES.read_text()) if TIMES.is_file() else {"notebooks": {}}
    for path in paths:
        print(f"{path.name} ...", flush=True)
        seconds = render(path, smoke=args.smoke, timeout=args.timeout)
        times["notebooks"][path.stem] = {"seconds": round(seconds, 1), "setting": "smoke" if args.smoke else "full",
                                         "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(),
                                         "machine": platform.machine()}
        TIMES.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
        print(f"{path.name}: {seconds:.0f} s, {path.stat().st_size:,} bytes", flush=True)


if __name__ == "__main__":
    main()
