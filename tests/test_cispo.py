"""CISPO loss: values and gradients against hand formulas, clip statistics, masking, validation."""

from __future__ import annotations

import math

import pytest
import torch

from sera_core.train.cispo import CISPOConfig, cispo_loss

# Two sequences x three tokens. Ratios rho = exp(logp - old): sequence 0 has 0.5, 1, 7 (7 is
# clipped to 5); sequence 1 has 2, 0.25 and a masked-out third token (ratio 3).
OLD = [[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]]
RHO = [[0.5, 1.0, 7.0], [2.0, 0.25, 3.0]]
LOGP = [[o + math.log(r) for o, r in zip(orow, rrow, strict=True)] for orow, rrow in zip(OLD, RHO, strict=True)]
MASK = [[True, True, True], [True, True, False]]
ADV = [2.0, -1.0]  # one per sequence
CLIPPED = [[0.5, 1.0, 5.0], [2.0, 0.25, None]]  # clip(rho, 0, 5) on masked tokens
MASKED = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def _inputs(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = torch.tensor(LOGP, dtype=dtype, requires_grad=True)
    return logp, torch.tensor(OLD, dtype=dtype), torch.tensor(ADV, dtype=dtype), torch.tensor(MASK)


def _hand_terms(weights: list[list[float]] | None = None) -> list[tuple[float, float]]:
    """``(w_t, loss_t = -c_t * A_t * logp_t)`` for every masked token, by hand."""
    return [
        (1.0 if weights is None else weights[i][t], -CLIPPED[i][t] * ADV[i] * LOGP[i][t])
        for i, t in MASKED
    ]


def test_loss_value_matches_hand_formula() -> None:
    loss, _ = cispo_loss(*_inputs())
    terms = _hand_terms()
    expected = sum(loss_t for _, loss_t in terms) / len(terms)  # token mean over the 5 masked tokens
    assert loss.shape == ()
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_gradient_is_clipped_ratio_times_advantage_over_token_count() -> None:
    logp, old, adv, mask = _inputs()
    loss, _ = cispo_loss(logp, old, adv, mask)
    loss.backward()
    expected = torch.zeros(2, 3)
    for i, t in MASKED:
        expected[i, t] = -CLIPPED[i][t] * ADV[i] / len(MASKED)  # d loss / d logp_t = -c_t * A_t * w_t / N
    torch.testing.assert_close(logp.grad, expected)


def test_gradient_only_through_logprobs() -> None:
    logp, old, adv, mask = _inputs()
    old.requires_grad_(True)
    adv.requires_grad_(True)
    weights = torch.ones(2, requires_grad=True)
    loss, _ = cispo_loss(logp, old, adv, mask, weights)
    loss.backward()
    assert logp.grad is not None
    assert old.grad is None and adv.grad is None and weights.grad is None


def test_gradcheck_float64() -> None:
    """The clip is detached, so with the ratio held fixed loss = -sum(c * A * w * logp) / sum(w), linear in logp."""
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    delta = torch.randn(3, 4, generator=gen, dtype=torch.float64)  # log-ratios: rho = exp(delta), some above 5 or below 1
    delta[0, 0] = 2.0  # rho = e^2 > 5: clipped
    adv = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    weights = torch.rand(3, generator=gen, dtype=torch.float64) + 0.5
    mask = torch.rand(3, 4, generator=gen) > 0.3
    mask[0, 0] = True

    def f(lp: torch.Tensor) -> torch.Tensor:
        # old = lp - delta keeps every ratio at exp(delta) under gradcheck's perturbations of lp
        return cispo_loss(lp, lp.detach() - delta, adv, mask, weights)[0]

    assert torch.autograd.gradcheck(f, (logp,))
    f(logp).backward()
    c = delta.exp().clamp(0.0, 5.0)
    w = weights[:, None].expand(3, 4)
    analytic = torch.where(mask, -c * adv * w / w[mask].sum(), torch.zeros(()))
    torch.testing.assert_close(logp.grad, analytic)


def test_clip_fractions_and_ratio_mean() -> None:
    _, stats = cispo_loss(*_inputs())
    assert stats["tokens"] == 5.0
    assert stats["clip_fraction_high"] == pytest.approx(1 / 5)  # rho = 7 > 5
    assert stats["clip_fraction_low"] == 0.0  # no ratio is below 0
    assert stats["ratio_mean"] == pytest.approx((0.5 + 1.0 + 7.0 + 2.0 + 0.25) / 5)  # masked-out 3.0 excluded

    logp, old, adv, mask = _inputs()
    loss, stats = cispo_loss(logp, old, adv, mask, cfg=CISPOConfig(clip_low=0.6, clip_high=1.5))
    assert stats["clip_fraction_low"] == pytest.approx(2 / 5)  # 0.5 and 0.25
    assert stats["clip_fraction_high"] == pytest.approx(2 / 5)  # 7 and 2
    c = {(0, 0): 0.6, (0, 1): 1.0, (0, 2): 1.5, (1, 0): 1.5, (1, 1): 0.6}
    expected = sum(-c[i, t] * ADV[i] * LOGP[i][t] for i, t in MASKED) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_per_sequence_and_per_token_advantages_agree() -> None:
    logp_a, old, adv, mask = _inputs()
    logp_b = logp_a.detach().clone().requires_grad_(True)
    loss_a, stats_a = cispo_loss(logp_a, old, adv, mask)
    loss_b, stats_b = cispo_loss(logp_b, old, adv[:, None].expand(2, 3).clone(), mask)
    loss_a.backward()
    loss_b.backward()
    assert loss_a.item() == loss_b.item()
    assert stats_a == stats_b
    assert torch.equal(logp_a.grad, logp_b.grad)


def test_float_mask_equals_bool_mask() -> None:
    logp, old, adv, mask = _inputs()
    assert cispo_loss(logp, old, adv, mask.float())[0].item() == cispo_loss(logp, old, adv, mask)[0].item()


def test_sequence_and_token_weights() -> None:
    logp, old, adv, mask = _inputs()
    per_seq = [[1.0] * 3, [3.0] * 3]
    loss, _ = cispo_loss(logp, old, adv, mask, torch.tensor([1.0, 3.0]))
    terms = _hand_terms(per_seq)
    expected = sum(w * loss_t for w, loss_t in terms) / sum(w for w, _ in terms)  # (3 * 1 + 2 * 3) = 9 total weight
    assert loss.item() == pytest.approx(expected, rel=1e-6)

    per_token = [[0.5, 1.0, 2.0], [4.0, 0.0, 100.0]]  # 100 sits on the masked-out token: ignored
    loss, _ = cispo_loss(logp, old, adv, mask, torch.tensor(per_token))
    terms = _hand_terms(per_token)
    expected = sum(w * loss_t for w, loss_t in terms) / sum(w for w, _ in terms)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_sum_reduction() -> None:
    loss, _ = cispo_loss(*_inputs(), weights=torch.tensor([1.0, 3.0]), cfg=CISPOConfig(reduction="sum"))
    expected = sum(w * loss_t for w, loss_t in _hand_terms([[1.0] * 3, [3.0] * 3]))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_empty_mask_gives_zero_loss_attached_to_graph() -> None:
    logp, old, adv, _ = _inputs()
    loss, stats = cispo_loss(logp, old, adv, torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    assert loss.requires_grad
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2, 3))
    assert stats == {"clip_fraction_low": 0.0, "clip_fraction_high": 0.0, "ratio_mean": 0.0, "tokens": 0.0}


def test_nan_in_masked_out_position_does_not_leak() -> None:
    reference, _ = cispo_loss(*_inputs())
    logp, old, adv, mask = _inputs()
    with torch.no_grad():
        logp[1, 2] = float("nan")
    old[1, 2] = float("inf")
    per_token_adv = adv[:, None].expand(2, 3).clone()
    per_token_adv[1, 2] = float("nan")
    weights = torch.ones(2, 3)
    weights[1, 2] = float("nan")
    loss, stats = cispo_loss(logp, old, per_token_adv, mask, weights)
    loss.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[1, 2].item() == 0.0
    assert math.isfinite(stats["ratio_mean"])


def test_low_precision_logprobs_computed_in_float32() -> None:
    logp, old, adv, mask = _inputs(torch.bfloat16)
    loss, _ = cispo_loss(logp, old, adv, mask)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logp.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"old_logprobs": torch.zeros(2, 4)}, "old_logprobs"),
        ({"mask": torch.ones(3, 3, dtype=torch.bool)}, "mask"),
        ({"advantages": torch.zeros(3)}, "advantages"),
        ({"advantages": torch.zeros(2, 4)}, "advantages"),
        ({"weights": torch.ones(2, 4)}, "weights"),
        ({"weights": torch.tensor([1.0, -1.0])}, "weights"),
        ({"logprobs": torch.zeros(6)}, "logprobs"),
        ({"logprobs": torch.zeros(2, 3, dtype=torch.long)}, "logprobs"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, torch.Tensor], match: str) -> None:
    logp, old, adv, mask = _inputs()
    args = {"logprobs": logp, "old_logprobs": old, "advantages": adv, "mask": mask} | kwargs
    with pytest.raises(ValueError, match=match):
        cispo_loss(**args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_low": 5.0}, "clip_low < clip_high"),
        ({"clip_low": 2.0, "clip_high": 1.0}, "clip_low < clip_high"),
        ({"clip_high": float("inf")}, "finite"),
        ({"clip_low": float("nan")}, "finite"),
        ({"reduction": "mean"}, "reduction"),
    ],
)
def test_config_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CISPOConfig(**kwargs)


def test_default_config_is_the_official_thresholds() -> None:
    cfg = CISPOConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.reduction) == (0.0, 5.0, "token_mean")
