"""Folders written whole or not at all (``sera_core/utils/folders.py``)."""

from __future__ import annotations

import pytest

from sera_core.utils.folders import write_once


def done(folder):
    return (folder / "ok").is_file()


def test_write_once_writes_once_replaces_an_incomplete_folder_and_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "cache" / "m"
    calls = []

    def write(tmp):
        calls.append(tmp)
        (tmp / "ok").write_text("1")

    assert write_once(out, write, done) == out and done(out) and len(calls) == 1
    assert write_once(out, write, done) == out and len(calls) == 1  # complete: not written again
    (out / "ok").unlink()  # an older, incomplete folder is replaced
    write_once(out, write, done)
    assert done(out) and len(calls) == 2

    def fails(tmp):
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    other = tmp_path / "cache" / "n"
    with pytest.raises(OSError, match="disk full"):
        write_once(other, fails, done)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["m"]  # no half-written folder left
