"""Loaders of user files under generated damage (hypothesis; ``SERA_FUZZ_EXAMPLES / 5`` inputs
each, 40 by default: every config input plans a run, about a second).

* a task file with a damaged line (cut short, not UTF-8, not an object, no ``misc``, bad
  target counts) makes ``sera eval`` exit 2 with one JSON error line naming the file and the
  line, before any work: the output folder is never created;
* a config file with generated damage (cut anywhere, bytes that are not UTF-8, a YAML
  syntax error, a known key given a value of any JSON type) either loads (the damage left a
  valid config) or makes ``sera train --dry-run`` exit 2 with one JSON error line naming the
  file or the key: never a traceback, and nothing is written.
"""

from __future__ import annotations

import json
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from sera_core.cli import main  # noqa: E402
from sera_core.train.config import CONFIGS, TrainConfig  # noqa: E402

EXAMPLES = int(os.environ.get("SERA_FUZZ_EXAMPLES", "200"))
settings.register_profile("sera-loaders", max_examples=max(20, EXAMPLES // 5), deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def _last_json(capsys) -> dict:
    lines = capsys.readouterr().out.strip().splitlines()
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def good_lines(val_tasks) -> list[bytes]:
    return [json.dumps(t).encode() for t in val_tasks[:3]]


def _damaged(line: bytes, kind: str, data) -> bytes:
    record = json.loads(line)
    if kind == "cut":
        return line[: data.draw(st.integers(1, len(line) - 2))]
    if kind == "bytes":
        at = data.draw(st.integers(0, len(line)))
        return line[:at] + data.draw(st.sampled_from([b"\xff", b"\xfe\xfe", b"\xc3", b"\x80abc"])) + line[at:]
    if kind == "not_object":
        return json.dumps(data.draw(st.one_of(st.lists(json_values, max_size=3), st.integers(), st.text()))).encode()
    if kind == "no_misc":
        record.pop("misc")
        return json.dumps(record).encode()
    # bad target counts: empty, zero, negative, not an int, not a mapping
    record["misc"]["target_items"] = data.draw(st.sampled_from([{}, {"x": 0}, {"x": -3}, {"x": 1.5}, {"x": "2"}, ["x"],
                                                                 None, {"x": True}]))
    return json.dumps(record).encode()


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data(), kind=st.sampled_from(["cut", "bytes", "not_object", "no_misc", "targets"]))
def test_a_damaged_task_file_fails_naming_the_line_and_writes_nothing(tmp_path_factory, capsys, good_lines, data, kind):
    folder = tmp_path_factory.mktemp("tasks")
    at = data.draw(st.integers(0, len(good_lines) - 1))
    lines = list(good_lines)
    lines[at] = _damaged(lines[at], kind, data)
    path = folder / "tasks.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = folder / "eval"
    capsys.readouterr()
    code = main(["eval", "--env", "textcraft", "--tasks", str(path), "--policy", "expert", "--out", str(out)])
    error = _last_json(capsys)["error"]
    assert code == 2 and f"{path}:{at + 1}" in error, error
    assert not out.exists()


KEYS = sorted(f.name for f in TrainConfig.__dataclass_fields__.values())


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data(), kind=st.sampled_from(["cut", "bytes", "syntax", "value"]))
def test_a_damaged_config_loads_or_fails_naming_the_file_or_key(tmp_path_factory, capsys, data, kind):
    folder = tmp_path_factory.mktemp("config")
    text = (f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\nseed: 3\nlr: 0.0001\n"
            "schedule: 'execution:2,delegation:1,rubric_generation:1'\n").encode()
    key = None
    if kind == "cut":
        text = text[: data.draw(st.integers(0, len(text)))]
    elif kind == "bytes":
        at = data.draw(st.integers(0, len(text)))
        text = text[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3(", b"\x00", b"\t:", b": [", b"{{"])) + text[at:]
    elif kind == "syntax":
        text += data.draw(st.sampled_from([b"lr: [1, 2\nseed: 4\n", b"  bad indent: 1\n", b"- a\n", b"key: 'open\n"]))
    else:
        key = data.draw(st.sampled_from(KEYS))
        text += f"{key}: {json.dumps(data.draw(json_values))}\n".encode()
    path = folder / "run.yaml"
    path.write_bytes(text)
    capsys.readouterr()
    code = main(["train", "--config", str(path), "--dry-run", "--out", str(folder / "run")])
    reply = _last_json(capsys)
    assert code in (0, 2), reply
    if code == 2:
        assert str(path) in reply["error"] or (key is not None and f"'{key}'" in reply["error"]), reply["error"]
    assert sorted(p.name for p in folder.iterdir()) == ["run.yaml"]  # a dry run, or a refusal, writes nothing
