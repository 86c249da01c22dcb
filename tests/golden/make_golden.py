"""Regenerate this machine's golden reference, tests/golden/train_tiny.<maker>.<kernel level>.json
(state the reason in the commit message). The file records the machine (``sera_core.utils.hardware.describe``)
and the kernel-forcing variables set for the run (``ATEN_CPU_CAPABILITY=avx2`` and friends:
tests/test_trainer.py ``instruction_set``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_trainer import GOLDEN, golden_config, golden_run, instruction_set, metrics  # noqa: E402

from sera_core.tiny.recipe import read_manifest  # noqa: E402
from sera_core.utils.hardware import describe  # noqa: E402

FORCING = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")

with tempfile.TemporaryDirectory() as tmp:
    cfg = golden_config(Path(tmp))
    golden_run(cfg, progress=True)
    rows = metrics(Path(cfg.out))
GOLDEN.write_text(json.dumps({"model_weights_sha256": read_manifest()["weights_sha256"], "instruction_set": instruction_set(),
                              "machine": describe(), "threads": 1, "forced": {k: v for k, v in os.environ.items() if k in FORCING},
                              "rows": rows}, indent=1) + "\n")
print(f"wrote {GOLDEN}: {len(rows)} rows")
