"""Files and folders: folders written whole or not at all, and a file's sha256."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
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


def write_once(out: Path, write: Callable[[Path], None], done: Callable[[Path], bool]) -> Path:
    """The cached folder ``out``, written by ``write(tmp)`` into a temporary sibling folder
    (one per process) and renamed into place, so a half-written ``out`` is never found;
    ``done(folder)`` says whether a folder is complete. When another process finishes first,
    its folder is kept and ours dropped; an incomplete ``out`` (an older format) is replaced."""
    if done(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        write(tmp)
        if not done(out):
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
    except OSError:  # another process renamed its folder into place first
        if not done(out):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def sha256_file(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (hex), read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
