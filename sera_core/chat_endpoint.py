"""A client of one OpenAI-compatible chat-completions endpoint: HTTP, retries, a response
cache, and what it cost.

Two parts of the workbook talk to a model behind such an endpoint, each through its own
:class:`ChatEndpoint`:

* the LLM judge of TextWorld children (:class:`sera_core.judges.LLMJudge`, key in
  ``$SERA_JUDGE_API_KEY``): it builds the prompt and reads the verdict, with a cache of
  parseable verdicts;
* the external rubric writer / scorer of the Table 3 ablations
  (:class:`sera_core.agents.actors.ExternalChatActor`, key in ``$SERA_EXTERNAL_API_KEY``).

The requests go through the official ``openai`` client (``client.chat.completions`` with its
raw response): :meth:`ChatEndpoint.chat` sends ``POST {base_url}/chat/completions`` with the
model, the messages, the temperature and the completion budget (``max_tokens``), and never
raises: every outcome is a :class:`ChatReply`. Connection errors, timeouts, HTTP 429 and 5xx
are retried with exponential backoff; other 4xx are not. A reply whose body is not JSON, or
holds no message content, is an answer without content (not retried).

The retries are this module's, not openai's: the client is built with ``max_retries=0`` and
:class:`ChatEndpoint` retries over openai's typed exceptions (``APIConnectionError``, which
``APITimeoutError`` is, ``RateLimitError``, ``InternalServerError``; any other
``APIStatusError`` ends the call). openai's own retries would wait on its own schedule
(0.5 s doubling up to 8 s, jittered, or the server's ``Retry-After``) instead of
``backoff_s * 2**(k-1)``, retry 408 and 409 as well, and hide the attempts inside one call;
here each attempt is one HTTP request, counted in ``requests``, and the waits go through the
``sleep`` the endpoint was given.

The key is not the client's: the client holds a placeholder (openai refuses to start without
one, and ignores ``$OPENAI_API_KEY`` once given one), and every request names its own
``Authorization`` header, ``Bearer <key>`` from the environment at that moment, or omitted
when there is no key.

Tokens are the endpoint's ``usage.prompt_tokens`` / ``usage.completion_tokens``; when it
omits them (or a field of them) they are *estimated* as ``len(text) // 4`` of the
messages' text (input) or of the reply's content (output). A failed request spends none,
a cache hit none.

Counted in :class:`EndpointStats` (``.stats``, under a lock: calls may come from several
threads): ``calls`` (chat calls that went to the endpoint, all their retries included),
``cache_hits``, ``failures`` (calls that ended without content), ``requests`` (HTTP
requests sent) and ``input_tokens`` / ``output_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai

__all__ = ["ChatEndpoint", "ChatEndpointConfig", "ChatReply", "EndpointStats"]


@dataclass(frozen=True)
class ChatEndpointConfig:
    """How to reach one OpenAI-compatible chat-completions endpoint."""

    base_url: str
    """Root of the API; requests go to ``{base_url}/chat/completions``."""
    model: str | None
    """Model name sent in every request (part of the cache key)."""
    api_key_env: str | None = None
    """Name of the environment variable that holds the API key, read at every request (the
    key itself is never stored in the config or written to logs). None, unset or empty: no
    Authorization header."""
    timeout_s: float = 60.0
    """Timeout of one HTTP request, in seconds (openai's ``timeout``: for connecting, each
    read and write, and waiting for a pooled connection)."""
    max_retries: int = 4
    """Retries after the first attempt, on connection errors, timeouts, HTTP 429 and 5xx
    (other 4xx are not retried); run by :class:`ChatEndpoint`, openai's own are off."""
    backoff_s: float = 1.0
    """Exponential backoff base: the k-th retry waits ``backoff_s * 2**(k-1)`` seconds."""
    temperature: float = 0.0
    """Sampling temperature of a call that names none."""
    max_tokens: int = 256
    """Completion budget of a call that names none."""
    cache: bool = False
    """Answer a call whose (model, messages) were answered before from the kept reply, without
    a request. The key holds no sampling settings, so a cache suits deterministic use (the
    judge, at temperature 0)."""
    cache_path: str | None = None
    """JSONL file behind the cache (``cache`` only): loaded when the client starts, one line
    ``{"key", "model", "content", "prompt_tokens", "completion_tokens"}`` appended atomically
    per newly kept reply."""

    def __post_init__(self) -> None:
        if self.cache_path and not self.cache:
            raise ValueError("cache_path needs cache=True")


@dataclass(frozen=True)
class ChatReply:
    """The outcome of one :meth:`ChatEndpoint.chat` call."""

    content: str | None
    """The reply's message content; None when no reply came back or it held none."""
    error: str | None
    """Why ``content`` is None: the request's last failure (``HTTP 502 ...``, ``timeout: ...``,
    ``connection error: ...``, with the attempts when it was retried) or ``the reply holds no
    message content: <the reply>``; None when there is content."""
    answered: bool
    """Whether a reply came back (from the endpoint or the cache), content or not; False:
    every attempt failed."""
    requests: int = 0
    """HTTP requests sent (0 for a cache hit)."""
    input_tokens: int = 0
    """Prompt tokens spent (the endpoint's count, or estimated; 0 for failures and cache hits)."""
    output_tokens: int = 0
    """Completion tokens spent (likewise)."""
    cached: bool = False
    """True when the content came from the cache."""


@dataclass
class EndpointStats:
    """Counters of calls to an external model (see :mod:`sera_core.chat_endpoint`)."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _RequestError(Exception):
    """A request that ended without an answer (an HTTP error status, a timeout, a broken
    connection): ``retryable`` or not, after ``attempts`` attempts."""

    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable
        self.attempts = 1


_PLACEHOLDER_KEY = "unused: each request names its own Authorization header"
"""The openai client's ``api_key`` (it needs one); never sent."""

_RETRYABLE = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
"""openai's exceptions for connection errors and timeouts, HTTP 429, HTTP 5xx."""


def _request_error(exc: openai.APIStatusError | openai.APIConnectionError) -> _RequestError:
    """The :class:`_RequestError` of one failed openai request: ``HTTP <code> <reason>: <body>``
    for an error status, ``timeout: ...`` or ``connection error: ...`` for no response."""
    retryable = isinstance(exc, _RETRYABLE)
    if isinstance(exc, openai.APIStatusError):
        response = exc.response
        message = f"HTTP {response.status_code} {response.reason_phrase}: {response.text[:200]}".rstrip(": ")
    else:
        kind = "timeout" if isinstance(exc, openai.APITimeoutError) else "connection error"
        message = f"{kind}: {exc.__cause__ or exc}"
    return _RequestError(message, retryable)


def _decode(raw: bytes) -> dict[str, Any]:
    """The JSON object in a reply's body; a body that is not one becomes an object without
    choices (``{"_raw": <its start>}``)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"_raw": raw[:300].decode("utf-8", "replace")}
    return data if isinstance(data, dict) else {"_raw": str(data)[:300]}


def _tokens(counted: Any, text: str | None) -> int:
    """``counted`` when the endpoint reported an integer, else the estimate ``len(text) // 4``
    (0 without text)."""
    if isinstance(counted, int) and not isinstance(counted, bool):
        return counted
    return len(text) // 4 if isinstance(text, str) else 0


class ChatEndpoint:
    """One OpenAI-compatible ``/chat/completions`` endpoint (see the module docstring).

    ``keep`` says which reply contents the cache keeps, and which lines of the cache file it
    loads (default: any content); a reply it refuses is returned but asked again next time.
    Two threads missing the same key at once may both ask the endpoint.

    ``sleep`` (default :func:`time.sleep`) is called between retries; tests pass one that
    records the delays."""

    def __init__(self, config: ChatEndpointConfig, *, keep: Callable[[str], bool] = lambda content: True,
                 sleep: Callable[[float], None] = time.sleep):
        self.config = config
        self.stats = EndpointStats()
        self._keep = keep
        self._sleep = sleep
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Any]] = {}
        self._cache_needs_newline = False
        client = openai.OpenAI(base_url=config.base_url, api_key=_PLACEHOLDER_KEY, max_retries=0,
                               timeout=config.timeout_s)
        self._completions = client.chat.completions.with_raw_response
        if config.cache_path:
            self._load_cache(Path(config.cache_path))

    def stats_snapshot(self) -> dict[str, int]:
        """A consistent copy of the counters."""
        with self._lock:
            return self.stats.as_dict()

    # -- the call ------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], *, temperature: float | None = None,
             max_tokens: int | None = None) -> ChatReply:
        """The endpoint's reply to ``messages`` at ``temperature`` with at most ``max_tokens``
        completion tokens (the config's when None), from the cache when it holds them; never
        raises, and counts the call."""
        if self.config.cache:
            with self._lock:
                hit = self._cache.get(self.cache_key(messages))
            if hit is not None:
                return self._count(ChatReply(hit["content"], error=None, answered=True, cached=True))
        try:
            response, requests = self._post_with_retries(messages, temperature, max_tokens)
        except _RequestError as exc:
            return self._count(ChatReply(None, error=str(exc), answered=False, requests=exc.attempts))
        try:
            content = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        content = content if isinstance(content, str) else None
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        reply = ChatReply(content, answered=True, requests=requests,
                          error=None if content is not None else
                          f"the reply holds no message content: {json.dumps(response)[:300]}",
                          input_tokens=_tokens(usage.get("prompt_tokens"), "".join(m["content"] for m in messages)),
                          output_tokens=_tokens(usage.get("completion_tokens"), content))
        if self.config.cache and content is not None and self._keep(content):
            self._append_cache({"key": self.cache_key(messages), "model": self.config.model, "content": content,
                                "prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens})
        return self._count(reply)

    def _count(self, reply: ChatReply) -> ChatReply:
        with self._lock:
            s = self.stats
            s.calls += not reply.cached
            s.cache_hits += reply.cached
            s.failures += reply.content is None
            s.requests += reply.requests
            s.input_tokens += reply.input_tokens
            s.output_tokens += reply.output_tokens
        return reply

    # -- cache -------------------------------------------------------------------------------
    def cache_key(self, messages: list[dict[str, str]]) -> str:
        """``sha256`` of the JSON of ``[model, messages]`` (sorted keys, compact): the cache's key."""
        blob = json.dumps([self.config.model, messages], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _load_cache(self, path: Path) -> None:
        if not path.exists():
            return
        data = path.read_bytes()
        self._cache_needs_newline = bool(data) and not data.endswith(b"\n")
        for line in data.decode("utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from an interrupted write
            if (isinstance(entry, dict) and isinstance(entry.get("key"), str) and isinstance(entry.get("content"), str)
                    and self._keep(entry["content"])):
                self._cache[entry["key"]] = entry

    def _append_cache(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._cache[entry["key"]] = entry
            if not self.config.cache_path:
                return
            path = Path(self.config.cache_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps(entry, ensure_ascii=False) + "\n"
            if self._cache_needs_newline:
                line = "\n" + line
            # One write() of the whole line on an O_APPEND descriptor: the line lands whole
            # at the end of the file, even with other appenders.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
            self._cache_needs_newline = False

    # -- HTTP ---------------------------------------------------------------------------------
    def _authorization(self) -> dict[str, str | openai.Omit]:
        """The ``Authorization`` header of a request: ``Bearer <key>`` with the key in the
        environment now, else omitted."""
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        return {"Authorization": f"Bearer {key}" if key else openai.omit}

    def _post_with_retries(self, messages: list[dict[str, str]], temperature: float | None,
                           max_tokens: int | None) -> tuple[dict[str, Any], int]:
        """``(response, attempts)``: the first answer after at most ``max_retries`` retries of
        retryable failures; raises :class:`_RequestError` (with its ``attempts``) otherwise."""
        cfg = self.config
        body = {"model": cfg.model, "messages": messages,
                "temperature": cfg.temperature if temperature is None else temperature,
                "max_tokens": cfg.max_tokens if max_tokens is None else max_tokens}
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._post_once(body), attempts
            except _RequestError as exc:
                if not exc.retryable or attempts > cfg.max_retries:
                    exc.attempts = attempts
                    if attempts > 1:
                        exc.args = (f"{exc} (after {attempts} attempts)",)
                    raise
            self._sleep(cfg.backoff_s * 2 ** (attempts - 1))

    def _post_once(self, body: dict[str, Any]) -> dict[str, Any]:
        """The decoded JSON object (see :func:`_decode`) of one request of ``body`` (one HTTP
        request: the client does not retry); raises :class:`_RequestError` on an HTTP error
        status, a timeout or a broken connection."""
        try:
            response = self._completions.create(**body, extra_headers=self._authorization())
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            raise _request_error(exc) from None
        return _decode(response.content)
