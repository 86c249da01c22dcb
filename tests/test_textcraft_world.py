"""The recipe world generator: shape, determinism, JSON round trip."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from sera_core.envs.textcraft.world import (
    DOMAINS, Recipe, RecipeBook, WorldConfig, base_item_name, generate_world, item_domain,
)

NAME = re.compile(r"^([mcoat])(\d)_i(\d+)(?:_(\d+))?(?:_(\d+))?$")


def test_shape_of_default_world(book):
    assert len(book.base_items) == 50
    assert {"m3_ore", "c1_ore", "raw_o2", "raw_a0", "raw_t7"} <= set(book.base_items)
    assert len(book.recipes) == 5 * 12 * 25
    per_cell = Counter((item_domain(i), book.depth(i)) for i in book.recipes)
    assert set(per_cell.values()) == {25}
    assert {d for d, _ in per_cell} == set(DOMAINS)


def test_names_follow_the_official_pattern(book):
    for item in book.recipes:
        m = NAME.match(item)
        assert m, item
        digit, tier = int(m.group(2)), int(m.group(3))
        suffixes = [int(s) for s in m.groups()[3:] if s is not None]
        if tier >= 6:  # the tier repeats from tier 6 on
            assert suffixes and suffixes[0] == tier, item
            suffixes = suffixes[1:]
        assert len(suffixes) <= 1
        if suffixes:  # collision suffix 10*j + k, j in {1, 2}
            assert suffixes[0] % 10 == digit and suffixes[0] // 10 in (1, 2), item


def test_recipes_structure(book):
    ingredient_types, yields = Counter(), {}
    cross_domain = 0
    for item, recipe in book.recipes.items():
        tier = book.depth(item)
        depths = [book.depth(n) for n, _ in recipe.ingredients]
        assert max(depths) == tier - 1  # depth == tier: one ingredient from just below
        assert len({n for n, _ in recipe.ingredients}) == len(recipe.ingredients)
        assert all(a in (1, 2) for _, a in recipe.ingredients)
        assert 1 <= len(recipe.ingredients) <= 5
        ingredient_types[len(recipe.ingredients)] += 1
        yields.setdefault(tier, set()).add(recipe.result_count)
        cross_domain += any(item_domain(n) != item_domain(item) for n, _ in recipe.ingredients)
        same = [book.depth(n) for n, _ in recipe.ingredients if item_domain(n) == item_domain(item)]
        if tier < 4:  # below tier 4 only the two tiers below (cross-tier starts at 4)
            assert min(same) >= tier - 2
    assert yields[1] == {2, 3, 4} and yields[2] == {2, 3}
    assert all(yields[t] == {1} for t in range(6, 13))
    assert max(max(yields[t]) for t in range(3, 6)) == 2
    assert 0 < cross_domain < 60  # "a few" cross-domain items
    assert ingredient_types[1] == 125  # tier 1 recipes take one base item


def test_depths_match_tiers(book):
    for item in book.recipes:
        assert book.depth(item) == int(NAME.match(item).group(3))
    assert all(book.depth(b) == 0 for b in book.base_items)


def test_generation_is_deterministic_and_seeded():
    a, b = generate_world(WorldConfig(seed=3)), generate_world(WorldConfig(seed=3))
    assert a.to_json() == b.to_json()
    assert generate_world(WorldConfig(seed=4)).to_json() != a.to_json()


def test_world_is_identical_under_any_hash_seed(tmp_path):
    code = ("import json,hashlib;from sera_core.envs.textcraft.world import generate_world;"
            "print(hashlib.sha256(json.dumps(generate_world().to_json()).encode()).hexdigest())")
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_json_round_trip(tmp_path, book):
    path = tmp_path / "recipes.json"
    book.save(path)
    loaded = RecipeBook.load(path)
    assert loaded.to_json() == book.to_json()
    assert loaded.depths == book.depths
    assert json.loads(path.read_text())["recipes"]["m3_i5"]["result_count"] == book.recipes["m3_i5"].result_count


def test_items_per_tier_is_configurable():
    small = generate_world(WorldConfig(items_per_tier=5, max_tier=4))
    assert len(small.recipes) == 5 * 4 * 5


@pytest.mark.parametrize("bad", [dict(items_per_tier=0), dict(max_tier=1), dict(cross_tier_prob=1.5)])
def test_bad_world_config_fails_early(bad):
    with pytest.raises(ValueError):
        WorldConfig(**bad)


def test_recipe_book_rejects_broken_books():
    with pytest.raises(ValueError, match="neither base nor craftable"):
        RecipeBook({"x": Recipe("x", (("nothing", 1),), 1)}, base_items=("raw_a0",))
    with pytest.raises(ValueError, match="cycle"):
        RecipeBook({"x": Recipe("x", (("y", 1),), 1), "y": Recipe("y", (("x", 1),), 1)}, base_items=())
    with pytest.raises(ValueError, match="not a TextCraft recipe book"):
        RecipeBook.from_json({"recipes": {"x": {}}})


def test_base_item_names():
    assert [base_item_name(d, 3) for d in DOMAINS] == ["m3_ore", "c3_ore", "raw_o3", "raw_a3", "raw_t3"]
