"""The layers of sera_core (docs/architecture.md): no module imports a lower layer, no two
modules import each other (scripts/import_layers.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
layers = runpy.run_path(str(ROOT / "scripts" / "import_layers.py"))


def test_no_import_runs_up_a_layer_and_no_modules_import_each_other():
    graph = layers["imports"](ROOT)
    assert len(graph) > 50  # every module was read
    assert layers["upward"](graph) == []
    assert layers["loops"](graph) == []


def test_a_planted_upward_import_and_loop_are_found(tmp_path):
    """A utility importing the trainer lazily, and the trainer importing it back: one upward
    import, one loop of both modules."""
    for name, text in {"__init__.py": "", "utils/__init__.py": "", "train/__init__.py": "",
                       "utils/text.py": "def f():\n    from sera_core.train import trainer\n",
                       "train/trainer.py": "from sera_core.utils.text import f\n"}.items():
        path = tmp_path / "sera_core" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    graph = layers["imports"](tmp_path)
    assert layers["upward"](graph) == ["sera_core.utils.text:2 -> sera_core.train.trainer (utilities -> training)"]
    assert layers["loops"](graph) == [["sera_core.train.trainer", "sera_core.utils.text"]]
