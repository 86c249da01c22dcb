"""Task generation: official sizes and fields, hold-out, gold plans, inventories."""

from __future__ import annotations

import pytest

from sera_core.envs.textcraft.planner import (
    InfeasiblePlan, base_requirements, plan_crafts, simulate, split_requirements,
)
from sera_core.envs.textcraft.tasks import (
    DIFFICULTY_DEPTHS, TaskConfig, book_for_record, generate_split, holdout_items, render_goal,
    validate_record,
)
from sera_core.envs.textcraft.world import WorldConfig, item_domain


def test_val_split_reproduces_official_sizes(val_tasks):
    counts = {d: 0 for d in DIFFICULTY_DEPTHS}
    for r in val_tasks:
        counts[r["misc"]["difficulty"]] += 1
    assert counts == {"easy": 147, "medium": 213, "hard": 136, "extreme": 136}
    assert [r["id"] for r in val_tasks[:3]] == ["textcraft_synth.val.0", "textcraft_synth.val.1", "textcraft_synth.val.2"]
    assert len({r["misc"]["difficulty"] for r in val_tasks[:20]}) > 1  # shuffled order


def test_record_fields_match_the_official_format(val_tasks):
    for r in val_tasks:
        assert list(r) == ["goal", "id", "max_steps", "misc"]
        m = r["misc"]
        assert r["goal"] == render_goal(m["target_items"])
        assert r["goal"].startswith("Craft the following items: ")
        assert r["max_steps"] == 75
        assert m["num_craft_steps"] == len(m["gold_trajectory"])
        low, high = DIFFICULTY_DEPTHS[m["difficulty"]]
        assert low <= m["max_depth"] <= high
        assert all(1 <= n <= 3 for n in m["target_items"].values())
        step = m["gold_trajectory"][-1]
        assert set(step) == {"action", "target", "ingredients", "result_count"} and step["action"] == "craft"


def test_plan_lengths_resemble_the_official_data(val_tasks):
    steps = {d: [r["misc"]["num_craft_steps"] for r in val_tasks if r["misc"]["difficulty"] == d] for d in DIFFICULTY_DEPTHS}
    # official sample ranges: easy 1-7, medium 7-54, hard 48-133, extreme 144-182
    assert max(steps["easy"]) <= 12
    assert 5 <= min(steps["medium"]) and max(steps["medium"]) <= 80
    assert 30 <= min(steps["hard"]) and max(steps["hard"]) <= 170
    assert 100 <= min(steps["extreme"]) and max(steps["extreme"]) <= 260


def test_gold_plans_are_valid_and_inventories_suffice(book, val_tasks):
    for r in val_tasks:
        m = r["misc"]
        final = simulate(book, m["initial_inventory"], m["gold_trajectory"])
        for t, n in m["target_items"].items():
            assert final[t] - m["initial_inventory"].get(t, 0) >= n
        # enough for a solver that delegates three levels piecewise, not just for gold
        need = split_requirements(book, m["target_items"], 3)
        assert all(m["initial_inventory"].get(k, 0) >= v for k, v in need.items())


def test_inventories_hold_distractors(book, val_tasks):
    with_distractor = 0
    for r in val_tasks:
        used = base_requirements(book, r["misc"]["gold_trajectory"])
        unused = [k for k in r["misc"]["initial_inventory"] if k not in used]
        assert all(book.is_base(k) for k in r["misc"]["initial_inventory"])
        with_distractor += bool(unused)
        domains = {item_domain(t) for t in r["misc"]["target_items"]}
        assert any(item_domain(k) not in domains for k in unused)
    assert with_distractor == len(val_tasks)


def test_train_and_val_targets_never_overlap(book):
    cfg = TaskConfig()
    pools = holdout_items(book, cfg)
    assert not set(pools["train"]) & set(pools["val"])
    share = len(pools["val"]) / (len(pools["val"]) + len(pools["train"]))
    assert 0.18 <= share <= 0.22
    small = TaskConfig(splits={"train": {"medium": 60, "hard": 20}, "val": {"medium": 60, "hard": 20}})
    train_targets = {t for r in generate_split("train", small) for t in r["misc"]["target_items"]}
    val_targets = {t for r in generate_split("val", small) for t in r["misc"]["target_items"]}
    assert not train_targets & val_targets
    assert train_targets <= set(pools["train"]) and val_targets <= set(pools["val"])


def test_default_train_split_has_852_medium():
    cfg = TaskConfig()
    assert sum(cfg.splits["train"].values()) == 2522 and cfg.splits["train"]["medium"] == 852


def test_records_are_independent_of_each_other():
    cfg = TaskConfig(splits={"val": {"easy": 5, "medium": 5}})
    full = generate_split("val", cfg)
    assert generate_split("val", cfg) == full
    other_seed = generate_split("val", TaskConfig(seed=1, splits={"val": {"easy": 5, "medium": 5}}))
    assert other_seed != full


def test_plan_uses_available_intermediates_and_never_counts_existing_targets(book):
    target = next(i for i in sorted(book.recipes) if book.depth(i) == 3)
    recipe = book.recipes[target]
    full = plan_crafts(book, {target: 1}, strict=False)
    assert full[-1]["target"][0] == target
    ingredient = recipe.ingredients[0][0]
    partial = plan_crafts(book, {target: 1}, {ingredient: 100}, strict=False)
    assert ingredient not in [s["target"][0] for s in partial]
    again = plan_crafts(book, {target: 1}, {target: 5}, strict=False)
    assert again[-1]["target"][0] == target  # units already held do not count


def test_infeasible_plan_names_the_shortfall(book):
    target = next(i for i in sorted(book.recipes) if book.depth(i) == 2)
    with pytest.raises(InfeasiblePlan) as err:
        plan_crafts(book, {target: 2}, {})
    assert err.value.shortfall and all(book.is_base(k) for k in err.value.shortfall)


def test_simulate_rejects_a_bad_plan(book, val_tasks):
    r = val_tasks[0]
    steps = [dict(s) for s in r["misc"]["gold_trajectory"]]
    with pytest.raises(ValueError, match="needs"):
        simulate(book, {}, steps)
    steps[0] = {**steps[0], "result_count": steps[0]["result_count"] + 1}
    with pytest.raises(ValueError, match="does not match"):
        simulate(book, r["misc"]["initial_inventory"], steps)


def test_book_for_record(book, val_tasks):
    r = val_tasks[0]
    assert book_for_record(r) is book
    gold_book = book_for_record(r, official=True)
    assert set(gold_book.recipes) == {s["target"][0] for s in r["misc"]["gold_trajectory"]}
    for item, recipe in gold_book.recipes.items():
        assert recipe == book.recipes[item]


@pytest.mark.parametrize("record, message", [
    ({"goal": "x"}, "no 'misc'"),
    ({"misc": {"target_items": {"a": 1}}}, "lacks"),
    ({"misc": {"target_items": {"a": 0}, "initial_inventory": {}, "gold_trajectory": []}}, "positive"),
])
def test_validate_record(record, message):
    with pytest.raises(ValueError, match=message):
        validate_record(record)


def test_bad_task_config_fails_early():
    with pytest.raises(ValueError):
        TaskConfig(holdout_fraction=0.0)
    with pytest.raises(ValueError):
        TaskConfig(splits={"val": {"legendary": 3}})
    with pytest.raises(ValueError, match="max_tier"):
        TaskConfig(world=WorldConfig(max_tier=5))
    with pytest.raises(ValueError, match="unknown split"):
        generate_split("test")
