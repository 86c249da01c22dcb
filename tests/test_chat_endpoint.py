"""The chat-endpoint client (sera_core.chat_endpoint) against a real local HTTP server
(127.0.0.1, port 0, tests/http_endpoint.py) that serves scripted chat-completions replies:
the request sent, retries and backoff, timeouts, the cache and its file, the counters, and
the external rubric writer/scorer asking through it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

import pytest
from http_endpoint import GOOD, completion

from sera_core.agents.actors import Call, ExternalChatActor, external_actor
from sera_core.chat_endpoint import ChatEndpoint, ChatEndpointConfig, ChatReply, EndpointStats
from sera_core.policy.base import SamplingParams

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]
GOOD_TEXT = GOOD["choices"][0]["message"]["content"]


@pytest.fixture
def client(endpoint):
    """``client(keep=None, **config)``: a :class:`ChatEndpoint` on the local server whose
    retries record their delays in ``client.sleeps`` instead of sleeping."""
    sleeps = []

    def make(keep=None, **kw):
        cfg = {"base_url": endpoint.url, "model": "m-test", "api_key_env": "SERA_TEST_ENDPOINT_KEY",
               "timeout_s": 5.0, "max_retries": 3, "backoff_s": 0.5, "max_tokens": 64, **kw}
        return ChatEndpoint(ChatEndpointConfig(**cfg), sleep=sleeps.append, **({"keep": keep} if keep else {}))

    make.sleeps = sleeps
    return make


def test_a_reply_the_request_sent_and_the_key(endpoint, client, monkeypatch):
    monkeypatch.delenv("SERA_TEST_ENDPOINT_KEY", raising=False)
    chat = client()
    assert chat.chat(HELLO) == ChatReply(GOOD_TEXT, error=None, answered=True, requests=1, input_tokens=11,
                                         output_tokens=5)
    req = endpoint.received[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["body"] == {"model": "m-test", "messages": HELLO, "temperature": 0.0, "max_tokens": 64}
    assert "Authorization" not in req["headers"]

    monkeypatch.setenv("SERA_TEST_ENDPOINT_KEY", "sekret-123")
    chat.chat(HELLO, temperature=1.0, max_tokens=7)  # no cache configured: asked again
    req = endpoint.received[1]
    assert req["headers"]["Authorization"] == "Bearer sekret-123"
    assert req["body"]["temperature"] == 1.0 and req["body"]["max_tokens"] == 7
    assert "sekret-123" not in repr(chat.config)
    assert chat.stats == EndpointStats(calls=2, requests=2, input_tokens=22, output_tokens=10)
    assert chat.stats_snapshot() == chat.stats.as_dict()


def test_through_openai_no_ambient_key_and_no_retries_of_its_own(endpoint, client, monkeypatch):
    """The request goes through the openai client: the same path under a base URL with a
    trailing slash, no key from openai's own ``$OPENAI_API_KEY`` (nor the client's placeholder),
    and only the endpoint's retries (openai's own would retry a 408)."""
    monkeypatch.delenv("SERA_TEST_ENDPOINT_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "ambient-key")
    endpoint.push(408, {"error": "request timeout"})
    chat = client(base_url=endpoint.url + "/")
    reply = chat.chat(HELLO)
    assert not reply.answered and reply.error.startswith("HTTP 408") and reply.requests == 1
    assert endpoint.count == 1 and client.sleeps == []
    req = endpoint.received[0]
    assert req["path"] == "/v1/chat/completions" and "Authorization" not in req["headers"]
    assert req["headers"]["User-Agent"].startswith("OpenAI/Python")


def test_missing_usage_is_estimated(endpoint, client):
    content = "r" * 41
    endpoint.push(body=completion(content, usage=None))
    reply = client().chat(HELLO)
    assert reply.output_tokens == len(content) // 4 == 10
    assert reply.input_tokens == len("Be brief.hello") // 4 == 3


def test_a_reply_without_content_is_a_failure_and_not_retried(endpoint, client):
    endpoint.push(body=b"<html>bad gateway</html>")  # a 200 whose body is not JSON at all
    endpoint.push(body={"choices": []})
    chat = client()
    first, second = chat.chat(HELLO), chat.chat(HELLO)
    assert first.content is None and first.answered and first.requests == 1
    assert first.error.startswith("the reply holds no message content") and "bad gateway" in first.error
    assert second.content is None and second.answered and '"choices": []' in second.error
    assert client.sleeps == [] and endpoint.count == 2
    assert chat.stats == EndpointStats(calls=2, failures=2, requests=2, input_tokens=6)


def test_server_errors_are_retried_with_exponential_backoff_then_succeed(endpoint, client):
    endpoint.push(500, {"error": "boom"})
    endpoint.push(503, {"error": "busy"})
    endpoint.push(429, {"error": "slow down"})
    chat = client()
    assert chat.chat(HELLO) == ChatReply(GOOD_TEXT, error=None, answered=True, requests=4, input_tokens=11,
                                         output_tokens=5)
    assert endpoint.count == 4 and client.sleeps == [0.5, 1.0, 2.0]
    assert chat.stats == EndpointStats(calls=1, requests=4, input_tokens=11, output_tokens=5)


def test_retries_run_out_into_a_failed_call(endpoint, client):
    for _ in range(3):
        endpoint.push(502, {"error": "down"})
    chat = client(max_retries=2)
    reply = chat.chat(HELLO)
    assert reply.content is None and not reply.answered and reply.requests == 3
    assert "HTTP 502" in reply.error and "after 3 attempts" in reply.error
    assert endpoint.count == 3 and client.sleeps == [0.5, 1.0]
    assert chat.stats == EndpointStats(calls=1, failures=1, requests=3)  # a failed request spends no tokens


def test_client_errors_are_not_retried(endpoint, client):
    endpoint.push(400, {"error": "bad model"})
    chat = client()
    reply = chat.chat(HELLO)
    assert not reply.answered and "HTTP 400" in reply.error and "bad model" in reply.error
    assert "attempts" not in reply.error and reply.requests == 1
    assert endpoint.count == 1 and client.sleeps == []
    assert chat.stats == EndpointStats(calls=1, failures=1, requests=1)


def test_a_timeout_is_retried_then_succeeds_or_runs_out(endpoint, client):
    chat = client(timeout_s=0.2, max_retries=1)
    endpoint.push(body=GOOD, delay=1.5)  # the first attempt times out, the retry is answered at once
    start = time.monotonic()
    reply = chat.chat(HELLO)
    assert time.monotonic() - start < 1.2  # one 0.2 s attempt, never the server's 1.5 s
    assert reply.content == GOOD_TEXT and reply.requests == 2 and client.sleeps == [0.5]

    endpoint.push(body=GOOD, delay=1.5)
    endpoint.push(body=GOOD, delay=1.5)
    start = time.monotonic()
    reply = chat.chat(HELLO)
    assert time.monotonic() - start < 1.2  # two 0.2 s attempts
    assert not reply.answered and "timeout" in reply.error and "after 2 attempts" in reply.error
    assert endpoint.count == 4 and client.sleeps == [0.5, 0.5]
    assert chat.stats == EndpointStats(calls=2, failures=1, requests=4, input_tokens=11, output_tokens=5)


def test_connection_refused_is_retried_and_fails(client):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    chat = client(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    reply = chat.chat(HELLO)
    assert not reply.answered and "connection error" in reply.error and reply.requests == 3
    assert client.sleeps == [0.5, 1.0] and chat.stats == EndpointStats(calls=1, failures=1, requests=3)


def test_a_cache_hit_sends_no_request_and_the_cache_file_reloads(endpoint, client, tmp_path):
    path = tmp_path / "cache" / "replies.jsonl"
    chat = client(cache=True, cache_path=str(path))
    first = chat.chat(HELLO)
    again = chat.chat(HELLO, temperature=1.0)  # the key is (model, messages): no sampling settings
    assert not first.cached and first.requests == 1
    assert again == ChatReply(GOOD_TEXT, error=None, answered=True, cached=True)
    assert endpoint.count == 1
    assert chat.stats == EndpointStats(calls=1, cache_hits=1, requests=1, input_tokens=11, output_tokens=5)
    blob = json.dumps(["m-test", HELLO], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    [line] = path.read_text().splitlines()  # the format judge caches were written in
    assert json.loads(line) == {"key": hashlib.sha256(blob.encode()).hexdigest(), "model": "m-test",
                                "content": GOOD_TEXT, "prompt_tokens": 11, "completion_tokens": 5}

    with path.open("a") as fh:
        fh.write('{"key": "torn')  # an interrupted write leaves a torn last line
    reloaded = client(cache=True, cache_path=str(path))
    assert reloaded.chat(HELLO).cached and endpoint.count == 1
    other = [{"role": "user", "content": "another question"}]
    assert not reloaded.chat(other).cached and endpoint.count == 2
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["key"] == reloaded.cache_key(other)  # on its own line
    assert client(cache=True, cache_path=str(path)).chat(other).cached and endpoint.count == 2
    assert not client(cache=True, cache_path=str(path), model="other").chat(HELLO).cached  # the model is in the key
    assert endpoint.count == 3


def test_the_cache_keeps_only_what_keep_accepts(endpoint, client, tmp_path):
    path = tmp_path / "replies.jsonl"
    chat = client(cache=True, cache_path=str(path), keep=lambda content: content.startswith("{"))
    endpoint.push(body=completion("garbage"))
    assert chat.chat(HELLO).content == "garbage"  # returned, not kept
    assert not chat.chat(HELLO).cached and chat.chat(HELLO).cached and endpoint.count == 2
    assert [json.loads(line)["content"] for line in path.read_text().splitlines()] == [GOOD_TEXT]

    path.write_text(json.dumps({"key": chat.cache_key(HELLO), "model": "m-test", "content": "garbage"}) + "\n")
    refusing = client(cache=True, cache_path=str(path), keep=lambda content: content.startswith("{"))
    assert not refusing.chat(HELLO).cached and endpoint.count == 3  # a refused line is not loaded
    assert client(cache=True, cache_path=str(path)).chat(HELLO).cached  # by default every content is kept


def test_a_cache_file_needs_the_cache():
    with pytest.raises(ValueError, match="cache_path needs cache=True"):
        ChatEndpointConfig(base_url="http://127.0.0.1:9/v1", model="m", cache_path="x.jsonl")


def test_the_external_actor_asks_through_a_chat_endpoint(endpoint, monkeypatch):
    """The Table 3 external writer/scorer is a :class:`ChatEndpoint` (its key, its retries, its
    counters) answering a call's messages at the call's sampling settings."""
    monkeypatch.setenv("SERA_EXTERNAL_API_KEY", "ext-key")
    actor = external_actor("external", "policy", endpoint.url, "writer")
    assert isinstance(actor, ExternalChatActor) and isinstance(actor.endpoint, ChatEndpoint)
    endpoint.push(503, {"error": "busy"})  # retried by the client (1 s backoff)
    endpoint.push(body=completion('{"criteria": []}', usage=(300, 120)))
    call = Call("rubric", [], SamplingParams(temperature=1.0, max_new_tokens=900), messages=HELLO)
    out = asyncio.run(actor.complete(call))
    assert out.text == '{"criteria": []}' and out.finish_reason == "stop"
    assert out.meta == {"error": None, "input_tokens": 300, "output_tokens": 120}
    assert [r["body"] for r in endpoint.received] == [
        {"model": "writer", "messages": HELLO, "temperature": 1.0, "max_tokens": 900}] * 2
    assert endpoint.received[1]["headers"]["Authorization"] == "Bearer ext-key"
    assert actor.stats is actor.endpoint.stats
    assert actor.stats == EndpointStats(calls=1, requests=2, input_tokens=300, output_tokens=120)

    endpoint.push(400, {"error": "bad model"})  # a failed call: empty text, the error in meta, never raised
    out = asyncio.run(actor.complete(call))
    assert out.text == "" and out.finish_reason == "error" and out.meta["error"].startswith("HTTP 400")
    assert actor.stats.failures == 1 and actor.stats.calls == 2
    with pytest.raises(ValueError, match="only writes or scores rubrics"):
        asyncio.run(actor.complete(Call("act", [1], SamplingParams())))
