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
