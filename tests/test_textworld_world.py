"""The TextWorld-Sync world, protocol, agent sessions and subtask checker."""

from __future__ import annotations

import json
import random
import threading

import pytest

from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import branch_label, check_goal, goal_for_dish, goal_for_ingredient
from sera_core.envs.textworld.protocol import Delegation, parse_reply
from sera_core.envs.textworld.world import SyncWorld
from textworld_records import make_record


def act(world, location, command):
    result, location = world.act(location, command)
    return result, location


def test_world_is_built_from_the_record():
    w = SyncWorld.from_record(make_record(distractors=3))
    s = w.state
    assert s.rooms == ["kitchen", "pantry", "garden", "supermarket", "hallway", "dining room"]
    assert s.items["carrot"].place == "kitchen.fridge" and s.items["parsley"].place == "garden"
    assert len(s.items) == 4 + 3 and s.required["carrot"] == ("grilled", "diced")
    assert SyncWorld.from_record(make_record()).snapshot() == SyncWorld.from_record(make_record()).snapshot()
    assert "carrot" in w.observe("kitchen") and "parsley" not in w.observe("kitchen")


def test_a_whole_dish_and_the_root_checker():
    w = SyncWorld.from_record(make_record())
    steps = ["take carrot", "dice carrot", "cook carrot on grill"]
    for cmd in steps:
        r, _ = act(w, "kitchen", cmd)
        assert r.ok and r.spent, r.message
    assert w.state.items["carrot"].place == "counter"
    r, loc = act(w, "kitchen", "go to pantry")
    assert r.ok and not r.spent and loc == "pantry"
    r, _ = act(w, "pantry", "take salt")  # raw/uncut: ready as soon as taken
    assert "goes to the counter" in r.message and w.state.items["salt"].place == "counter"
    r, _ = act(w, "pantry", "prepare dish_1")
    assert not r.ok and "kitchen" in r.message
    assert act(w, "kitchen", "prepare dish_1")[0].ok and act(w, "kitchen", "eat dish_1")[0].ok
    assert w.dish_progress("dish_1") == (2, 2)
    verdict = w.check()
    assert not verdict["passed"] and verdict["unfinished"] == ["dish_2"] and verdict["dishes_eaten"] == 1


@pytest.mark.parametrize("commands, expected", [
    (["take parsley"], "you see no parsley in the kitchen"),
    (["dice carrot"], "you are not holding the carrot"),
    (["take carrot", "dice carrot", "slice carrot"], "already diced"),
    (["prepare dish_1"], "still needs on the counter: carrot, salt"),
    (["eat dish_2"], "dish_2 is not prepared yet"),
    (["open door"], "there is no door"),
    (["cook carrot in microwave"], "write `cook <item> in stove`"),
    (["juggle carrot"], "unknown command"),
    (["prepare dish_9"], "no dish called 'dish_9'"),
])
def test_invalid_actions_say_why_and_still_spend_a_step(commands, expected):
    w = SyncWorld.from_record(make_record())
    for cmd in commands:
        result, _ = act(w, "kitchen", cmd)
    assert not result.ok and result.spent and expected in result.message
    assert w.state.steps == len(commands)


def test_irreversible_mistakes_make_the_task_fail():
    w = SyncWorld.from_record(make_record())
    act(w, "kitchen", "take carrot")
    act(w, "kitchen", "chop carrot")  # needs diced
    assert w.state.items["carrot"].ruined and w.state.events == ["ruined carrot (raw, chopped)"]
    act(w, "kitchen", "cook carrot on grill")
    assert w.state.items["carrot"].place == "inventory"  # never reaches the counter
    w2 = SyncWorld.from_record(make_record())
    act(w2, "kitchen", "take red apple")
    act(w2, "kitchen", "cook red apple in oven")
    r, _ = act(w2, "kitchen", "cook red apple in oven")
    assert "burn" in r.message and w2.state.items["red apple"].place == "destroyed"
    w3 = SyncWorld.from_record(make_record())
    act(w3, "kitchen", "take carrot")
    act(w3, "kitchen", "eat carrot")
    assert w3.state.events == ["ate carrot"] and not act(w3, "kitchen", "take carrot")[0].ok


def test_capacity_limits_the_shared_inventory():
    w = SyncWorld.from_record(make_record(capacity=1))
    assert act(w, "kitchen", "take carrot")[0].ok
    r, _ = act(w, "kitchen", "take red apple")
    assert not r.ok and "full (1 item(s))" in r.message
    act(w, "kitchen", "dice carrot")
    act(w, "kitchen", "cook carrot on grill")  # ready: moves to the counter, frees the slot
    assert act(w, "kitchen", "take red apple")[0].ok


def test_tool_cooldown_is_counted_in_global_steps():
    w = SyncWorld.from_record(make_record(cooldown=1))
    act(w, "kitchen", "take carrot")
    act(w, "kitchen", "take red apple")
    assert act(w, "kitchen", "dice carrot")[0].ok
    r, _ = act(w, "kitchen", "slice red apple")
    assert not r.ok and "knife is busy for 1 more step" in r.message
    assert "knife busy" not in w.observe("kitchen")  # the failed try advanced the clock
    assert act(w, "kitchen", "slice red apple")[0].ok


def test_the_gate_hides_gated_dishes_until_opened():
    w = SyncWorld.from_record(make_record(doors=1, gated=("dish_2",)))
    assert w.state.items["red apple"].hidden and not w.state.items["carrot"].hidden
    r, _ = act(w, "kitchen", "take red apple")
    assert not r.ok
    assert not act(w, "kitchen", "open door")[0].ok  # the door is in the hallway
    assert "open door" in w.valid_actions("hallway")
    assert act(w, "hallway", "open door")[0].ok and w.state.gate == "open"
    assert act(w, "kitchen", "take red apple")[0].ok


def test_gated_task_is_unsolvable_without_opening_the_gate():
    w = SyncWorld.from_record(make_record(doors=1, gated=("dish_2",), budget=200))
    for room in w.state.rooms:
        assert "red apple" not in w.observe(room).split("You see: ")[1].split("\n")[0]
        assert "parsley" not in w.observe(room).split("You see: ")[1].split("\n")[0]


def test_budget_is_never_overspent_and_free_actions_cost_nothing():
    w = SyncWorld.from_record(make_record(budget=3))
    for _ in range(5):
        act(w, "kitchen", "go to garden")
        act(w, "kitchen", "inventory")
        act(w, "kitchen", "read cookbook")
    assert w.state.steps == 0
    results = [act(w, "kitchen", "dance")[0] for _ in range(5)]
    assert w.state.steps == 3 and [r.spent for r in results] == [True, True, True, False, False]
    assert "No shared steps remain" in results[-1].message


def test_many_threads_hammering_one_world_lose_and_duplicate_nothing():
    record = make_record(budget=400, distractors=0)
    for dish in record["dishes"]:  # everything in the kitchen, no capacity limit
        for e in dish["recipe"]:
            e["candidate_source_locations"] = ["kitchen.counter"]
    w = SyncWorld.from_record(record)
    names = list(w.state.items)
    outcomes: list[tuple[str, bool, bool]] = []
    guard = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(80):
            cmd = rng.choice([f"take {rng.choice(names)}", f"dice {rng.choice(names)}", "dance", "go to garden"])
            r, _ = w.act("kitchen", cmd)
            with guard:
                outcomes.append((cmd, r.ok, r.spent))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spent = sum(1 for _, _, s in outcomes if s)
    assert w.state.steps == spent == min(400, sum(1 for c, _, _ in outcomes if not c.startswith("go")))
    successful_takes = [c for c, ok, _ in outcomes if ok and c.startswith("take")]
    assert sorted(c[5:] for c in successful_takes) == sorted(n for n, i in w.state.items.items()
                                                              if i.place != "kitchen.counter")
    assert len(successful_takes) == len(set(successful_takes))  # each item taken at most once
    dices = [c for c, ok, _ in outcomes if ok and c.startswith("dice")]
    assert len(dices) == len(set(dices)) == sum(1 for i in w.state.items.values() if i.cut == "diced")


def test_fork_isolation_and_commit_in_place():
    parent_world = SyncWorld.from_record(make_record())
    parent = TextWorldEnv(parent_world, "root")
    child = parent.spawn_child(Delegation("prepare and eat dish_1", 40))
    assert child.world is parent.world and child.state.max_steps == 20  # min(requested, 20)
    before = parent_world.snapshot()
    branches = [parent_world.fork() for _ in range(8)]
    act(branches[0], "kitchen", "take carrot")
    act(branches[1], "kitchen", "take red apple")
    assert parent_world.snapshot() == before
    assert branches[2].state.items["carrot"].place == "kitchen.fridge"
    assert branches[1].state.items["carrot"].place == "kitchen.fridge"
    parent_world.commit(branches[0])
    assert child.world.state.items["carrot"].place == "inventory" and parent_world.state.steps == 1
    act(branches[0], "kitchen", "dice carrot")  # the committed copy is independent of the branch
    assert parent_world.state.items["carrot"].cut == "uncut"


# -- protocol ---------------------------------------------------------------------------------

ADVERSARIAL = [
    "", "<action></action>", "<action>take</action><action>take</action>", "<delegate>{</delegate>",
    "<delegate>" + "[" * 10000 + "</delegate>", '<delegate>{"delegations": []}</delegate>',
    '<delegate>{"delegations": [{"goal": 5}]}</delegate>', '<delegate>{"goal": "x", "max_steps": true}</delegate>',
    '<delegate>{"goal": "x", "max_steps": -1}</delegate>', "<finish>" * 50, "<ACTION>go</ACTION>",
    "<action>\u0000\ud800</action>", "<think><action>x</action></think><finish>y</finish>",
    '<delegate>{"delegations": [' + ",".join(['{"goal": "g"}'] * 9) + "]}</delegate>",
]


@pytest.mark.parametrize("reply", ADVERSARIAL)
def test_adversarial_replies_never_raise(reply):
    parsed = parse_reply(reply)
    assert parsed.kind in ("action", "delegate", "finish", "invalid")
    if parsed.kind == "invalid":
        assert parsed.error.startswith("Invalid reply: ")


def test_random_replies_never_raise():
    rng = random.Random(0)
    alphabet = list("<>/{}[]\":, actiondelgfnshx0123\n") + ["<action>", "</action>", "<delegate>", "</delegate>",
                                                             "<finish>", "</finish>", '{"goal": "a"}']
    kinds = set()
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        kinds.add(parse_reply(text).kind)
    assert "invalid" in kinds and len(kinds) >= 3


def test_valid_replies_parse():
    assert parse_reply("thinking... <action>  take   red apple </action>").action == "take red apple"
    d = parse_reply('<delegate>{"delegations": [{"goal": "a", "max_steps": 5}, {"goal": "b"}]}</delegate>')
    assert d.delegations == (Delegation("a", 5), Delegation("b", 20))
    assert parse_reply("<finish>done</finish>").message == "done"


# -- agent sessions -------------------------------------------------------------------------------

def test_turns_budgets_and_free_inventory():
    env = TextWorldEnv(SyncWorld.from_record(make_record()), "goal", max_steps=4, max_depth=0)
    r = env.step("<action>inventory</action>")
    assert "Shared inventory: nothing." in r.observation and env.world.state.steps == 0 and env.state.steps == 1
    r = env.step("no block here")
    assert r.kind == "invalid" and env.world.state.steps == 0 and env.state.steps == 2
    r = env.step('<delegate>{"goal": "prepare and eat dish_1"}</delegate>')
    assert "Delegation rejected: the maximum depth (0)" in r.observation and env.state.steps == 3
    r = env.step("<finish>bye</finish>")
    assert r.done and env.state.finish_message == "bye" and len(env.state.history) == 4
    with pytest.raises(RuntimeError):
        env.step("<finish>again</finish>")


def test_delegation_runs_children_on_the_shared_world():
    async def hook(parent, delegation):
        child = parent.spawn_child(delegation)
        await child.astep("<action>take carrot</action>")
        await child.astep("<finish>took it</finish>")
        return child.result_text()

    env = TextWorldEnv(SyncWorld.from_record(make_record()), "goal", delegate_hook=hook)
    r = env.step('<delegate>{"delegations": [{"goal": "a"}, {"goal": "b", "max_steps": 3}]}</delegate>')
    assert r.observation.startswith("[SubAgent Results]\n- a: took it (used 2 of 20 turns)")
    assert "- b: took it (used 2 of 3 turns)" in r.observation  # b could not take it again, but finished
    assert env.world.state.items["carrot"].place == "inventory" and [c.state.depth for c in env.children] == [1, 1]


# -- subtask checker --------------------------------------------------------------------------------

def test_subtask_checker_judges_canonical_goals_and_refuses_others():
    w = SyncWorld.from_record(make_record(doors=1, gated=("dish_2",)))
    carrot = goal_for_ingredient("carrot", ("grilled", "diced"))
    assert check_goal(carrot, w) == "failure" and check_goal("open the door", w) == "failure"
    for cmd in ("take carrot", "dice carrot", "cook carrot on grill"):
        act(w, "kitchen", cmd)
    act(w, "hallway", "open door")
    assert check_goal(carrot.upper() + ".", w) == "success" and check_goal("open the door", w) == "success"
    assert check_goal(goal_for_ingredient("carrot", ("fried", "diced")), w) == "failure"
    assert check_goal(f"{carrot}; {goal_for_dish('dish_1')}", w) == "failure"
    act(w, "pantry", "take salt")
    act(w, "kitchen", "prepare dish_1")
    assert check_goal("prepare dish_1", w) == "success" and check_goal(goal_for_dish("dish_1"), w) == "failure"
    act(w, "kitchen", "eat dish_1")
    assert check_goal(f"{carrot}; {goal_for_dish('dish_1')}", w) == "success"  # used in the meal still counts
    for vague in ("make something tasty", "prepare dish_7", "bring the unicorn, raw and uncut, to the counter",
                  f"{carrot}; dance", ""):
        assert check_goal(vague, w) == "unknown" and branch_label(vague, w) is None
    assert branch_label(carrot, w) is True


def test_official_records_build_worlds(official_dir):
    for line in (official_dir / "textworld_sync_test_sample.jsonl").read_text().splitlines():
        record = json.loads(line)
        env = TextWorldEnv.from_task(record)
        assert record["task_description"] in env.prompt()
        assert env.world.state.max_steps == record["parallelism"]["shared_environment_max_steps"]
        assert len(env.world.state.dishes) == record["game_params"]["numDishes"]
        gated = {e["to"] for e in record["parallelism"]["dependencies"] if e["type"] == "door"}
        hidden = {n for n, i in env.world.state.items.items() if i.hidden}
        assert hidden == {n for d in record["dishes"] if d["dish_id"] in gated for n in d["ingredient_names"]}


def test_preparation_commands_make_the_required_state():
    from sera_core.envs.textworld.world import preparation_commands

    assert preparation_commands("carrot", ("grilled", "diced")) == ["dice carrot", "cook carrot on grill"]
    assert preparation_commands("salt", ("raw", "uncut")) == []
    w = SyncWorld.from_record(make_record())
    for cmd in ["take red apple"] + preparation_commands("red apple", ("roasted", "sliced")):
        assert act(w, "kitchen", cmd)[0].ok
    assert w.state.items["red apple"].place == "counter"


def test_invalid_free_actions_still_spend_a_step():
    w = SyncWorld.from_record(make_record())
    for cmd in ("go to narnia", "go to kitchen", "go north"):
        r, loc = act(w, "kitchen", cmd)
        assert not r.ok and r.spent and loc == "kitchen"
    r, _ = act(w, "garden", "read cookbook")
    assert not r.ok and r.spent and "kitchen" in r.message
    assert w.state.steps == 4


def test_cookbook_and_stove():
    record = make_record()
    record["dishes"][1]["recipe"][0]["preparation"] = ["fried", "sliced"]
    w = SyncWorld.from_record(record)
    r, _ = act(w, "kitchen", "read cookbook")
    assert r.ok and not r.spent
    assert r.message.splitlines()[1:] == ["dish_1: carrot (grilled, diced); salt (raw, uncut)",
                                          "dish_2: red apple (fried, sliced); parsley (raw, chopped)"]
    for cmd in ("take red apple", "cook red apple in stove", "slice red apple"):
        assert act(w, "kitchen", cmd)[0].ok
    assert w.state.items["red apple"].place == "counter" and w.state.items["red apple"].state == ("fried", "sliced")
