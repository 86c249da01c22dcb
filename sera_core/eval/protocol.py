"""Measurement protocols, fixed before the runs they report (docs/protocol.md).

A protocol is a JSON file under ``sera_core/configs/protocol/``: named task sets, each with its
benchmark, split, explicit task ids, its role (``dev``: may guide choices, measured as often
as needed; ``test``: touched once per frozen candidate) and how it is played (temperature,
trees per task, the evaluation contract's caps); and the measures with their targets. Its
hash (:func:`protocol_hash`, the first 16 hex digits of the sha256 of its JSON) goes into
every reported run; :func:`require_protocol` refuses a run recorded under another hash.

:func:`warmstart_protocol` states the rules that chose the warm-start protocol's ids, and a
test checks that the committed file is what they give, so neither can change alone.
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
