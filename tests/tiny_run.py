"""A small `sera train` config for tests that run the command itself (tests/test_faults.py,
tests/test_fuzz_loaders.py): the tiny SERA config on the from-scratch fixture model, easy
train tasks, one task per update."""

from __future__ import annotations

import json
from pathlib import Path

from sera_core.envs.textcraft.tasks import generate_split
from sera_core.tiny.recipe import ASSETS
from sera_core.train.config import CONFIGS


def write_train_config(folder: Path, out: Path, *, tasks: int = 4, **settings) -> Path:
    """Write ``folder/<out name>.yaml`` (and the ``tasks`` first easy train tasks beside it):
    2 trees of 1 task per update, ``out`` as the run folder, ``settings`` on top (YAML values).
    Returns the config's path."""
    task_file = folder / "easy.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in [t for t in generate_split("train")
                                                                 if t["misc"]["difficulty"] == "easy"][:tasks]))
    values = {"extends": str(CONFIGS / "textcraft" / "sera_tiny.yaml"), "model": str(ASSETS), "backend": "hf", "mixed_precision": "no", "tasks": str(task_file),
              "tasks_per_update": 1, "trees_per_task": 2, **settings, "out": str(out)}
    cfg = folder / f"{out.name}.yaml"
    cfg.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))  # JSON scalars are YAML
    return cfg
