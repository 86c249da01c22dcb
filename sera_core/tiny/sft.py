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

    Packed epochs (``tokens_per_step > 0``): the run is ``epochs`` passes over the samples;
    each pass visits every sample once in its own shuffled order and packs consecutive
    samples into steps of at most ``tokens_per_step`` positions (:func:`packed_steps`). A
    step runs its samples one after another, each unpadded at its own length (positions
    from 0), and backpropagates each sample's share of the step's loss: the gradient of one
    packed row with a block-diagonal causal mask, without padding and without the mask's
    ``T^2`` attention over other samples. The step count, and so the learning-rate
    schedule, follows from the samples' lengths.

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

Output folder: ``loss.csv`` (``step,loss,lr,tokens,positions,seconds``; a row every ``log_every``
steps and at the last step; ``loss`` is the mean over the steps since the previous row,
``lr`` the rate used at ``step``, ``tokens`` (learnt), ``positions`` (run through the model,
padding excluded) and ``seconds`` are cumulative) and
``checkpoint/`` (``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``state.json``).

Carrying a run across machines (``carry``)
    A build of hours outlives the machine it started on, and a new machine starts with an
    empty home folder. With a ``carry`` folder (in the repository, committed at a session's
    end), every checkpoint and ``loss.csv`` are mirrored there as they are written, and a run
    resumes from whichever of ``out_dir``'s and ``carry``'s checkpoints is further on: the
    same resume, to the same weights, on any machine that plays the same samples.
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
from dataclasses import asdict, dataclass, field
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
CSV_HEADER = "step,loss,lr,tokens,positions,seconds\n"


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
    role: str = field(default="", compare=False)
    """What the sample teaches (``act``, ``rubric``, ``score``; "" unknown), for the build's
    tables and checks; not part of the sample's identity (:func:`samples_sha256`)."""
    head: int = 0
    """Leading prompt tokens that a cut keeps (:func:`fit`): the system prompt and the task of
    an agent's conversation, or a rubric or scoring call's prompt up to the transcript it
    reads. 0: a cut keeps the tail only."""

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
        if not (_int(self.head, 0) and self.head <= len(self.prompt_ids)):
            raise ValueError(f"Sample.head must be an integer in [0, len(prompt_ids)], got {self.head!r}")


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
    """Longest training sequence: a longer sample is cut in the middle of its prompt, keeping
    its :attr:`Sample.head`, a marker and the tokens that fit before the completion
    (:func:`fit`); the first ``max_len`` completion tokens and no prompt when the completion
    alone is that long."""
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
    """``"no"`` (float32), ``"bf16"`` (autocast) or ``"auto"`` (bf16 where the machine runs it
    natively, :func:`~sera_core.utils.hardware.native_bf16`, else float32; resolved when a run
    starts or resumes and recorded per stretch of steps in the checkpoint, so a build may move
    between machines of both kinds)."""
    tokens_per_step: int = field(default=0, metadata={"hashed_when_set": True})
    """Packed epochs: every sample once per epoch, in an order shuffled per epoch, whole
    samples packed into steps of at most this many positions, without padding
    (:func:`packed_steps`; ``steps``, ``batch_size`` and ``curriculum`` are then unused).
    0: ``steps`` steps of ``batch_size`` samples drawn by :func:`batch_indices` (the recipes
    built before packing)."""
    epochs: int = field(default=0, metadata={"hashed_when_set": True})
    """With ``tokens_per_step``: the number of epochs (the run's step count follows from the
    samples' lengths). 0 without it."""

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
            ("mixed_precision", self.mixed_precision in ("no", "bf16", "auto"), "'no', 'bf16' or 'auto'"),
            ("tokens_per_step", _int(self.tokens_per_step, 0) and (self.tokens_per_step == 0 or self.tokens_per_step >= self.max_len),
             "0 or an integer >= max_len"),
            ("epochs", _int(self.epochs, 0) and (self.epochs > 0) == (self.tokens_per_step > 0),
             "an integer >= 1 with tokens_per_step, 0 without"),
        )
        for name, ok, what in checks:
            if not ok:
                raise ValueError(f"SFTConfig.{name} must be {what}, got {getattr(self, name)!r}")


def fit(sample: Sample, max_len: int, marker: Sequence[int] = ()) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """The sample's tokens cut to at most ``max_len`` and the ranges of them that are learnt
    (the completion and the ``learn`` spans, or what survives of them).

    A sample that fits is whole. A longer one keeps its first :attr:`Sample.head` tokens,
    then ``marker`` (the tokens that stand for the cut, as the runtime's prompts show a
    section cut in the middle: :func:`sera_core.utils.text.truncate_middle`), then the last
    tokens that fit: the completion and the end of the prompt; what is cut is the middle of
    the transcript. When the head, the marker and the completion do not fit together the
    cut is on the left (the tail only, no marker); a completion of ``max_len`` tokens or
    more keeps its first ``max_len`` tokens and no prompt."""
    full = sample.prompt_ids + sample.completion_ids
    n_completion = len(sample.completion_ids)
    learnt = list(sample.learn) + [(len(sample.prompt_ids), len(full))]
    if len(full) <= max_len:
        return full, learnt
    if n_completion >= max_len:
        return sample.completion_ids[:max_len], [(0, max_len)]
    head, marker = sample.head, tuple(marker)
    if head + len(marker) + n_completion > max_len:
        head, marker = 0, ()
    start = len(full) - (max_len - head - len(marker))  # the tail kept: full[start:]
    shift = head + len(marker) - start
    spans = []
    for a, b in learnt:
        if a < head:
            spans.append((a, min(b, head)))
        if b > start:
            spans.append((max(a, start) + shift, b + shift))
    return full[:head] + marker + full[start:], spans


def build_batch(samples: Sequence[Sample], pad_id: int, max_len: int, marker: Sequence[int] = ()) -> dict[str, torch.Tensor]:
    """Right-padded tensors of ``samples`` (each cut by :func:`fit`): ``input_ids``,
    ``attention_mask`` (0 on padding), ``labels`` (the token ids on learnt positions: the
    completion and the ``learn`` spans; ``IGNORE`` on the rest of the prompt and on padding),
    all ``(batch, longest)``, and ``weights`` ``(batch,)``."""
    cut = [fit(s, max_len, marker) for s in samples]
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


def chunked_sft_loss(model, batch: dict[str, torch.Tensor], chunk: int = 1024,
                     total_weight: float | None = None) -> torch.Tensor:
    """:func:`sft_loss` of ``model`` on ``batch`` without full-vocabulary logits.

    The same value (up to float rounding) as ``sft_loss(model(...).logits, labels, weights)``,
    but the head runs only on the hidden states of learnt positions (``N`` of them), in
    chunks of ``chunk`` rows, each under activation checkpointing: the largest vocabulary
    tensor alive is ``(chunk, V)`` float32 instead of ``(B, T, V)`` (for SmolLM2's 49,152
    tokens at 2 x 1,536 positions that is 200 MB instead of 600 MB, plus its gradient).
    ``total_weight``: divide the weighted sum by it instead of the batch's own weight (a
    packed step's samples each contribute their share of the step's loss).
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
    return total / (w.sum().clamp_min(torch.finfo(w.dtype).tiny) if total_weight is None else total_weight)


def cast_frozen_linears(model, dtype: torch.dtype) -> int:
    """Store the frozen weights of the decoder blocks' linear layers (modules named
    ``*.layers.*``: the base layers under a LoRA adapter) in ``dtype``; return how many were cast.
    Under bf16 autocast a weight that does not train is cast afresh at every call (autocast
    caches only the casts of weights that train), so casting it once gives the same products and
    gradients, bit for bit (tested), without recasting the base's 106 M weights for every sample
    in both passes: 12% less time a step on 2 cores of an AMD EPYC with AVX512_BF16 (docs/embedded.md).
    The embedding, and an output layer tied to it, are left alone: they feed the float32
    residual stream."""
    cast = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}." and not module.weight.requires_grad \
                and module.weight.dtype != dtype:
            module.weight.data = module.weight.data.to(dtype)
            cast += 1
    return cast


def step_backward(model, parts: Sequence[dict[str, torch.Tensor]], accelerator) -> tuple[float, int, int]:
    """Run one optimizer step's batches (``parts``: :func:`build_batch` outputs) forward and
    backward under ``accelerator``; return the step's loss, learnt tokens and positions
    (padding excluded). One part is a padded batch, its loss the batch's own weighted mean;
    several are a packed step's samples, each unpadded, each backpropagating its share of the
    weighted mean over all their tokens (``total_weight``: the step's ``sum_i w_i n_i``), so the
    gradients add up to the packed row's."""
    learnt = [int((b["labels"][:, 1:] != IGNORE).sum()) for b in parts]
    weight = None if len(parts) == 1 else (sum(float(b["weights"][0]) * n for b, n in zip(parts, learnt, strict=True)) or 1.0)
    value = 0.0
    for batch in parts:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.autocast():
            loss = chunked_sft_loss(model, batch, total_weight=weight)
        accelerator.backward(loss)
        value += loss.item()
    return value, sum(learnt), sum(int(b["attention_mask"].sum()) for b in parts)


def lr_factor(t: int, cfg: SFTConfig, steps: int | None = None) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``t`` (0-based) of ``steps`` (default
    ``cfg.steps``): linear warm-up, then cosine."""
    steps = cfg.steps if steps is None else steps
    if t < cfg.warmup_steps:
        return (t + 1) / cfg.warmup_steps
    progress = min(1.0, (t - cfg.warmup_steps) / max(1, steps - 1 - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(order: Sequence[int], step: int, cfg: SFTConfig) -> list[int]:
    """Sample indices of step ``step``: a draw from the curriculum pool of ``order`` (indices by length)."""
    n = len(order)  # pool size ceil(n * q(step)) in exact integers: n * q = n * (steps + 6 * step) / (4 * steps)
    pool = list(order[:min(n, -(-n * (cfg.steps + 6 * step) // (4 * cfg.steps)))] if cfg.curriculum else order)
    rng = random.Random(derive_seed(cfg.seed, "sft", step))
    return rng.sample(pool, cfg.batch_size) if len(pool) >= cfg.batch_size else rng.choices(pool, k=cfg.batch_size)


def packed_steps(lengths: Sequence[int], cfg: SFTConfig) -> list[list[int]]:
    """The steps of a packed run (``cfg.tokens_per_step > 0``): the sample indices of each
    optimizer step, epoch after epoch.

    Epoch ``e`` visits every sample once, in the order ``random.Random(derive_seed(seed,
    "epoch", e))`` shuffles them to; consecutive samples fill a step while their lengths
    (``lengths``: each sample's length after :func:`fit`, at most ``max_len <= tokens_per_step``)
    sum to at most ``tokens_per_step``; the next sample opens the next step. No sample is
    drawn twice or skipped in an epoch, and none is more likely to wait than another (the
    shortest-first curriculum gave the longest quarter of the samples a third of the
    shortest quarter's chance to be drawn)."""
    steps: list[list[int]] = []
    for e in range(cfg.epochs):
        order = list(range(len(lengths)))
        random.Random(derive_seed(cfg.seed, "epoch", e)).shuffle(order)
        step, used = [], 0
        for i in order:
            if step and used + lengths[i] > cfg.tokens_per_step:
                steps.append(step)
                step, used = [], 0
            step.append(i)
            used += lengths[i]
        if step:
            steps.append(step)
    return steps


def samples_sha256(samples: Sequence[Sample]) -> str:
    """A hash of the samples' tokens and weights, in order."""
    h = hashlib.sha256()
    for s in samples:
        extra = ([s.learn] if s.learn else []) + ([{"head": s.head}] if s.head else [])
        h.update(json.dumps([s.prompt_ids, s.completion_ids, s.weight] + extra).encode() + b"\n")
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


def _checkpoint_step(folder: Path) -> int:
    """The step of the checkpoint in ``folder`` (``state.json``), -1 where there is none."""
    state = folder / "state.json"
    return json.loads(state.read_text())["step"] if state.exists() else -1


def mirror_checkpoint(out: Path, carry: Path) -> None:
    """Copy ``out``'s checkpoint and ``loss.csv`` into ``carry``, each written beside and then
    swapped in, ``loss.csv`` first: ``carry`` never holds half a checkpoint, and its
    ``loss.csv`` is never behind its checkpoint (rows ahead are dropped at resume)."""
    carry.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(out / "loss.csv", carry / "loss.csv.tmp")
    os.replace(carry / "loss.csv.tmp", carry / "loss.csv")
    tmp = carry / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(out / "checkpoint", tmp)
    swap_in(tmp, carry / "checkpoint")


def adopt_carried(out: Path, carry: Path) -> bool:
    """Take ``carry``'s checkpoint and ``loss.csv`` into ``out`` where it is further on than
    ``out``'s own (a fresh machine, or an older local copy); return whether it did."""
    ours = max(_checkpoint_step(out / "checkpoint"), _checkpoint_step(out / "checkpoint.old"))
    if _checkpoint_step(carry / "checkpoint") <= ours:
        return False
    mirror_checkpoint(carry, out)
    shutil.rmtree(out / "checkpoint.old", ignore_errors=True)
    return True


def _reset_csv(path: Path, step: int | None) -> None:
    """Start ``loss.csv`` afresh (``step`` None) or keep its complete rows up to ``step``."""
    rows = path.read_text().splitlines(keepends=True)[1:] if step is not None and path.exists() else []
    kept = [r for r in rows if r.endswith("\n") and int(r.split(",")[0]) <= step]
    path.with_suffix(".tmp").write_text(CSV_HEADER + "".join(kept))
    os.replace(path.with_suffix(".tmp"), path)


def train_sft(model, samples: Sequence[Sample], cfg: SFTConfig, out_dir: str | os.PathLike, *, resume: bool = True,
              progress: bool = True, pad_id: int = 0, stop_after: int | None = None, marker: Sequence[int] = (),
              carry: str | os.PathLike | None = None) -> dict:
    """Train ``model`` in place on ``samples`` (see the module docstring); return a summary.

    ``resume``: continue from ``out_dir/checkpoint`` if there is one (its config and
    samples must match). ``stop_after``: return after that step (to simulate an
    interruption; the run resumes from the last checkpoint). ``marker``: the tokens that
    stand for a cut (:func:`fit`). ``carry``: a folder that mirrors every checkpoint and
    is resumed from where it is further on than ``out_dir`` (module docstring). Summary: ``steps`` done (of ``total_steps``),
    ``first_loss`` (step 1), ``final_loss`` (the last ``loss.csv`` row, None before one),
    ``tokens`` (completion tokens trained on), ``positions`` (sequence positions run through
    the model, padding excluded), ``seconds`` (training time, all cumulative over resumes),
    ``epochs`` (packed runs: epochs done, a fraction while one is under way), ``precision``
    (``[first step, precision, machine]`` for each stretch of steps) and ``resumed_from``
    (the checkpoint's step, 0 for a fresh run). Under bf16 the frozen linear weights of the
    model's blocks stay stored in bf16 afterwards (:func:`cast_frozen_linears`).
    """
    from sera_core.utils.hardware import describe, native_bf16

    if not samples:
        raise ValueError("train_sft needs at least one sample")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if carry is not None and resume:
        adopt_carried(out, Path(carry))
    config, digest = json.loads(json.dumps(asdict(cfg))), samples_sha256(samples)
    precision = cfg.mixed_precision if cfg.mixed_precision != "auto" else ("bf16" if native_bf16() else "no")
    plan = packed_steps([len(fit(s, cfg.max_len, marker)[0]) for s in samples], cfg) if cfg.tokens_per_step else None
    total_steps = len(plan) if plan is not None else cfg.steps
    accelerator = make_accelerator(precision)
    if precision == "bf16":  # the frozen base's products, cast once (the same numbers)
        cast_frozen_linears(model, torch.bfloat16)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(t, cfg, total_steps))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = {"step": 0, "window_sum": 0.0, "window_n": 0, "first_loss": None, "final_loss": None, "tokens": 0,
             "positions": 0, "seconds": 0.0, "precision": []}
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
        state = {k: saved.get(k, state[k]) for k in state}
    _reset_csv(out / "loss.csv", state["step"] if ckpt is not None else None)
    machine = describe()["cpu"]
    if state["step"] < total_steps and [p[1:] for p in state["precision"][-1:]] != [[precision, machine]]:
        state["precision"].append([state["step"], precision, machine])  # a new stretch: this machine's precision

    start, was_training = state["step"], accelerator.unwrap_model(model).training
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].completion_ids), i))
    t0 = time.perf_counter() - state["seconds"]
    model.train()
    bar = tqdm(total=total_steps, initial=start, desc="sft", disable=not progress)
    for s in range(start, total_steps if stop_after is None else min(total_steps, stop_after)):
        torch.manual_seed(derive_seed(cfg.seed, "torch", s) % 2**31)
        if plan is None:  # one padded batch
            parts = [build_batch([samples[i] for i in batch_indices(order, s, cfg)], pad_id, cfg.max_len, marker)]
        else:  # whole samples, each unpadded
            parts = [build_batch([samples[i]], pad_id, cfg.max_len, marker) for i in plan[s]]
        value, n_tokens, n_positions = step_backward(model, parts, accelerator)
        accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        step = s + 1
        state.update(step=step, window_sum=state["window_sum"] + value, window_n=state["window_n"] + 1,
                     tokens=state["tokens"] + n_tokens, positions=state["positions"] + n_positions,
                     seconds=time.perf_counter() - t0)
        if state["first_loss"] is None:
            state["first_loss"] = value
        if step % cfg.log_every == 0 or step == total_steps:
            state.update(final_loss=state["window_sum"] / state["window_n"], window_sum=0.0, window_n=0)
            with open(out / "loss.csv", "a") as f:
                f.write(f"{step},{state['final_loss']!r},{lr!r},{state['tokens']},{state['positions']},{state['seconds']:.3f}\n")
        if step % cfg.checkpoint_every == 0 or step == total_steps:
            _save_checkpoint(out, accelerator.unwrap_model(model), optimizer, scheduler,
                             {**state, "config": config, "samples_sha256": digest, "total_steps": total_steps})
            if carry is not None:
                mirror_checkpoint(out, Path(carry))
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", pos_per_s=f"{(state['positions']) / max(state['seconds'], 1e-9):.0f}")
    bar.close()
    accelerator.unwrap_model(model).train(was_training)
    epochs = None
    if plan is not None:
        per_epoch = len(plan) / cfg.epochs  # steps of an epoch, on average (epochs pack alike, to a step)
        epochs = round(state["step"] / per_epoch, 4)
    return {"steps": state["step"], "total_steps": total_steps, "final_loss": state["final_loss"],
            "first_loss": state["first_loss"], "tokens": state["tokens"], "positions": state["positions"],
            "seconds": state["seconds"], "epochs": epochs, "precision": state["precision"], "resumed_from": start}
