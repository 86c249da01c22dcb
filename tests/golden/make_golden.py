"""Regenerate this machine's golden reference, tests/golden/train_tiny.<instruction set>.json
(state the reason in the commit message)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_trainer import GOLDEN, golden_config, instruction_set, metrics  # noqa: E402

from sera_core.tiny.recipe import read_manifest  # noqa: E402
from sera_core.train.trainer import Trainer  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    cfg = golden_config(Path(tmp))
    Trainer(cfg, progress=True).run()
    rows = metrics(Path(cfg.out))
GOLDEN.write_text(json.dumps({"model_weights_sha256": read_manifest()["weights_sha256"], "instruction_set": instruction_set(),
                              "rows": rows}, indent=1) + "\n")
print(f"wrote {GOLDEN}: {len(rows)} rows")
