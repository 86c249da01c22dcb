"""Branch judges: the TextCraft and TextWorld program checkers, and the LLM judge against a
real local HTTP server (127.0.0.1, port 0) that serves scripted chat-completions replies."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from http_endpoint import completion
from textworld_records import make_record

from sera_core.chat_endpoint import ChatEndpointConfig, EndpointStats
from sera_core.envs.textcraft.env import CraftWorld, TextCraftEnv
from sera_core.envs.textcraft.verifier import TextCraftVerifier
from sera_core.envs.textcraft.world import Recipe, RecipeBook
from sera_core.envs.textworld.env import TextWorldEnv
from sera_core.envs.textworld.goals import goal_for_dish, goal_for_ingredient
from sera_core.envs.textworld.verifier import CanonicalOrLLM, TextWorldVerifier
from sera_core.envs.textworld.world import SyncWorld
from sera_core.judges import (
    JudgeStats,
    JudgeVerdict,
    LLMJudge,
    build_messages,
    parse_judge_output,
    truncate_middle,
)

# -- TextCraft ---------------------------------------------------------------------------------

BOOK = RecipeBook(
    recipes={
        "a1_i1": Recipe("a1_i1", (("raw_a1", 2),), 3),
        "a2_i1": Recipe("a2_i1", (("raw_a2", 1),), 2),
        "a3_i2": Recipe("a3_i2", (("a1_i1", 1), ("a2_i1", 2)), 1),
    },
    base_items=("raw_a1", "raw_a2"),
)


def craft_env(targets):
    return TextCraftEnv(BOOK, CraftWorld(inventory={"raw_a1": 10, "raw_a2": 10}), targets, max_steps=5)


def test_textcraft_verifier_labels_children_from_their_frozen_verdict():
    verifier = TextCraftVerifier()
    good = craft_env({"a1_i1": 3})
    assert good.step('<python>craft({"raw_a1": 2}, ("a1_i1", 3))\nfinish("x")</python>').done
    bad = craft_env({"a3_i2": 1, "a1_i1": 3})
    assert bad.step('<python>craft({"raw_a1": 2}, ("a1_i1", 3))\nfinish("x")</python>').done

    good.world.inventory["a1_i1"] -= 3  # a parent consumes the child's products afterwards
    v_good, v_bad = verifier.judge(good), verifier.judge(bad)
    assert v_good == JudgeVerdict(True, "all targets crafted", "textcraft_verifier", 0, 0, False)
    assert v_bad.success is False and v_bad.reason == "missing 1x a3_i2" and v_bad.labeled
    assert verifier.stats == JudgeStats(calls=2)


def test_textcraft_verifier_falls_back_to_the_live_check():
    verifier = TextCraftVerifier()
    env = craft_env({"a1_i1": 3})
    env.craft({"raw_a1": 2}, ("a1_i1", 3))
    v = verifier.judge(env)  # crafted, but finish() never called and the episode is still running
    assert v.success is False and v.reason.startswith("finish() was not called") and "live check" in v.reason
    env.finish("done")  # a direct tool call: the episode ended without a step, so no frozen verdict
    assert env.state.verdict is None and verifier.judge(env).success is True
    assert verifier.stats.as_dict() == {"calls": 2, "cache_hits": 0, "failures": 0, "unlabeled": 0, "requests": 0,
                                        "input_tokens": 0, "output_tokens": 0}


# -- TextWorld ---------------------------------------------------------------------------------

CARROT = goal_for_ingredient("carrot", ("grilled", "diced"))


def run_child(goal, actions, world=None):
    env = TextWorldEnv(world or SyncWorld.from_record(make_record()), goal, location="kitchen", max_steps=10)
    for a in actions:
        env.step(f"<action>{a}</action>")
    env.step("<finish>done</finish>")
    return env


def test_textworld_verifier_labels_canonical_goals_only():
    verifier = TextWorldVerifier()
    good = run_child(CARROT, ["take carrot", "dice carrot", "cook carrot on grill"])
    bad = run_child(CARROT, ["take carrot", "chop carrot", "cook carrot on grill"])  # ruined: must be diced
    vague = run_child("make the carrot tasty", ["take carrot", "dice carrot", "cook carrot on grill"])
    v_good, v_bad, v_vague = verifier.judge(good), verifier.judge(bad), verifier.judge(vague)
    assert v_good.success is True and CARROT in v_good.reason and v_good.source == "textworld_verifier"
    assert v_bad.success is False and "not met" in v_bad.reason
    assert v_vague == JudgeVerdict(None, "goal is not canonical; no label", "textworld_verifier")
    assert not v_vague.labeled
    # a compound goal needs every part; dish_1 is not prepared in the good child's world
    assert verifier.judge(run_child(f"{CARROT}; {goal_for_dish('dish_1')}", [], good.world)).success is False
    assert verifier.stats == JudgeStats(calls=4, unlabeled=1)


# -- the LLM judge against a real local server -------------------------------------------------
# (the HTTP itself, retries, timeouts and the cache file: tests/test_chat_endpoint.py)

@pytest.fixture
def make_judge(endpoint):
    sleeps = []

    def make(**kw):
        cfg = {"base_url": endpoint.url, "model": "kimi-test", "api_key_env": "SERA_TEST_JUDGE_KEY",
               "timeout_s": 5.0, "max_retries": 3, "backoff_s": 0.5, "max_tokens": 64, **kw}
        return LLMJudge(ChatEndpointConfig(**cfg), sleep=sleeps.append)

    make.sleeps = sleeps
    return make


def test_good_reply_and_the_prompt_sent(endpoint, make_judge):
    judge = make_judge()
    v = judge.judge("bring the carrot", "[turn 1] take carrot", "Counter: carrot (grilled, diced)")
    assert v == JudgeVerdict(True, "the carrot is on the counter", "llm:kimi-test", 11, 5, False)
    req = endpoint.received[0]
    assert req["body"]["model"] == "kimi-test" and req["body"]["temperature"] == 0.0
    system, user = req["body"]["messages"]
    assert system["role"] == "system" and '"success"' in system["content"]
    assert user["role"] == "user" and "bring the carrot" in user["content"]
    assert "[turn 1] take carrot" in user["content"] and "Counter: carrot" in user["content"]
    judge.judge("another goal", "t", "s")
    assert judge.stats == JudgeStats(calls=2, requests=2, input_tokens=22, output_tokens=10)


def test_fenced_reply_is_accepted(endpoint, make_judge):
    endpoint.push(body=completion('  ```json\n{"success": false, "reason": "salt missing"}\n```\n'))
    v = make_judge().judge("g", "t", "s")
    assert v.success is False and v.reason == "salt missing"


def test_garbage_reply_is_no_label_and_a_failure(endpoint, make_judge):
    endpoint.push(body=completion("Yes, I think the agent did it.", usage=(40, 9)))
    endpoint.push(body=b"<html>bad gateway</html>")  # a 200 whose body is not JSON at all
    judge = make_judge()
    v = judge.judge("g", "t", "s")
    assert v.success is None and v.reason.startswith("unparseable judge output: ") and "I think" in v.reason
    v2 = judge.judge("g2", "t", "s")
    assert v2.success is None and v2.reason.startswith("unparseable judge output") and "bad gateway" in v2.reason
    assert judge.stats == JudgeStats(calls=2, failures=2, unlabeled=2, requests=2, input_tokens=40 + v2.input_tokens,
                                     output_tokens=9)
    assert make_judge.sleeps == []  # a bad reply is not retried


@pytest.mark.parametrize("content", [
    'The answer: {"success": true, "reason": "x"}',
    '{"success": true, "reason": "x"} {"success": false, "reason": "y"}',
    '{"success": "yes", "reason": "x"}',
    '{"success": 1, "reason": "x"}',
    '{"success": true}',
    '{"success": true, "reason": 3}',
    '[{"success": true, "reason": "x"}]',
    "```json\n{\"success\": true, \"reason\": \"x\"}",
    None,
])
def test_strict_parser_rejects_everything_else(content):
    assert parse_judge_output(content) is None


def test_parser_accepts_plain_and_fenced_objects():
    assert parse_judge_output(' {"success": true, "reason": "ok", "extra": 1}\n') == (True, "ok")
    assert parse_judge_output('```\n{"success": false, "reason": "no"}\n```') == (False, "no")


def test_a_failed_request_is_no_label_and_a_failure(endpoint, make_judge):
    for _ in range(3):
        endpoint.push(502, {"error": "down"})
    judge = make_judge(max_retries=2)
    v = judge.judge("g", "t", "s")
    assert v.success is None and v.reason.startswith("judge request failed: HTTP 502")
    assert "after 3 attempts" in v.reason and make_judge.sleeps == [0.5, 1.0]
    assert judge.stats == JudgeStats(calls=1, failures=1, unlabeled=1, requests=3)


def test_the_cache_keeps_verdicts_only_and_an_existing_cache_file_loads(endpoint, make_judge, tmp_path):
    path = tmp_path / "cache" / "judge.jsonl"
    judge = make_judge(cache=True, cache_path=str(path))
    first = judge.judge("bring the carrot", "t", "s")
    again = judge.judge("bring the carrot", "t", "s")
    assert first.success is True and not first.cached
    assert again == JudgeVerdict(True, first.reason, "llm:kimi-test", 0, 0, True)
    assert endpoint.count == 1
    assert judge.stats == JudgeStats(calls=1, cache_hits=1, requests=1, input_tokens=11, output_tokens=5)

    endpoint.push(body=completion("garbage"))  # unparseable replies are not cached: asked again
    assert judge.judge("other goal", "t", "s").success is None
    assert judge.judge("other goal", "t", "s").success is True and endpoint.count == 3
    assert len(path.read_text().splitlines()) == 2

    # a cache file as the judge wrote it before the endpoint client existed: a verdict, and a
    # line whose content is no verdict (not loaded: that goal is asked)
    def key(goal):
        blob = json.dumps(["kimi-test", build_messages(goal, "t", "s", max_chars=48_000)], sort_keys=True,
                          ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()

    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"key": key("an old goal"), "model": "kimi-test",
                               "content": '{"success": false, "reason": "from last week"}',
                               "prompt_tokens": 900, "completion_tokens": 12}) + "\n"
                   + json.dumps({"key": key("a garbled goal"), "model": "kimi-test", "content": "no verdict"}) + "\n")
    reloaded = make_judge(cache=True, cache_path=str(old))
    assert reloaded.judge("an old goal", "t", "s") == JudgeVerdict(False, "from last week", "llm:kimi-test", 0, 0, True)
    assert endpoint.count == 3 and reloaded.stats == JudgeStats(cache_hits=1)
    assert not reloaded.judge("a garbled goal", "t", "s").cached and endpoint.count == 4


def test_concurrent_judging_keeps_exact_counts(endpoint, make_judge):
    judge = make_judge()
    results, errors = [], []

    def worker(i):
        try:
            for j in range(5):
                results.append(judge.judge(f"goal {i}-{j}", "t", "s"))
        except Exception as exc:  # noqa: BLE001 - surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors and len(results) == 40 and all(v.success for v in results)
    assert endpoint.count == 40
    assert judge.stats == JudgeStats(calls=40, requests=40, input_tokens=440, output_tokens=200)
    assert judge.endpoint.stats == EndpointStats(calls=40, requests=40, input_tokens=440, output_tokens=200)


def test_a_free_form_goal_goes_to_the_llm_with_the_rendered_textworld_child(endpoint, make_judge):
    child = run_child(f"{CARROT}, nicely", ["take carrot", "dice carrot", "cook carrot on grill"])  # no canonical form
    assert CanonicalOrLLM(TextWorldVerifier(), make_judge()).judge(child).success is True
    user = endpoint.received[0]["body"]["messages"][1]["content"]
    assert CARROT in user and "<action>dice carrot</action>" in user
    assert "carrot (grilled, diced)" in user and "finished with the message: done" in user


def test_long_trajectories_are_cut_in_the_middle():
    text = "A" * 500 + "B" * 500
    cut = truncate_middle(text, 200)
    assert len(cut) <= 200 and cut.startswith("A") and cut.endswith("B") and "omitted" in cut
    assert truncate_middle("short", 200) == "short"


def test_a_configured_llm_judge_labels_free_form_goals_and_the_program_the_canonical(endpoint):
    """``judge: llm`` on TextWorld: canonical goals stay with the program checker (no
    request), free-form goals go to the endpoint; both are counted."""
    from sera_core.envs.registry import benchmark

    def judge_for(env, kind="program", **options):
        return benchmark(env).make_judge(kind, **options)

    judge = judge_for("textworld", "llm", url=endpoint.url, model="kimi-test", max_retries=0)
    assert isinstance(judge, CanonicalOrLLM)
    canonical = judge.judge(run_child(CARROT, ["take carrot", "dice carrot", "cook carrot on grill"]))
    assert canonical.success is True and canonical.source == "textworld_verifier" and endpoint.count == 0
    free = judge.judge(run_child("make the carrot tasty", ["take carrot", "dice carrot", "cook carrot on grill"]))
    assert free.success is True and free.source == "llm:kimi-test" and endpoint.count == 1
    assert judge.llm.stats.calls == 1 and judge.llm.stats.input_tokens == 11
    assert judge.stats_snapshot()["calls"] == 3  # the program's two (one unlabelled) and the LLM's one
    assert isinstance(judge_for("textcraft"), TextCraftVerifier) and isinstance(judge_for("textworld"), TextWorldVerifier)
    with pytest.raises(ValueError, match="TextCraft is always checked"):
        judge_for("textcraft", "llm", url=endpoint.url, model="m")
    with pytest.raises(ValueError, match="base URL and a model"):
        judge_for("textworld", "llm", model="m")
