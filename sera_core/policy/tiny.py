"""Tiny Qwen3-architecture models built locally: a byte-level tokenizer and a seeded model.

Nothing can be downloaded here, so the workbook builds its own small model in the same
Hugging Face format as Qwen3-4B-Instruct-2507 (same code paths as at full scale): a
byte-level BPE tokenizer trained with ``tokenizers`` on text the caller provides (any
text round-trips), Qwen-style special tokens and chat template, and a ``Qwen3Config``
model initialised from a seed. The imitation warm start that makes it useful is built
on top of this (the embedded-model issue).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Padding/end of text, message start, message end (end of a turn = EOS)."""
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Qwen's ChatML layout."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Size of a tiny Qwen3 model."""

    hidden_size: int = 64
    """Width of the residual stream."""
    intermediate_size: int = 128
    """Width of the MLP."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen3)."""
    head_dim: int = 16
    """Per-head width."""
    max_position_embeddings: int = 4096
    """Longest sequence."""


PRETOKEN_PATTERN = r" ?[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
"""Pre-tokens: identifiers with underscores and digits (``a1_i5_13``, ``raw_o2``) as one
piece, like tool names (``get_info``), words, numbers, punctuation runs and whitespace (GPT-2 style, an optional leading
space). BPE merges only inside a pre-token, so an identifier becomes one token when the
vocabulary holds it and is never glued to its neighbours."""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1000):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (ChatML specials;
    pre-tokenised by :data:`PRETOKEN_PATTERN`, then bytes, so any text round-trips)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def init_model(tokenizer, cfg: TinyModelConfig | None = None, seed: int = 0):
    """A Qwen3 causal LM sized by ``cfg``, initialised from ``seed``."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = cfg or TinyModelConfig()
    config = Qwen3Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **asdict(cfg),
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_tiny(path: str | os.PathLike, texts: Iterable[str], *, vocab_size: int = 1000,
               cfg: TinyModelConfig | None = None, seed: int = 0) -> Path:
    """Train a tokenizer, initialise a model and save both to ``path`` (HF format)."""
    path = Path(path)
    tokenizer = train_tokenizer(texts, vocab_size)
    model = init_model(tokenizer, cfg, seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
