"""The embedded policy: SmolLM2-135M-Instruct plus a LoRA warm start, built on a CPU.

The policy every laptop path uses (``--policy tiny``, ``model: tiny``) is the embedded
base model (:mod:`sera_core.policy.base_model`: SmolLM2-135M-Instruct, Q4_1 weights
de-quantized to fp32) with a LoRA adapter trained by imitation of the scripted expert.
Only the adapter (``adapter_model.safetensors``, ``adapter_config.json``) and its
``manifest.json`` ship in the package (:data:`sera_core.policy.models.EMBEDDED`); loading means base + adapter,
merged into plain linear layers for inference (:func:`sera_core.policy.models.load_model`).

:class:`WarmStartRecipe` holds every setting; :func:`build_adapter` runs it:

1. the base model and its tokenizer (the caller may name another base folder: tests use
   a small stand-in of the same architecture);
2. expert demonstrations of all three roles (acting, rubric writing, scoring) on both
   benchmarks, in the base tokenizer's ids (:func:`sera_core.tiny.demos.demonstrations`):
   fresh TextCraft worlds (the val world, seed 0, is never trained on), TextWorld's
   train fold, and every ``noisy_every``-th task played by the noisy expert with
   counterfactual groups, so failed children are scored too;
3. a LoRA adapter (peft) on every attention and MLP projection, trained with
   :func:`sera_core.tiny.sft.train_sft` (the completion-only loss computed without
   full-vocabulary logits, gradient checkpointing through the frozen base): peak memory
   stays near 10 GB on 2 CPU cores at batch 2 x 1,536 tokens;
4. the adapter, stored in bfloat16, and the manifest (base sha256, recipe and its hash,
   data counts, training summary; measured results are added by ``sera tiny measure
   --record``) are written to a temporary folder and swapped in whole.

An interrupted build resumes from its last checkpoint (``{out}.work``); the same recipe
gives bit-identical adapter weights on the same machine.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sera_core import __version__
from sera_core.policy.base_model import BASE_NAME, GGUF_SHA256, base_model_folder, load_tokenizer, weights_digest
from sera_core.policy.models import EMBEDDED, checkpoint_activations
from sera_core.tiny.demos import DemoConfig, demonstrations
from sera_core.tiny.recipe import Hashed, _machine
from sera_core.tiny.sft import SFTConfig, train_sft
from sera_core.utils.folders import sha256_file, swap_in

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama/Qwen block that get LoRA matrices."""


@dataclass(frozen=True)
class LoraSettings:
    """The adapter's shape (peft ``LoraConfig``)."""

    r: int = 16
    """Rank of each update ``B A`` (``A``: r x in, ``B``: out x r)."""
    alpha: int = 32
    """Scale: the update is ``(alpha / r) B A``."""
    dropout: float = 0.0
    """Dropout on the adapter's input (0 keeps training deterministic)."""
    targets: tuple[str, ...] = PROJECTIONS
    """Module names that get an adapter."""


@dataclass(frozen=True)
class WarmStartRecipe(Hashed):
    """Everything that determines the shipped adapter (its hash names the build)."""

    demos: DemoConfig = field(default_factory=lambda: DemoConfig(textcraft_worlds=60, textworld_tasks=40, noisy_every=3))
    """Demonstrations imitated (fresh TextCraft worlds from seed 1000; TextWorld train fold).
    ``sera tiny build --perturb 0.15`` adds recovery demonstrations (:attr:`DemoConfig.perturb`)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """The adapter."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(
        steps=220, batch_size=2, lr=1e-3, warmup_steps=10, weight_decay=0.0, max_len=1536, log_every=5,
        checkpoint_every=10))
    """The imitation loop (float32 on CPU: bf16 autocast measured slower there)."""
    seed: int = 0
    """Seed of the adapter's initial weights."""


SMALL_WARMSTART = WarmStartRecipe(
    demos=DemoConfig(textcraft_worlds=2, textcraft_mix={"easy": 1}, textworld_tasks=1),
    lora=LoraSettings(r=4, alpha=8),
    sft=SFTConfig(steps=6, batch_size=2, lr=1e-2, warmup_steps=1, max_len=512, log_every=2, checkpoint_every=2),
)
"""A recipe for tests and CI (seconds, on a small stand-in base): same code, tiny sizes."""


def lora_model(model, lora: LoraSettings, seed: int):
    """``model`` wrapped with a fresh LoRA adapter (initialised from ``seed``), with
    gradient checkpointing through the frozen base."""
    from peft import LoraConfig, get_peft_model

    checkpoint_activations(model)
    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.targets), task_type="CAUSAL_LM"))


def build_adapter(recipe: WarmStartRecipe, out: str | os.PathLike, *, base: str | os.PathLike | None = None,
                  progress: bool = True, stop_after: int | None = None) -> dict | None:
    """Run ``recipe`` on ``base`` (default: the embedded base model) into ``out``; return
    the manifest (None when ``stop_after`` stopped the training early; a rerun resumes)."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    work, tmp = out.with_name(out.name + ".work"), out.with_name(out.name + ".tmp")
    t0 = time.perf_counter()
    name = BASE_NAME if base is None else str(base)
    base = Path(base) if base is not None else base_model_folder()
    tokenizer = load_tokenizer(base)
    samples, demo_stats = demonstrations(tokenizer, recipe.demos, progress=progress)
    model = lora_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), recipe.lora, recipe.seed)
    summary = train_sft(model, samples, recipe.sft, work / "sft", progress=progress, pad_id=tokenizer.pad_token_id,
                        stop_after=stop_after)
    if summary["steps"] < recipe.sft.steps:
        return None
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "README.md").unlink(missing_ok=True)  # peft's empty model-card template
    _store_bf16(tmp / "adapter_model.safetensors")
    manifest = {
        "recipe_hash": recipe.config_hash(), "recipe": recipe.to_json(), "sera_version": __version__,
        "base": {"name": name,
                 "gguf_sha256": GGUF_SHA256, "weights_sha256": weights_digest(base)},
        "adapter_sha256": sha256_file(tmp / "adapter_model.safetensors"),
        "parameters": {"base": sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n),
                       "adapter": sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)},
        "build_seconds": round(time.perf_counter() - t0, 1), "machine": _machine(),
        "demonstrations": demo_stats, "training": summary, "results": None,
    }
    write_manifest(tmp, manifest)
    swap_in(tmp, out)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def read_manifest(path: str | os.PathLike = EMBEDDED) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def write_manifest(path: Path, manifest: dict) -> None:
    """``manifest.json`` beside the adapter (atomically)."""
    tmp = path / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path / "manifest.json")


def _store_bf16(path: Path) -> None:
    """Rewrite a safetensors file with its floating tensors in bfloat16 (halves the shipped size)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}, str(path),
              metadata={"format": "pt"})
