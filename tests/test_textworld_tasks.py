"""TextWorld-Sync task generation: official sizes, seeds, bands, family structure, texts."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from sera_core.envs.textworld.data import FOLDS, branch_work, load_foods, task_foods
from sera_core.envs.textworld.tasks import (
    BANDS,
    DIFFICULTIES,
    DISH_KEYS,
    FAMILIES,
    GAME_PARAM_KEYS,
    PARALLELISM_KEYS,
    RECIPE_KEYS,
    SPLITS,
    TOP_LEVEL_KEYS,
    TaskConfig,
    generate_split,
    make_task,
    render_coarse,
    render_structured,
    seed_for,
    split_stats,
    validate_record,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return {split: generate_split(split) for split in SPLITS}


@pytest.fixture(scope="module")
def everything(splits) -> list[dict]:
    return [r for records in splits.values() for r in records]


@pytest.fixture(scope="module")
def official(official_dir) -> list[dict]:
    path = official_dir / "textworld_sync_test_sample.jsonl"
    if not path.is_file():
        pytest.skip("official TextWorld-Sync sample is not present")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def works(record: dict) -> list[int]:
    return [d["estimated_branch_work"] for d in record["dishes"]]


def prepared_counts(record: dict) -> list[int]:
    return [sum(e["requires_preparation"] for e in d["recipe"]) for d in record["dishes"]]


def of_family(records: list[dict], family: str) -> list[dict]:
    chosen = [r for r in records if r["task_family"] == family]
    assert chosen
    return chosen


# --------------------------------------------------------------------------- sizes, order, seeds

def test_test_split_has_official_size_order_ids_and_seeds(splits):
    records = splits["test"]
    assert len(records) == 1400
    expected = [(d, f, i) for d in DIFFICULTIES for f in FAMILIES for i in range(50)]
    assert [(r["difficulty"], r["task_family"], int(r["task_id"][-4:])) for r in records] == expected
    assert records[0]["task_id"] == "cookingworld_multidish_test_multi_dish_fork_join_easy_0000"
    assert records[-1]["task_id"] == "cookingworld_multidish_test_hierarchical_extreme_0049"
    for r in records:
        d, f, i = DIFFICULTIES.index(r["difficulty"]), list(FAMILIES).index(r["task_family"]), int(r["task_id"][-4:])
        assert r["seed"] == 820000 + 1000 * d + 100 * f + i
        assert r["seed"] == r["generation"]["v7_seed"] == r["generation"]["source_db_seed"]
        assert r["split"] == r["source_fold"] == r["generation"]["source_db_fold"] == "test"
    assert split_stats(records) == {
        "tasks": 1400, "by_difficulty": {d: 350 for d in DIFFICULTIES}, "by_family": {f: 200 for f in FAMILIES},
    }


def test_train_and_dev_sizes_spread_and_fields(splits):
    train, dev = splits["train"], splits["dev"]
    assert split_stats(train)["by_difficulty"] == {"medium": 900, "hard": 150, "extreme": 450}
    assert split_stats(dev)["by_difficulty"] == {d: 50 for d in DIFFICULTIES}
    cells = Counter((r["difficulty"], r["task_family"]) for r in train)
    assert [cells[("medium", f)] for f in FAMILIES] == [129, 129, 129, 129, 128, 128, 128]
    assert [cells[("hard", f)] for f in FAMILIES] == [22, 22, 22, 21, 21, 21, 21]
    assert [cells[("extreme", f)] for f in FAMILIES] == [65, 65, 64, 64, 64, 64, 64]
    dev_cells = Counter((r["difficulty"], r["task_family"]) for r in dev)
    assert all([dev_cells[(d, f)] for f in FAMILIES] == [8, 7, 7, 7, 7, 7, 7] for d in DIFFICULTIES)
    for split, records in (("train", train), ("dev", dev)):
        keys = [(DIFFICULTIES.index(r["difficulty"]), list(FAMILIES).index(r["task_family"]), int(r["task_id"][-4:]))
                for r in records]
        assert keys == sorted(keys)  # difficulty, family, index
        start = 850000 if split == "train" else 860000
        for r, (d, f, i) in zip(records, keys, strict=True):
            assert r["task_id"] == f"cookingworld_multidish_{split}_{r['task_family']}_{r['difficulty']}_{i:04d}"
            assert r["seed"] == start + 100000 * d + 200 * f + i
            assert r["split"] == r["source_fold"] == split
            assert r["generation"]["source_db_fold"] == {"train": "train", "dev": "valid"}[split]


def test_seeds_and_ids_never_repeat_across_splits(everything):
    assert len({r["seed"] for r in everything}) == len(everything) == 3100
    assert len({r["task_id"] for r in everything}) == 3100


def test_every_generated_record_validates_and_round_trips(everything):
    for r in everything:
        validate_record(r, r["task_id"])
        assert json.loads(json.dumps(r, sort_keys=True)) == r
        assert list(r) and set(r) == set(TOP_LEVEL_KEYS)


# --------------------------------------------------------------------------- bands and data

def test_difficulty_bands_are_respected(everything):
    for r in everything:
        band, gp, family = BANDS[r["difficulty"]], r["game_params"], r["task_family"]
        gen, par = r["generation"], r["parallelism"]
        sp, rt = gen["v7_sampled_parameters"], gen["v7_sampled_runtime"]
        assert gen["v7_parameter_band"] == band.parameter_band()
        assert gen["v7_runtime_band"] == band.runtime_band()
        assert band.dishes[0] <= gp["numDishes"] == len(r["dishes"]) == sp["dish_count"] <= band.dishes[1]
        assert band.ingredients_per_dish[0] <= gp["numIngredientsPerDish"] <= band.ingredients_per_dish[1]
        assert all(len(d["recipe"]) == gp["numIngredientsPerDish"] for d in r["dishes"])
        assert gp["numIngredientsTotal"] == gp["numDishes"] * gp["numIngredientsPerDish"]
        assert band.locations[0] <= gp["numLocations"] == sp["num_locations"] <= band.locations[1]
        assert band.distractors[0] <= gp["numDistractorItems"] == sp["num_distractor_items"] <= band.distractors[1]
        assert band.max_steps[0] <= par["shared_environment_max_steps"] == rt["shared_environment_max_steps"] \
            <= band.max_steps[1]
        assert rt["tool_cooldown_steps"] in band.tool_cooldown
        assert par["mechanisms"] == {"tool_cooldown_steps": rt["tool_cooldown_steps"]}
        assert sp["include_doors"] in band.include_doors and sp["limit_inventory_size"] in band.limit_inventory
        assert gp["includeDoors"] == int(sp["include_doors"] or family == "dependency_gate")
        assert gp["limitInventorySize"] == int(sp["limit_inventory_size"] or family == "resource_constrained")
        assert band.inventory_capacity[0] <= sp["inventory_capacity"] <= band.inventory_capacity[1]
        assert sp["preparation_complexity"] in band.complexity
        lo, hi = sp["min_prepared_ingredients_per_dish"], sp["max_prepared_ingredients_per_dish"]
        assert band.min_prepared[0] <= lo <= band.min_prepared[1] and band.max_prepared[0] <= hi <= band.max_prepared[1]
        assert all(lo <= p <= hi for p in prepared_counts(r))
        assert r["task_view"] == ("coarse" if r["difficulty"] == "extreme" else "structured")
        assert r["task_description"] == r["task_descriptions"][r["task_view"]]
    easy = [r for r in everything if r["difficulty"] == "easy" and r["task_family"] != "dependency_gate"]
    assert all(r["game_params"]["includeDoors"] == 0 for r in easy)
    assert all(r["game_params"]["includeDoors"] == 1 for r in everything if r["difficulty"] != "easy")


def test_ingredients_are_disjoint_and_preparations_come_from_the_fold(splits):
    foods = load_foods()
    for split, records in splits.items():
        used_preps: set[tuple[str, str]] = set()
        for r in records:
            names = [n for d in r["dishes"] for n in d["ingredient_names"]]
            assert len(names) == len(set(names)) and set(names) <= set(task_foods())
            for d in r["dishes"]:
                for e in d["recipe"]:
                    prep = tuple(e["preparation"])
                    assert prep in foods[e["name"]].preparations[FOLDS[split]]
                    assert e["candidate_source_locations"] == list(foods[e["name"]].locations)
                    assert len(e["candidate_source_locations"]) == 2
                    used_preps.add(prep)
        assert len(used_preps) >= 8  # preparations vary, not one fixed pair


def test_branch_work_and_parallelism_formulas(everything):
    for r in everything:
        par, k = r["parallelism"], len(r["dishes"])
        for d in r["dishes"]:
            for e in d["recipe"]:
                assert e["branch_work"] == branch_work(tuple(e["preparation"]))
                assert e["requires_preparation"] == (e["preparation"] != ["raw", "uncut"])
            assert d["estimated_branch_work"] == sum(e["branch_work"] for e in d["recipe"])
            assert d["ingredient_names"] == [e["name"] for e in d["recipe"]]
        total = sum(works(r))
        assert par["branches"] == k and par["total_branch_work"] == total
        assert par["critical_path_estimate"] == max(works(r)) + 2 * k
        assert par["estimated_sequential_actions"] == total + 2 * k + r["game_params"]["includeDoors"]
        assert par["ideal_parallel_speedup"] == round(total / par["critical_path_estimate"], 4)
        assert par["pattern"] == FAMILIES[r["task_family"]] and par["ingredient_disjoint"] is True


# --------------------------------------------------------------------------- family structure

def test_fork_join_dishes_carry_equal_work(everything):
    for r in of_family(everything, "multi_dish_fork_join"):
        assert max(works(r)) - min(works(r)) <= 1
        assert r["parallelism"]["dependencies"] == [] and r["parallelism"]["resource_capacity"] is None
        assert r["parallelism"]["shared_bottlenecks"] == ["kitchen", "meal_preparation", "meal_eating"]


def test_critical_path_has_one_much_longer_dish(everything):
    for r in of_family(everything, "critical_path"):
        w = sorted(works(r))
        assert w[-1] >= w[-2] + 3 and len(set(w[:-1])) == 1
        long = max(r["dishes"], key=lambda d: d["estimated_branch_work"])
        prepared = [e for e in long["recipe"] if e["requires_preparation"]]
        assert len(prepared) == BANDS[r["difficulty"]].max_prepared[1]
        assert all(e["branch_work"] == 3 for e in prepared)


def test_load_balanced_workloads_are_graded(everything):
    for r in of_family(everything, "load_balanced"):
        w = works(r)
        assert max(w) - min(w) >= 3
        assert len(set(w)) >= min(3, len(w))


def test_resource_constrained_limits_the_inventory(everything):
    for r in of_family(everything, "resource_constrained"):
        cap = r["generation"]["v7_sampled_parameters"]["inventory_capacity"]
        assert r["game_params"]["limitInventorySize"] == 1
        assert r["parallelism"]["resource_capacity"] == {"inventory": cap}
        assert r["parallelism"]["shared_bottlenecks"] == ["knife", "stove", "kitchen"]
        assert f"The shared inventory can hold at most {cap} ingredients at once." in r["task_description"]
    others = [r for r in everything if r["task_family"] != "resource_constrained"]
    assert all(r["parallelism"]["resource_capacity"] != {"inventory": 1} for r in others)


def test_dependency_gate_gates_every_dish_but_the_first(everything):
    for r in of_family(everything, "dependency_gate"):
        assert r["game_params"]["includeDoors"] == 1
        expected = [{"from": "gate_1", "to": f"dish_{k}", "type": "door"} for k in range(2, len(r["dishes"]) + 1)]
        assert r["parallelism"]["dependencies"] == expected
    assert not any(r["parallelism"]["dependencies"] for r in everything
                   if r["task_family"] not in ("dependency_gate", "hierarchical"))


def test_conflict_dishes_all_need_the_knife_and_the_stove(everything):
    for r in of_family(everything, "conflict"):
        for d in r["dishes"]:
            assert any(e["preparation"][0] == "fried" for e in d["recipe"])
            assert any(e["preparation"][1] != "uncut" for e in d["recipe"])
        par = r["parallelism"]
        assert par["resource_capacity"] == {"knife": 1, "stove": 1} and par["resource_conflict"] is True
        assert par["shared_bottlenecks"] == ["knife", "stove"]
        cooldown = par["mechanisms"]["tool_cooldown_steps"]
        assert cooldown >= 1 or BANDS[r["difficulty"]].tool_cooldown == (0,)
    assert not any(r["parallelism"]["resource_conflict"] for r in everything if r["task_family"] != "conflict")


def test_hierarchical_decomposes_dishes_into_ingredients(everything):
    for r in of_family(everything, "hierarchical"):
        par = r["parallelism"]
        assert par["hierarchy_depth"] == 2
        expected = []
        for d in r["dishes"]:
            expected.append({"from": "root", "to": d["dish_id"], "type": "decompose"})
            expected += [{"from": d["dish_id"], "to": f"{d['dish_id']}::{n}", "type": "decompose"}
                         for n in d["ingredient_names"]]
        assert par["dependencies"] == expected
        assert all(p == BANDS[r["difficulty"]].max_prepared[1] for p in prepared_counts(r))
    assert all(r["parallelism"]["hierarchy_depth"] == 1 for r in everything if r["task_family"] != "hierarchical")


def test_families_differ_in_average_work_shape(splits):
    """The spread of dish work separates the work-shaped families on the test split."""
    spread = {f: sum(max(works(r)) - min(works(r)) for r in of_family(splits["test"], f)) / 200 for f in FAMILIES}
    assert spread["multi_dish_fork_join"] == 0
    assert spread["critical_path"] >= 3 and spread["load_balanced"] >= 3
    assert spread["multi_dish_fork_join"] < spread["resource_constrained"] < spread["critical_path"]


# --------------------------------------------------------------------------- determinism

def _digest(records: list[dict]) -> str:
    return hashlib.sha256("\n".join(json.dumps(r, sort_keys=True) for r in records).encode()).hexdigest()


def test_generation_is_deterministic_in_process(splits):
    assert _digest(generate_split("dev")) == _digest(splits["dev"])
    r = splits["test"][777]
    again = make_task("test", r["task_family"], r["difficulty"], int(r["task_id"][-4:]), r["seed"], TaskConfig())
    assert again == r


def test_generation_is_identical_under_different_hash_seeds(splits):
    code = ("import hashlib, json; from sera_core.envs.textworld.tasks import generate_split; "
            "print(hashlib.sha256('\\n'.join(json.dumps(r, sort_keys=True) for r in generate_split('dev'))"
            ".encode()).hexdigest())")
    digests = set()
    for hash_seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                             check=True)
        digests.add(out.stdout.strip())
    assert digests == {_digest(splits["dev"])}


# --------------------------------------------------------------------------- official compatibility

def test_official_records_validate(official):
    assert len(official) >= 50
    for r in official:
        validate_record(r, r["task_id"])


def test_official_keys_equal_ours(official, splits):
    ours = splits["test"][0]
    assert set(ours) == set(TOP_LEVEL_KEYS)
    for r in official:
        assert set(r) == set(ours)
        assert set(r["game_params"]) == set(ours["game_params"]) == set(GAME_PARAM_KEYS)
        assert set(r["parallelism"]) == set(ours["parallelism"]) == set(PARALLELISM_KEYS)
        assert set(r["generation"]) == set(ours["generation"])
        assert set(r["task_descriptions"]) == set(ours["task_descriptions"])
        for key in ("v7_parameter_band", "v7_sampled_parameters", "v7_runtime_band", "v7_sampled_runtime"):
            assert set(r["generation"][key]) == set(ours["generation"][key])
        for d in r["dishes"]:
            assert set(d) == set(DISH_KEYS)
            assert all(set(e) == set(RECIPE_KEYS) for e in d["recipe"])


def test_official_band_objects_equal_ours(official):
    for r in official:
        band = BANDS[r["difficulty"]]
        assert r["generation"]["v7_parameter_band"] == band.parameter_band()
        assert r["generation"]["v7_runtime_band"] == band.runtime_band()


def test_renderers_reproduce_official_texts(official):
    families = set()
    for r in official:
        assert render_structured(r) == r["task_descriptions"]["structured"]
        assert render_coarse(r) == r["task_descriptions"]["coarse"]
        families.add(r["task_family"])
    assert families == set(FAMILIES)


# --------------------------------------------------------------------------- errors

def _set(path: tuple, value: object) -> Callable[[dict], None]:
    def apply(record: dict) -> None:
        obj = record
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return apply


def _repeat_ingredient(record: dict) -> None:
    record["dishes"][1]["recipe"][0] = copy.deepcopy(record["dishes"][0]["recipe"][0])
    record["dishes"][1]["ingredient_names"][0] = record["dishes"][0]["recipe"][0]["name"]


def _preparation_of_another_fold(record: dict) -> None:
    entry = next(e for d in record["dishes"] for e in d["recipe"] if e["requires_preparation"])
    allowed = load_foods()[entry["name"]].preparations
    entry["preparation"] = list(next(p for p in allowed["train"] if p not in allowed["test"]))


MUTATIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "missing field": (lambda r: r.pop("parallelism"), "missing fields parallelism"),
    "unknown family": (_set(("task_family",), "bogus"), "unknown task_family"),
    "unknown difficulty": (_set(("difficulty",), "insane"), "unknown difficulty"),
    "repeated ingredient": (_repeat_ingredient, "repeats across or within dishes"),
    "bad preparation": (_set(("dishes", 0, "recipe", 0, "preparation"), ["boiled", "uncut"]),
                        "is not a (cook, cut) pair"),
    "fold preparation": (_preparation_of_another_fold, "is not allowed in the test fold"),
    "wrong view text": (_set(("task_description",), "Eat something."), "task_description is not"),
    "tampered text": (_set(("task_descriptions", "coarse"), "Prepare and eat 2 dishes."),
                      "task_descriptions do not match"),
    "zero budget": (_set(("parallelism", "shared_environment_max_steps"), 0), "must be a positive int"),
    "bad formula": (_set(("parallelism", "critical_path_estimate"), 1), "critical_path_estimate disagree"),
    "bad seed": (_set(("generation", "v7_seed"), 1), "seed must be an int equal"),
    "bad task id": (_set(("task_id",), "cookingworld_multidish_test_conflict_easy_0000"), "does not name"),
    "out of band": (_set(("game_params", "numLocations"), 11), "numLocations 11 is outside the band 5-6"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_validate_record_rejects_malformed_records(splits, case):
    mutate, message = MUTATIONS[case]
    record = copy.deepcopy(splits["test"][0])
    validate_record(record)
    mutate(record)
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_record(record, "rec")


def test_validate_record_rejects_non_objects():
    with pytest.raises(ValueError, match="rec: expected an object"):
        validate_record(["not", "a", "record"], "rec")  # type: ignore[arg-type]


def test_config_and_split_errors():
    with pytest.raises(ValueError, match="unknown split"):
        generate_split("val")
    with pytest.raises(ValueError, match="collide"):
        TaskConfig(dev_seed_start=850000)
    with pytest.raises(ValueError, match="test cells overlap"):
        TaskConfig(tasks_per_cell=150)
    with pytest.raises(ValueError, match="train/dev cells overlap"):
        TaskConfig(train_counts={"medium": 7 * 201})
    with pytest.raises(ValueError, match="unknown difficulties"):
        TaskConfig(dev_counts={"nightmare": 3})
    with pytest.raises(ValueError, match="unknown split/family/difficulty"):
        make_task("test", "bogus", "easy", 0, 1)
    small = TaskConfig(tasks_per_cell=2, train_counts={"hard": 14}, dev_counts={"easy": 7})
    assert split_stats(generate_split("test", small))["tasks"] == 56
    assert seed_for("train", "conflict", "hard", 1, small) == 850000 + 200000 + 1000 + 1
