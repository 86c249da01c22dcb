"""The TextCraft environment: tools' success and error paths, the checker, state copies."""

from __future__ import annotations

import asyncio

import pytest

from sera_core.envs.textcraft.env import CraftWorld, TextCraftEnv, extract_code
from sera_core.envs.textcraft.world import Recipe, RecipeBook

# A hand-made book: two base items, three crafted items.
BOOK = RecipeBook(
    recipes={
        "a1_i1": Recipe("a1_i1", (("raw_a1", 2),), 3),                     # 2 raw -> 3 units
        "a2_i1": Recipe("a2_i1", (("raw_a2", 1),), 2),
        "a3_i2": Recipe("a3_i2", (("a1_i1", 1), ("a2_i1", 2)), 1),
    },
    base_items=("raw_a1", "raw_a2", "raw_t0"),
)


def make_env(inventory=None, targets=None, **kw) -> TextCraftEnv:
    world = CraftWorld(inventory=dict(inventory if inventory is not None else {"raw_a1": 10, "raw_a2": 10}))
    return TextCraftEnv(BOOK, world, targets or {"a3_i2": 2}, **kw)


def test_view_inventory_is_a_copy():
    env = make_env()
    inv = env.view_inventory()
    inv["raw_a1"] = 999
    assert env.world.inventory["raw_a1"] == 10


def test_get_info_reports_recipes_depths_and_unknowns():
    env = make_env()
    info = {d["item"]: d for d in env.get_info(["a3_i2", "raw_a1", "nonsense"])}
    assert info["a3_i2"] == {
        "item": "a3_i2", "can_craft": True, "is_base": False, "in_inventory": 0, "crafting_depth": 2,
        "recipes": [{"ingredients": {"a1_i1": 1, "a2_i1": 2}, "result_count": 1}],
    }
    assert info["raw_a1"]["is_base"] and not info["raw_a1"]["can_craft"] and info["raw_a1"]["in_inventory"] == 10
    assert info["nonsense"]["error"] == "unknown item 'nonsense'" and info["nonsense"]["crafting_depth"] is None
    assert env.get_info("a1_i1")[0]["item"] == "a1_i1"  # a lone name is accepted


def test_craft_success_updates_inventory_atomically():
    env = make_env()
    assert env.craft({"raw_a1": 4}, ("a1_i1", 6)) == "Crafted 6x a1_i1."
    assert env.world.inventory == {"raw_a1": 6, "raw_a2": 10, "a1_i1": 6}
    assert env.world.crafts == 1


@pytest.mark.parametrize("ingredients, target, expected", [
    ({"raw_a1": 2}, ("raw_a1", 1), "no recipe for raw_a1: it is a base item"),
    ({"raw_a1": 2}, ("dragon", 1), "no recipe for dragon: unknown item"),
    ({"raw_a1": 2}, ("a1_i1", 4), "count not divisible: a1_i1 is made 3 per craft"),
    ({"raw_a1": 2, "raw_t0": 1}, ("a1_i1", 3), "extra ingredient(s) not in the recipe for a1_i1: raw_t0"),
    ({"raw_a1": 3}, ("a1_i1", 3), "wrong amount for 3x a1_i1 (1 craft): raw_a1 needs 2, got 3"),
    ({"raw_a1": 2}, ("a1_i1", 6), "wrong amount for 6x a1_i1 (2 crafts): raw_a1 needs 4, got 2"),
    ({"a1_i1": 1}, ("a3_i2", 1), "missing ingredient(s) for a3_i2: a2_i1 (need 2)"),
    ({"raw_a1": 20}, ("a1_i1", 30), "insufficient raw_a1 (need 20, have 10)"),
    ({"raw_a1": 2}, ("a1_i1", 0), "count must be positive"),
    ({"raw_a1": "2"}, ("a1_i1", 3), "ingredients must be a dict"),
    ({"raw_a1": 2}, "a1_i1", "target must be a tuple"),
])
def test_craft_errors_say_what_was_wrong_and_change_nothing(ingredients, target, expected):
    env = make_env()
    before = env.snapshot()
    out = env.craft(ingredients, target)
    assert out.startswith("Error: ") and expected in out
    assert env.snapshot() == before


def test_checker_requires_finish():
    env = make_env()
    env.craft({"raw_a1": 2}, ("a1_i1", 3))
    env.craft({"raw_a2": 2}, ("a2_i1", 4))
    assert env.craft({"a1_i1": 2, "a2_i1": 4}, ("a3_i2", 2)) == "Crafted 2x a3_i2."
    verdict = env.check()
    assert not verdict.passed and verdict.reason == "finish() was not called" and verdict.gains == {"a3_i2": 2}
    assert env.finish("done") == "Finished."
    assert env.finish("again") == "Already finished."
    assert env.check().passed and env.state.finish_message == "done"


def test_pre_existing_targets_do_not_count():
    env = make_env({"raw_a1": 10, "raw_a2": 10, "a3_i2": 5})
    env.finish("nothing to do")
    verdict = env.check()
    assert not verdict.passed and verdict.missing == {"a3_i2": 2}


def test_child_shares_inventory_and_measures_its_own_net_gain():
    parent = make_env()
    parent.craft({"raw_a1": 2}, ("a1_i1", 3))
    child = parent.spawn_child({"a1_i1": 3}, context="for a3_i2")
    assert child.world is parent.world and child.state.depth == 1
    assert child.state.start_inventory["a1_i1"] == 3
    assert child.goal == "Craft the following items: 3x a1_i1\nContext provided from parent agent: for a3_i2"
    child.craft({"raw_a1": 2}, ("a1_i1", 3))
    assert parent.view_inventory()["a1_i1"] == 6  # the parent sees the child's work at once
    child.finish("ok")
    assert child.check().passed and child.check().gains == {"a1_i1": 3}
    assert list(parent.walk()) == [parent, child]


def test_snapshot_restore_round_trip():
    env = make_env()
    snap = env.snapshot()
    env.craft({"raw_a1": 2}, ("a1_i1", 3))
    env.finish("x")
    env.restore(snap)
    assert env.world.inventory == {"raw_a1": 10, "raw_a2": 10} and not env.state.finished
    assert env.snapshot() == snap


def test_fork_is_isolated_and_commit_writes_back_in_place():
    parent = make_env()
    child = parent.spawn_child({"a1_i1": 3})  # a delegation point: a child on the shared world
    branches = [child.fork() for _ in range(8)]
    assert all(b.world is not parent.world for b in branches)
    branches[0].craft({"raw_a1": 2}, ("a1_i1", 3))
    branches[1].craft({"raw_a1": 4}, ("a1_i1", 6))
    assert parent.world.inventory == {"raw_a1": 10, "raw_a2": 10}  # branches never touch the parent
    assert branches[2].world.inventory == {"raw_a1": 10, "raw_a2": 10}
    assert branches[1].world.inventory["a1_i1"] == 6 and branches[0].world.inventory["a1_i1"] == 3
    shared_view = parent.world
    child.commit(branches[0])
    assert parent.world is shared_view and parent.world.inventory == {"raw_a1": 8, "raw_a2": 10, "a1_i1": 3}
    assert child.world.inventory == parent.world.inventory


def test_step_runs_code_counts_steps_and_stops_at_budget():
    env = make_env(max_steps=3)
    r = env.step("<thought>look</thought>\n<python>\nprint(view_inventory())\nget_info(['a1_i1'])[0]['can_craft']\n</python>")
    assert r.observation == "{'raw_a1': 10, 'raw_a2': 10}\nTrue" and not r.done
    r = env.step("I forgot the block")
    assert r.observation.startswith("Error: no <python>") and env.state.steps == 2
    r = env.step("<python>x = 1")  # generation stopped at </python>: the closing tag is optional
    assert r.observation == "(no output)" and r.done
    with pytest.raises(RuntimeError, match="done"):
        env.step("<python>1</python>")


def test_step_after_finish_is_done():
    env = make_env()
    r = env.step("<python>finish('bye')</python>")
    assert r.done and env.state.finished


def test_extract_code():
    assert extract_code("<thought>t</thought><python>\na = 1\n</python> trailing") == "a = 1"
    assert extract_code("no code") is None


def test_launch_subagent_rules():
    async def hook(parent, targets, context):
        child = parent.spawn_child(targets, context)
        child.finish(f"made {targets}")
        return child.result_text()

    env = make_env(subagent_hook=hook, max_depth=1)
    r = asyncio.run(env.astep("<python>r = await launch_subagent({'a1_i1': 3}, context='c')\nprint(r)</python>"))
    assert r.observation == "made {'a1_i1': 3}\nSubagent budget: used 0 of 20 steps, 20 remaining."
    assert env.children[0].state.context == "c"
    child = env.children[0]
    assert asyncio.run(child.launch_subagent({"a1_i1": 3})).startswith("Error: maximum delegation depth (1)")
    assert asyncio.run(env.launch_subagent({"raw_a1": 3})) == "Error: raw_a1 cannot be crafted, so it cannot be delegated."
    assert asyncio.run(env.launch_subagent({"a1_i1": 0})).startswith("Error: invalid target")
    assert asyncio.run(make_env().launch_subagent({"a1_i1": 3})) == "Error: subagents are not available in this run."


def test_unawaited_launch_is_an_error_observation():
    async def hook(parent, targets, context):  # pragma: no cover - must never run
        raise AssertionError("an un-awaited launch must not run")

    env = make_env(subagent_hook=hook)
    r = asyncio.run(env.astep("<python>launch_subagent({'a1_i1': 3})</python>"))
    assert "without `await`" in r.observation and not env.children


def test_verdict_is_frozen_when_the_episode_ends():
    env = make_env(targets={"a1_i1": 3}, max_steps=5)
    r = env.step("<python>print(craft({'raw_a1': 2}, ('a1_i1', 3)))\nfinish('made it')</python>")
    assert r.done and env.state.verdict == {"passed": True, "finished": True, "gains": {"a1_i1": 3}, "missing": {}}
    env.world.inventory["a1_i1"] = 0  # a parent uses the product afterwards
    assert not env.check().passed and env.state.verdict["passed"]
    out_of_steps = make_env(targets={"a1_i1": 3}, max_steps=1)
    out_of_steps.step("<python>x = 1</python>")
    assert out_of_steps.state.verdict["passed"] is False and out_of_steps.state.verdict["finished"] is False
