"""The ``hf`` policy backend: a transformers causal LM with a KV cache, batched.

Prompts are left-padded into one batch; the first forward pass fills the KV cache,
then every step feeds one token per sequence (finished sequences are fed padding and
ignored). Sampling runs per sequence with its own ``torch.Generator`` seeded from
``SamplingParams.seed``, so a sequence's sample does not depend on what else is in the
batch; temperature 0 is greedy. Log-probabilities are log-softmax of the raw logits
(see :mod:`sera_core.policy.base`). Stop strings are checked on the decoded tail of
each sequence after every token.

Works on CPU (float32) and GPU (bfloat16 by default); the model and tokenizer come from
a local directory (``save_pretrained`` format), never from a hub.
"""

from __future__ import annotations

import inspect
import os

import torch

from sera_core.policy.base import Generation, SamplingParams, per_prompt


class HFPolicy:
    """A local Hugging Face checkpoint as a :class:`~sera_core.policy.base.Policy`."""

    def __init__(self, path: str | os.PathLike, *, device: str | None = None, dtype: torch.dtype | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
        self._setup(model, AutoTokenizer.from_pretrained(str(path)))

    @classmethod
    def from_model(cls, model, tokenizer) -> HFPolicy:
        """A policy that generates with ``model`` itself (shared, not copied: the trainer's
        updates are what the next rollouts sample from). Generation runs under
        ``torch.no_grad`` in the model's current mode; the caller keeps it in eval mode."""
        policy = cls.__new__(cls)
        policy._setup(model, tokenizer)
        return policy

    def _setup(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        # transformers 5.2x renamed the KV-cache argument and output from past_key_values to cache
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Generation]:
        """Batched generation with a KV cache (see the module docstring)."""
        ps = per_prompt(params, len(prompts))
        n = len(prompts)
        if n == 0:
            return []
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention[i, width - len(prompt):] = 1
        ids, attention = ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
        past, logits = getattr(out, self._cache_arg), out.logits[:, -1, :]
        generators = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in ps]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        stops: list[str | None] = [None] * n
        next_pos = positions[:, -1] + 1
        for _ in range(max(p.max_new_tokens for p in ps)):
            logp = torch.log_softmax(logits.float(), dim=-1).cpu()
            feed = []
            for i in range(n):
                if reasons[i] is not None:
                    feed.append(self.pad_id)
                    continue
                token = _sample(logits[i].float().cpu(), ps[i], generators[i])
                tokens[i].append(token)
                logprobs[i].append(float(logp[i, token]))
                if token in self.eos_ids:
                    reasons[i] = "eos"
                elif ps[i].stop and (hit := self._stop_hit(tokens[i], ps[i].stop)) is not None:
                    reasons[i], stops[i] = "stop", hit
                elif len(tokens[i]) >= ps[i].max_new_tokens:
                    reasons[i] = "length"
                feed.append(token)
            if all(r is not None for r in reasons):
                break
            attention = torch.cat([attention, torch.ones((n, 1), dtype=torch.long, device=self.device)], dim=1)
            out = self.model(input_ids=torch.tensor(feed, device=self.device)[:, None], attention_mask=attention,
                             position_ids=next_pos[:, None], use_cache=True, **{self._cache_arg: past})
            past, logits = getattr(out, self._cache_arg), out.logits[:, -1, :]
            next_pos = next_pos + 1
        return [Generation(tokens[i], logprobs[i], self.decode(tokens[i]), reasons[i] or "length", stops[i])
                for i in range(n)]

    def _stop_hit(self, tokens: list[int], stop: tuple[str, ...]) -> str | None:
        """The stop string completed by the last token, if any (checked on a decoded tail)."""
        window = max(len(s) for s in stop) + 4
        tail = self.decode(tokens[-window:])
        last = self.decode(tokens[-window:-1]) if len(tokens) > 1 else ""
        for s in stop:
            if s in tail and s not in last:
                return s
        return None


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id: greedy at temperature 0, else temperature and nucleus sampling."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
