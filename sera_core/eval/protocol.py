"""Measurement protocols, fixed before the runs they report (docs/protocol.md).

A protocol is a JSON file under ``sera_core/configs/protocol/``: named task sets, each with its
benchmark, split, explicit task ids, its role (``dev``: may guide choices, measured as often
as needed; ``test``: touched once per frozen candidate) and how it is played (temperature,
trees per task, the evaluation contract's caps); and the measures with their targets. Its
hash (:func:`protocol_hash`, the first 16 hex digits of the sha256 of its JSON) goes into
every reported run; :func:`require_protocol` refuses a run recorded under another hash.

:func:`warmstart_protocol` and :func:`learning_protocol` state the rules that chose each
protocol's ids, and a test checks that the committed files are what they give, so neither can
change alone.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from sera_core.utils.errors import UserInputError
from sera_core.utils.jsonio import settings_hash

PROTOCOLS = Path(__file__).resolve().parents[1] / "configs" / "protocol"
"""The shipped protocols (``<name>.json``)."""

ROLES = ("dev", "test")


def load_protocol(name: str | os.PathLike) -> dict[str, Any]:
    """A shipped protocol by name (``warmstart``) or a protocol file by path, checked
    (:func:`check_protocol`)."""
    path = Path(name) if str(name).endswith(".json") else PROTOCOLS / f"{name}.json"
    if not path.is_file():
        raise UserInputError(f"no protocol {name!r} (shipped: {', '.join(sorted(p.stem for p in PROTOCOLS.glob('*.json')))})")
    protocol = json.loads(path.read_text())
    check_protocol(protocol)
    return protocol


def protocol_hash(protocol: dict[str, Any]) -> str:
    """The protocol's name in records: ``settings_hash`` of its JSON (sorted keys)."""
    return settings_hash(protocol)


def check_protocol(protocol: dict[str, Any]) -> None:
    """Every set names a benchmark, a split, a role of :data:`ROLES` and ids without repeats;
    no task id is in a dev set and a test set of the same benchmark. UserInputError otherwise."""
    seen: dict[tuple[str, str], set[str]] = {}
    for name, spec in protocol["sets"].items():
        if spec.get("role") not in ROLES or not spec.get("ids") or len(set(spec["ids"])) != len(spec["ids"]):
            raise UserInputError(f"protocol set {name}: a role of {ROLES} and distinct task ids are required")
        seen.setdefault((spec["benchmark"], spec["role"]), set()).update(spec["ids"])
    for (bench, role), ids in seen.items():
        if role == "dev" and (both := ids & seen.get((bench, "test"), set())):
            raise UserInputError(f"protocol: {bench} task(s) in both a dev and a test set: {sorted(both)[:5]}")


def protocol_tasks(protocol: dict[str, Any], name: str) -> list[dict]:
    """The task records of set ``name``, in the order of its ids (a missing id is an error
    naming it: the splits are generated, so a change of generator shows here)."""
    from sera_core.envs.registry import BENCHMARKS, pick_tasks

    spec = protocol["sets"][name]
    bench = BENCHMARKS[spec["benchmark"]]
    by_id = {bench.task_id(t): t for t in pick_tasks(spec["benchmark"], spec["split"])}
    missing = [i for i in spec["ids"] if i not in by_id]
    if missing:
        raise UserInputError(f"protocol set {name}: {len(missing)} task id(s) not in {spec['benchmark']} {spec['split']}: {missing[:5]}")
    return [by_id[i] for i in spec["ids"]]


def require_protocol(recorded: str | None, protocol: dict[str, Any], what: str) -> None:
    """Refuse ``what`` (a run, a results file) recorded under another protocol than ``protocol``."""
    if recorded != protocol_hash(protocol):
        raise UserInputError(f"{what} was recorded under protocol {recorded}, not {protocol['name']} "
                             f"{protocol_hash(protocol)}: measure it again under this protocol")


def bind_protocol(out: str | os.PathLike, name: str | os.PathLike, *set_names: str) -> dict[str, Any]:
    """Tie the results folder ``out`` to the sets ``set_names`` of protocol ``name``: the first
    call writes ``out/protocol.json`` (``{"name", "hash", "set", "role", "tasks"}``; several sets:
    their names and roles joined by ``+``, their tasks added), a later one refuses, before any work
    and naming the difference, a folder bound to another protocol (a changed file, whose hash
    differs) or other sets. Returns the record, which the script puts into its results; a set
    name the protocol lacks is an error naming those it has."""
    protocol = load_protocol(name)
    if not set_names:
        raise ValueError("bind_protocol needs at least one set name")
    for set_name in set_names:
        if set_name not in protocol["sets"]:
            raise UserInputError(f"protocol {protocol['name']} has no set {set_name!r} (sets: {', '.join(protocol['sets'])})")
    chosen = "+".join(set_names)
    record = {"name": protocol["name"], "hash": protocol_hash(protocol), "set": chosen,
              "role": "+".join(protocol["sets"][n]["role"] for n in set_names),
              "tasks": sum(len(protocol["sets"][n]["ids"]) for n in set_names)}
    path = Path(out) / "protocol.json"
    if path.exists():
        old = json.loads(path.read_text())
        require_protocol(old.get("hash"), protocol, str(Path(out)))
        if old.get("set") != chosen:
            raise UserInputError(f"{out} measures set {old.get('set')!r} of {protocol['name']}, not {chosen!r}: "
                                 "use another folder")
        return old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def warmstart_protocol() -> dict[str, Any]:
    """The warm-start protocol as its rules choose it (the committed
    ``configs/protocol/warmstart.json`` must equal this; docs/protocol.md says why each set)."""
    from sera_core.envs.registry import BENCHMARKS, pick_tasks

    def ids(env: str, tasks: list[dict]) -> list[str]:
        return [BENCHMARKS[env].task_id(t) for t in tasks]

    easy = ids("textcraft", pick_tasks("textcraft", difficulty="easy"))
    medium = ids("textcraft", pick_tasks("textcraft", difficulty="medium"))
    points = medium[-24:]  # sera tiny measure --points 24: the last 24 medium val tasks (tiny.measure.points_tasks)
    tw_dev = ids("textworld", pick_tasks("textworld", difficulty="easy", per_level=8, spread=True))  # measured_tasks
    tw_spread = ids("textworld", pick_tasks("textworld", difficulty="easy", per_level=40, spread=True))
    long_easy = [t for t in pick_tasks("textcraft", "train", difficulty="easy") if 5 <= t["misc"]["num_craft_steps"] <= 8]
    drawn = random.Random(0).sample(long_easy, 8)
    greedy = {"temperature": 0.0, "trees": 1}
    contract = {"max_depth": 3, "max_steps_per_agent": 20, "max_new_tokens": 512}
    sets = {
        "textcraft_easy_dev": {"benchmark": "textcraft", "split": "val", "role": "dev", "ids": easy[:50], **greedy},
        "textcraft_easy_test": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": easy[50:100], **greedy},
        "textcraft_medium_dev": {"benchmark": "textcraft", "split": "val", "role": "dev", "ids": medium[:4], **greedy},
        "textcraft_medium_test": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": medium[4:24], **greedy},
        "scorer_points": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": points, **greedy,
                          "note": "the 34 held-out delegation points (the noisy expert's mixed groups of 8) on these tasks"},
        "textworld_easy_dev": {"benchmark": "textworld", "split": "test", "role": "dev", "ids": tw_dev, **greedy},
        "textworld_easy_test": {"benchmark": "textworld", "split": "test", "role": "test",
                                "ids": [i for i in tw_spread if i not in tw_dev][:28], **greedy},
        "textcraft_long_easy_t1": {"benchmark": "textcraft", "split": "train", "role": "dev", "ids": ids("textcraft", drawn),
                                   "temperature": 1.0, "trees": 4, "seed": 0,
                                   "note": "8 easy training tasks of 5-8 crafts drawn with random.Random(0): can the start "
                                           "solve long tasks at T=1, the rollouts curve 2 learns from"},
    }
    return {
        "name": "warmstart", "frozen": "2026-12-07",
        "purpose": "compare a candidate warm-start adapter with the shipped one (issue 58), once per candidate on test",
        "contract": contract, "sets": sets,
        "measures": [
            {"set": "textcraft_easy_test", "measure": "root success", "target": 0.60},
            {"set": "textcraft_easy_test", "measure": "well-formed act turns", "target": 0.95},
            {"set": "textcraft_medium_test", "measure": "root success", "target": 0.15},
            {"set": "textworld_easy_test", "measure": "root success", "target": 0.30},
            {"set": "scorer_points", "measure": "greedy pairwise accuracy", "target": 0.70},
            {"set": "textcraft_long_easy_t1", "measure": "trees solved of 32", "target": 4},
        ],
        "rule": "ship the candidate if it beats the shipped adapter on most measures (issue 58)",
    }


def learning_protocol() -> dict[str, Any]:
    """The learning curves' protocol (issue 60) as its rules choose it (the committed
    ``configs/protocol/learning.json`` must equal this; docs/protocol.md says why each set). Its
    test sets avoid every task that guided a choice so far: the curves' own (the first 50 easy
    val tasks, the 34 held-out points of the last 24 medium val tasks) and the warm-start
    comparison's (:func:`warmstart_protocol`, which chooses the adapter the curves start from)."""
    from sera_core.envs.registry import BENCHMARKS, pick_tasks

    def ids(env: str, tasks: list[dict]) -> list[str]:
        return [BENCHMARKS[env].task_id(t) for t in tasks]

    warm = warmstart_protocol()["sets"]
    easy = ids("textcraft", pick_tasks("textcraft", difficulty="easy"))
    medium = ids("textcraft", pick_tasks("textcraft", difficulty="medium"))
    tw_used = set(warm["textworld_easy_dev"]["ids"]) | set(warm["textworld_easy_test"]["ids"])
    tw_spread = ids("textworld", pick_tasks("textworld", difficulty="easy", per_level=80, spread=True))
    greedy = {"temperature": 0.0, "trees": 1}
    sets = {
        "textcraft_easy_dev": {"benchmark": "textcraft", "split": "val", "role": "dev", "ids": easy[:50], **greedy,
                               "note": "every curve-2 arm so far was compared on these"},
        "textcraft_easy_test": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": easy[100:], **greedy,
                                "note": "after the warm-start protocol's test (easy tasks 51-100)"},
        "textcraft_medium_dev": {"benchmark": "textcraft", "split": "val", "role": "dev", "ids": medium[24:64], **greedy},
        "textcraft_medium_test": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": medium[64:104], **greedy},
        "points_dev": {"benchmark": "textcraft", "split": "val", "role": "dev", "ids": medium[-24:], **greedy,
                       "note": "the 34 held-out delegation points curve 1 chose its length and arm on"},
        "points_test": {"benchmark": "textcraft", "split": "val", "role": "test", "ids": medium[104:128], **greedy,
                        "note": "held-out points built the same way (the noisy expert's mixed groups of 8) on other "
                                "medium val tasks; the overlap of their subtasks with the training pool's is reported"},
        "textworld_easy_dev": {"benchmark": "textworld", "split": "test", "role": "dev",
                               "ids": warm["textworld_easy_dev"]["ids"], **greedy},
        "textworld_easy_test": {"benchmark": "textworld", "split": "test", "role": "test",
                                "ids": [i for i in tw_spread if i not in tw_used][:28], **greedy},
    }
    return {
        "name": "learning", "frozen": "2026-12-07",
        "purpose": "the learning curves and the ablation on the start that can learn (issue 60): dev sets choose "
                   "arms, lengths, learning rates and checkpoints; test sets report each frozen recipe once",
        "contract": warmstart_protocol()["contract"], "sets": sets,
        "runs": {
            "curve1": {"seeds": [0, 1, 2], "dev": "points_dev", "test": "points_test",
                       "arms": ["rubric_scorer (SERA's own ranking credit)", "rubric_scorer_label (the label extension)"]},
            "curve2": {"seeds": [0, 1, 2, 3, 4], "dev": "textcraft_easy_dev", "test": "textcraft_easy_test",
                       "also": "textcraft_medium_test when the start solves medium dev tasks"},
            "ablation": {"seeds": [0, 1, 2, 3, 4], "dev": "points_dev", "test": "points_test",
                         "arms": ["sera", "sera_wo_rt"]},
        },
        "intervals": "over seeds: Student's t, 95%; within a seed: exact McNemar on paired success, a seeded "
                     "bootstrap over tasks or points (sera_core.eval.aggregate)",
        "measures": [
            {"run": "curve1", "set": "points_test", "measure": "greedy pairwise accuracy, SERA's own credit",
             "target": ">= 0.65, t-interval above 0.50"},
            {"run": "curve2", "set": "textcraft_easy_test", "measure": "root success, after - before",
             "target": ">= +0.10, t-interval above 0"},
            {"run": "ablation", "set": "points_test", "measure": "greedy pairwise accuracy, SERA - w/o RT",
             "target": "t-interval above 0"},
        ],
        "rule": "a miss is reported as a miss, with what was tried",
    }
