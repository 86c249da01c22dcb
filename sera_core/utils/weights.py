"""Save and load what a model trains: all its weights, or only an adapter's.

A model whose every parameter requires gradients is saved whole (``safetensors``'
``save_model``, which drops tied copies); a model with frozen parameters (a LoRA adapter
on a frozen base) is saved as its trainable parameters only, by name, since the frozen
base is known from elsewhere (the adapter's manifest).
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, load_model, save_file, save_model


def trains_everything(model) -> bool:
    return all(p.requires_grad for p in model.parameters())


def save_trained(model, path: str | os.PathLike) -> None:
    """Write the trained parameters of ``model`` to the safetensors file ``path``."""
    if trains_everything(model):
        save_model(model, str(path))
    else:
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}, str(path))


def load_trained(model, path: str | os.PathLike, device: str | torch.device | None = None) -> None:
    """Load a file written by :func:`save_trained` into ``model`` (same trained parameters,
    else ValueError naming the file)."""
    device = str(device or next(model.parameters()).device)
    if trains_everything(model):
        load_model(model, str(path), device=device)
        return
    state = load_file(str(path), device=device)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(state) != trained:
        raise ValueError(f"{path} holds other parameters than the model trains "
                         f"({len(state)} saved, {len(trained)} trained)")
    model.load_state_dict(state, strict=False)
