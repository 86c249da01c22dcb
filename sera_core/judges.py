"""External judges: the binary labels of counterfactual branches, and what they cost.

At a rubric-generation delegation point SERA runs B = 8 counterfactual child branches
on forked worlds, and each branch gets an *external* binary label y_b (SPEC 3). The
ranking loss only compares branches that have a label, so a judge must be able to say
"no label" as well as "success" or "failure". The judges:

* :class:`~sera_core.envs.textcraft.verifier.TextCraftVerifier` - TextCraft-Synth's
  program checker, applied to a child :class:`~sera_core.envs.textcraft.env.TextCraftEnv`:
  the verdict frozen when the child's episode ended (net gain against the child's own
  start, after ``finish()``).
* :class:`~sera_core.envs.textworld.verifier.TextWorldVerifier` - our programmatic subtask
  checker for TextWorld-Sync (:mod:`sera_core.envs.textworld.goals`): labels children whose
  goal is written in the canonical form; any other goal gets no label.
* :class:`LLMJudge` (here) - the paper's TextWorld judge (Kimi in the paper): any
  OpenAI-compatible chat-completions endpoint, asked for strict JSON
  ``{"success": bool, "reason": str}`` about a goal, a trajectory and a final state, with
  retries, a response cache and token accounting. It never raises: network errors and
  unparseable replies give no label.
* :class:`~sera_core.envs.textworld.verifier.CanonicalOrLLM` - TextWorld with an LLM judge
  configured (``judge: llm``): a goal in the canonical form is checked by the program, any
  other by the LLM judge on the child's rendered trajectory.

This module knows no benchmark: the verdict and its counters (:class:`JudgeVerdict`,
:class:`JudgeStats`, :class:`CountingJudge`) and the LLM judge; each benchmark's checker lives
with its benchmark and builds on them.

The benchmark registry builds the judge a config names
(:meth:`sera_core.envs.registry.Benchmark.make_judge`;
training and evaluation share it).

Every judge returns a :class:`JudgeVerdict`. ``success=None`` means *no label*
(unknown goal, unparseable reply, network error): it must never be counted as a
success or a failure; callers drop that branch from the ranking pairs.

What is counted (the paper's Table 2 reports external supervision calls, and for
TextWorld the judge's input tokens): every judge keeps a :class:`JudgeStats` in
``.stats``, updated under a lock (branches may be judged from several threads):

* ``calls`` - judge invocations that consulted the external supervisor (a program
  check, or an LLM request including all its retries); a cache hit is not a call;
* ``cache_hits`` - LLM invocations answered from the response cache (no tokens spent);
* ``failures`` - invocations that ended in an error or an unparseable reply;
* ``unlabeled`` - verdicts with ``success=None`` (failures plus, for the TextWorld
  verifier, non-canonical goals);
* ``requests`` - HTTP requests sent (an LLM call with retries sends several);
* ``input_tokens`` / ``output_tokens`` - the endpoint's ``usage.prompt_tokens`` and
  ``usage.completion_tokens`` (estimated when the endpoint omits them; see
  :class:`LLMJudge`); program judges spend none.

Every judge returns the same verdict type and keeps the same counters (Table 2's cost). A
judge that may wait on a network says so with ``remote = True``: the runtime calls it off the
event loop.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sera_core.utils.text import truncate_middle

__all__ = [
    "CountingJudge",
    "JudgeStats",
    "JudgeVerdict",
    "LLMJudge",
    "LLMJudgeConfig",
    "parse_judge_output",
    "truncate_middle",
]


@dataclass(frozen=True)
class JudgeVerdict:
    """One judge's answer about one branch."""

    success: bool | None
    """True / False: the external label; None: no label (unknown, unparseable, error)."""
    reason: str
    """Why (the checker's reason, the judge's reason, or the error)."""
    source: str
    """Which judge gave it (``textcraft_verifier``, ``textworld_verifier``, ``llm:<model>``)."""
    input_tokens: int = 0
    """Prompt tokens this verdict spent (0 for program judges and cache hits)."""
    output_tokens: int = 0
    """Completion tokens this verdict spent."""
    cached: bool = False
    """True when the answer came from the response cache."""

    @property
    def labeled(self) -> bool:
        """Whether this verdict is a usable binary label."""
        return self.success is not None


@dataclass
class JudgeStats:
    """Counters of one judge (see the module docstring for what each one means)."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    unlabeled: int = 0
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class CountingJudge:
    """What every judge shares: a name, its :class:`JudgeStats` and the lock that guards them
    (the base of the program checkers and of :class:`LLMJudge`)."""

    name = "judge"

    def __init__(self) -> None:
        self.stats = JudgeStats()
        self._lock = threading.Lock()

    def _record(self, verdict: JudgeVerdict, *, failure: bool = False, requests: int = 0) -> JudgeVerdict:
        with self._lock:
            s = self.stats
            if verdict.cached:
                s.cache_hits += 1
            else:
                s.calls += 1
            s.failures += int(failure)
            s.unlabeled += int(verdict.success is None)
            s.requests += requests
            s.input_tokens += verdict.input_tokens
            s.output_tokens += verdict.output_tokens
        return verdict

    def stats_snapshot(self) -> dict[str, int]:
        """A consistent copy of the counters."""
        with self._lock:
            return self.stats.as_dict()


# -- the LLM judge -----------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You are a strict judge. You decide whether an agent accomplished its goal in a text-based "
    "environment, using only the evidence given: the goal, the agent's trajectory and the final "
    "environment state. Claims the agent makes without evidence in the state do not count.\n"
    'Reply with exactly one JSON object and nothing else: {"success": true or false, '
    '"reason": "one short sentence"}'
)


def build_messages(goal: str, trajectory: str, final_state: str, *, max_chars: int = 0) -> list[dict[str, str]]:
    """The judge's chat messages (system + user)."""
    user = (
        f"## Goal\n{goal.strip()}\n\n"
        f"## Agent trajectory\n{truncate_middle(trajectory.strip(), max_chars) or '(empty)'}\n\n"
        f"## Final environment state\n{final_state.strip() or '(not given)'}\n\n"
        'Did the agent accomplish the goal? Answer with the JSON object only: {"success": ..., "reason": ...}'
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


_FENCE = re.compile(r"^```(?:json|JSON)?[ \t]*\n?(.*?)\n?[ \t]*```$", re.DOTALL)


def parse_judge_output(content: Any) -> tuple[bool, str] | None:
    """``(success, reason)`` from a judge reply, or None when it is not strict JSON.

    The reply must be one JSON object with a boolean ``success`` and a string
    ``reason``, optionally surrounded by whitespace or wrapped in a ```` ```json ````
    fence. Anything else (prose around it, two objects, ``"success": "yes"``) is None.
    """
    if not isinstance(content, str):
        return None
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("success"), bool) or not isinstance(obj.get("reason"), str):
        return None
    return obj["success"], obj["reason"]


@dataclass(frozen=True)
class LLMJudgeConfig:
    """How to reach an OpenAI-compatible chat-completions endpoint used as a judge."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Root of the API; requests go to ``{base_url}/chat/completions``."""
    model: str = "judge"
    """Model name sent in every request (part of the cache key)."""
    api_key_env: str | None = "SERA_JUDGE_API_KEY"
    """Name of the environment variable that holds the API key (the key itself is never
    stored in the config or written to logs). Unset or empty: no Authorization header."""
    timeout_s: float = 60.0
    """Socket timeout of one HTTP request, in seconds."""
    max_retries: int = 4
    """Retries after the first attempt, on connection errors, timeouts, HTTP 429 and 5xx
    (other 4xx are not retried)."""
    backoff_s: float = 1.0
    """Exponential backoff base: the k-th retry waits ``backoff_s * 2**(k-1)`` seconds."""
    temperature: float = 0.0
    """Sampling temperature (0: the judge should be deterministic)."""
    max_tokens: int = 256
    """Completion budget of one reply."""
    cache_path: str | None = None
    """Optional JSONL response cache, keyed by sha256 of (model, messages): loaded when
    the judge starts, one line appended atomically per new parsed answer."""
    max_trajectory_chars: int = 48_000
    """Trajectories longer than this are cut in the middle (0: never cut)."""


class _RequestError(Exception):
    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable
        self.attempts = 1


class LLMJudge(CountingJudge):
    """An LLM judge over any OpenAI-compatible ``/chat/completions`` endpoint.

    ``judge(goal, trajectory, final_state)`` sends a short system + user prompt asking
    for strict JSON ``{"success": bool, "reason": str}`` and returns a
    :class:`JudgeVerdict`. It never raises: after all retries a network failure is
    ``success=None`` with the error in ``reason``; an unparseable reply is
    ``success=None`` with reason ``unparseable judge output: ...``; both count as
    failures.

    Tokens: ``usage.prompt_tokens`` / ``usage.completion_tokens`` of the response are
    counted. If the endpoint omits ``usage`` (or a field of it), the count is
    *estimated* as ``len(text) // 4`` of the prompt messages' text (input) or of the
    reply's content (output). Tokens of an unparseable reply are counted too (they were
    spent); failed requests spend none.

    Cache: with ``config.cache_path`` every parsed answer is appended to a JSONL file
    keyed by ``sha256(json([model, messages]))`` and loaded when a judge starts; a hit
    returns ``cached=True``, counts in ``cache_hits`` (not ``calls``) and spends no
    tokens. Unparseable replies and errors are not cached, so they are asked again.
    Two threads missing the same key at once may both ask the endpoint.

    ``sleep`` (default :func:`time.sleep`) is called between retries; tests inject one
    that records the delays. Counters and the cache are guarded by a lock, so branches
    may be judged from several threads.
    """

    remote = True
    """It waits on an endpoint: the runtime calls it off the event loop."""

    def __init__(self, config: LLMJudgeConfig, *, sleep: Callable[[float], None] = time.sleep):
        super().__init__()
        self.config = config
        self.name = f"llm:{config.model}"
        self._sleep = sleep
        self._cache: dict[str, dict[str, Any]] = {}
        self._cache_needs_newline = False
        self._cache_lock = threading.Lock()
        if config.cache_path:
            self._load_cache(Path(config.cache_path))

    # -- cache -------------------------------------------------------------------------------
    def cache_key(self, messages: list[dict[str, str]]) -> str:
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
            if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
                continue
            if parse_judge_output(entry.get("content")) is not None:
                self._cache[entry["key"]] = entry

    def _append_cache(self, entry: dict[str, Any]) -> None:
        with self._cache_lock:
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

    # -- judging -----------------------------------------------------------------------------
    def judge(self, goal: str, trajectory: str, final_state: str) -> JudgeVerdict:
        """Ask the judge whether ``goal`` was accomplished (see the class docstring)."""
        messages = build_messages(goal, trajectory, final_state, max_chars=self.config.max_trajectory_chars)
        key = self.cache_key(messages)
        with self._cache_lock:
            hit = self._cache.get(key)
        if hit is not None:
            success, reason = parse_judge_output(hit["content"])  # type: ignore[misc]
            return self._record(JudgeVerdict(success, reason, self.name, cached=True))

        try:
            response, requests = self._post_with_retries(messages)
        except _RequestError as exc:
            verdict = JudgeVerdict(None, f"judge request failed: {exc}", self.name)
            return self._record(verdict, failure=True, requests=exc.attempts)

        content = None
        try:
            content = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            pass
        usage = response.get("usage") if isinstance(response, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        prompt_text = "".join(m["content"] for m in messages)
        input_tokens = usage.get("prompt_tokens")
        output_tokens = usage.get("completion_tokens")
        if not isinstance(input_tokens, int) or isinstance(input_tokens, bool):
            input_tokens = len(prompt_text) // 4
        if not isinstance(output_tokens, int) or isinstance(output_tokens, bool):
            output_tokens = len(content) // 4 if isinstance(content, str) else 0

        parsed = parse_judge_output(content)
        if parsed is None:
            shown = content if isinstance(content, str) else json.dumps(response)[:300]
            verdict = JudgeVerdict(None, f"unparseable judge output: {shown[:300]!r}", self.name,
                                   input_tokens, output_tokens)
            return self._record(verdict, failure=True, requests=requests)
        success, reason = parsed
        self._append_cache({"key": key, "model": self.config.model, "content": content,
                            "prompt_tokens": input_tokens, "completion_tokens": output_tokens})
        return self._record(JudgeVerdict(success, reason, self.name, input_tokens, output_tokens), requests=requests)

    # -- HTTP ---------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.config.api_key_env) if self.config.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def chat(self, messages: list[dict[str, str]], *, temperature: float | None = None,
             max_tokens: int | None = None) -> dict[str, Any]:
        """One free-form chat completion from the same endpoint (e.g. an external model that
        writes or scores rubrics). Never raises; returns ``content`` (None on failure),
        ``error``, ``requests``, ``input_tokens`` and ``output_tokens`` (estimated like the
        judge's when the endpoint omits ``usage``); the judge's counters are not touched."""
        try:
            response, requests = self._post_with_retries(messages, temperature, max_tokens)
        except _RequestError as exc:
            return {"content": None, "error": str(exc), "requests": exc.attempts, "input_tokens": 0, "output_tokens": 0}
        try:
            content = response["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            content = None
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        tokens_in, tokens_out = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(tokens_in, int) or isinstance(tokens_in, bool):
            tokens_in = len("".join(m["content"] for m in messages)) // 4
        if not isinstance(tokens_out, int) or isinstance(tokens_out, bool):
            tokens_out = len(content) // 4 if isinstance(content, str) else 0
        error = None if isinstance(content, str) else "the reply holds no message content"
        return {"content": content if isinstance(content, str) else None, "error": error, "requests": requests,
                "input_tokens": tokens_in, "output_tokens": tokens_out}

    def _post_with_retries(self, messages: list[dict[str, str]], temperature: float | None = None,
                           max_tokens: int | None = None) -> tuple[dict[str, Any], int]:
        cfg = self.config
        body = json.dumps({"model": cfg.model, "messages": messages,
                           "temperature": cfg.temperature if temperature is None else temperature,
                           "max_tokens": cfg.max_tokens if max_tokens is None else max_tokens}).encode("utf-8")
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._post_once(url, body), attempts
            except _RequestError as exc:
                if not exc.retryable or attempts > cfg.max_retries:
                    exc.attempts = attempts
                    if attempts > 1:
                        exc.args = (f"{exc} (after {attempts} attempts)",)
                    raise
            self._sleep(cfg.backoff_s * 2 ** (attempts - 1))

    def _post_once(self, url: str, body: bytes) -> dict[str, Any]:
        request = urllib.request.Request(url, data=body, headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read().decode("utf-8", errors="replace")[:200]
            except Exception:  # noqa: BLE001 - the body is only for the message
                detail = ""
            retryable = exc.code == 429 or exc.code >= 500
            raise _RequestError(f"HTTP {exc.code} {exc.reason}: {detail}".rstrip(": "), retryable) from None
        except urllib.error.URLError as exc:
            kind = "timeout" if isinstance(exc.reason, TimeoutError) else "connection error"
            raise _RequestError(f"{kind}: {exc.reason}", True) from None
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            kind = "timeout" if isinstance(exc, TimeoutError) else "connection error"
            raise _RequestError(f"{kind}: {exc or type(exc).__name__}", True) from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = {"choices": [{"message": {"content": None}}], "_raw": raw[:300].decode("utf-8", "replace")}
        return data if isinstance(data, dict) else {"_raw": str(data)[:300]}
