"""Loaders of user files under generated damage (hypothesis; ``SERA_FUZZ_EXAMPLES / 5`` inputs
each, 40 by default: every config input plans a run, about a second).

* TextWorld task records are checked whole: any top-level field changed or dropped is
  refused naming the line;
* an evaluation folder whose ``plan.json`` or a result row was damaged does not merge: exit 2
  naming the file, no summary;
* a checkpoint whose ``state.json`` or weights were damaged is refused by ``sera export``:
  exit 2 naming the checkpoint, nothing exported.

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
from pathlib import Path

import pytest
from tiny_run import write_train_config

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
                                                                 None, {"x": True}, {"x": 10**30}]))
    return json.dumps(record).encode()


def _refused_task_file(folder: Path, lines: list[bytes], at: int, capsys, *args: str) -> str:
    """Write ``lines`` as a task file, run ``sera eval ARGS`` on it: it must exit 2 with one
    JSON error line naming the file and line ``at`` (0-based), before any work (no output
    folder). Returns the error."""
    path = folder / "tasks.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = folder / "eval"
    capsys.readouterr()
    code = main(["eval", *args, "--tasks", str(path), "--policy", "expert", "--out", str(out)])
    error = _last_json(capsys)["error"]
    assert code == 2 and f"{path}:{at + 1}" in error, error
    assert not out.exists()
    return error


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data(), kind=st.sampled_from(["cut", "bytes", "not_object", "no_misc", "targets"]))
def test_a_damaged_task_file_fails_naming_the_line_and_writes_nothing(tmp_path_factory, capsys, good_lines, data, kind):
    folder = tmp_path_factory.mktemp("tasks")
    at = data.draw(st.integers(0, len(good_lines) - 1))
    lines = list(good_lines)
    lines[at] = _damaged(lines[at], kind, data)
    _refused_task_file(folder, lines, at, capsys, "--env", "textcraft")


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data(), kind=st.sampled_from(["cut", "bytes", "not_object", "no_misc", "targets"]))
def test_a_damaged_official_task_file_fails_naming_the_line(tmp_path_factory, capsys, official_dir, data, kind):
    """The same damage in the official TextCraft-Synth format (``--format official``; the
    samples are read from ../shared, never copied into the repository)."""
    lines = (official_dir / "textcraft_synth_val_sample.jsonl").read_bytes().splitlines()[:3]
    folder = tmp_path_factory.mktemp("official")
    at = data.draw(st.integers(0, len(lines) - 1))
    lines[at] = _damaged(lines[at], kind, data)
    _refused_task_file(folder, lines, at, capsys, "--env", "textcraft", "--format", "official")


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


@pytest.fixture(scope="module")
def world_lines() -> list[bytes]:
    from sera_core.envs.textworld.tasks import generate_split

    return [json.dumps(t, sort_keys=True).encode() for t in generate_split("test")[:2]]


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data())
def test_a_textworld_task_with_any_field_changed_fails_naming_the_line(tmp_path_factory, capsys, world_lines, data):
    """TextWorld records are checked whole (every field, the texts against their renderings):
    any top-level field given another JSON value, or dropped, is refused before any work."""
    folder = tmp_path_factory.mktemp("world")
    at = data.draw(st.integers(0, len(world_lines) - 1))
    record = json.loads(world_lines[at])
    key = data.draw(st.sampled_from(sorted(record)))
    if data.draw(st.booleans()):
        record.pop(key)
    else:
        record[key] = data.draw(json_values.filter(lambda v, old=record[key]: v != old))
    lines = list(world_lines)
    lines[at] = json.dumps(record).encode()
    _refused_task_file(folder, lines, at, capsys, "--env", "textworld")


@pytest.fixture(scope="module")
def finished_eval(tmp_path_factory, val_tasks) -> Path:
    """A finished evaluation folder (the expert on 3 val tasks)."""
    folder = tmp_path_factory.mktemp("eval_done")
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in val_tasks[:3]))
    assert main(["eval", "--env", "textcraft", "--tasks", str(tasks), "--policy", "expert", "--out", str(folder / "out")]) == 0
    return folder / "out"


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data(), target=st.sampled_from(["plan", "row"]))
def test_a_damaged_evaluation_folder_fails_to_merge_naming_the_file(tmp_path_factory, capsys, finished_eval, data, target):
    """``sera eval --merge`` on a folder whose ``plan.json`` or a result row was damaged
    (cut, not UTF-8, a field given any JSON value or dropped) merges nothing: exit 2 naming
    the file, and no summary is written."""
    import shutil

    out = tmp_path_factory.mktemp("eval") / "out"
    shutil.copytree(finished_eval, out)
    (out / "summary.json").unlink()
    path = out / ("plan.json" if target == "plan" else "seed0.shard0of1.jsonl")
    lines = path.read_bytes().split(b"\n") if target == "row" else [path.read_bytes()]
    k = data.draw(st.integers(0, len([ln for ln in lines if ln]) - 1))
    obj = json.loads(lines[k])
    how = data.draw(st.sampled_from(["cut", "bytes", "value", "drop"]))
    key = data.draw(st.sampled_from(sorted(["env", "tasks", "seeds", "shards", "config", "format"] if target == "plan"
                                            else ["task_id", "success", "error", "seconds", "difficulty"])))
    if how == "cut":
        lines[k] = lines[k][: data.draw(st.integers(0, len(lines[k]) - 2))] + (b"" if target == "plan" else b"}")
    elif how == "bytes":
        lines[k] = lines[k][:5] + b"\xff" + lines[k][5:]
    elif how == "drop":
        obj.pop(key)
        lines[k] = json.dumps(obj).encode()
    else:
        obj[key] = data.draw(json_values.filter(lambda v, old=obj[key]: v != old and not (
            key == "error" and v is None) and not (key == "difficulty" and isinstance(v, str))))
        lines[k] = json.dumps(obj).encode()
    path.write_bytes(b"\n".join(lines))
    capsys.readouterr()
    code = main(["eval", "--merge", "--out", str(out)])
    reply = _last_json(capsys)
    if code == 0:  # the damage left a valid folder (a row's outcome, time or error text changed): it merges
        row_types = {"success": (bool,), "seconds": (int, float), "error": (str, type(None)), "difficulty": (str,)}
        assert target == "row" and how == "value" and key in row_types and isinstance(obj[key], row_types[key]), reply
        return
    assert code == 2 and (str(path) in reply["error"] or path.name in reply["error"] or str(out) in reply["error"]), reply
    assert not (out / "summary.json").exists()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """One tiny training run (1 update of the from-scratch fixture model, tests/tiny_run.py)."""
    folder = tmp_path_factory.mktemp("trained")
    cfg = write_train_config(folder, folder / "run", tasks=2, schedule="execution:1", max_new_tokens=16,
                             max_steps_per_agent=1)
    assert main(["train", "--config", str(cfg), "--total-updates", "1"]) == 0
    return folder / "run"


@settings(settings.get_profile("sera-loaders"))
@given(data=st.data())
def test_a_damaged_checkpoint_is_refused_naming_it(tmp_path_factory, capsys, trained_run, data):
    """``sera export`` of a run whose ``state.json`` or weights were damaged (cut, not UTF-8,
    a field given any JSON value or dropped, a weights file changed): exit 2 naming the
    checkpoint, nothing exported."""
    import shutil

    run = tmp_path_factory.mktemp("ckpt") / "run"
    shutil.copytree(trained_run, run)
    state = run / "checkpoint" / "state.json"
    how = data.draw(st.sampled_from(["cut", "bytes", "value", "drop", "weights"]))
    obj = json.loads(state.read_text())
    key = data.draw(st.sampled_from(sorted(obj)))
    if how == "cut":
        text = state.read_bytes()
        state.write_bytes(text[: data.draw(st.integers(0, len(text) - 2))])
    elif how == "bytes":
        state.write_bytes(b"\xff" + state.read_bytes())
    elif how == "drop":
        obj.pop(key)
        state.write_text(json.dumps(obj))
    elif how == "value":
        obj[key] = data.draw(json_values.filter(lambda v, old=obj[key]: v != old))
        state.write_text(json.dumps(obj))
    else:
        weights = run / "checkpoint" / "model.safetensors"
        blob = bytearray(weights.read_bytes())
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= 0xFF
        weights.write_bytes(bytes(blob))
    capsys.readouterr()
    code = main(["export", "--run", str(run), "--out", str(run.parent / "hf")])
    reply = _last_json(capsys)
    if code == 0:  # only a field that is recorded, never read back, can change harmlessly
        assert how == "value" and key == "counters", reply
        return
    assert code == 2 and "checkpoint" in reply["error"], reply
    assert not (run.parent / "hf").exists()
