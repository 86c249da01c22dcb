"""One policy update: datums' tokens -> current logprobs -> CISPO (or GRPO) loss -> gradients.

Each :class:`~sera_core.train.advantages.Advantage` names the tokens of one role in one
place of a tree (:class:`~sera_core.rewards.Datum`). :func:`token_rows` turns them into
training rows: token ids, and per position whether it is trained, its old logprob
(recorded at generation) and its advantage ``w_d * A``. An agent's act turns are packed
into one row when each turn's context extends the previous turn's context and completion
(always, unless a context was cut): the same tokens in the same contexts, one forward
pass instead of one per turn.

:func:`loss_and_backward` runs the rows in micro-batches of at most ``micro_batch_tokens``
tokens, computes ``log pi_theta`` of every trained token, and back-propagates::

    loss = sum_{rows, trained t} loss_t / N_tokens        (token mean over the whole update)

(``CISPOConfig(reduction="sum")`` leaves out the division: ``sum_{rows, trained t} loss_t``.)

with ``loss_t`` CISPO's ``-sg(clip(rho_t, c_min, c_max)) A_t log pi_theta(a_t|h_t)`` (or
GRPO's clipped surrogate). ``N_tokens`` counts every trained token of the update, so
micro-batching changes nothing but memory.

Distributed (``part=(i, P)``): every process holds all the update's rows (so ``N_tokens``
and the depth weights are the whole batch's), cuts them into the same micro-batches and
runs micro-batches ``i::P``, padded with zero-weight micro-batches (a real row with no
trained position: a forward and backward pass that adds nothing) so that every process
runs ``ceil(M / P)`` of them and enters every collective of FSDP or DDP. DDP and FSDP
average gradients over processes, so each process scales its loss by ``P``: the averaged
gradient is the gradient of the one-process loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from sera_core.agents.tree import Tree, Turn
from sera_core.train.advantages import Advantage
from sera_core.train.cispo import CISPOConfig, cispo_loss, grpo_loss
from sera_core.train.config import PI_OLD


@dataclass(frozen=True)
class TokenRow:
    """One training sequence: ids, and per position (aligned with ``ids``) what to train."""

    ids: tuple[int, ...]
    """Prompt and completion token ids."""
    trained: tuple[bool, ...]
    """True at the positions whose token is trained (completion tokens of the datum's role)."""
    old_logprobs: tuple[float, ...]
    """log pi_old of each trained position's token (0 elsewhere)."""
    advantage: tuple[float, ...]
    """``w_d * A`` at each trained position (0 elsewhere)."""

    @property
    def tokens(self) -> int:
        return sum(self.trained)


def token_rows(trees: Mapping[str, Tree], advantages: Sequence[Advantage], *, datum_balance: bool = False) -> list[TokenRow]:
    """The training rows of ``advantages`` (module docstring), in datum order.

    ``datum_balance`` (an extension, not SPEC 4; ``TrainConfig.datum_balance``) rescales each
    datum's advantages so that every datum weighs the same in the token-mean loss, whatever its
    length. With ``N`` the trained tokens of all the rows, ``D`` the datums that train any token
    and ``T_d`` datum ``d``'s::

        A_t <- A_t * N / (D * T_d)    so    sum_t loss_t / N = (1/D) sum_d (1/T_d) sum_{t in d} loss_t

    Under the plain token mean a datum pushes in proportion to its length, so failures that repeat
    a block until the turn cap outweigh 5-turn successes (:func:`advantage_token_mean` < 0, where
    a group's leave-one-out advantages sum to 0 over its datums); balanced, the token-weighted
    advantage mean equals the datums' own mean."""
    per_datum = []
    for a in advantages:
        d = a.datum
        node = trees[d.tree_id].nodes[d.node_id]
        turns = [t for t in node.turns if t.kind == "act"] if d.turn is None else [node.turns[d.turn]]
        per_datum.append(turn_rows(turns, d.role, a.value))
    if datum_balance:
        lengths = [sum(r.tokens for r in rows) for rows in per_datum]
        n, count = sum(lengths), sum(1 for t in lengths if t)
        per_datum = [[_scaled(r, n / (count * t)) for r in rows] if t else rows
                     for rows, t in zip(per_datum, lengths, strict=True)]
    return [r for rows in per_datum for r in rows]


def _scaled(row: TokenRow, factor: float) -> TokenRow:
    """``row`` with every advantage multiplied by ``factor``."""
    return TokenRow(row.ids, row.trained, row.old_logprobs, tuple(a * factor for a in row.advantage))


def turn_rows(turns: Sequence[Turn], role: str, value: float) -> list[TokenRow]:
    """The rows that train the ``role`` tokens of ``turns`` with advantage ``value``: turns
    whose context extends the previous turn's context and completion share one row."""
    rows: list[TokenRow] = []
    ids: list[int] = []
    trained: list[bool] = []
    old: list[float] = []
    for turn in turns:
        mask = turn.mask(role)
        if not any(mask):
            continue
        full = turn.prompt_ids + turn.completion_ids
        if ids and full[:len(ids)] != ids:  # the context was not extended: start a new row
            rows.append(_row(ids, trained, old, value))
            ids, trained, old = [], [], []
        prompt_tail = len(turn.prompt_ids) - len(ids)
        ids = list(full)
        trained += [False] * prompt_tail + list(mask)
        old += [0.0] * prompt_tail + [lp if m else 0.0 for lp, m in zip(turn.logprobs, mask, strict=True)]
    if ids:
        rows.append(_row(ids, trained, old, value))
    return rows


def _row(ids: list[int], trained: list[bool], old: list[float], value: float) -> TokenRow:
    return TokenRow(tuple(ids), tuple(trained), tuple(old), tuple(value if t else 0.0 for t in trained))


def micro_batches(rows: Sequence[TokenRow], max_tokens: int) -> list[list[TokenRow]]:
    """Rows in order, grouped so each group's padded size (rows x longest) stays within
    ``max_tokens`` (a longer row is a group of its own)."""
    groups: list[list[TokenRow]] = []
    for row in rows:
        if groups and (len(groups[-1]) + 1) * max(len(row.ids), max(len(r.ids) for r in groups[-1])) <= max_tokens:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _tensors(rows: Sequence[TokenRow], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded ``(batch, longest)`` tensors; targets shifted: position t predicts token t + 1."""
    n = max(len(r.ids) for r in rows)
    def pad(values, fill, dtype):
        return torch.tensor([list(v) + [fill] * (n - len(v)) for v in values], dtype=dtype, device=device)
    return {
        "input_ids": pad([r.ids for r in rows], pad_id, torch.long),
        "attention_mask": pad([[1] * len(r.ids) for r in rows], 0, torch.long),
        "trained": pad([r.trained for r in rows], False, torch.bool),
        "old": pad([r.old_logprobs for r in rows], 0.0, torch.float32),
        "advantage": pad([r.advantage for r in rows], 0.0, torch.float32),
    }


def sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      positions: torch.Tensor | None = None) -> torch.Tensor:
    """``log pi_theta(x_{t+1} | x_{<=t})`` for every position, ``(batch, T - 1)``, in float32.

    ``positions`` (bool, ``(batch, T - 1)``): the positions needed; the output layer and the
    softmax over the vocabulary then run only at the columns where some row needs one
    (``logits_to_keep``, inside the model's forward, so wrappers such as DDP and FSDP see one
    ordinary call), and every position not needed is 0. A rollout's prompt is most of its row and is
    never trained: at 49,152 tokens of vocabulary this is a sixth of the update's time."""
    if positions is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    keep = positions.any(0).nonzero().squeeze(-1)  # columns t whose logits predict token t + 1
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits.float()
    kept = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, keep + 1, None]).squeeze(-1)
    return torch.where(positions, kept.new_zeros(positions.shape).index_copy(1, keep, kept), 0.0)


def rescored(model, rows: Sequence[TokenRow], *, pad_id: int, micro_batch_tokens: int = 16384) -> list[TokenRow]:
    """``rows`` with ``old_logprobs`` replaced by ``model``'s own teacher-forced
    ``log pi(x_{t+1} | x_{<=t})`` at every trained position (no gradient; 0 elsewhere).

    For tokens the model did not sample itself (a demonstration written by the scripted
    expert in the model's tokenizer, trained *as if* the model had generated it: notebook
    07), and for the mean log-probability of rows under a model. With the model unchanged
    since, every importance ratio of the result is 1."""
    out: list[TokenRow] = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for group in micro_batches(rows, micro_batch_tokens):
            b = _tensors(group, pad_id, device)
            logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"], b["trained"][:, 1:]).cpu().tolist()
            for row, lp in zip(group, logp, strict=True):
                # position t of the row is predicted by logits at t - 1 (position 0 is never trained)
                old = (0.0,) + tuple(lp[t - 1] if row.trained[t] else 0.0 for t in range(1, len(row.ids)))
                out.append(TokenRow(row.ids, row.trained, old, row.advantage))
    return out


def logprob_by_sign(rows: Sequence[TokenRow]) -> dict[str, float | None]:
    """The token means of ``rows``' ``old_logprobs`` over trained positions whose advantage
    is positive (``pos``) and negative (``neg``), None where there are none: the policy that
    sampled them, or, after :func:`rescored`, the model that rescored them."""
    out = {}
    for sign, keep in (("pos", lambda a: a > 0), ("neg", lambda a: a < 0)):
        values = [lp for r in rows for lp, t, a in zip(r.old_logprobs, r.trained, r.advantage, strict=True) if t and keep(a)]
        out[sign] = sum(values) / len(values) if values else None
    return out


def advantage_weighted_logprob(rows: Sequence[TokenRow]) -> float | None:
    """``sum_t A_t log pi(x_t) / N`` over the trained positions of ``rows`` (``old_logprobs``:
    the sampling policy's, or after :func:`rescored` the rescoring model's); None without any.

    The objective that CISPO's gradient follows at ratio 1 (on-policy, weights not clipped):
    ``grad J_CISPO = (1/N) sum_t A_t grad log pi(x_t)``. A small enough step along it raises
    this number; measured before and after one update on the same rows, its change says
    whether the step moved probability the way the advantages ask, both signs at once."""
    values = [a * lp for r in rows for lp, t, a in zip(r.old_logprobs, r.trained, r.advantage, strict=True) if t]
    return sum(values) / len(values) if values else None


def advantage_token_mean(rows: Sequence[TokenRow]) -> float | None:
    """``(1/N) sum_t A_t`` over the trained tokens of ``rows`` (``A_t = w_d * A`` of the
    token's datum; None without trained tokens): the advantage as the token-mean loss weighs it.

    Leave-one-out advantages sum to 0 over each group's datums, but each datum's advantage
    counts once per token. So this is 0 when a group's trajectories are equally long, negative
    when its failing ones are longer (their negative advantage is spread over more tokens, e.g.
    a failure that repeats one block until its turns run out beside a 5-turn success), and
    positive when the successful ones are. ``advantage_mean`` weighs each datum once instead."""
    values = [a for r in rows for t, a in zip(r.trained, r.advantage, strict=True) if t]
    return sum(values) / len(values) if values else None


def process_share(groups: Sequence[list[TokenRow]], part: tuple[int, int]) -> list[list[TokenRow]]:
    """Micro-batches ``i::P`` of ``groups`` for ``part=(i, P)``, padded to ``ceil(M / P)``
    with zero-weight copies of the first row (module docstring); ``[]`` when ``M = 0``."""
    index, count = part
    if not 0 <= index < count:
        raise ValueError(f"part {part}: need 0 <= index < count")
    mine = list(groups[index::count])
    if groups:
        first = groups[0][0]
        idle = TokenRow(first.ids, (False,) * len(first.ids), (0.0,) * len(first.ids), (0.0,) * len(first.ids))
        mine += [[idle]] * (-(-len(groups) // count) - len(mine))
    return mine


def loss_and_backward(model, rows: Sequence[TokenRow], *, pad_id: int, total_tokens: int, micro_batch_tokens: int,
                      loss: str = "cispo", cispo: CISPOConfig | None = None, grpo_eps: float = 0.2,
                      backward: Callable[[torch.Tensor], None] | None = None,
                      part: tuple[int, int] = (0, 1), pi_old: str = "engine",
                      tis_cap: float | None = None) -> dict[str, float]:
    """Back-propagate the update's loss (module docstring) micro-batch by micro-batch.

    ``rows``: all the update's rows (every process passes the same). ``total_tokens``:
    ``N_tokens`` of the whole update. ``backward``: how to back-propagate
    (``accelerator.backward``; default ``Tensor.backward``). ``part=(i, P)``: this
    process's share (module docstring). Returns this process's share of the loss, its
    trained tokens, the sums of its clip statistics over tokens (``*_sum``: add them
    over processes, divide by the tokens) and their token-weighted means, and the mean
    ``log pi_theta`` (before this step) of its trained tokens with a positive and with a
    negative advantage (``logprob_pos_mean``, ``logprob_neg_mean``; None without such tokens)
    and their advantage-weighted mean (``logprob_weighted_mean``, :func:`advantage_weighted_logprob`).

    The engine-trainer gap. ``old_logprobs`` are the rollout engine's (vLLM in bfloat16 on a
    GPU), ``log pi_theta`` the trainer's (float32, or bf16 autocast). The trainer takes one
    optimizer step per update, so before that step both are the same policy and differ only by
    the engines' arithmetic; ``logprob_gap`` (with ``logprob_gap_sum``) is that difference's
    token mean, ``(1/N) sum_t |log pi_theta(a_t) - log pi_engine(a_t)|``, measured before the
    step. ``pi_old`` chooses what the importance ratio divides by:

    * ``engine`` (the paper's): ``rho_t = pi_theta / pi_engine``, so CISPO's clipped weight
      ``clip(rho_t, c_min, c_max)`` is the whole correction for sampling from the engine;
    * ``trainer``: ``log pi_old`` recomputed by the trainer, which before its one step is its
      own ``log pi_theta``, detached (no second forward): ``rho_t = 1``, the CISPO/GRPO clip is
      idle, and sampling from the engine is corrected by truncated importance sampling
      (Yao et al. 2025), the advantage scaled by ``min(pi_theta / pi_engine, tis_cap)``
      (detached; ``tis_cap`` None: no correction).
    ``ratio_mean`` and the clip fractions are those of the ratio the loss used."""
    if pi_old not in PI_OLD:
        raise ValueError(f"pi_old is one of {PI_OLD}, not {pi_old!r}")
    device = next(model.parameters()).device
    backward = backward or (lambda t: t.backward())
    bounds = cispo or CISPOConfig()
    # CISPO's reduction over the whole update: each micro-batch's token sum, divided by the
    # update's N_tokens for ``token_mean`` (the paper's), left as it is for ``sum``
    scale = 1.0 / max(total_tokens, 1) if loss == "grpo" or bounds.reduction == "token_mean" else 1.0
    sums = {"loss": 0.0, "clip_fraction_low": 0.0, "clip_fraction_high": 0.0, "ratio_mean": 0.0, "tokens": 0.0}
    by_sign = {"pos": [0.0, 0], "neg": [0.0, 0]}  # log pi_theta sum and count of trained tokens by sign of A
    weighted = 0.0  # sum of A * log pi_theta over trained tokens
    gap = 0.0  # sum of |log pi_theta - log pi_engine| over trained tokens, before the step
    for group in process_share(micro_batches(rows, micro_batch_tokens), part):
        b = _tensors(group, pad_id, device)
        mask, old, adv = b["trained"][:, 1:], b["old"][:, 1:], b["advantage"][:, 1:]
        logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"], mask)
        gap += float((logp.detach() - old).abs()[mask].sum())
        ratio_old, weight = old, adv
        if pi_old == "trainer":
            ratio_old = logp.detach()
            if tis_cap is not None:
                weight = adv * torch.exp(logp.detach() - old).clamp(max=tis_cap)
        if loss == "grpo":
            total, stats = grpo_loss(logp, ratio_old, weight, mask, eps=grpo_eps)
        else:
            total, stats = cispo_loss(logp, ratio_old, weight, mask,
                                      cfg=CISPOConfig(bounds.clip_low, bounds.clip_high, "sum"))
        backward(total * (scale * part[1]))  # x P: the processes' gradients are averaged
        for sign, where in (("pos", mask & (adv > 0)), ("neg", mask & (adv < 0))):
            by_sign[sign][0] += float(logp.detach()[where].sum())
            by_sign[sign][1] += int(where.sum())
        weighted += float((adv * logp.detach())[mask].sum())
        sums["loss"] += float(total.detach()) * scale
        for key in ("clip_fraction_low", "clip_fraction_high", "ratio_mean"):
            sums[key] += stats[key] * stats["tokens"]
        sums["tokens"] += stats["tokens"]
    n = sums["tokens"]
    keys = ("clip_fraction_low", "clip_fraction_high", "ratio_mean")
    return {"loss": sums["loss"], "tokens": n, **{f"{k}_sum": sums[k] for k in keys},
            **{k: (sums[k] / n if n else 0.0) for k in keys},
            **{f"logprob_{sign}_mean": (lp_sum / count if count else None) for sign, (lp_sum, count) in by_sign.items()},
            "logprob_weighted_mean": weighted / n if n else None,
            "logprob_gap_sum": gap, "logprob_gap": gap / n if n else 0.0}
