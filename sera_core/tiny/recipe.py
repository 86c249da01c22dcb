"""The tiny model's recipe: tokenizer, model, demonstrations, imitation, manifest.

:class:`TinyRecipe` holds every setting; its :meth:`~TinyRecipe.config_hash` names the
build. :func:`build` runs the recipe from scratch:

1. **Tokenizer**: a bootstrap tokenizer (:func:`sera_core.policy.tiny.default_tokenizer`)
   lets the expert play a small set of tasks (``corpus``); a byte-level BPE of
   ``vocab_size`` is trained on their text (prompts, observations, replies, rubrics,
   scores) plus :func:`sera_core.agents.corpus.corpus`, with identifier-aware
   pre-tokenisation and the ChatML template.
2. **Model**: a Qwen3 causal LM (:class:`~sera_core.policy.tiny.TinyModelConfig`)
   initialised from ``seed``.
3. **Demonstrations** (:mod:`sera_core.tiny.demos`) in the new tokenizer's ids, and the
   **imitation warm start** (:func:`sera_core.tiny.sft.train_sft`; resumable: a rerun of
   an interrupted build continues from its last checkpoint).
4. **Output**: model, tokenizer, ``manifest.json`` and ``MODEL_CARD.md`` are written to a
   temporary folder beside ``out`` and moved into place at the end, so a half-written
   model is never found at ``out``.

:func:`measure` runs a model at temperature 0 through the real runtime and returns the
figures the manifest and the docs report.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sera_core import __version__
from sera_core.agents.corpus import corpus, default_tokenizer
from sera_core.policy.tiny import TinyModelConfig, init_model, train_tokenizer
from sera_core.tiny.demos import DemoConfig, copy_drills, corpus_texts, demonstrations
from sera_core.tiny.sft import SFTConfig, train_sft
from sera_core.utils.folders import swap_in
from sera_core.utils.jsonio import hashed_settings, settings_hash

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "tiny"
"""Where the shipped model lives inside the package."""
MODEL_CARD = """# SERA tiny model

**What it is:** a {params:,}-parameter Qwen3-architecture causal LM with a {vocab}-token
byte-level tokenizer, built from scratch on a CPU by the SERA workbook's recipe
(`sera tiny build`, recipe hash `{hash}`), and trained only by imitating the workbook's
scripted expert on generated TextCraft-Synth and TextWorld-Sync tasks: acting, delegating,
writing rubrics and scoring children.

**What it is not:** it is *not* Qwen3-4B-Instruct-2507 and not a reproduction of any
result of the SERA paper. It is a tiny stand-in for an instruction-tuned base model, so
that every notebook runs the real code paths (tokens, logprobs, gradients) on a laptop.
Every report produced with it says so.

Measured results are in `manifest.json` (`results`).
"""


WARMUP_STEPS, SFT_STEPS = 3000, 1300


class Hashed:
    """A dataclass recipe named by its settings: ``to_json`` and ``config_hash``."""

    def to_json(self) -> dict[str, Any]:
        """The settings as JSON (``utils.jsonio.hashed_settings``: a field added after builds were
        named is left out while it holds its default, so those names stay valid)."""
        return hashed_settings(self)

    def config_hash(self) -> str:
        """sha256 of the recipe's settings (the first 16 hex digits name a build)."""
        return settings_hash(self.to_json())


@dataclass(frozen=True)
class TinyRecipe(Hashed):
    """Everything that determines the built model."""

    vocab_size: int = 4096
    """Tokenizer vocabulary (special tokens included)."""
    model: TinyModelConfig = field(default_factory=lambda: TinyModelConfig(
        hidden_size=128, intermediate_size=320, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=8192))
    """Model size."""
    corpus: DemoConfig = field(default_factory=lambda: DemoConfig(textcraft_worlds=12, textworld_tasks=24, world_seed=900))
    """Demonstrations whose text trains the tokenizer (worlds apart from the training ones)."""
    demos: DemoConfig = field(default_factory=lambda: DemoConfig(textworld_tasks=75, copy_drills=4000))
    """Demonstrations the model imitates."""
    warmup: SFTConfig | None = field(default_factory=lambda: SFTConfig(
        steps=WARMUP_STEPS, batch_size=16, lr=1e-2, warmup_steps=50, max_len=256, curriculum=False, weight_decay=0.0,
        checkpoint_every=250))
    """A copy warm-up before imitation (None: none): the same loop on ``warmup_drills``
    copy drills only (:func:`sera_core.tiny.demos.copy_drills`), at a high learning rate,
    so that copying from the context (induction) is learned before the transcripts need it."""
    warmup_drills: int = 20000
    """Copy drills of the warm-up (drawn with seed ``demos.seed + 1``)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=SFT_STEPS, batch_size=8, lr=3e-3, max_len=2048))
    """The imitation loop."""
    seed: int = 0
    """Seed of the model's initial weights."""


SMALL = TinyRecipe(
    vocab_size=600,
    model=TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=16, max_position_embeddings=4096),
    corpus=DemoConfig(textcraft_worlds=1, textcraft_mix={"easy": 1}, textworld_tasks=1, world_seed=900),
    demos=DemoConfig(textcraft_worlds=2, textcraft_mix={"easy": 1}, textworld_tasks=2, copy_drills=8),
    warmup=SFTConfig(steps=4, batch_size=4, lr=1e-2, warmup_steps=1, max_len=128, curriculum=False, log_every=2,
                     checkpoint_every=2),
    warmup_drills=16,
    sft=SFTConfig(steps=12, batch_size=4, lr=3e-3, warmup_steps=2, max_len=512, log_every=2, checkpoint_every=4),
)
"""A recipe small enough for tests and CI (seconds): same code, tiny sizes."""


def weights_sha256(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def build(recipe: TinyRecipe, out: str | os.PathLike, *, progress: bool = True, stop_after: int | None = None) -> dict:
    """Run ``recipe`` from scratch into ``out`` (see the module docstring); return the manifest.

    Training state lives in ``{out}.work`` (kept until the build completes, so a rerun
    resumes); ``stop_after`` stops the training after that many optimizer steps, warm-up
    steps first, then imitation steps (to test resuming), and returns None without writing
    ``out``."""
    out = Path(out)
    work, tmp = out.with_name(out.name + ".work"), out.with_name(out.name + ".tmp")
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(corpus_texts(default_tokenizer(), recipe.corpus) + corpus(), recipe.vocab_size)
    samples, demo_stats = demonstrations(tokenizer, recipe.demos, progress=progress)
    model = init_model(tokenizer, recipe.model, recipe.seed)
    warmup = None
    if recipe.warmup is not None:
        drills = copy_drills(tokenizer, replace(recipe.demos, copy_drills=recipe.warmup_drills, seed=recipe.demos.seed + 1))
        warmup = train_sft(model, drills, recipe.warmup, work / "warmup", progress=progress, pad_id=tokenizer.pad_token_id,
                           stop_after=stop_after)
        if stop_after is not None and warmup["steps"] < recipe.warmup.steps:
            return None
        stop_after = None if stop_after is None else max(1, stop_after - recipe.warmup.steps)
    summary = train_sft(model, samples, recipe.sft, work / "sft", progress=progress, pad_id=tokenizer.pad_token_id,
                        stop_after=stop_after)
    if stop_after is not None and summary["steps"] < recipe.sft.steps:
        return None
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    manifest = {
        "recipe_hash": recipe.config_hash(), "recipe": recipe.to_json(), "sera_version": __version__,
        "libraries": _versions(), "seed": recipe.seed, "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - t0, 1), "machine": _machine(),
        "demonstrations": demo_stats, "warmup": warmup, "training": summary, "results": None, "weights_sha256": weights_sha256(tmp),
    }
    write_manifest(tmp, manifest)
    swap_in(tmp, out)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def write_manifest(path: Path, manifest: dict) -> None:
    """``manifest.json`` and ``MODEL_CARD.md`` beside the weights (atomically)."""
    for name, text in (("manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n"),
                       ("MODEL_CARD.md", MODEL_CARD.format(params=manifest["parameters"], hash=manifest["recipe_hash"],
                                                           vocab=manifest["recipe"]["vocab_size"]))):
        tmp = path / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path / name)


def read_manifest(path: str | os.PathLike = ASSETS) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}


def _machine() -> str:
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return f"{platform.machine()} {os.cpu_count()} cores, {device}, {platform.system()}"
