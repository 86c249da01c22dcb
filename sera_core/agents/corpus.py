"""The text the scripted policies' tokenizer is trained on, and that tokenizer.

Scripted actors (the expert) and the from-scratch test models need token ids before any
model is given: :func:`default_tokenizer` trains a byte-level BPE
(:func:`sera_core.policy.tiny.train_tokenizer`) on :func:`corpus`, the benchmarks'
vocabulary and the runtime's own text.
"""

from __future__ import annotations

import functools
import json

from sera_core.agents import prompts
from sera_core.envs.registry import ENVS
from sera_core.envs.textcraft.expert import expert_rubric as craft_rubric
from sera_core.envs.textcraft.tasks import world_for
from sera_core.envs.textcraft.world import WorldConfig
from sera_core.envs.textworld.data import COOKING, CUTTING, ROOMS, load_foods
from sera_core.envs.textworld.expert import expert_rubric as world_rubric
from sera_core.policy.tiny import train_tokenizer


def corpus(seed: int = 0) -> list[str]:
    """A small deterministic corpus of both benchmarks' vocabulary and the runtime's text.

    Item names and recipes of the default TextCraft world, CookingWorld foods with every
    preparation, the agents' system prompts, tool listings and the rubric/score prompt
    skeletons: enough for a byte-level BPE to keep common identifiers and phrases whole.
    """
    book = world_for(WorldConfig(seed=seed))
    texts = [f"{item}: {json.dumps(dict(r.ingredients))} -> {r.result_count}" for item, r in sorted(book.recipes.items())]
    texts += [" ".join(book.base_items)]
    foods = sorted(load_foods())
    texts += [f"bring the {f}, {c} and {k}, to the counter" for f in foods for c in COOKING for k in CUTTING]
    texts += [f"go to {r}" for r in ROOMS]
    for env in ENVS:
        for depth in (0, 3):
            texts.append(prompts.system_prompt(env, depth=depth, max_depth=3, max_steps=20))
    texts += [" ".join(f"## {s}" for s in prompts.RUBRIC_SECTIONS), prompts.RUBRIC_SYSTEM, prompts.SCORE_SYSTEM]
    texts += [json.dumps(craft_rubric({"a1_i5": 3})), json.dumps(world_rubric("prepare and eat dish_1"))]
    return texts


@functools.lru_cache(maxsize=2)
def default_tokenizer(vocab_size: int = 2000):
    """A tokenizer for scripted policies until a model is given: :func:`train_tokenizer`
    on :func:`corpus` (deterministic; about a second; cached per process)."""
    return train_tokenizer(corpus(), vocab_size)
