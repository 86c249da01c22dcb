"""The policy interface every backend implements.

``generate(prompts, params)`` takes a batch of prompts as token ids and returns, per
prompt, the new token ids, the log-probability of each under the policy, and the
decoded text. Conventions shared by all backends:

* Log-probabilities are of the *unmodified* model distribution (log-softmax of the raw
  logits, temperature 1), whatever temperature was used to sample: they are the
  "old" log-probabilities pi_old(a_t | h_t) of CISPO, and the training temperature is
  1.0 anyway (SPEC 4).
* Temperature 0 is greedy decoding (deterministic).
* Generation ends at the end-of-sequence token (kept, with its logprob), at the first
  completion of a stop string (the tokens that complete it are kept, so the stop
  string is part of the text: trajectories keep every generated token), with
  ``stop_json`` at the token that completes the first JSON object (:func:`json_object_closed`),
  or at ``max_new_tokens``.
* ``seed`` gives a sequence its own random stream, so what it draws does not depend on the
  other sequences' draws, and the same calls made the same way repeat token for token. It does
  not make a sample independent of the batch: the logits it samples from may differ in their
  last bits with the batch's shapes (``hf``: the padded block; ``vllm``: the engine step's
  requests), and a draw that falls within that rounding of a token boundary then picks the
  neighbouring token. Runs repeat because the runtime submits calls in an order its event
  loop fixes (tested per backend: tests/test_policy.py, tests/test_vllm_backend.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    temperature: float = 1.0
    """0 means greedy."""
    max_new_tokens: int = 512
    """Completion cap (TextCraft 512, TextWorld 3,072 per turn; SPEC 4)."""
    stop: tuple[str, ...] = ()
    """Stop strings (e.g. ``</python>``); the completing tokens are kept."""
    seed: int | None = None
    """Per-sequence sampling seed (derived per sample by the caller)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    stop_json: bool = False
    """End the completion at the token that completes its first JSON object (rubric and
    scoring calls: their parsers read only that object, so later tokens change nothing, and a
    model that writes the object and then runs on, as the embedded policy does, stops there
    instead of at ``max_new_tokens``)."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.max_new_tokens < 1 or not 0 < self.top_p <= 1:
            raise ValueError("temperature >= 0, max_new_tokens >= 1 and 0 < top_p <= 1 are required")


@dataclass(frozen=True)
class Generation:
    """One completion."""

    token_ids: list[int]
    logprobs: list[float]
    """One per token (see the module docstring)."""
    text: str
    finish_reason: str
    """``stop`` (a stop string), ``json`` (``stop_json``), ``eos`` or ``length``."""
    stop_string: str | None = None
    meta: dict = field(default_factory=dict)


class Policy(Protocol):
    """What the runtime needs from a policy backend."""

    tokenizer: Any
    """The Hugging Face tokenizer of the model (its chat template formats prompts)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Generation]:
        """One completion per prompt (``params`` shared or one per prompt)."""
        ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` under the tokenizer's chat template, ready to generate."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Text of token ids (no special-token stripping beyond the tokenizer's defaults)."""
        ...


def per_prompt(params: SamplingParams | list[SamplingParams], n: int) -> list[SamplingParams]:
    """``params`` as one entry per prompt (a shared one repeated)."""
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise ValueError(f"{len(params)} sampling params for {n} prompts")
    return list(params)


def json_object_closed(text: str) -> bool:
    """Whether a complete JSON object starts at the first ``{`` of ``text``.

    Then :func:`~sera_core.rubrics.extract_json_object` returns that same object for ``text``
    and for every continuation of it (it decodes from the first ``{`` and an object's end
    does not depend on what follows), so generation may stop there losing nothing the
    parsers read. Otherwise (no ``{`` yet, the object still open, or invalid JSON from the
    first ``{``) it is False and generation goes on."""
    start = text.find("{")
    if start == -1:
        return False
    try:
        json.JSONDecoder().raw_decode(text, start)
    except (json.JSONDecodeError, RecursionError):
        return False
    return True


def json_closed_by_last(token_ids: list[int], decode: Callable[[list[int]], str]) -> bool:
    """Whether the last of ``token_ids`` completes the text's first JSON object
    (:func:`json_object_closed`, decoded only when that token prints a ``}``): the ``stop_json``
    test of every backend, so they stop at the same token."""
    return "}" in decode(token_ids[-1:]) and json_object_closed(decode(token_ids))
