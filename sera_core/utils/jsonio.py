"""JSON lines I/O with atomic writes.

Records are written compactly (``json.dumps`` default separators, keys in insertion
order) so that the same records always produce the same bytes. A path ending in ``.gz``
is read and written gzip-compressed (the header's time set to 0, so the same records
still give the same bytes).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from sera_core.utils.errors import UserInputError


def json_native(obj: Any) -> Any:
    """A JSON-native copy of ``obj``: what ``json.loads(json.dumps(obj))`` gives (tuples become lists)."""
    return json.loads(json.dumps(obj))


def hashed_settings(obj: Any) -> Any:
    """The settings of a (nested) dataclass as JSON, as a name is computed from them: every field
    except those added after names were recorded (their metadata says ``hashed_when_set``) while
    they hold their default, so the names recorded before them (a warm-start build's, a course
    fixture's) stay valid; tuples become lists."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: hashed_settings(getattr(obj, f.name)) for f in fields(obj)
                if not (f.metadata.get("hashed_when_set") and getattr(obj, f.name) == f.default)}
    if isinstance(obj, (list, tuple)):
        return [hashed_settings(x) for x in obj]
    if isinstance(obj, dict):
        return {k: hashed_settings(v) for k, v in obj.items()}
    return json_native(obj)


def settings_hash(value: Any) -> str:
    """The first 16 hex digits of the sha256 of ``value`` as JSON with sorted keys: the name of
    a set of settings (a warm-start recipe, a run config); equal settings, equal names."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def write_jsonl(path: str | os.PathLike, records: Iterable[dict[str, Any]], *, sort_keys: bool = False) -> int:
    """Write ``records`` one per line to ``path`` atomically; return how many.

    ``sort_keys`` writes every object's keys sorted (the TextWorld-Sync files' style); a
    ``path`` ending in ``.gz`` is gzip-compressed (header time 0: the same bytes every run).

    The file is written to a temporary sibling and renamed into place, so a reader
    never sees a half-written file and an interrupted write leaves the old one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    count = 0
    try:
        with os.fdopen(fd, "wb") as raw:
            binary = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if path.suffix == ".gz" else raw
            with io.TextIOWrapper(binary, encoding="utf-8", newline="\n") as fh:
                for rec in records:
                    fh.write(json.dumps(rec, sort_keys=sort_keys))
                    fh.write("\n")
                    count += 1
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return count


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_jsonl(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield the JSON object on each non-empty line of ``path``.

    Raises :class:`~sera_core.utils.errors.UserInputError` naming the file when there is no
    such file, and the file and line when a line is not UTF-8 text or not a JSON object, or a
    ``.gz`` file is not gzip data.
    """
    for lineno, raw in enumerate(_lines(path), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserInputError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise UserInputError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield obj


def _lines(path: str | os.PathLike) -> Iterator[bytes]:
    """The raw lines of ``path``, decompressed when it ends in ``.gz`` (no such file or damaged
    gzip data: UserInputError)."""
    try:
        fh = gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise UserInputError(f"no such file: {path}") from None
    try:
        with fh:
            yield from fh
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise UserInputError(f"{path}: not readable gzip data ({exc or type(exc).__name__})") from None


class JsonlCheckpoint:
    """An append-only JSONL file of finished records, keyed by ``key``: resume support.

    Each finished record is appended as one line and flushed to disk, so an interrupted
    run loses at most the record in progress. On open, complete lines are loaded and a
    trailing partial line (a write cut short) is truncated away, so a resumed run
    neither loses nor duplicates records.
    """

    def __init__(self, path: str | os.PathLike, key: str = "id"):
        self.path = Path(path)
        self.key = key
        self.records: dict[Any, dict[str, Any]] = {}
        if self.path.exists():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                with open(self.path, "r+b") as fh:
                    fh.truncate(end)
            for i, rec in enumerate(read_jsonl(self.path), 1):
                if not isinstance(rec.get(key), (str, int)) or isinstance(rec.get(key), bool):
                    raise UserInputError(f"{self.path}: record {i} has no {key!r} (a string or integer)")
                self.records[rec[key]] = rec
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __contains__(self, key: Any) -> bool:
        return key in self.records

    def add(self, record: dict[str, Any]) -> None:
        """Append one finished record (flushed and fsynced before returning)."""
        with open(self.path, "a", encoding="utf-8", newline="\n") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.records[record[self.key]] = record
