"""Trained checkpoints as models and policies: the checks a checkpoint must pass, and the
model, ``hf`` policy, vLLM engine or Hugging Face folder it becomes.

A checkpoint (written by :meth:`sera_core.train.trainer.Trainer.save`) is a folder with the
trained weights (``model.safetensors``: the LoRA weights of an adapter run, else the whole
model), the optimizer state and ``state.json`` (version, config, counters, the sha256 of every
file). Loading one needs only the policy layer: the run's starting model (its config's
``model``) with the trained weights put in, so the actors (``--policy PATH``), the evaluator
and the notebooks load checkpoints without importing the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sera_core.utils.errors import UserInputError
from sera_core.utils.folders import sha256_file, swap_in


class CheckpointError(UserInputError):
    """A checkpoint that cannot be resumed from (the message says why): bad input, so the
    command line answers it with exit code 2 and one JSON error line."""


class CheckpointWriteError(OSError, UserInputError):
    """A checkpoint that could not be written where the run writes (a full disk, a read-only
    folder, a size limit; the message names it and the checkpoint kept): the user's to fix,
    so exit code 2 and one JSON error line; an ``OSError`` with the failed write's errno."""


def model_path(cfg) -> Path:
    """The folder of the starting model of ``cfg`` (a ``TrainConfig``, or a ``model`` setting; ``tiny``:
    the shipped embedded policy, an adapter folder: :mod:`sera_core.policy.models`)."""
    from sera_core.policy.models import model_folder

    return model_folder(cfg if isinstance(cfg, str) else cfg.model)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The ``state.json`` of a checkpoint written by :meth:`~sera_core.train.trainer.Trainer.save`, after checking
    that every file is there and matches its sha256 (else :class:`CheckpointError`)."""
    path = Path(path)
    try:
        state = json.loads((path / "state.json").read_bytes().decode("utf-8"))
        files, version, config, counters = state["files"], state["version"], state["config"], state["counters"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: no readable state.json ({exc}); the checkpoint is partial or corrupt") from None
    if not (isinstance(version, int) and not isinstance(version, bool) and version >= 0
            and isinstance(files, dict) and files and all(isinstance(v, str) for v in files.values())
            and isinstance(config, dict) and isinstance(config.get("model"), str)
            and isinstance(counters, dict)):
        raise CheckpointError(f"{path}: state.json lacks a version, files, config or counters of the right types; "
                              "the checkpoint is partial or corrupt")
    if any(not isinstance(name, str) or "/" in name or name.startswith(".") for name in files):
        raise CheckpointError(f"{path}: state.json names files outside the checkpoint; the checkpoint is corrupt")
    for name, digest in files.items():
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: {name} is missing; the checkpoint is partial")
        if sha256_file(path / name) != digest:
            raise CheckpointError(f"{path}: {name} does not match its sha256; the checkpoint is corrupt")
    return state


def checkpoint_folder(path: str | os.PathLike) -> Path:
    """``path``, or its ``checkpoint/`` when ``path`` is a run folder (``RUN`` for ``RUN/checkpoint``)."""
    path = Path(path)
    if not (path / "state.json").exists() and (path / "checkpoint" / "state.json").exists():
        return path / "checkpoint"
    return path


def initial_weights(path: str | os.PathLike, model: str) -> Path:
    """The trained weights (``model.safetensors``) of checkpoint ``path`` (``RUN`` or
    ``RUN/checkpoint``) for a new run that starts from ``model`` (a config's ``model``), after
    :func:`read_checkpoint`'s checks; :class:`CheckpointError` when the checkpoint is missing,
    partial or corrupt, or was trained from another starting model (its weights would not fit)."""
    path = checkpoint_folder(path)
    if not (path / "state.json").exists():
        raise CheckpointError(f"{path}: no checkpoint here (no state.json, nor checkpoint/state.json)")
    theirs = read_checkpoint(path)["config"]["model"]
    if model_path(theirs).resolve() != model_path(model).resolve():
        raise CheckpointError(f"{path}: trained from model {theirs!r}, this run starts from {model!r}")
    return path / "model.safetensors"


def checkpoint_model(path: str | os.PathLike):
    """The model and tokenizer of a trained checkpoint (``RUN/checkpoint`` or the run folder
    ``RUN``): the run's starting model (architecture, tokenizer) with the checkpoint's trained
    weights (an adapter's merged into its base), in eval mode, after :func:`read_checkpoint`'s
    checks."""
    return _checkpoint(path)[1:]


def _checkpoint(path: str | os.PathLike):
    """``(starting model folder, model, tokenizer)`` of :func:`checkpoint_model`."""
    from sera_core.policy.models import load_model, merged
    from sera_core.utils.weights import load_trained

    path = checkpoint_folder(path)
    start = model_path(read_checkpoint(path)["config"]["model"])
    model, tokenizer = load_model(start, trainable=True)
    load_trained(model, path / "model.safetensors")
    return start, merged(model).eval(), tokenizer


def checkpoint_policy(path: str | os.PathLike):
    """An :class:`~sera_core.policy.hf.HFPolicy` of a trained checkpoint (:func:`checkpoint_model`).
    It owns the model (nothing else holds it), so on CPU its weights take the decode layout."""
    from sera_core.policy.hf import HFPolicy

    return HFPolicy.from_model(*checkpoint_model(path), own=True)


def checkpoint_engine(path: str | os.PathLike, engine: Any = None):
    """A :class:`~sera_core.policy.vllm_backend.VLLMPolicy` of a trained checkpoint: an engine
    (started with ``engine``, an ``EngineConfig``; default its defaults) on the run's starting
    model with the checkpoint's weights (:func:`checkpoint_model`) pushed."""
    from sera_core.policy.vllm_backend import VLLMPolicy

    start, model, _ = _checkpoint(path)
    policy = VLLMPolicy(start, engine)
    policy.load_weights(model.state_dict())
    return policy


def export_checkpoint(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the model of a trained checkpoint (see :func:`checkpoint_model`) as a Hugging
    Face folder ``out`` (weights, config, tokenizer), atomically: what ``vllm:`` and
    ``hf:`` policies and other tools load."""
    model, tokenizer = checkpoint_model(path)
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    swap_in(tmp, out)
    return out
