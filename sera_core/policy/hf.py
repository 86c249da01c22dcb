"""The ``hf`` policy backend: a transformers causal LM with a reusable KV cache, batched.

Generation
    Every prompt of a batch is right-aligned in one block (left padding), run through
    the model once to fill the key/value cache, then every step feeds one token per
    sequence (finished sequences are fed padding and ignored). Sampling runs per
    sequence with its own ``torch.Generator`` seeded from ``SamplingParams.seed``, so a
    sequence's sample does not depend on what else is in the batch; temperature 0 is
    greedy. Log-probabilities are log-softmax of the raw logits (see
    :mod:`sera_core.policy.base`). Stop strings are checked on the decoded tail of each
    sequence after every token.

Reusing key/value states (``prefix_cache_bytes > 0``, the default)
    An agent's next prompt is its previous prompt + completion + the next observation
    (:mod:`sera_core.policy.chat`), and every agent of a benchmark starts with the same
    system prompt. So after each call the policy keeps, per sequence, the key/value
    states of every token it processed (:class:`PrefixStore`, least recently used
    evicted beyond the byte budget), and a new prompt only runs its tokens past the
    longest prefix it shares with a kept sequence: a turn prefills its new tokens, and a
    fresh agent reuses the system prompt another agent processed (a batch of fresh agents
    runs its shared prefix once, then reuses it). Kept states belong to
    the weights they were computed with: any in-place change of a parameter (an optimizer
    step, ``load_state_dict``) bumps torch's version counters and empties the store.
    The cache of a call is preallocated (:class:`_PreallocatedLayer`: the prompt block and
    256 new tokens, doubling when full), so no step concatenates tensors. A forward computes
    logits for its last position only, a long prompt block runs in column chunks
    (:func:`prefill_chunk`) and a batch is generated in parts of similar context length, each
    within :data:`CALL_CACHE_BYTES` (:func:`plan_batch`), so memory stays bounded for a batch
    of long prompts and short agents do not attend over a long one's padding. Greedy output
    is token-identical to recomputing every prompt (tested), up to float rounding between
    batch shapes.

Weight layout on CPU
    A policy that owns its model (loaded from a folder, or ``from_model(..., own=True)``:
    a merged copy nobody trains or saves) stores each linear layer's weight transposed in
    memory (:func:`decode_layout`): a decode step multiplies a few rows by every weight,
    and MKL runs such a product 1.3-1.9x faster on one thread with an untransposed right
    operand (2% with two threads). A model shared with a trainer keeps its layout
    (optimizer states and saved files expect contiguous weights).

Works on CPU (float32) and GPU (bfloat16 by default); the model and tokenizer come from
a local model folder (a Hugging Face folder, or an adapter on its base:
:mod:`sera_core.policy.models`), never from a hub.
"""

from __future__ import annotations

import inspect
import os
import time
from collections import OrderedDict

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

from sera_core.policy.base import Generation, SamplingParams, json_closed_by_last, per_prompt
from sera_core.policy.chat import chat_ids

SHARED_PREFIX_MIN = 32
"""A batch whose prompts share this many more tokens than the store holds runs the shared
prefix once first (a system prompt read by a batch of fresh agents)."""
GROW = 256
"""Generated positions a call's cache holds before its first doubling."""
PREFILL_SCORE_BYTES = 1 << 30
"""Most bytes of float32 attention scores one prefill forward may hold (batch x heads x
chunk x context x 4): a longer block runs in column chunks through the cache
(:func:`prefill_chunk`). One forward over 64 rescoring prompts of about 2,000 tokens
otherwise holds 9 GB of scores (and, without ``logits_to_keep=1``, 25 GB of logits): it was
killed for memory at 20 GB on a 24 GB machine."""
CALL_CACHE_BYTES = 4 << 30
"""Most bytes of key/value cache one batched call may allocate (rows x (prompt + new
tokens) x layers x 2 x kv heads x head dim x dtype size): a larger batch is generated in
parts (:func:`plan_batch`). 64 rescoring prompts of about 2,000 tokens with
1,024 new tokens each need 12 GB in float32 (SmolLM2-135M: 46 KB a token)."""
PREFIX_CACHE_BYTES = 2 << 30
"""Default budget of kept key/value states (2 GiB: about 45,000 tokens of SmolLM2-135M in float32)."""


class HFPolicy:
    """A local Hugging Face checkpoint as a :class:`~sera_core.policy.base.Policy`."""

    def __init__(self, path: str | os.PathLike, *, device: str | None = None, dtype: torch.dtype | None = None,
                 prefix_cache_bytes: int = PREFIX_CACHE_BYTES):
        from sera_core.policy.models import load_model

        model, tokenizer = load_model(path, device=device, dtype=dtype)
        self._setup(model, tokenizer, prefix_cache_bytes, own=True)

    @classmethod
    def from_model(cls, model, tokenizer, *, prefix_cache_bytes: int = PREFIX_CACHE_BYTES, own: bool = False) -> HFPolicy:
        """A policy that generates with ``model`` itself (shared, not copied: the trainer's
        updates are what the next rollouts sample from, and they empty the prefix store).
        Generation runs under ``torch.no_grad`` in the model's current mode; the caller
        keeps it in eval mode. ``own``: nothing else trains or saves ``model`` (a merged
        copy), so on CPU its weights may be re-laid out for decoding (:func:`decode_layout`)."""
        policy = cls.__new__(cls)
        policy._setup(model, tokenizer, prefix_cache_bytes, own=own)
        return policy

    def _setup(self, model, tokenizer, prefix_cache_bytes: int, *, own: bool) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        if own and self.device.type == "cpu":
            decode_layout(model)
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids))
        # transformers 5.2x renamed the KV-cache argument and output from past_key_values to cache
        inner = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # peft
        params = inspect.signature(inner.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.store = PrefixStore(prefix_cache_bytes)
        self._weights_version: int | None = None
        self.step_log: list[tuple[int, float]] | None = None
        """Set to a list to record ``(sequences still generating, seconds)`` of every decode step
        (the batching measurement); None records nothing (a long run would grow it without bound)."""

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return chat_ids(self.tokenizer, messages)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Generation]:
        """Batched generation reusing kept key/value states (see the module docstring)."""
        ps = per_prompt(params, len(prompts))
        n = len(prompts)
        if n == 0:
            return []
        if any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        parts = plan_batch([len(p) + q.max_new_tokens for p, q in zip(prompts, ps, strict=True)], _token_bytes(self.model),
                           _weight_bytes(self.model))
        if len(parts) > 1:
            out: list[Generation | None] = [None] * n
            for rows in parts:
                for i, g in zip(rows, self.generate([prompts[i] for i in rows], [ps[i] for i in rows]), strict=True):
                    out[i] = g
            return out  # type: ignore[return-value]
        version = sum(p._version for p in self.model.parameters())
        if version != self._weights_version:
            self.store.clear()
            self._weights_version = version
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        found = [self.store.lookup(a) for a in arrays]
        shared = _common_prefix(arrays) if n > 1 and self.store.budget > 0 else 0
        if shared - max(reused for _, reused in found) >= SHARED_PREFIX_MIN:
            # fresh agents with one system prompt: run it once, keep it, and let every prompt reuse it
            self.generate([prompts[0][:shared + 1]], SamplingParams(temperature=0.0, max_new_tokens=1))
            found = [self.store.lookup(a) for a in arrays]
        # one block of the last `width` tokens of every prompt; what precedes it comes from the store
        width = max(len(a) - reused for a, (_, reused) in zip(arrays, found, strict=True))
        kept = [max(0, len(a) - width) for a in arrays]
        past_len = max(kept)
        layers = _allocate(self.model, n, past_len + width + min(GROW, max(p.max_new_tokens for p in ps)), self.device)

        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, past_len + width), dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        for i, a in enumerate(arrays):
            block = a[kept[i]:]
            ids[i, width - len(block):] = torch.from_numpy(block)
            positions[i, width - len(block):] = torch.arange(kept[i], len(a))
            attention[i, past_len + width - len(a):] = 1  # the row's tokens end at the last column
            if kept[i]:
                entry = found[i][0]
                for j, layer in enumerate(layers):
                    layer.write(i, past_len - kept[i], entry.keys[j, :, :kept[i]], entry.values[j, :, :kept[i]])
        ids, attention, positions = ids.to(self.device), attention.to(self.device), positions.to(self.device)
        past = Cache(layers=layers)
        for layer in layers:
            layer.advance(past_len)
        chunk = prefill_chunk(n, self.model.config.num_attention_heads, past_len + width)
        for c0 in range(0, width, chunk):  # a long block runs in column chunks (memory: see PREFILL_SCORE_BYTES)
            c1 = min(width, c0 + chunk)
            out = self.model(input_ids=ids[:, c0:c1], attention_mask=attention[:, :past_len + c1],
                             position_ids=positions[:, c0:c1], use_cache=True, **self._last_logits,
                             **{self._cache_arg: past})
        logits = out.logits[:, -1, :]
        generators = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in ps]
        greedy = all(p.temperature == 0 for p in ps)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        stops: list[str | None] = [None] * n
        next_pos = positions[:, -1] + 1
        mask = torch.ones((n, past_len + width + max(p.max_new_tokens for p in ps)), dtype=torch.long, device=self.device)
        mask[:, :past_len + width] = attention
        steps, tick = 0, time.perf_counter()
        for _ in range(max(p.max_new_tokens for p in ps)):
            logp = torch.log_softmax(logits.float(), dim=-1).cpu()
            picked = torch.argmax(logp, dim=-1).tolist() if greedy else None
            feed = []
            for i in range(n):
                if reasons[i] is not None:
                    feed.append(self.pad_id)
                    continue
                token = picked[i] if greedy else _sample(logits[i].float().cpu(), ps[i], generators[i])
                tokens[i].append(token)
                logprobs[i].append(float(logp[i, token]))
                if token in self.eos_ids:
                    reasons[i] = "eos"
                elif ps[i].stop and (hit := self._stop_hit(tokens[i], ps[i].stop)) is not None:
                    reasons[i], stops[i] = "stop", hit
                elif ps[i].stop_json and json_closed_by_last(tokens[i], self.decode):
                    reasons[i] = "json"
                elif len(tokens[i]) >= ps[i].max_new_tokens:
                    reasons[i] = "length"
                feed.append(token)
            if all(r is not None for r in reasons):
                break
            steps += 1
            out = self.model(input_ids=torch.tensor(feed, device=self.device)[:, None],
                             attention_mask=mask[:, :past_len + width + steps], position_ids=next_pos[:, None],
                             use_cache=True, **self._last_logits, **{self._cache_arg: past})
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
            if self.step_log is not None:
                now = time.perf_counter()  # this step's sampling and forward, for the sequences still generating
                self.step_log.append((sum(r is None for r in reasons), now - tick))
                tick = now
        if self.store.budget > 0:
            for i, a in enumerate(arrays):  # keep each sequence: its prompt and all but its last token
                start, end = past_len + width - len(a), past_len + width + len(tokens[i]) - 1
                self.store.add(np.concatenate([a, np.asarray(tokens[i][:-1], dtype=np.int64)]),
                               torch.stack([layer.keys[i, :, start:end] for layer in layers]),
                               torch.stack([layer.values[i, :, start:end] for layer in layers]))
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


def decode_layout(model) -> None:
    """Store every linear layer's ``(out, in)`` weight transposed in memory, in place: a
    contiguous ``(in, out)`` buffer viewed as ``(out, in)`` (same values, shape and dtype).

    ``F.linear(x, W)`` computes ``x @ W^T``; with this layout ``W^T`` is a plain row-major
    matrix and MKL's GEMM skips its transposed-operand path. Measured on this CPU (one
    core, float32, ``rows x in x out``): 32 x 1,536 x 576 takes 418 us instead of 742;
    8 x 576 x 49,152 (the output layer) 16.7 ms instead of 29.3; at 256 rows (prefill)
    both layouts take the same time. A decode step of SmolLM2-135M at batch 32 drops from
    200 to 182 ms, at batch 8 from 131 to 110 ms on one thread (with two threads MKL splits
    each product and the gain is 2%; docs/embedded.md). An output layer tied
    to the input embedding gets its own copy (113 MB for SmolLM2): the embedding's lookup
    reads whole rows and keeps the row-major layout. Each weight becomes a new
    ``Parameter`` (same ``requires_grad``), so call this before anything holds the old ones."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.stride() == (module.weight.shape[1], 1):
            weight = module.weight
            module.weight = torch.nn.Parameter(weight.detach().t().contiguous().t(), requires_grad=weight.requires_grad)


def _kv_heads(model) -> tuple[int, int]:
    """Key/value heads and head dimension of the model's attention layers."""
    cfg = model.config
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return heads, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _token_bytes(model) -> int:
    """Bytes of key/value cache per token: layers x 2 x kv heads x head dim x dtype size."""
    heads, head_dim = _kv_heads(model)
    return model.config.num_hidden_layers * 2 * heads * head_dim * next(model.parameters()).element_size()


def _weight_bytes(model) -> int:
    """Bytes of the model's parameters: what every forward reads once, whatever its batch."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def plan_batch(lengths: list[int], token_bytes: int, weight_bytes: int = 0, budget: int | None = None) -> list[list[int]]:
    """The parts a batch is generated in, as lists of row indices (each part's rows in order).

    A batched decode step reads the weights once and attends every row over the longest
    row's context (shorter rows are padded), so a step over part ``P`` costs about

        cost(P) = weight_bytes + |P| * max_{i in P} lengths[i] * token_bytes   (bytes read)

    Rows are sorted by length and cut into consecutive runs minimising ``sum_P cost(P)``
    (dynamic programming, O(n^2)) subject to each part's cache, ``|P| * longest *
    token_bytes``, fitting ``budget`` (default :data:`CALL_CACHE_BYTES`; a row alone always
    runs). Agents of similar length stay in one batch (the weights dominate); a root at
    9,000 tokens beside eight branches of 400-4,000 runs apart from them instead of padding
    all nine to 9,000 (SmolLM2-135M in float32: 0.54 GB of weights, 46 KB a token). A split
    is taken only when strictly cheaper, so a batch that fits and gains nothing stays one part.
    The model assumes the parts run equally many decode steps."""
    budget = CALL_CACHE_BYTES if budget is None else budget
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = [0.0] + [float("inf")] * len(order)  # best[k]: cheapest plan of the k shortest rows
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        for start in range(end - 1, -1, -1):
            rows = end - start
            if rows > 1 and rows * longest * token_bytes > budget:
                break
            cost = best[start] + weight_bytes + rows * longest * token_bytes
            if cost <= best[end]:  # a tie keeps the larger last part
                best[end], cut[end] = cost, start
    parts, end = [], len(order)
    while end:
        parts.append(sorted(order[cut[end]:end]))
        end = cut[end]
    return parts[::-1]


def prefill_chunk(rows: int, heads: int, context: int, budget: int | None = None) -> int:
    """Columns per prefill forward: the most whose attention scores (``rows x heads x
    chunk x context`` float32) fit ``budget`` (default :data:`PREFILL_SCORE_BYTES`), at least 1."""
    return max(1, (PREFILL_SCORE_BYTES if budget is None else budget) // (rows * heads * context * 4))


def _allocate(model, n: int, capacity: int, device) -> list[_PreallocatedLayer]:
    """One empty :class:`_PreallocatedLayer` per decoder layer, ``n`` rows of ``capacity`` positions."""
    heads, head_dim = _kv_heads(model)
    dtype = next(model.parameters()).dtype
    return [_PreallocatedLayer((n, heads, capacity, head_dim), dtype, device) for _ in range(model.config.num_hidden_layers)]


class _PreallocatedLayer(DynamicLayer):
    """A cache layer over preallocated ``(batch, heads, capacity, head_dim)`` buffers:
    ``update`` writes the new positions in place and returns views of the filled part (a
    ``DynamicLayer`` concatenates, copying the whole cache every step); a full buffer
    doubles (amortised: a long generation copies each position about twice, not once per step)."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device):
        super().__init__()
        self._k = torch.zeros(shape, dtype=dtype, device=device)  # zeros: masked positions stay finite
        self._v = torch.zeros(shape, dtype=dtype, device=device)
        self.length, self.device, self.is_initialized = 0, torch.device(device), True
        self.keys, self.values = self._k[:, :, :0], self._v[:, :, :0]

    def write(self, row: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put kept ``(heads, length, head_dim)`` states of one row at positions ``start``..."""
        self._k[row, :, start:start + keys.shape[-2]] = keys
        self._v[row, :, start:start + keys.shape[-2]] = values

    def advance(self, length: int) -> None:
        """Count the first ``length`` positions as filled (by :meth:`write`)."""
        self.length = length
        self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            grown = list(self._k.shape)
            grown[2] = max(end, 2 * self._k.shape[2])
            for name in ("_k", "_v"):
                bigger = torch.zeros(grown, dtype=self._k.dtype, device=self._k.device)
                bigger[:, :, :self.length] = getattr(self, name)[:, :, :self.length]
                setattr(self, name, bigger)
        self._k[:, :, self.length:end] = key_states
        self._v[:, :, self.length:end] = value_states
        self.advance(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


class _Entry:
    __slots__ = ("tokens", "keys", "values", "nbytes")

    def __init__(self, tokens: np.ndarray, keys: torch.Tensor, values: torch.Tensor):
        self.tokens, self.keys, self.values = tokens, keys, values
        self.nbytes = keys.numel() * keys.element_size() * 2


class PrefixStore:
    """Key/value states of processed sequences, kept for reuse as prompt prefixes.

    Each entry holds a token sequence and its states ``(layers, kv_heads, length,
    head_dim)``; :meth:`lookup` returns the entry sharing the longest prefix with a
    prompt (at most ``len(prompt) - 1`` tokens, so at least one token is run and gives
    the next-token logits). Least recently used entries are dropped beyond ``budget``
    bytes; an entry that is a prefix of a newly added one is dropped at once."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self.nbytes = 0
        self._next = 0

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0

    def lookup(self, prompt: np.ndarray) -> tuple[_Entry | None, int]:
        best, best_len = None, 0
        for key, entry in self.entries.items():
            m = min(len(entry.tokens), len(prompt) - 1)
            if m <= best_len:
                continue
            differ = np.flatnonzero(entry.tokens[:m] != prompt[:m])
            common = int(differ[0]) if len(differ) else m
            if common > best_len:
                best, best_len, best_key = entry, common, key
        if best is not None:
            self.entries.move_to_end(best_key)
        return best, best_len

    def add(self, tokens: np.ndarray, keys: torch.Tensor, values: torch.Tensor) -> None:
        entry = _Entry(tokens, keys, values)  # the caller's copies (torch.stack)
        if entry.nbytes > self.budget:
            return
        for key in [k for k, e in self.entries.items()
                    if len(e.tokens) <= len(tokens) and np.array_equal(e.tokens, tokens[:len(e.tokens)])]:
            self.nbytes -= self.entries.pop(key).nbytes
        self.entries[self._next] = entry
        self._next += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget:
            self.nbytes -= self.entries.popitem(last=False)[1].nbytes


def _common_prefix(arrays: list[np.ndarray]) -> int:
    """Length of the longest prefix all ``arrays`` share (at most the shortest length - 1)."""
    m = min(len(a) for a in arrays) - 1
    first = arrays[0][:m]
    differ = [np.flatnonzero(a[:m] != first) for a in arrays[1:]]
    return min([int(d[0]) if len(d) else m for d in differ] or [m])


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id: greedy at temperature 0, else temperature and nucleus sampling.

    Sampling inverts the cumulative distribution: with ``p = softmax(logits / T)``
    (restricted to the nucleus when ``top_p < 1``) and one uniform draw ``u`` from the
    sequence's generator, the token is the first ``i`` with ``sum_{j<=i} p_j > u sum_j p_j``.
    A zero-probability token is never picked. One draw per token, where
    ``torch.multinomial`` draws an exponential per vocabulary entry (1 ms a token for
    49,152 entries on 2 cores: 17% of a decode step at batch 32)."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    cdf = probs.cumsum(-1)
    u = torch.rand((), generator=generator) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))
    return token if token < len(probs) else int(torch.nonzero(probs)[-1])
