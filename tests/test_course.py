"""The notebooks' shared helpers: task picking, the noisy expert, a results row."""

from __future__ import annotations

import pytest

from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.course import eval_row, noisy_expert, pick_tasks
from sera_core.envs.textcraft.tasks import generate_split as craft_split
from sera_core.envs.textworld.tasks import generate_split as world_split
from sera_core.policy.base import SamplingParams


def test_pick_tasks_filters_by_level_family_and_count():
    val = craft_split("val")
    medium = [t for t in val if t["misc"]["difficulty"] == "medium"]
    assert pick_tasks("textcraft", difficulty="medium", count=3) == medium[:3]  # the evaluation split by default
    mixed = pick_tasks("textcraft", difficulty=("hard", "easy"), per_level=2)
    assert [t["misc"]["difficulty"] for t in mixed] == ["hard", "hard", "easy", "easy"]
    assert pick_tasks("textcraft", "train", count=2) == craft_split("train")[:2]
    gate = pick_tasks("textworld", family="dependency_gate", difficulty="medium")
    assert gate == [t for t in world_split("test") if t["task_family"] == "dependency_gate" and t["difficulty"] == "medium"]
    assert len(gate) == 50
    with pytest.raises(ValueError, match="env"):
        pick_tasks("minecraft")


def test_setup_resolves_the_smoke_switch_loads_the_config_and_checks_what_the_notebook_needs(monkeypatch):
    from sera_core.course import setup
    from sera_core.train.config import ConfigError

    monkeypatch.delenv("SERA_SMOKE", raising=False)
    lesson = setup("textcraft/sera_tiny.yaml", False, benchmark="textcraft", loss="cispo", native=True, trees_per_task=3)
    assert not lesson.smoke and lesson.config.trees_per_task == 3 and lesson.scale(8, 2) == 8
    assert lesson.settings(branches=False).counterfactual == 0 and lesson.settings().counterfactual == lesson.config.counterfactual
    assert lesson.tasks("train", difficulty="easy", count=2) == pick_tasks("textcraft", "train", difficulty="easy", count=2)
    monkeypatch.setenv("SERA_SMOKE", "1")  # CI's switch wins over the parameter
    assert setup("textcraft/sera_tiny.yaml", False).scale(8, 2) == 2 and setup(None, False).config is None
    with pytest.raises(ValueError, match="this notebook needs env: textworld"):
        setup("textcraft/sera_tiny.yaml", True, benchmark="textworld")
    with pytest.raises(ConfigError, match="not_a_key"):  # a bad key fails before any work, naming the key
        setup("textcraft/sera_tiny.yaml", True, not_a_key=1)


def test_one_selection_serves_splits_files_spread_levels_and_says_what_is_missing(tmp_path):
    from sera_core.envs.registry import select_tasks
    from sera_core.utils.jsonio import write_jsonl

    val = craft_split("val")
    easy = [t for t in val if t["misc"]["difficulty"] == "easy"]
    spread = pick_tasks("textcraft", difficulty="easy", per_level=3, spread=True)
    assert spread == [easy[0], easy[len(easy) // 3], easy[2 * (len(easy) // 3)]]  # evenly over the level
    path = tmp_path / "mine.jsonl"
    mine = easy[:3] + [t for t in val if t["misc"]["difficulty"] == "medium"][:2]
    write_jsonl(path, mine)
    assert pick_tasks("textcraft", str(path)) == mine  # a task file: every record when no level is asked
    assert pick_tasks("textcraft", str(path), difficulty="easy") == easy[:3]
    with pytest.raises(ValueError, match=f"{path}: no task of difficulty extreme"):
        pick_tasks("textcraft", str(path), difficulty="extreme")
    write_jsonl(path, [{"not": "a task"}])
    with pytest.raises(ValueError, match=":1"):  # each record of a file is validated, the line named
        pick_tasks("textcraft", str(path))
    with pytest.raises(ValueError, match="splits train, val, not 'test'"):
        pick_tasks("textcraft", "test")
    assert select_tasks("textcraft", [], difficulty="easy") == []  # nothing to select from is not an error


def test_the_noisy_expert_makes_seeded_mistakes_on_both_benchmarks():
    tasks = pick_tasks("textcraft", difficulty="medium", count=3)
    clean = Runtime("textcraft", noisy_expert(0.0), RuntimeConfig(seed=0)).run(tasks, trees=2)
    noisy = Runtime("textcraft", noisy_expert(), RuntimeConfig(seed=0)).run(tasks, trees=2)
    again = Runtime("textcraft", noisy_expert(), RuntimeConfig(seed=0)).run(tasks, trees=2)
    assert all(r.tree.root_reward == 1.0 for r in clean)
    assert [r.tree.root_reward for r in noisy] == [r.tree.root_reward for r in again]  # seeded
    assert len({r.tree.root_reward for r in noisy}) == 2  # some trees fail: rewards differ between trees
    expert = noisy_expert(textworld={"mistake": 0.4})
    world, craft = expert.configs["textworld"], expert.configs["textcraft"]
    assert world.mistake == 0.4 and world.early_finish == 0.05 and craft.waste == 0.3
    with pytest.raises(ValueError, match="no benchmark named minecraft"):
        noisy_expert(minecraft={"waste": 0.1})


def test_the_noisy_experts_lenient_scorer_passes_a_seeded_share_of_the_failures():
    """``lenient`` (notebook 07): a seeded share of the scoring calls gives full marks whatever
    the child did (the embedded policy's scoring mistake), so some groups rank a failure level
    with the successes and ``L_rank > 0``; the honest scorer ranks every group perfectly."""
    from sera_core.agents.corpus import default_tokenizer
    from sera_core.policy.expert import ExpertPolicy, lenient_score
    from sera_core.rubrics import GLOBAL_RUBRIC

    tasks = pick_tasks("textcraft", "train", difficulty="medium", count=1)

    def points(lenient: float) -> list:
        expert = noisy_expert(lenient=lenient, textcraft={"waste": 0.15, "early_finish": 0.05})
        rollouts = Runtime("textcraft", expert, RuntimeConfig(seed=0, counterfactual=4)).run(tasks, trees=2)
        return [p for r in rollouts for p in r.points if not p.ranking.skipped]

    honest, lenient, again = points(0.0), points(0.5), points(0.5)
    assert honest and all(p.ranking.loss == 0 for p in honest)
    assert [p.scores for p in lenient] == [p.scores for p in again]  # seeded
    assert any(p.ranking.loss > 0 for p in lenient)
    failed = [s for p in lenient for s, y, b in zip(p.scores, p.labels, p.branches) if y is False and b.score_turn]
    assert 0 < failed.count(1.0) < len(failed)  # a share of the scored failures passed, not every one
    everyone = [s for p in points(1.0) for s, b in zip(p.scores, p.branches) if b.score_turn]
    assert everyone and set(everyone) == {1.0}
    full = lenient_score(GLOBAL_RUBRIC)
    assert full["success"] and full["final_score"] == 1.0 and {c["score"] for c in full["criterion_scores"]} == {1.0}
    with pytest.raises(ValueError, match="lenient"):
        ExpertPolicy(default_tokenizer(), lenient=1.5)


def test_eval_row_reads_a_summary():
    summary = {"by_difficulty": {"easy": {"mean": 50.0}, "hard": {"mean": 0.0}}, "average": {"mean": 20.0}, "errors": 1}
    assert eval_row(summary) == {"easy": 50.0, "hard": 0.0, "average": 20.0, "errors": 1}


def test_rollout_policy_follows_the_configs_backend():
    """``backend: hf`` gives the transformers backend on the config's model (``backend:
    vllm``, the tiny configs' default, is exercised by notebook 07 under nbval)."""
    from sera_core.course import rollout_policy
    from sera_core.policy.hf import HFPolicy
    from sera_core.tiny.recipe import ASSETS
    from sera_core.train.config import load_config

    policy = rollout_policy(load_config("textcraft/sera_tiny.yaml", backend="hf", model=str(ASSETS)))
    assert isinstance(policy, HFPolicy) and policy.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=2))


def test_expert_configs_are_given_by_benchmark_name_and_default_to_the_registrys():
    from sera_core.agents.corpus import default_tokenizer
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.policy.expert import ExpertPolicy

    with pytest.raises(ValueError, match="no benchmark named minecraft"):
        ExpertPolicy(default_tokenizer(), minecraft=None)
    explained = ExpertPolicy(default_tokenizer(), explain=True)
    assert set(explained.configs) == set(BENCHMARKS) and explained.configs["textcraft"].explain
    assert explained.configs["textworld"] == BENCHMARKS["textworld"].expert_config()


def test_the_clis_expert_noise_is_its_mistake_rate_with_half_as_many_early_finishes():
    from sera_core.agents.actors import make_actor

    configs = make_actor("expert", noise=0.2).configs
    assert (configs["textcraft"].waste, configs["textcraft"].early_finish) == (0.2, 0.1)
    assert (configs["textworld"].mistake, configs["textworld"].early_finish) == (0.2, 0.1)


def test_a_recorded_fixture_loads_as_typed_rollouts_and_a_damaged_file_fails_naming_it(tmp_path):
    """A small fixture recorded with the noisy expert in the policy's place (seconds): what
    notebooks 04-07 read comes back typed and checked, and a changed byte is refused."""
    import dataclasses
    import gzip
    import json
    import shlex

    from sera_core.agents.points import DelegationPoint
    from sera_core.agents.tree import Tree
    from sera_core.cli import _setting, build_parser
    from sera_core.agents.view import render_tree
    from sera_core.course import DELEGATING_FILE, FIXTURE_FILES, config_hash, load_fixture, record_fixture, stale_fixture
    from sera_core.train.config import load_config

    out = tmp_path / "fixture"
    small = dict(overrides={"trees_per_task": 2}, expert_tasks=1, points=1, policy_tasks=2, policy=noisy_expert(),
                 policy_split="val", delegating_tasks=1)
    with pytest.raises(ValueError, match="at policy seed 4 every task's trees end alike"):  # refused before the rest
        record_fixture(out, **small, policy_seed=4)
    assert not out.exists()
    with pytest.raises(ValueError, match="seed tries: at least 1, not 0"):
        record_fixture(out, **small, seed_tries=0)
    manifest = record_fixture(out, **small, policy_seed=4, seed_tries=3)  # 4 refused, 5 kept: the next is tried
    fixture = load_fixture(out, load_config("textcraft/sera_tiny.yaml", trees_per_task=2))
    assert fixture.manifest == manifest == json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["hash"] == config_hash(load_config("textcraft/sera_tiny.yaml", trees_per_task=2))
    assert manifest["command"].startswith("sera course record --out ") and "--set trees_per_task=2" in manifest["command"]
    assert set(manifest["files"]) == {*FIXTURE_FILES.values(), DELEGATING_FILE} and manifest["bytes"] < 400_000
    # the delegating tree: the first medium task's greedy tree, whose root delegated (the expert always does there)
    delegating = manifest["delegating"]
    assert delegating["kept"] == fixture.policy_delegating.tree_id == delegating["delegated"][0]
    assert len(delegating["tasks"]) == 1 and delegating["settings"]["temperature"] == 0.0
    assert fixture.policy_delegating.delegation_events() and all(
        n.rubric and n.score for n in fixture.policy_delegating.nodes.values() if n.parent_id is not None)
    assert fixture.delegating_words() == (f"tree {delegating['kept']}: the first of the 1 greedy trees, of 1 medium "
                                          "val tasks tried, whose root delegated")
    view = fixture.delegating_view()  # what notebook 00 prints: the words, the tree, a graded child's rubric and score
    assert view.startswith(fixture.delegating_words() + "\n") and "graded by the policy against its own rubric" in view
    assert render_tree(fixture.policy_delegating) in view
    none = dataclasses.replace(fixture, policy_delegating=None,
                               manifest={**manifest, "delegating": {**delegating, "delegated": [], "kept": None}})
    assert none.delegating_words() == "none: the policy's greedy root delegated on none of the 1 medium tasks tried"
    assert none.delegating_view() == none.delegating_words()  # nothing more to show
    older = dataclasses.replace(fixture, policy_delegating=None, manifest={**manifest, "delegating": None})
    recorded_with = dict(overrides={"trees_per_task": 2}, expert_tasks=1, points=1, policy_tasks=2, policy_split="val",
                         delegating_tasks=1)
    assert stale_fixture(out, **recorded_with, policy_seed=4, seed_tries=3) is None  # what --unless-current skips
    assert "was recorded with" in stale_fixture(out, **{**recorded_with, "delegating_tasks": 2}, policy_seed=4, seed_tries=3)
    assert stale_fixture(out, **recorded_with, policy_seed=6) == f"{out} kept policy seed 5, not one of the 1 tried from 6"
    assert "was recorded with the config" in stale_fixture(out, **{**recorded_with, "overrides": {}})  # load_fixture's
    assert "no course fixture here" in stale_fixture(tmp_path / "nothing", **recorded_with)
    assert older.delegating_words().startswith("not recorded: this fixture was recorded without the policy's delegating "
                                                "tree") and older.delegating_words().endswith(
        f"`{manifest['command']} --delegating-tasks 8` records one")
    assert manifest["code"]["sera_version"] and manifest["seeds"]["policy"] == 5 and manifest["seconds"] > 0
    assert len(fixture.expert_trees) == 2 and all(isinstance(t, Tree) for t in fixture.expert_trees + fixture.policy_trees)
    (point,) = fixture.expert_points
    (rescored,) = fixture.policy_points
    assert isinstance(point, DelegationPoint) and not point.ranking.skipped and len(point.branches) == 8  # mixed, B = 8
    assert (rescored.tree_id, rescored.child_id, rescored.labels) == (point.tree_id, point.child_id, point.labels)
    assert manifest["expert"]["groups"]["kept"] == 1 <= manifest["expert"]["groups"]["mixed"]
    rewards = manifest["policy"]["root_rewards"]
    assert len(fixture.policy_trees) == 4 and any(len(set(v)) > 1 for v in rewards.values())  # trees that differ
    assert [r.points for r in fixture.rollouts("expert") if r.tree.tree_id == point.tree_id] == [[point]]
    assert fixture.settings("expert").counterfactual == 8 and fixture.settings("policy").counterfactual == 0
    assert fixture.settings("rescore").rubric_temperature == 0.0
    assert fixture.settings("policy").max_steps_per_agent == 8
    renamed = json.loads(json.dumps(manifest))  # as recorded before the agent budget's rename
    renamed["policy"]["settings"]["max_steps"] = renamed["policy"]["settings"].pop("max_steps_per_agent")
    with pytest.raises(ValueError, match="'max_steps' was renamed 'max_steps_per_agent'.*sera course record"):
        dataclasses.replace(fixture, manifest=renamed).settings("policy")
    assert [t["id"] for t in fixture.policy_tasks] == list(rewards)
    args = build_parser().parse_args(shlex.split(manifest["command"])[1:])  # the command remakes this fixture
    assert (args.command, args.action, args.out, args.config, dict(_setting(s) for s in args.set)) == \
        ("course", "record", out, "textcraft/sera_tiny.yaml", {"trees_per_task": 2})
    assert (args.expert_tasks, args.points, args.policy_tasks, args.policy_split, args.seed, args.policy_seed,
            args.policy_max_steps, args.delegating_tasks) == (1, 1, 2, "val", 0, 5, 8, 1)  # the seed kept

    with pytest.raises(ValueError, match="recorded with the config textcraft/sera_tiny.yaml"):
        load_fixture(out, load_config("textcraft/sera_tiny.yaml"))  # another K: another config
    played_by_another = {**manifest, "model": {"model": "tiny", "adapter_sha256": "0" * 64}}
    (out / "manifest.json").write_text(json.dumps(played_by_another))
    with pytest.raises(ValueError, match="played by another adapter"):  # recorded logprobs are not this model's
        load_fixture(out, load_config("textcraft/sera_tiny.yaml", trees_per_task=2))
    damaged = out / FIXTURE_FILES["expert_points"]
    data = bytearray(gzip.decompress(damaged.read_bytes()))
    data[data.index(b'"label": true')] = ord(" ")
    damaged.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(ValueError, match=f"{damaged}: its sha256 differs.*sera course record"):
        load_fixture(out)
    damaged.unlink()
    with pytest.raises(ValueError, match=f"{damaged}: missing"):
        load_fixture(out)
    with pytest.raises(ValueError, match="no course fixture here.*sera course record"):
        load_fixture(tmp_path / "nothing")


def test_json_lines_round_trip_gzip_with_the_same_bytes_and_name_a_damaged_file(tmp_path):
    from sera_core.utils.jsonio import read_jsonl, write_jsonl

    rows = [{"a": 1}, {"b": [1, 2]}]
    write_jsonl(tmp_path / "x.jsonl.gz", rows)
    first = (tmp_path / "x.jsonl.gz").read_bytes()
    write_jsonl(tmp_path / "x.jsonl.gz", rows)
    assert (tmp_path / "x.jsonl.gz").read_bytes() == first and first[:2] == b"\x1f\x8b"  # gzip, time 0: same bytes
    assert list(read_jsonl(tmp_path / "x.jsonl.gz")) == rows
    (tmp_path / "cut.jsonl.gz").write_bytes(first[:-6])
    with pytest.raises(ValueError, match="cut.jsonl.gz: not readable gzip data"):
        list(read_jsonl(tmp_path / "cut.jsonl.gz"))


def test_sera_course_record_hands_its_arguments_to_record_fixture(tmp_path, monkeypatch, capsys):
    import json
    import pathlib

    import sera_core.course
    from sera_core.cli import main

    seen = {}

    def fake(out, config, **kwargs):
        seen.update(out=out, config=config, **kwargs)
        return {"config": {"hash": "h"}, "expert": {"groups": {"kept": 4}}, "policy": {"root_rewards": {}},
                "bytes": 1, "seconds": 2.0}

    monkeypatch.setattr(sera_core.course, "record_fixture", fake)
    assert main(["course", "record", "--out", str(tmp_path), "--set", "trees_per_task=3", "--policy-max-steps", "0"]) == 0
    assert seen["out"] == tmp_path and seen["config"] == "textcraft/sera_tiny.yaml"
    assert seen["overrides"] == {"trees_per_task": 3} and seen["policy_max_steps"] is None  # 0: the config's steps
    assert (seen["points"], seen["policy_seed"], seen["policy_split"], seen["delegating_tasks"]) == (4, 0, "train", 8)
    assert seen["seed_tries"] == 1 and json.loads(capsys.readouterr().out.splitlines()[-1])["command"] == "course"
    # --unless-current: a current fixture (course.stale_fixture says None) is not recorded again; the committed
    # fixture predates the recorded arguments, so it would be, and why is printed
    seen.clear()
    monkeypatch.setattr(sera_core.course, "stale_fixture", lambda out, config, **kwargs: None)
    assert main(["course", "record", "--out", str(tmp_path / "current"), "--unless-current"]) == 0
    assert not seen and json.loads(capsys.readouterr().out.splitlines()[-1])["recorded"] is False
    monkeypatch.undo()
    monkeypatch.setattr(sera_core.course, "record_fixture", fake)
    committed = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "fixture"
    assert main(["course", "record", "--out", str(committed), "--unless-current", "--policy-seed-tries", "4"]) == 0
    err = capsys.readouterr().err
    assert seen["seed_tries"] == 4 and "recording: " in err and "arguments it does not record" in err


def test_the_committed_fixture_still_loads_with_the_config_it_names():
    """A config key added later (``hashed_when_set``) must leave the committed fixture's config hash
    valid while at its default, and change it once set: notebooks 04-07 load this fixture."""
    import json
    from pathlib import Path

    from sera_core.course import config_hash, load_fixture
    from sera_core.train.config import load_config

    folder = Path(__file__).resolve().parents[1] / "notebooks" / "fixture"
    recorded = json.loads((folder / "manifest.json").read_text())["config"]
    cfg = load_config(recorded["name"], **recorded["overrides"])
    assert config_hash(cfg) == recorded["hash"]
    assert load_fixture(folder, cfg).manifest["config"]["hash"] == recorded["hash"]
    assert config_hash(cfg.replace(init_from="runs/x")) != recorded["hash"]
