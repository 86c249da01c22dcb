"""Save and load what a model trains, from one process or from many (DDP or FSDP2).

A checkpoint holds the **trained parameters** of a model, by name, as full (unsharded)
tensors: all its weights, or only an adapter's when the base is frozen (a LoRA adapter
on the embedded base, known from the adapter's manifest). Tied copies are stored once
(``named_parameters`` lists a shared parameter under its first name). The optimizer state
is stored the same way: full tensors keyed by parameter name.

The state is read and written through ``torch.distributed.checkpoint.state_dict``
(``get_model_state_dict`` / ``set_model_state_dict`` with ``full_state_dict=True``): on
one process it is the plain state dict; under FSDP2 (``fully_shard``, what Accelerate's
``fsdp_version: 2`` configs apply) it gathers every shard into full tensors on the main
process and shards full tensors back on load. So one file format serves every layout,
and a run saved on 16 GPUs resumes on 8 or on one.

**Every process must call** :func:`trained_state` and :func:`optimizer_state` (they are
collectives under FSDP); the full tensors arrive on the main process (rank 0), which
writes the files. Loading reads the file on every process: the run's output folder must be
one that every node sees (a shared filesystem), as it is for the run's metrics.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors, on the CPU of rank 0
_SCATTER = StateDictOptions(full_state_dict=True, strict=False)  # full tensors in, each process keeps its shard


def trains_everything(model) -> bool:
    return all(p.requires_grad for p in model.parameters())


def trained_names(model) -> list[str]:
    """Names of the parameters ``model`` trains (tied parameters once, under their first name)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trained_state(model) -> dict[str, torch.Tensor]:
    """The trained parameters of ``model`` as full CPU tensors by name (a collective under
    FSDP: every process calls it; processes other than rank 0 may get an empty dict)."""
    full = get_model_state_dict(model, options=_GATHER)
    return {n: full[n].contiguous() for n in trained_names(model) if n in full}


def save_trained(model, path: str | os.PathLike) -> None:
    """Write the trained parameters of a one-process ``model`` to the safetensors file ``path``."""
    save_file(trained_state(model), str(path))


def load_trained(model, path: str | os.PathLike) -> None:
    """Load a file written from :func:`trained_state` into ``model`` (every process reads it;
    under FSDP each keeps its shard). The file must hold exactly the parameters the model
    trains, else ValueError naming the file."""
    state = load_file(str(path))
    trained = trained_names(model)
    if set(state) != set(trained):
        raise ValueError(f"{path} holds other parameters than the model trains "
                         f"({len(state)} saved, {len(trained)} trained)")
    set_model_state_dict(model, state, options=_SCATTER)


def optimizer_state(model, optimizer) -> dict:
    """The optimizer's state keyed by parameter name, full CPU tensors (a collective under FSDP)."""
    return get_optimizer_state_dict(model, _unwrapped(optimizer), options=_GATHER)


def load_optimizer_state(model, optimizer, path: str | os.PathLike) -> None:
    """Load a state written from :func:`optimizer_state` (``torch.save``) into ``optimizer``.

    The loaded hyperparameters come back with the types the optimizer was built with:
    ``set_optimizer_state_dict`` hands AdamW's ``betas`` back as a list, and a run resumed
    from a checkpoint would then save ``optimizer.pt`` with other bytes (another sha256)
    than the uninterrupted run, although every tensor is equal."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    opt = _unwrapped(optimizer)
    types = [{k: type(v) for k, v in group.items()} for group in opt.param_groups]
    set_optimizer_state_dict(model, opt, state, options=_SCATTER)
    for group, kinds in zip(opt.param_groups, types, strict=True):
        for k, v in group.items():
            if kinds.get(k) is tuple and isinstance(v, list):
                group[k] = tuple(v)


def _unwrapped(optimizer):
    """The torch optimizer inside Accelerate's ``AcceleratedOptimizer`` (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def full_weights(model) -> dict[str, torch.Tensor]:
    """Every entry of ``model``'s state dict as a full tensor on **every** process: a sharded
    parameter (FSDP2's DTensor) is all-gathered with ``full_tensor`` (a collective each
    process joins, in the same name order), a plain one is taken as it is. Unlike
    :func:`trained_state` (full tensors on rank 0 only, for writing files) this is what each
    process's own rollout engine loads after an update."""
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach() for name, t in model.state_dict().items()}
