"""The text the scripted policies' tokenizer is trained on, and that tokenizer.

Scripted actors (the expert) and the from-scratch test models need token ids before any
model is given: :func:`default_tokenizer` trains a byte-level BPE
(:func:`sera_core.policy.tiny.train_tokenizer`) on :func:`corpus`, the benchmarks'
vocabulary and the runtime's own text.
"""

from __future__ import annotations

import functools

from sera_core.agents import prompts
from sera_core.envs.registry import BENCHMARKS
from sera_core.policy.tiny import train_tokenizer


def corpus(seed: int = 0) -> list[str]:
    """A small deterministic corpus of the benchmarks' vocabulary and the runtime's text.

    Each benchmark's own words (:meth:`~sera_core.envs.registry.Benchmark.vocabulary`:
    TextCraft's item names and recipes of the default world, CookingWorld foods with every
    preparation, an expert rubric each), the agents' system prompts, tool listings and the
    rubric/score prompt skeletons: enough for a byte-level BPE to keep common identifiers and
    phrases whole. (The BPE counts words, so the order of the texts does not change it.)
    """
    texts = [text for bench in BENCHMARKS.values() for text in bench.vocabulary(seed)]
    for env in BENCHMARKS:
        for depth in (0, 3):
            texts.append(prompts.system_prompt(env, depth=depth, max_depth=3, max_steps=20))
    texts += [" ".join(f"## {s}" for s in prompts.RUBRIC_SECTIONS), prompts.RUBRIC_SYSTEM, prompts.SCORE_SYSTEM]
    return texts


@functools.lru_cache(maxsize=2)
def default_tokenizer(vocab_size: int = 2000):
    """A tokenizer for scripted policies until a model is given: :func:`train_tokenizer`
    on :func:`corpus` (deterministic; about a second; cached per process)."""
    return train_tokenizer(corpus(), vocab_size)
