"""Supervised fine-tuning (the imitation warm start) of small Hugging Face causal LMs.

The loop
    Step ``s`` (0-based) draws ``batch_size`` sample indices with
    ``random.Random(derive_seed(seed, "sft", s))`` from the curriculum pool: the samples
    sorted by total length (ties by index), of which the shortest fraction
    ``q(s) = min(1, 0.25 + 0.75 * s / (0.5 * steps))`` is eligible (all with
    ``curriculum=False``). The batch is right-padded (:func:`build_batch`), run through
    the model under Hugging Face Accelerate (CPU or GPU, optional bf16 autocast) and
    trained with AdamW (on the parameters that require gradients: all of them, or a
    LoRA adapter's), gradient-norm clipping and a linear warm-up then cosine decay of
    the learning rate to ``min_lr_ratio * lr``. One process: the same code runs on CPU
    and on one GPU.

The loss (:func:`sft_loss`)
    Only completion tokens count. Position ``t`` predicts token ``t + 1``; with ``C`` the
    positions ``(i, t)`` whose target ``y[i, t + 1]`` is a completion token of sample
    ``i`` (weight ``w_i``) and ``z`` the logits::

        loss = sum_{(i,t) in C} w_i * CE(z[i, t], y[i, t + 1]) / sum_{(i,t) in C} w_i

    a weighted token mean over the whole batch (a long completion counts more than a
    short one). The loop computes it with :func:`chunked_sft_loss`, which never holds the
    full ``(B, T, V)`` logits (for a 49k vocabulary they dominate memory). A completion's first token is learnt only when some prompt precedes it.
    A packed sample (:attr:`Sample.learn`) learns its earlier completions too: the same
    tokens in the same contexts as one sample per turn, for one forward pass instead of
    one per turn.

Determinism and resume
    Batch composition depends only on ``(seed, step)`` and torch is reseeded from
    ``derive_seed(seed, "torch", step)`` before each step (dropout, if any), so no random
    state needs carrying over. A checkpoint (written atomically every
    ``checkpoint_every`` steps and at the end) holds the model, optimizer and scheduler
    states and the loss-log window; ``resume=True`` continues from it when config and
    samples match (ValueError otherwise). On CPU two runs, or an interrupted run resumed
    to the end, give bit-identical weights and ``loss.csv`` (but for its wall-clock
    ``seconds`` column).

Output folder: ``loss.csv`` (``step,loss,lr,tokens,seconds``; a row every ``log_every``
steps and at the last step; ``loss`` is the mean over the steps since the previous row,
``lr`` the rate used at ``step``, ``tokens`` and ``seconds`` are cumulative) and
``checkpoint/`` (``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``state.json``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from tqdm.auto import tqdm

from sera_core.utils.folders import swap_in
from sera_core.utils.hardware import make_accelerator
from sera_core.utils.seeding import derive_seed
from sera_core.utils.weights import load_optimizer_state, load_trained, optimizer_state, save_trained

IGNORE = -100
"""Label of positions without loss (prompt and padding), as in Hugging Face."""
CSV_HEADER = "step,loss,lr,tokens,seconds\n"


@dataclass(frozen=True)
class Sample:
    """One training example: a context and the completion to learn."""

    prompt_ids: tuple[int, ...]
    """Context tokens (no loss)."""
    completion_ids: tuple[int, ...]
    """Tokens to learn (the loss counts these only)."""
    weight: float = 1.0
    """Loss weight of each of this sample's completion tokens (>= 0)."""
    learn: tuple[tuple[int, int], ...] = ()
    """Half-open ranges ``[start, end)`` of ``prompt_ids`` that are learnt too: the
    earlier completions of a packed conversation (one sequence carries every turn of an
    agent, since each turn's context extends the previous turn's context and completion).
    Sorted, disjoint, non-empty."""

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "completion_ids", tuple(int(t) for t in self.completion_ids))
        object.__setattr__(self, "learn", tuple((int(a), int(b)) for a, b in self.learn))
        if not self.completion_ids:
            raise ValueError("Sample.completion_ids must not be empty")
        bounds = [x for span in self.learn for x in span]
        if any(a >= b for a, b in self.learn) or bounds != sorted(bounds) or (bounds and (bounds[0] < 0 or bounds[-1] > len(self.prompt_ids))):
            raise ValueError(f"Sample.learn must hold sorted, disjoint, non-empty ranges inside the prompt, got {self.learn!r}")
        if not (_num(self.weight) and self.weight >= 0):
            raise ValueError(f"Sample.weight must be a finite number >= 0, got {self.weight!r}")


def _int(x, lo: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= lo


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class SFTConfig:
    """Hyper-parameters of :func:`train_sft` (all part of the checkpoint's identity)."""

    steps: int = 2000
    """Optimizer steps in all."""
    batch_size: int = 16
    """Samples per optimizer step (drawn without replacement when the pool is large enough)."""
    lr: float = 3e-3
    """Peak learning rate of AdamW."""
    warmup_steps: int = 100
    """Linear warm-up (``lr * (t + 1) / warmup_steps`` at step ``t``), then cosine decay."""
    min_lr_ratio: float = 0.1
    """The cosine decays to ``min_lr_ratio * lr`` at the last step."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's moment decay rates."""
    grad_clip: float = 1.0
    """Maximum global gradient norm."""
    max_len: int = 1024
    """Longest training sequence: a longer sample keeps its last ``max_len`` tokens (the
    context is cut on the left), or the first ``max_len`` completion tokens and no prompt
    when the completion alone is that long."""
    seed: int = 0
    """Seed of batch composition and torch randomness."""
    log_every: int = 10
    """A ``loss.csv`` row every this many steps (and at the last step)."""
    checkpoint_every: int = 200
    """A checkpoint every this many steps (and at the last step)."""
    curriculum: bool = True
    """Shorter samples first: step ``s`` draws from the shortest fraction
    ``min(1, 0.25 + 0.75 * s / (0.5 * steps))`` of samples sorted by length, then index."""
    mixed_precision: str = "no"
    """``"no"`` (float32) or ``"bf16"`` (autocast); one value per process, since
    Accelerate's state is process-wide (a second value raises Accelerate's ValueError)."""

    def __post_init__(self):
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        checks = (
            ("steps", _int(self.steps, 1), "an integer >= 1"),
            ("batch_size", _int(self.batch_size, 1), "an integer >= 1"),
            ("lr", _num(self.lr) and self.lr > 0, "a finite number > 0"),
            ("warmup_steps", _int(self.warmup_steps, 0), "an integer >= 0"),
            ("min_lr_ratio", _num(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "a number in [0, 1]"),
            ("weight_decay", _num(self.weight_decay) and self.weight_decay >= 0, "a finite number >= 0"),
            ("betas", isinstance(self.betas, tuple) and len(self.betas) == 2
             and all(_num(b) and 0 <= b < 1 for b in self.betas), "two numbers in [0, 1)"),
            ("grad_clip", _num(self.grad_clip) and self.grad_clip > 0, "a finite number > 0"),
            ("max_len", _int(self.max_len, 2), "an integer >= 2"),
            ("seed", _int(self.seed, 0), "an integer >= 0"),
            ("log_every", _int(self.log_every, 1), "an integer >= 1"),
            ("checkpoint_every", _int(self.checkpoint_every, 1), "an integer >= 1"),
            ("curriculum", isinstance(self.curriculum, bool), "a bool"),
            ("mixed_precision", self.mixed_precision in ("no", "bf16"), "'no' or 'bf16'"),
        )
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"SFTConfig.{name} must be {what}, got {getattr(self, name)!r}")


def _truncate(sample: Sample, max_len: int) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """The sample's tokens cut to ``max_len`` (see :attr:`SFTConfig.max_len`) and the
    ranges of them that are learnt (the completion and the ``learn`` spans that survive)."""
    n_completion = len(sample.completion_ids)
    if n_completion >= max_len:
        return sample.completion_ids[:max_len], [(0, max_len)]
    ids = (sample.prompt_ids + sample.completion_ids)[-max_len:]
    cut = len(sample.prompt_ids) + n_completion - len(ids)
    spans = [(max(0, a - cut), b - cut) for a, b in sample.learn if b - cut > 0]
    return ids, spans + [(len(ids) - n_completion, len(ids))]


def build_batch(samples: Sequence[Sample], pad_id: int, max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors of ``samples``: ``input_ids``, ``attention_mask`` (0 on
    padding), ``labels`` (the token ids on learnt positions: the completion and the
    ``learn`` spans; ``IGNORE`` on the rest of the prompt and on padding), all
    ``(batch, longest)``, and ``weights`` ``(batch,)``."""
    cut = [_truncate(s, max_len) for s in samples]
    input_ids = torch.full((len(cut), max(len(ids) for ids, _ in cut)), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE)
    for row, (ids, spans) in enumerate(cut):
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention_mask[row, :len(ids)] = 1
        for a, b in spans:
            labels[row, a:b] = input_ids[row, a:b]
    weights = torch.tensor([s.weight for s in samples], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "weights": weights}


def sft_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted token-mean cross-entropy of the completion tokens (module docstring), in float32."""
    targets = labels[:, 1:]
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="none")
    w = (weights[:, None] * (targets != IGNORE)).flatten()
    return (w * nll).sum() / w.sum().clamp_min(torch.finfo(w.dtype).tiny)


def causal_lm_parts(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(decoder, lm_head)`` of a Hugging Face causal LM, through Accelerate's and
    peft's wrappers: the decoder maps ids to final hidden states ``(B, T, H)``, the head
    maps hidden states to vocabulary logits."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(inner, "get_base_model"):  # peft.PeftModel (LoRA layers are inside the base model)
        inner = inner.get_base_model()
    return inner.get_decoder(), inner.get_output_embeddings()


def chunked_sft_loss(model, batch: dict[str, torch.Tensor], chunk: int = 1024) -> torch.Tensor:
    """:func:`sft_loss` of ``model`` on ``batch`` without full-vocabulary logits.

    The same value (up to float rounding) as ``sft_loss(model(...).logits, labels, weights)``,
    but the head runs only on the hidden states of learnt positions (``N`` of them), in
    chunks of ``chunk`` rows, each under activation checkpointing: the largest vocabulary
    tensor alive is ``(chunk, V)`` float32 instead of ``(B, T, V)`` (for SmolLM2's 49,152
    tokens at 2 x 1,536 positions that is 200 MB instead of 600 MB, plus its gradient).
    """
    decoder, head = causal_lm_parts(model)
    hidden = decoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    targets = batch["labels"][:, 1:]
    learnt = targets != IGNORE
    h, y = hidden[:, :-1][learnt], targets[learnt]  # (N, H), (N,)
    w = batch["weights"][:, None].expand_as(targets)[learnt].to(torch.float32)

    def nll(h_chunk: torch.Tensor, y_chunk: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(head(h_chunk).float(), y_chunk, reduction="none")

    parts = [torch.utils.checkpoint.checkpoint(nll, h[a:a + chunk], y[a:a + chunk], use_reentrant=False)
             if torch.is_grad_enabled() else nll(h[a:a + chunk], y[a:a + chunk]) for a in range(0, len(y), chunk)]
    total = (w * torch.cat(parts)).sum() if parts else hidden.sum() * 0.0
    return total / w.sum().clamp_min(torch.finfo(w.dtype).tiny)


def lr_factor(t: int, cfg: SFTConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``t`` (0-based): linear warm-up, then cosine."""
    if t < cfg.warmup_steps:
        return (t + 1) / cfg.warmup_steps
    progress = min(1.0, (t - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(order: Sequence[int], step: int, cfg: SFTConfig) -> list[int]:
    """Sample indices of step ``step``: a draw from the curriculum pool of ``order`` (indices by length)."""
    n = len(order)  # pool size ceil(n * q(step)) in exact integers: n * q = n * (steps + 6 * step) / (4 * steps)
    pool = list(order[:min(n, -(-n * (cfg.steps + 6 * step) // (4 * cfg.steps)))] if cfg.curriculum else order)
    rng = random.Random(derive_seed(cfg.seed, "sft", step))
    return rng.sample(pool, cfg.batch_size) if len(pool) >= cfg.batch_size else rng.choices(pool, k=cfg.batch_size)


def samples_sha256(samples: Sequence[Sample]) -> str:
    """A hash of the samples' tokens and weights, in order."""
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.prompt_ids, s.completion_ids, s.weight] + ([s.learn] if s.learn else [])).encode() + b"\n")
    return h.hexdigest()


def _save_checkpoint(out: Path, model, optimizer, scheduler, state: dict) -> None:
    """Write ``checkpoint.tmp/`` in full, then swap it in for ``checkpoint/``."""
    tmp = out / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_trained(model, tmp / "model.safetensors")  # the whole model, or an adapter's weights only
    torch.save(optimizer_state(model, optimizer), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    swap_in(tmp, out / "checkpoint")


def _reset_csv(path: Path, step: int | None) -> None:
    """Start ``loss.csv`` afresh (``step`` None) or keep its complete rows up to ``step``."""
    rows = path.read_text().splitlines(keepends=True)[1:] if step is not None and path.exists() else []
    kept = [r for r in rows if r.endswith("\n") and int(r.split(",")[0]) <= step]
    path.with_suffix(".tmp").write_text(CSV_HEADER + "".join(kept))
    os.replace(path.with_suffix(".tmp"), path)


def train_sft(model, samples: Sequence[Sample], cfg: SFTConfig, out_dir: str | os.PathLike, *, resume: bool = True,
              progress: bool = True, pad_id: int = 0, stop_after: int | None = None) -> dict:
    """Train ``model`` in place on ``samples`` (see the module docstring); return a summary.

    ``resume``: continue from ``out_dir/checkpoint`` if there is one (its config and
    samples must match). ``stop_after``: return after that step (to simulate an
    interruption; the run resumes from the last checkpoint). Summary: ``steps`` done,
    ``first_loss`` (step 1), ``final_loss`` (the last ``loss.csv`` row, None before one),
    ``tokens`` (completion tokens trained on), ``seconds`` (training time, both cumulative
    over resumes) and ``resumed_from`` (the checkpoint's step, 0 for a fresh run).
    """
    if not samples:
        raise ValueError("train_sft needs at least one sample")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config, digest = json.loads(json.dumps(asdict(cfg))), samples_sha256(samples)
    accelerator = make_accelerator(cfg.mixed_precision)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(t, cfg))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = {"step": 0, "window_sum": 0.0, "window_n": 0, "first_loss": None, "final_loss": None, "tokens": 0, "seconds": 0.0}
    ckpt = next((d for d in (out / "checkpoint", out / "checkpoint.old") if (d / "state.json").exists()), None) if resume else None
    if ckpt is not None:
        saved = json.loads((ckpt / "state.json").read_text())
        diff = sorted(k for k in config.keys() | saved["config"].keys() if config.get(k) != saved["config"].get(k))
        problems = [f"config ({', '.join(diff)})"] * bool(diff) + ["samples"] * (saved["samples_sha256"] != digest)
        if problems:
            raise ValueError(f"cannot resume from {ckpt}: it was written with different {' and '.join(problems)}; "
                             "pass resume=False or another out_dir")
        load_trained(accelerator.unwrap_model(model), ckpt / "model.safetensors")
        load_optimizer_state(accelerator.unwrap_model(model), optimizer, ckpt / "optimizer.pt")
        scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt"))
        state = {k: saved[k] for k in state}
    _reset_csv(out / "loss.csv", state["step"] if ckpt is not None else None)

    start, was_training = state["step"], accelerator.unwrap_model(model).training
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].completion_ids), i))
    t0 = time.perf_counter() - state["seconds"]
    model.train()
    bar = tqdm(total=cfg.steps, initial=start, desc="sft", disable=not progress)
    for s in range(start, cfg.steps if stop_after is None else min(cfg.steps, stop_after)):
        torch.manual_seed(derive_seed(cfg.seed, "torch", s) % 2**31)
        batch = build_batch([samples[i] for i in batch_indices(order, s, cfg)], pad_id, cfg.max_len)
        n_tokens = int((batch["labels"][:, 1:] != IGNORE).sum())
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.autocast():
            loss = chunked_sft_loss(model, batch)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        value, step = loss.item(), s + 1
        state.update(step=step, window_sum=state["window_sum"] + value, window_n=state["window_n"] + 1,
                     tokens=state["tokens"] + n_tokens, seconds=time.perf_counter() - t0)
        if state["first_loss"] is None:
            state["first_loss"] = value
        if step % cfg.log_every == 0 or step == cfg.steps:
            state.update(final_loss=state["window_sum"] / state["window_n"], window_sum=0.0, window_n=0)
            with open(out / "loss.csv", "a") as f:
                f.write(f"{step},{state['final_loss']!r},{lr!r},{state['tokens']},{state['seconds']:.3f}\n")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            _save_checkpoint(out, accelerator.unwrap_model(model), optimizer, scheduler,
                             {**state, "config": config, "samples_sha256": digest})
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}")
    bar.close()
    accelerator.unwrap_model(model).train(was_training)
    return {"steps": state["step"], "final_loss": state["final_loss"], "first_loss": state["first_loss"],
            "tokens": state["tokens"], "seconds": state["seconds"], "resumed_from": start}
