"""The measurement protocol: the committed file is what its rules give, dev and test never share a
task, every id exists, and a run under another protocol is refused."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from sera_core.eval.protocol import (PROTOCOLS, bind_protocol, check_protocol, learning_protocol, load_protocol,
                                     protocol_hash, protocol_tasks, require_protocol, warmstart_protocol)
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


def test_the_learning_protocols_test_sets_touch_no_task_that_guided_a_choice():
    """The committed ``learning`` protocol is what its rules give; its test sets share no task
    with its dev sets, with any set of the warm-start comparison (which chose the start), or with
    the tasks the curves chose on so far (the first 50 easy val tasks, the 34 points' 24 tasks);
    every id exists; the measures name its runs and sets."""
    from sera_core.tiny.measure import points_tasks

    committed = load_protocol("learning")
    assert committed == json.loads(json.dumps(learning_protocol()))
    sets = {name: set(spec["ids"]) for name, spec in committed["sets"].items()}
    tests = {name for name, spec in committed["sets"].items() if spec["role"] == "test"}
    seen = set().union(*(set(spec["ids"]) for spec in load_protocol("warmstart")["sets"].values()))
    seen |= set().union(*(sets[n] for n in sets if n not in tests))
    for name in tests:
        assert sets[name].isdisjoint(seen), name
    assert sets["points_dev"] == {t["id"] for t in points_tasks("textcraft", 24)}
    assert sets["textcraft_easy_dev"] == set(load_protocol("warmstart")["sets"]["textcraft_easy_dev"]["ids"])
    assert [len(sets[n]) for n in ("textcraft_easy_test", "points_test", "textworld_easy_test")] == [47, 24, 28]
    for name in sets:
        assert len(protocol_tasks(committed, name)) == len(sets[name])
    assert {m["run"] for m in committed["measures"]} == set(committed["runs"])
    assert all(m["set"] in tests for m in committed["measures"])
    assert protocol_hash(committed) != protocol_hash(load_protocol("warmstart"))


def test_a_results_folder_is_bound_to_one_protocol_and_set(tmp_path):
    """The first run writes ``protocol.json``; the same protocol and set continue; a changed
    protocol file (another hash), another set or an unknown set is refused, naming it."""
    record = bind_protocol(tmp_path / "out", "learning", "textcraft_easy_dev")
    assert record == {"name": "learning", "hash": protocol_hash(load_protocol("learning")), "set": "textcraft_easy_dev",
                      "role": "dev", "tasks": 50}
    assert bind_protocol(tmp_path / "out", "learning", "textcraft_easy_dev") == record
    with pytest.raises(UserInputError, match="measures set 'textcraft_easy_dev' of learning, not 'textcraft_easy_test'"):
        bind_protocol(tmp_path / "out", "learning", "textcraft_easy_test")
    changed = load_protocol("learning")
    changed["sets"]["textcraft_easy_dev"]["temperature"] = 1.0  # a protocol edited after the run began
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    with pytest.raises(UserInputError, match=f"recorded under protocol {record['hash']}, not learning"):
        bind_protocol(tmp_path / "out", tmp_path / "changed.json", "textcraft_easy_dev")
    with pytest.raises(UserInputError, match="has no set 'nonesuch'"):
        bind_protocol(tmp_path / "other", "learning", "nonesuch")


def test_a_policy_is_measured_on_a_protocols_sets_and_resumes(tmp_path):
    """``measure_protocol`` (``sera tiny measure --protocol``) on a small protocol of three sets
    of the warm-start protocol's kinds, with the scripted expert as the policy: greedy root success
    and well-formed turns, trees solved of ``trees`` per task at temperature 1, and the held-out
    points' pairwise accuracy; the folder is bound to the protocol, and a second call reads the
    finished sets instead of playing them again."""
    from sera_core.tiny.measure import measure_protocol

    warm = load_protocol("warmstart")
    small = {**warm, "name": "small", "sets": {
        "easy": {**warm["sets"]["textcraft_easy_test"], "ids": warm["sets"]["textcraft_easy_test"]["ids"][:2]},
        "long": {**warm["sets"]["textcraft_long_easy_t1"], "ids": warm["sets"]["textcraft_long_easy_t1"]["ids"][:1],
                 "trees": 2, "role": "test"},
        "scorer_points": {**warm["sets"]["scorer_points"], "ids": warm["sets"]["scorer_points"]["ids"][-2:]}}}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    out = tmp_path / "measured"
    results = measure_protocol("expert", path, out=out)
    sets = results["sets"]
    assert set(sets) == {"easy", "long", "scorer_points"} and results["protocol"]["hash"] == protocol_hash(small)
    assert sets["easy"]["tasks"] == 2 and sets["easy"]["trees"] == 2 and sets["easy"]["well_formed"] == 1.0
    assert sets["long"]["tasks"] == 1 and sets["long"]["trees"] == 2 and 0 <= sets["long"]["trees_solved"] <= 2
    assert sets["scorer_points"]["points"] >= 1 and 0 <= sets["scorer_points"]["pairwise_accuracy"] <= 1
    assert len(list((out / "long.trees.jsonl").read_text().splitlines())) == 2  # tree by tree, t0 and t1
    again = measure_protocol("expert", path, out=out)
    assert again == results  # read back, not played again
    one_at_a_time = measure_protocol("expert", path, out=tmp_path / "one", trees_in_flight=1)["sets"]
    assert list(one_at_a_time) == list(sets) == list(small["sets"])  # the file's order, whichever set ended first
    assert all({k: v for k, v in one_at_a_time[n].items() if k != "seconds"}  # sets played together, through
               == {k: v for k, v in sets[n].items() if k != "seconds"} for n in sets)  # a gate of 1 or 32: the same
    with pytest.raises(UserInputError, match="at least 1, not 0"):
        measure_protocol("expert", path, out=tmp_path / "none", trees_in_flight=0)
    assert not (tmp_path / "none").exists()  # refused before any work
    assert results["adapter"] is None  # a scripted expert plays no adapter
    with pytest.raises(UserInputError, match="measures expert, not vllm:tiny"):
        measure_protocol("vllm:tiny", path, out=out)


def test_two_measurements_are_compared_by_the_protocols_rule_tree_by_tree(tmp_path):
    """``sera tiny compare`` (:func:`~sera_core.tiny.verdict.compare_measurements`): a careful and
    a careless scripted expert measured on a small protocol with three measures; each measure's
    two values are the measurements' own figures, the paired counts are the trees each alone
    solved (their difference is the change in trees solved), the McNemar p follows from them, and
    the candidate ships exactly when it beats the other on more than half the measures. By
    default a measurement plays the sets its measures read even when they are dev sets."""
    from sera_core.agents.actors import noisy_expert
    from sera_core.eval.aggregate import mcnemar_exact
    from sera_core.tiny.measure import default_sets, measure_protocol
    from sera_core.tiny.verdict import compare_measurements, verdict_table

    warm = load_protocol("warmstart")
    small = {**warm, "name": "small", "sets": {
        "easy": {**warm["sets"]["textcraft_easy_test"], "ids": warm["sets"]["textcraft_easy_test"]["ids"][:4]},
        "long": {**warm["sets"]["textcraft_long_easy_t1"], "ids": warm["sets"]["textcraft_long_easy_t1"]["ids"][:2],
                 "trees": 2},
        "unread": {**warm["sets"]["textcraft_easy_dev"], "ids": warm["sets"]["textcraft_easy_dev"]["ids"][:1]}},
        "measures": [{"set": "easy", "measure": "root success", "target": 0.6},
                     {"set": "easy", "measure": "well-formed act turns", "target": 0.95},
                     {"set": "long", "measure": "trees solved of 32", "target": 3}]}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    assert default_sets(small) == ["easy", "long"]  # long is a dev set a measure reads; unread is neither
    careful = measure_protocol("expert", path, out=tmp_path / "careful")
    careless = measure_protocol("careless", path, out=tmp_path / "careless", actor=noisy_expert(0.9))
    verdict = compare_measurements(tmp_path / "careless", tmp_path / "careful", path)
    rows = {(r["set"], r["measure"]): r for r in verdict["measures"]}
    success, solved = rows["easy", "root success"], rows["long", "trees solved of 32"]
    assert success["candidate"] == careful["sets"]["easy"]["success"]["easy"] == 1.0
    assert success["shipped"] == careless["sets"]["easy"]["success"]["easy"]
    assert solved["candidate"] - solved["shipped"] == solved["gained"] - solved["lost"]
    assert (success["candidate"] - success["shipped"]) * 4 == success["gained"] - success["lost"]
    assert success["mcnemar_p"] == round(mcnemar_exact(success["gained"], success["lost"]), 4)
    assert all(r["beats_shipped"] == (r["candidate"] > r["shipped"]) for r in verdict["measures"])
    assert verdict["beaten"] >= 1 and verdict["ships"] == (verdict["beaten"] >= 2)
    assert success["meets_target"] and "beats the shipped adapter on" in verdict_table(verdict)
    assert verdict["adapters"] == {"shipped": None, "candidate": None} and "candidate: `expert`, no adapter" in verdict_table(verdict)
    same = compare_measurements(tmp_path / "careful", tmp_path / "careful", path)
    assert same["beaten"] == 0 and not same["ships"]  # a tie beats nothing
    assert all(r.get("mcnemar_p", 1.0) == 1.0 for r in same["measures"])
    with pytest.raises(UserInputError, match="measure the shipped adapter first"):
        compare_measurements(tmp_path / "nothing", tmp_path / "careful", path)
    from sera_core.cli import main

    written = tmp_path / "figures" / "warmstart.json"
    assert main(["tiny", "compare", "--protocol", str(path), "--save", str(tmp_path / "careful"),
                 "--against", str(tmp_path / "careless"), "--write", str(written)]) == 0
    record = json.loads(written.read_text())
    assert record.pop("command").startswith("sera tiny compare --save") and record == json.loads(json.dumps(verdict))


def test_a_candidate_that_wins_by_the_rule_is_shipped_whole_and_one_that_loses_moves_nothing(tmp_path):
    """``sera tiny ship`` (:func:`~sera_core.tiny.verdict.ship`): the candidate measurement's
    adapter folder (its policy ``vllm:FOLDER``) replaces the shipped folder when the rule says so,
    with exactly the shipped files and its measured figures in its manifest; a losing candidate, or
    one whose recipe the code no longer holds, leaves the shipped folder as it was."""
    import shutil

    from sera_core.agents.actors import make_actor, noisy_expert
    from sera_core.cli import main
    from sera_core.policy.models import EMBEDDED
    from sera_core.tiny.measure import measure_protocol, results_table
    from sera_core.tiny.verdict import SHIPPED_FILES, ship
    from sera_core.tiny.warmstart import RECIPES, read_manifest, shipped_recipe, write_manifest

    warm = load_protocol("warmstart")
    small = {**warm, "name": "small", "sets": {
        "easy": {**warm["sets"]["textcraft_easy_test"], "ids": warm["sets"]["textcraft_easy_test"]["ids"][:4]}},
        "measures": [{"set": "easy", "measure": "root success", "target": 0.6}]}
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small))
    adapter, shipped = tmp_path / "candidate", tmp_path / "embedded"
    for folder in (adapter, shipped):  # real adapter files: the candidate's and the place it goes
        shutil.copytree(EMBEDDED, folder, ignore=shutil.ignore_patterns("*.tmp"))
    (shipped / "stale.txt").write_text("from the adapter shipped before")
    measure_protocol(f"vllm:{adapter}", path, out=tmp_path / "good", actor=make_actor("expert"))
    measure_protocol("careless", path, out=tmp_path / "bad", actor=noisy_expert(0.9))
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}

    lost = ship(tmp_path / "bad", tmp_path / "good", path, to=shipped)
    assert not lost["ships"] and not lost["shipped"]
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before

    manifest = read_manifest(adapter)
    write_manifest(adapter, manifest | {"recipe_hash": "0" * 16})
    with pytest.raises(UserInputError, match="names recipe 0000000000000000"):
        ship(tmp_path / "good", tmp_path / "bad", path, to=shipped)
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    write_manifest(adapter, manifest)

    weights = adapter / "adapter_model.safetensors"  # the folder's weights changed after their measurement
    measured = weights.read_bytes()
    recorded = json.loads((tmp_path / "good" / "results.json").read_text())["adapter"]
    assert recorded == {"recipe_hash": manifest["recipe_hash"], "base": manifest["base"],
                        "adapter_sha256": hashlib.sha256(measured).hexdigest()}
    weights.write_bytes(measured[:-1] + bytes([measured[-1] ^ 1]))
    with pytest.raises(UserInputError, match=f"but {tmp_path / 'good'} measured adapter {recorded['adapter_sha256'][:12]}"):
        ship(tmp_path / "good", tmp_path / "bad", path, to=shipped)
    with pytest.raises(UserInputError, match="measure it into another folder"):
        measure_protocol(f"vllm:{adapter}", path, out=tmp_path / "good", actor=make_actor("expert"))
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before
    weights.write_bytes(measured)

    assert main(["tiny", "ship", "--protocol", str(path), "--save", str(tmp_path / "good"),
                 "--against", str(tmp_path / "bad"), "--out", str(shipped)]) == 0
    assert sorted(p.name for p in shipped.iterdir()) == sorted(SHIPPED_FILES)
    assert (shipped / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
    figures = read_manifest(shipped)["results"]
    good = json.loads((tmp_path / "good" / "results.json").read_text())
    assert {k: v for k, v in figures.items() if k != "note"} == good["sets"]
    assert good["protocol"]["hash"] in figures["note"] and "1 of 1 measures" in figures["note"]
    assert shipped_recipe(shipped) is RECIPES["first"]
    table = results_table(figures)  # notebook 00's table of the shipped manifest: one column per set, its role in it
    assert list(table) == ["easy"] and table["easy"]["role"] == "test" and table["easy"]["tasks"] == 4
    assert table["easy"]["success easy"] == good["sets"]["easy"]["success"]["easy"]


def test_the_manifest_results_table_reads_both_shapes_a_manifest_holds():
    """``results_table`` (notebook 00): a manifest from before the protocols (one entry per benchmark,
    the scorer's points nested in TextCraft's) gives one column per benchmark and no role; one written
    by ``sera tiny ship`` (one entry per protocol set) gives one column per set with its role, a
    points set's greedy pairwise accuracy among them; the note is never a column."""
    from sera_core.tiny.measure import results_table

    played = {"tasks": 8, "well_formed": 0.9, "rubric_validity": None, "score_validity": 1.0, "delegations": 2,
              "success": {"easy": 0.5}, "delegating_tasks": {"easy": 0.25}}
    points = {"points": 34, "pairwise_accuracy": 0.62, "ranking_loss": 0.15, "mixed": 34}
    old = results_table({"textcraft": played | {"points": points}, "textworld": played, "note": "how"})
    assert list(old) == ["textcraft", "textworld"] and "role" not in old["textcraft"]
    assert old["textcraft"] == {"tasks": 8, "well-formed turns": 0.9, "valid rubrics": None, "valid scores": 1.0,
                                "success easy": 0.5, "delegating easy": 0.25}
    new = results_table({"textcraft_easy_test": played | {"role": "test", "trees": 8, "trees_solved": 4},
                         "scorer_points": points | {"role": "test"}, "note": "how"})
    assert new["textcraft_easy_test"]["role"] == "test" and new["textcraft_easy_test"]["success easy"] == 0.5
    assert new["scorer_points"] == {"role": "test", "points": 34, "greedy pairwise accuracy": 0.62, "ranking loss": 0.15}


def test_an_experiment_folder_is_bound_to_the_adapter_its_runs_start_from(tmp_path):
    """``bind_start`` (the learning scripts' ``OUT/start.json``): the first call records the
    adapter a spec plays (the sha256 of its weights file, its recipe), a later call with the same
    weights reads it back, and one after the weights changed (an adapter shipped in its place) is
    refused before any work, naming both; a folder from before it has no start."""
    import shutil

    from sera_core.policy.models import EMBEDDED
    from sera_core.tiny.measure import bind_start, read_start

    adapter = tmp_path / "adapter"
    shutil.copytree(EMBEDDED, adapter, ignore=shutil.ignore_patterns("*.tmp"))
    weights = adapter / "adapter_model.safetensors"
    out = tmp_path / "curve"
    assert read_start(out) is None
    first = bind_start(out, f"vllm:{adapter}")
    assert first["adapter"]["adapter_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert read_start(out) == first and bind_start(out, f"vllm:{adapter}") == first
    measured = weights.read_bytes()
    weights.write_bytes(measured[:-1] + bytes([measured[-1] ^ 1]))
    with pytest.raises(UserInputError, match=f"started from vllm:{adapter}, adapter {first['adapter']['adapter_sha256'][:12]}"):
        bind_start(out, f"vllm:{adapter}")
    assert read_start(out) == first  # the record is kept as it was
    assert bind_start(tmp_path / "checkpoint", "vllm:runs/a/checkpoint")["adapter"] is None  # no adapter: the spec names it
    with pytest.raises(UserInputError, match="started from vllm:runs/a/checkpoint, no adapter; vllm:runs/b/checkpoint"):
        bind_start(tmp_path / "checkpoint", "vllm:runs/b/checkpoint")


def test_sera_tiny_measure_hands_the_feed_and_the_engine_to_measure_protocol(tmp_path, monkeypatch, capsys):
    """``sera tiny measure --protocol P --save DIR --trees-in-flight N --kv-cache-gib G``: the
    shipped adapter through vLLM, N trees at a time, an engine of G GiB of KV cache; a KV cache
    of 0 is refused before any work."""
    import sera_core.tiny.measure
    from sera_core.cli import main
    from sera_core.policy.models import EMBEDDED

    seen = {}

    def fake(spec, protocol, sets, **kwargs):
        seen.update(spec=spec, protocol=protocol, sets=sets, **kwargs)
        return {"sets": {}}

    monkeypatch.setattr(sera_core.tiny.measure, "measure_protocol", fake)
    assert main(["tiny", "measure", "--protocol", "warmstart", "--save", str(tmp_path / "m"),
                 "--trees-in-flight", "3", "--kv-cache-gib", "4"]) == 0
    assert (seen["spec"], seen["protocol"], seen["sets"], seen["out"]) == (f"vllm:{EMBEDDED}", "warmstart", None, tmp_path / "m")
    assert seen["trees_in_flight"] == 3 and seen["engine"].kv_cache_gib == 4.0
    seen.clear()
    assert main(["tiny", "measure", "--protocol", "warmstart", "--save", str(tmp_path / "m"), "--kv-cache-gib", "0"]) == 2
    assert not seen and "--kv-cache-gib: a size in GiB above 0, not 0.0" in capsys.readouterr().out
    assert main(["tiny", "measure", "--protocol", "warmstart", "--save", str(tmp_path / "m")]) == 0
    assert seen["engine"] is None  # the engine's own default
