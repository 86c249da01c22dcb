"""Files and folders: folders written whole or not at all, and a file's sha256."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def swap_in(tmp: Path, final: Path) -> None:
    """Put the fully written folder ``tmp`` in the place of ``final``: the old ``final``
    is first renamed to ``final.old`` (removed at the end), so ``final`` is never half
    written; at worst an interruption leaves the previous version as ``*.old``."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
