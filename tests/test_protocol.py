"""The measurement protocol: the committed file is what its rules give, dev and test never share a
task, every id exists, and a run under another protocol is refused."""

from __future__ import annotations

import copy
import json

import pytest

from sera_core.eval.protocol import (PROTOCOLS, check_protocol, load_protocol, protocol_hash, protocol_tasks, require_protocol,
                                     warmstart_protocol)
from sera_core.utils.errors import UserInputError


def test_the_committed_warmstart_protocol_is_what_its_rules_choose():
    committed = load_protocol("warmstart")
    assert committed == json.loads(json.dumps(warmstart_protocol()))
    assert protocol_hash(committed) == protocol_hash(load_protocol(PROTOCOLS / "warmstart.json"))
    sets = committed["sets"]
    assert [len(sets[k]["ids"]) for k in ("textcraft_easy_test", "textcraft_medium_test", "textworld_easy_test")] == [50, 20, 28]
    assert {m["set"] for m in committed["measures"]} <= set(sets)


def test_the_sets_agree_with_what_sera_tiny_measure_plays_and_never_mix_dev_and_test():
    """The dev sets are the tasks measured so far (``sera tiny measure``'s selections); the test
    sets are later ids, disjoint from them and from the held-out points' tasks."""
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.tiny.measure import measured_tasks, points_tasks

    p = load_protocol("warmstart")
    ids = {name: set(spec["ids"]) for name, spec in p["sets"].items()}
    assert ids["scorer_points"] == {t["id"] for t in points_tasks("textcraft", 24)}
    assert ids["textworld_easy_dev"] == {BENCHMARKS["textworld"].task_id(t) for t in measured_tasks("textworld", 8)}
    assert p["sets"]["textcraft_medium_dev"]["ids"] == [t["id"] for t in measured_tasks("textcraft", 4)
                                                         if t["misc"]["difficulty"] == "medium"]
    assert ids["textcraft_medium_test"].isdisjoint(ids["scorer_points"] | ids["textcraft_medium_dev"])
    assert ids["textcraft_easy_test"].isdisjoint(ids["textcraft_easy_dev"])
    assert ids["textworld_easy_test"].isdisjoint(ids["textworld_easy_dev"])
    records = protocol_tasks(p, "textcraft_long_easy_t1")
    assert all(5 <= r["misc"]["num_craft_steps"] <= 8 and r["misc"]["difficulty"] == "easy" for r in records)
    assert [BENCHMARKS["textworld"].task_id(r) for r in protocol_tasks(p, "textworld_easy_test")] == \
        p["sets"]["textworld_easy_test"]["ids"]


def test_a_bad_protocol_or_a_run_under_another_one_is_refused():
    p = load_protocol("warmstart")
    mixed = copy.deepcopy(p)
    mixed["sets"]["textcraft_easy_test"]["ids"][0] = mixed["sets"]["textcraft_easy_dev"]["ids"][0]
    with pytest.raises(UserInputError, match="both a dev and a test set"):
        check_protocol(mixed)
    missing = copy.deepcopy(p)
    missing["sets"]["textcraft_medium_test"]["ids"][3] = "textcraft_synth.val.999999"
    with pytest.raises(UserInputError, match=r"not in textcraft val.*999999"):
        protocol_tasks(missing, "textcraft_medium_test")
    require_protocol(protocol_hash(p), p, "a run")
    with pytest.raises(UserInputError, match="recorded under protocol 0123"):
        require_protocol("0123", p, "a run")
    with pytest.raises(UserInputError, match="no protocol"):
        load_protocol("nonesuch")
