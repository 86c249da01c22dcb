"""Branch judges: the TextCraft and TextWorld program checkers, and the LLM judge against a
real local HTTP server (127.0.0.1, port 0) that serves scripted chat-completions replies."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from http_endpoint import GOOD, Endpoint, completion
from textworld_records import make_record

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
    LLMJudgeConfig,
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

@pytest.fixture
def endpoint():
    ep = Endpoint()
    yield ep
    ep.close()


@pytest.fixture
def make_judge(endpoint):
    sleeps = []

    def make(**kw):
        cfg = {"base_url": endpoint.url, "model": "kimi-test", "api_key_env": "SERA_TEST_JUDGE_KEY",
               "timeout_s": 5.0, "max_retries": 3, "backoff_s": 0.5, "max_tokens": 64, **kw}
        return LLMJudge(LLMJudgeConfig(**cfg), sleep=sleeps.append)

    make.sleeps = sleeps
    return make


def test_good_reply_and_the_request_sent(endpoint, make_judge, monkeypatch):
    monkeypatch.delenv("SERA_TEST_JUDGE_KEY", raising=False)
    judge = make_judge()
    v = judge.judge("bring the carrot", "[turn 1] take carrot", "Counter: carrot (grilled, diced)")
    assert v == JudgeVerdict(True, "the carrot is on the counter", "llm:kimi-test", 11, 5, False)
    req = endpoint.received[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["body"]["model"] == "kimi-test" and req["body"]["temperature"] == 0.0
    assert req["body"]["max_tokens"] == 64
    system, user = req["body"]["messages"]
    assert system["role"] == "system" and '"success"' in system["content"]
    assert user["role"] == "user" and "bring the carrot" in user["content"]
    assert "[turn 1] take carrot" in user["content"] and "Counter: carrot" in user["content"]
    assert "Authorization" not in req["headers"]

    monkeypatch.setenv("SERA_TEST_JUDGE_KEY", "sekret-123")
    judge.judge("another goal", "t", "s")
    assert endpoint.received[1]["headers"]["Authorization"] == "Bearer sekret-123"
    assert "sekret-123" not in repr(judge.config)
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
    assert v2.success is None and v2.reason.startswith("unparseable judge output")
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


def test_missing_usage_is_estimated(endpoint, make_judge):
    content = '{"success": true, "reason": "' + "r" * 40 + '"}'
    endpoint.push(body=completion(content, usage=None))
    v = make_judge().judge("goal " * 20, "trajectory", "state")
    assert v.success is True and v.output_tokens == len(content) // 4
    messages = endpoint.received[0]["body"]["messages"]
    assert v.input_tokens == len("".join(m["content"] for m in messages)) // 4 > 20


def test_server_errors_are_retried_with_exponential_backoff(endpoint, make_judge):
    endpoint.push(500, {"error": "boom"})
    endpoint.push(503, {"error": "busy"})
    endpoint.push(429, {"error": "slow down"})
    judge = make_judge()
    v = judge.judge("g", "t", "s")
    assert v.success is True and endpoint.count == 4
    assert make_judge.sleeps == [0.5, 1.0, 2.0]
    assert judge.stats == JudgeStats(calls=1, requests=4, input_tokens=11, output_tokens=5)


def test_retries_run_out_into_no_label(endpoint, make_judge):
    for _ in range(3):
        endpoint.push(502, {"error": "down"})
    judge = make_judge(max_retries=2)
    v = judge.judge("g", "t", "s")
    assert v.success is None and "HTTP 502" in v.reason and "after 3 attempts" in v.reason
    assert endpoint.count == 3 and make_judge.sleeps == [0.5, 1.0]
    assert judge.stats == JudgeStats(calls=1, failures=1, unlabeled=1, requests=3)


def test_client_errors_are_not_retried(endpoint, make_judge):
    endpoint.push(400, {"error": "bad model"})
    judge = make_judge()
    v = judge.judge("g", "t", "s")
    assert v.success is None and "HTTP 400" in v.reason and "bad model" in v.reason
    assert endpoint.count == 1 and make_judge.sleeps == []
    assert judge.stats.failures == 1 and judge.stats.requests == 1


def test_slow_server_times_out_and_gives_no_label(endpoint, make_judge):
    endpoint.push(body=GOOD, delay=1.5)
    endpoint.push(body=GOOD, delay=1.5)
    judge = make_judge(timeout_s=0.2, max_retries=1)
    start = time.monotonic()
    v = judge.judge("g", "t", "s")
    assert time.monotonic() - start < 1.2  # two 0.2 s attempts, never the server's 1.5 s
    assert v.success is None and "timeout" in v.reason and "after 2 attempts" in v.reason
    assert endpoint.count == 2 and make_judge.sleeps == [0.5]


def test_connection_refused_gives_no_label(make_judge):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    judge = make_judge(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    v = judge.judge("g", "t", "s")
    assert v.success is None and "connection error" in v.reason
    assert make_judge.sleeps == [0.5, 1.0] and judge.stats.failures == 1 and judge.stats.requests == 3


def test_cache_hits_skip_the_server_and_reload_from_disk(endpoint, make_judge, tmp_path):
    path = tmp_path / "cache" / "judge.jsonl"
    judge = make_judge(cache_path=str(path))
    first = judge.judge("bring the carrot", "t", "s")
    again = judge.judge("bring the carrot", "t", "s")
    assert first.success is True and not first.cached
    assert again == JudgeVerdict(True, first.reason, "llm:kimi-test", 0, 0, True)
    assert endpoint.count == 1
    assert judge.stats == JudgeStats(calls=1, cache_hits=1, requests=1, input_tokens=11, output_tokens=5)

    endpoint.push(body=completion("garbage"))  # unparseable replies are not cached
    assert judge.judge("other goal", "t", "s").success is None
    lines = path.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["key"] == judge.cache_key(
        endpoint.received[0]["body"]["messages"])

    with path.open("a") as fh:
        fh.write('{"key": "torn')  # an interrupted write leaves a torn last line
    reloaded = make_judge(cache_path=str(path))
    assert reloaded.judge("bring the carrot", "t", "s").cached and endpoint.count == 2
    assert reloaded.stats == JudgeStats(cache_hits=1)
    assert reloaded.judge("fresh goal", "t", "s").success is True and endpoint.count == 3
    valid = [json.loads(line) for line in path.read_text().splitlines()[::2]]  # the new entry is on its own line
    assert len(valid) == 2 and make_judge(cache_path=str(path)).judge("fresh goal", "t", "s").cached

    other_model = make_judge(cache_path=str(path), model="other")  # the model is part of the key
    assert not other_model.judge("bring the carrot", "t", "s").cached and endpoint.count == 4


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
