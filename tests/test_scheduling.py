"""The suite's scheduling (conftest.py): under ``-n 2 --dist loadfile`` every notebook runs on
one worker, in order, while test files go to either worker."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                       "source": src} for i, src in enumerate(cells)],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_the_notebooks_run_in_order_on_one_worker_and_test_files_on_either(tmp_path):
    """Two notebooks whose second reads what the first wrote (as 09 reads 08's run), and two test
    files: the notebooks share a worker and run in order; the files are spread."""
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    books = tmp_path / "notebooks"
    books.mkdir()
    (books / "a_first.ipynb").write_text(json.dumps(notebook(
        ["import os, time\ntime.sleep(2)", "open('made_by_a.txt', 'w').write(str(os.getpid()))"])))
    (books / "b_second.ipynb").write_text(json.dumps(notebook(["assert open('made_by_a.txt').read()"])))
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text("import time\n\ndef test_wait():\n    time.sleep(1)\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-v", "-p", "no:cacheprovider",
                          "--nbval-lax", "notebooks", "test_one.py", "test_two.py"],
                         cwd=books.parent, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    done = re.findall(r"\[(gw\d)\] .*?PASSED (\S+)", run.stdout)
    workers = {name: {w for w, n in done if n.startswith(name)} for name in ("notebooks/a_first", "notebooks/b_second",
                                                                               "test_one", "test_two")}
    assert len(workers["notebooks/a_first"] | workers["notebooks/b_second"]) == 1, done
    assert all(len(w) == 1 for w in workers.values()) and len(set().union(*workers.values())) == 2, done


def test_the_longest_units_go_out_first_and_the_rest_keep_xdists_order():
    """``handout_order`` (conftest.py): the notebooks, then the rubric stage's file and the other
    long files of ``FIRST`` in its order, then every other file in the order xdist gave."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    given = ["tests/test_a.py", "tests/test_vllm_backend.py", "tests/test_b.py", "notebooks", "tests/test_rubric_stage.py"]
    assert root.handout_order(given) == ["notebooks", "tests/test_rubric_stage.py", "tests/test_vllm_backend.py",
                                         "tests/test_a.py", "tests/test_b.py"]
    assert all((ROOT / unit).exists() for unit in root.FIRST)  # a renamed file would silently lose its place
