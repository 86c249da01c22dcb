"""CISPO: clipped importance-sampling-weight policy optimisation (the SERA policy objective).

Per completion token ``t`` of a rollout sampled under the old policy ``pi_old``::

    rho_t  = pi_theta(a_t | h_t) / pi_old(a_t | h_t) = exp(logp_t - old_logp_t)
    loss_t = - sg(clip(rho_t, c_min, c_max)) * A_t * log pi_theta(a_t | h_t)

``sg`` is stop-gradient: unlike PPO, the clip never zeroes a token's gradient, it only
bounds the importance weight that scales it, so every token keeps learning. The official
thresholds are *absolute* bounds on the ratio (``clip_low_threshold = 0.0``,
``clip_high_threshold = 5.0``), not ``1 +- eps``. The per-token losses are averaged over
all completion tokens of the batch (token mean, optionally weighted); there is no KL term
and the advantages are used as given (no normalisation here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

REDUCTIONS = ("token_mean", "sum")
"""Allowed values of :attr:`CISPOConfig.reduction`."""


@dataclass(frozen=True)
class CISPOConfig:
    """The CISPO hyperparameters."""

    clip_low: float = 0.0
    """Absolute lower bound of the importance ratio (``c_min``)."""
    clip_high: float = 5.0
    """Absolute upper bound of the importance ratio (``c_max``)."""
    reduction: str = "token_mean"
    """``token_mean``: ``sum_t w_t * loss_t / sum_t w_t`` over masked tokens; ``sum``: ``sum_t w_t * loss_t``."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.clip_low) and math.isfinite(self.clip_high)):
            raise ValueError(f"clip_low and clip_high must be finite, got clip_low={self.clip_low}, clip_high={self.clip_high}")
        if not 0 <= self.clip_low < self.clip_high:
            raise ValueError(f"0 <= clip_low < clip_high is required, got clip_low={self.clip_low}, clip_high={self.clip_high}")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")


def _per_token(name: str, x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``x`` of shape ``(batch,)`` or ``(batch, T)`` as ``(batch, T)`` (a per-sequence value broadcast over tokens)."""
    if x.shape == shape:
        return x
    if x.shape == shape[:1]:
        return x[:, None].expand(shape)
    raise ValueError(f"{name} must have shape {tuple(shape[:1])} or {tuple(shape)}, got {tuple(x.shape)}")


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    cfg: CISPOConfig = CISPOConfig(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """The CISPO loss of a batch of completion tokens, and its statistics.

    Shapes: ``logprobs``, ``old_logprobs``, ``mask`` are ``(batch, T)``; ``advantages`` and
    ``weights`` are ``(batch,)`` (one per sequence, broadcast over its tokens) or ``(batch, T)``.
    ``mask`` (bool or 0/1) selects the tokens that count (completion tokens of the trained
    role); ``weights`` default to ones. With ``M`` the masked tokens::

        rho_t  = exp(logprobs_t - old_logprobs_t)                    (float32 or wider)
        c_t    = sg(clamp(rho_t, clip_low, clip_high))
        loss_t = - c_t * A_t * logprobs_t
        loss   = sum_{t in M} w_t * loss_t / sum_{t in M} w_t        (token_mean)
               = sum_{t in M} w_t * loss_t                           (sum)

    so ``d loss / d logprobs_t = - c_t * A_t * w_t / sum_{M} w`` on masked tokens and 0
    elsewhere. The gradient flows through ``logprobs`` only. Masked-out positions are
    selected away (``torch.where``), so NaN or inf there reaches neither the loss nor the
    gradient. An empty mask (or zero total weight under ``token_mean``) gives a loss of
    exactly 0, still attached to the graph.

    Returns ``(loss, stats)``: ``loss`` a scalar tensor; ``stats`` (unweighted, over masked
    tokens) ``clip_fraction_low`` (share with ``rho < clip_low``), ``clip_fraction_high``
    (share with ``rho > clip_high``), ``ratio_mean`` (mean ``rho``) and ``tokens`` (``|M|``).
    """
    if logprobs.ndim != 2:
        raise ValueError(f"logprobs must have shape (batch, T), got {tuple(logprobs.shape)}")
    if not logprobs.is_floating_point():
        raise ValueError(f"logprobs must be a floating-point tensor, got {logprobs.dtype}")
    shape = logprobs.shape
    for name, x in (("old_logprobs", old_logprobs), ("mask", mask)):
        if x.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(x.shape)}")
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    m = mask != 0  # (batch, T) bool
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    logp = torch.where(m, logprobs.to(dtype), zero)  # (batch, T); grad flows through here only
    old = torch.where(m, old_logprobs.detach().to(dtype), zero)
    adv = torch.where(m, _per_token("advantages", advantages.detach().to(dtype), shape), zero)
    w = torch.ones_like(logp) if weights is None else _per_token("weights", weights.detach().to(dtype), shape)
    w = torch.where(m, w, zero)
    if bool((w < 0).any()):
        raise ValueError("weights must be >= 0 on masked tokens")

    rho = torch.exp(logp.detach() - old)  # (batch, T); 1 at masked-out positions
    clipped = rho.clamp(cfg.clip_low, cfg.clip_high)
    loss_t = torch.where(m, -clipped * adv * logp, zero)  # (batch, T)
    total = (w * loss_t).sum()
    if cfg.reduction == "token_mean":
        weight_sum = w.sum()
        total = total / torch.where(weight_sum > 0, weight_sum, torch.ones_like(weight_sum))

    n = int(m.sum())  # rho is detached: the stats carry no graph
    stats = {
        "clip_fraction_low": float((m & (rho < cfg.clip_low)).sum()) / n if n else 0.0,
        "clip_fraction_high": float((m & (rho > cfg.clip_high)).sum()) / n if n else 0.0,
        "ratio_mean": float(torch.where(m, rho, zero).sum()) / n if n else 0.0,
        "tokens": float(n),
    }
    return total, stats


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The PPO-style clipped surrogate of GRPO (the single-agent GRPO row), summed over masked tokens.

    Shapes as :func:`cispo_loss`. With ``rho_t = exp(logprobs_t - old_logprobs_t)``::

        loss_t = - min(rho_t * A_t, clip(rho_t, 1 - eps, 1 + eps) * A_t)
        loss   = sum_{t in M} loss_t

    (the caller divides by the batch's token count). Unlike CISPO, a token whose ratio
    left the trust region on the profitable side gets no gradient. Stats as
    :func:`cispo_loss`, with the clip fractions counted against ``1 -+ eps``.
    """
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    if logprobs.ndim != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError("logprobs, old_logprobs and mask must share one (batch, T) shape")
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    m = mask != 0
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    logp = torch.where(m, logprobs.to(dtype), zero)
    old = torch.where(m, old_logprobs.detach().to(dtype), zero)
    adv = torch.where(m, _per_token("advantages", advantages.detach().to(dtype), logprobs.shape), zero)
    rho = torch.exp(logp - old)  # with grad
    surrogate = torch.minimum(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv)
    total = torch.where(m, -surrogate, zero).sum()
    n = int(m.sum())
    r = rho.detach()
    stats = {
        "clip_fraction_low": float((m & (r < 1 - eps)).sum()) / n if n else 0.0,
        "clip_fraction_high": float((m & (r > 1 + eps)).sum()) / n if n else 0.0,
        "ratio_mean": float(torch.where(m, r, zero).sum()) / n if n else 0.0,
        "tokens": float(n),
    }
    return total, stats
