"""One policy update on a real (random-initialised) Qwen3 model: rows, packing, direction, micro-batching."""

from __future__ import annotations

import pytest
import torch

from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.tree import Tree, Turn
from sera_core.policy.tiny import TinyModelConfig, init_model
from sera_core.rewards import Datum
from sera_core.train.advantages import Advantage
from sera_core.train.update import TokenRow, advantage_token_mean, loss_and_backward, micro_batches, rescored, sequence_logprobs, token_rows


def act(prompt, completion, roles, logprobs=None):
    return Turn("act", prompt, completion, logprobs or [-1.0] * len(completion), roles)


def agent_tree() -> Tree:
    """A root with two act turns whose contexts extend each other, a rubric call, and a
    third act turn after a cut context (so it cannot be packed)."""
    tree = Tree.new("t", "textcraft", "x", "task")
    t0 = act([1, 2, 3], [10, 11], ["execution", "execution"], [-0.1, -0.2])
    t1 = act([1, 2, 3, 10, 11, 4], [12, 13, 14], ["execution", "launch", "launch"], [-0.3, -0.4, -0.5])
    rubric = Turn("rubric", [9, 9], [20, 21], [-0.6, -0.7], ["rubric", "rubric"])
    t2 = act([5, 6], [15], ["execution"], [-0.8])
    tree.root.turns += [t0, t1, rubric, t2]
    tree.add_child("0", "sub", launch_step=1)
    return tree


def test_rows_pack_an_agents_turns_and_mask_exactly_the_role():
    tree = agent_tree()
    exec_adv = Advantage(Datum("t", "x", "0", None, "execution", 0, 1.0), 0.5, 2.0)
    rows = token_rows({"t": tree}, [exec_adv])
    assert len(rows) == 2  # t0+t1 packed; t2's context does not extend them
    packed = rows[0]
    assert packed.ids == (1, 2, 3, 10, 11, 4, 12, 13, 14)
    assert packed.trained == (False, False, False, True, True, False, True, False, False)
    assert packed.old_logprobs == (0, 0, 0, -0.1, -0.2, 0, -0.3, 0, 0)
    assert packed.advantage == (0, 0, 0, 1.0, 1.0, 0, 1.0, 0, 0)  # w_d * A = 2 * 0.5
    assert rows[1].ids == (5, 6, 15) and rows[1].trained == (False, False, True)
    launch = token_rows({"t": tree}, [Advantage(Datum("t", "x", "0", 1, "launch", 0, 1.0), -1.0)])
    assert [r.trained for r in launch] == [(False,) * 6 + (False, True, True)]
    rubric = token_rows({"t": tree}, [Advantage(Datum("t", "x", "0", 2, "rubric", 0, 1.0), 1.0)])
    assert rubric[0].ids == (9, 9, 20, 21) and rubric[0].tokens == 2


def test_advantage_token_mean_weighs_each_datum_by_its_trained_tokens():
    """A group of two, leave-one-out: the success (+1) trains 2 tokens, the failure (-1) 6, so
    the datums' mean is 0 and the tokens' mean (2 - 6) / 8 = -0.5; untrained positions do not count."""
    def row(advantage: float, trained: int, untrained: int) -> TokenRow:
        n = trained + untrained
        return TokenRow(tuple(range(n)), (False,) * untrained + (True,) * trained, (0.0,) * n,
                        (0.0,) * untrained + (advantage,) * trained)

    assert advantage_token_mean([row(1.0, 2, 5), row(-1.0, 6, 3)]) == -0.5
    assert advantage_token_mean([row(1.0, 4, 1), row(-1.0, 4, 9)]) == 0.0  # equally long: 0
    assert advantage_token_mean([row(1.0, 0, 4)]) is None


def test_datum_balance_weighs_every_datum_the_same_whatever_its_length():
    """A success (+0.5) that trains 4 tokens over two rows beside a failure (-0.5) that trains 2:
    the token mean leans toward the longer datum; balanced, each datum's tokens carry N / D = 3
    tokens' worth of its advantage, so the token-weighted mean is the datums' own mean, 0."""
    tree = agent_tree()
    success = Advantage(Datum("t", "x", "0", None, "execution", 0, 1.0), 0.5)  # act turns: 3 + 1 tokens
    failure = Advantage(Datum("t", "x", "0", 1, "launch", 0, 1.0), -0.5)  # 2 tokens
    plain = token_rows({"t": tree}, [success, failure])
    balanced = token_rows({"t": tree}, [success, failure], datum_balance=True)
    assert [r.tokens for r in plain] == [r.tokens for r in balanced] == [3, 1, 2]
    assert advantage_token_mean(plain) == pytest.approx((4 * 0.5 - 2 * 0.5) / 6)
    assert advantage_token_mean(balanced) == pytest.approx(0.0)
    n, d = 6, 2
    assert balanced[0].advantage[3] == pytest.approx(0.5 * n / (d * 4))  # one datum over two rows
    assert balanced[1].advantage[-1] == pytest.approx(0.5 * n / (d * 4))
    assert balanced[2].advantage[-1] == pytest.approx(-0.5 * n / (d * 2))
    assert [r.ids for r in balanced] == [r.ids for r in plain] and [r.trained for r in balanced] == [r.trained for r in plain]
    untrained = Advantage(Datum("t", "x", "0", 2, "execution", 0, 1.0), 1.0)  # the rubric turn trains no execution token
    assert token_rows({"t": tree}, [success, untrained], datum_balance=True) == token_rows({"t": tree}, [success])


def test_micro_batches_respect_the_token_budget():
    rows = [TokenRow((1,) * n, (True,) * n, (0.0,) * n, (1.0,) * n) for n in (4, 4, 3, 9, 2)]
    groups = micro_batches(rows, 8)
    assert [[len(r.ids) for r in g] for g in groups] == [[4, 4], [3], [9], [2]]
    assert [r for g in groups for r in g] == rows


@pytest.fixture(scope="module")
def model_and_rows():
    tok = default_tokenizer()
    model = init_model(tok, TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=16), seed=0)
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (12, 7, 20):
        ids = tuple(torch.randint(5, 500, (n,), generator=g).tolist())
        trained = tuple(i >= n // 2 for i in range(n))
        rows.append((ids, trained))
    return model, rows


def _rows(model, spec, advantage: float, stale: float = 0.0):
    """Rows whose old logprobs are the model's own (on-policy), shifted by ``stale``."""
    out = []
    for ids, trained in spec:
        with torch.no_grad():
            lp = sequence_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].tolist()
        old = [0.0] + [x + stale for x in lp]  # position t's token was predicted at t - 1
        out.append(TokenRow(ids, trained, tuple(o if t else 0.0 for o, t in zip(old, trained, strict=True)),
                            tuple(advantage if t else 0.0 for t in trained)))
    return out


def _trained_logprob(model, rows):
    total = 0.0
    with torch.no_grad():
        for r in rows:
            lp = sequence_logprobs(model, torch.tensor([r.ids]), torch.ones(1, len(r.ids), dtype=torch.long))[0]
            total += float(lp[torch.tensor(r.trained[1:])].sum())
    return total


@pytest.mark.parametrize("loss", ["cispo", "grpo"])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_an_update_moves_trained_tokens_in_the_advantages_direction(model_and_rows, loss, advantage):
    import copy

    model = copy.deepcopy(model_and_rows[0])
    rows = _rows(model, model_and_rows[1], advantage)
    before = _trained_logprob(model, rows)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    n = sum(r.tokens for r in rows)
    stats = loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=64, loss=loss)
    opt.step()
    assert stats["tokens"] == n and stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    # at rho = 1: CISPO's loss is -A * mean log pi; GRPO's surrogate is -A * mean rho = -A (same gradient)
    assert stats["loss"] == pytest.approx(advantage * -before / n if loss == "cispo" else -advantage, rel=1e-4)
    after = _trained_logprob(model, rows)
    assert (after - before) * advantage > 0


def test_micro_batching_and_token_mean_do_not_change_the_gradient(model_and_rows):
    model, spec = model_and_rows
    rows = _rows(model, spec, 0.7, stale=0.3)  # rho = exp(-0.3) on every trained token
    n = sum(r.tokens for r in rows)
    grads = []
    for budget in (10_000, 16):
        model.zero_grad()
        stats = loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=budget)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert stats["ratio_mean"] == pytest.approx(float(torch.exp(torch.tensor(-0.3))), rel=1e-4)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    model.zero_grad()


def test_cispo_reduction_is_honoured_over_the_whole_update(model_and_rows):
    """``token_mean`` divides the update's summed loss by N_tokens; ``sum`` does not."""
    from sera_core.train.cispo import CISPOConfig

    model, spec = model_and_rows
    rows = _rows(model, spec, 0.7)
    n = sum(r.tokens for r in rows)
    mean = loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=16)
    total = loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=16, cispo=CISPOConfig(reduction="sum"))
    model.zero_grad()
    assert n > 1 and total["loss"] == pytest.approx(mean["loss"] * n, rel=1e-5)


@pytest.mark.parametrize("budget", [10_000, 16])
def test_rescored_rows_carry_the_models_own_logprobs(model_and_rows, budget):
    model, spec = model_and_rows
    reference = _rows(model, spec, 0.5)  # one row at a time, unpadded
    stale = [TokenRow(r.ids, r.trained, tuple(-9.0 if t else 0.0 for t in r.trained), r.advantage) for r in reference]
    rows = rescored(model, stale, pad_id=0, micro_batch_tokens=budget)  # batched and right-padded, or one by one
    assert [(r.ids, r.trained, r.advantage) for r in rows] == [(r.ids, r.trained, r.advantage) for r in reference]
    for got, want in zip(rows, reference, strict=True):
        assert got.old_logprobs == pytest.approx(want.old_logprobs, abs=1e-5)
    n = sum(r.tokens for r in rows)
    stats = loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=budget)
    model.zero_grad()
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # every importance ratio is 1


@pytest.mark.parametrize("which", ["qwen3", "embedded"])
def test_logprobs_at_the_trained_positions_only_equal_the_full_computation(model_and_rows, which):
    """``sequence_logprobs(..., positions)`` (the output layer at the needed columns only)
    gives the full computation's logprobs and gradients at those positions and 0 elsewhere:
    on the random Qwen3 and on the embedded policy as it trains (LoRA, activation
    checkpointing), with a padded batch whose rows need different columns."""
    if which == "qwen3":
        model, spec = model_and_rows
    else:
        from sera_core.policy.models import EMBEDDED, load_model

        model = load_model(EMBEDDED, trainable=True)[0].train()
        spec = model_and_rows[1]
    n = max(len(ids) for ids, _ in spec)
    ids = torch.tensor([list(i) + [0] * (n - len(i)) for i, _ in spec])
    attention = torch.tensor([[1] * len(i) + [0] * (n - len(i)) for i, _ in spec])
    positions = torch.tensor([list(t[1:]) + [False] * (n - len(t)) for _, t in spec])
    weights = torch.linspace(-1.0, 1.0, positions.numel()).reshape(positions.shape)
    grads = []
    for pos in (None, positions):
        model.zero_grad(set_to_none=True)
        lp = sequence_logprobs(model, ids, attention, pos)
        (lp * weights * positions).sum().backward()
        grads.append({k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None})
        if pos is None:
            full = lp.detach()
        else:
            part = lp.detach()
    assert positions.any(0).sum() < n - 1  # some columns are skipped
    assert torch.equal(part[~positions], torch.zeros_like(part[~positions]))
    assert torch.allclose(part[positions], full[positions], atol=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for k in grads[0]:
        assert torch.allclose(grads[0][k], grads[1][k], atol=1e-5, rtol=1e-4), k


def test_logprob_by_sign_of_rescored_rows_equals_the_updates_own_measure(model_and_rows):
    """``logprob_by_sign`` averages trained tokens by the sign of their advantage; on rows
    rescored by the model it equals what ``loss_and_backward`` measured before its step."""
    from sera_core.train.update import logprob_by_sign

    model, spec = model_and_rows
    rows = _rows(model, spec[:2], 1.0) + _rows(model, spec[2:], -1.0)
    manual = [lp for r in rows[:2] for lp, t in zip(r.old_logprobs, r.trained, strict=True) if t]
    assert logprob_by_sign(rows)["pos"] == pytest.approx(sum(manual) / len(manual))
    assert logprob_by_sign(rows[:2])["neg"] is None
    stats = loss_and_backward(model, rows, pad_id=0, total_tokens=sum(r.tokens for r in rows), micro_batch_tokens=20)
    model.zero_grad(set_to_none=True)
    scored = logprob_by_sign(rescored(model, rows, pad_id=0))
    assert stats["logprob_pos_mean"] == pytest.approx(scored["pos"], abs=1e-5)
    assert stats["logprob_neg_mean"] == pytest.approx(scored["neg"], abs=1e-5)
    assert scored["pos"] == pytest.approx(logprob_by_sign(rows)["pos"], abs=1e-5)  # the rows' own model


def test_one_small_step_raises_the_advantage_weighted_logprob_the_update_measured(model_and_rows):
    """``advantage_weighted_logprob`` is ``sum A log pi / N`` over trained tokens; the update
    reports it before its step, and one small AdamW step on the same rows raises it (the
    direction notebook 08's smoke setting asserts)."""
    import copy

    from sera_core.train.update import advantage_weighted_logprob

    shared, spec = model_and_rows
    model = copy.deepcopy(shared)  # the fixture's model is shared by the module's tests
    rows = _rows(model, spec[:2], 1.0) + _rows(model, spec[2:], -0.5)
    manual = [a * lp for r in rows for lp, t, a in zip(r.old_logprobs, r.trained, r.advantage, strict=True) if t]
    assert advantage_weighted_logprob(rows) == pytest.approx(sum(manual) / len(manual))
    assert advantage_weighted_logprob([]) is None
    lora = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(lora, lr=1e-4)
    stats = loss_and_backward(model, rows, pad_id=0, total_tokens=sum(r.tokens for r in rows), micro_batch_tokens=20)
    assert stats["logprob_weighted_mean"] == pytest.approx(advantage_weighted_logprob(rescored(model, rows, pad_id=0)),
                                                           abs=1e-5)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    assert advantage_weighted_logprob(rescored(model, rows, pad_id=0)) > stats["logprob_weighted_mean"]


def _bf16_engine_rows(model, spec, advantage: float):
    """Rows whose old logprobs come from a bfloat16 copy of ``model`` (a bf16 rollout engine
    beside a float32 trainer: the gap the GPU check measures), and those logprobs per row."""
    import copy

    engine = copy.deepcopy(model).to(torch.bfloat16)
    rows = []
    for ids, trained in spec:
        with torch.no_grad():
            lp = sequence_logprobs(engine, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))[0].tolist()
        old = [0.0] + lp
        rows.append(TokenRow(ids, trained, tuple(o if t else 0.0 for o, t in zip(old, trained, strict=True)),
                             tuple(advantage if t else 0.0 for t in trained)))
    return rows


def _gradient(model, loss_fn) -> torch.Tensor:
    model.zero_grad()
    loss_fn()
    out = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    return out


def test_the_engine_trainer_gap_is_measured_and_pi_old_from_the_trainer_corrects_it_by_truncated_is(model_and_rows):
    """A bfloat16 engine's logprobs against the float32 trainer: ``logprob_gap`` is the token
    mean of ``|log pi_trainer - log pi_engine|``; ``pi_old: engine`` puts the gap into CISPO's
    ratio; ``pi_old: trainer`` makes the ratio 1 and scales each advantage by
    ``min(pi_trainer / pi_engine, tis_cap)`` (the gradient equals the hand-written one), or by
    nothing without a cap."""
    model, spec = model_and_rows
    rows = _bf16_engine_rows(model, spec, 0.7)
    n = sum(r.tokens for r in rows)
    trainer_lp, engine_lp = [], []
    for r in rows:
        lp = sequence_logprobs(model, torch.tensor([r.ids]), torch.ones(1, len(r.ids), dtype=torch.long))[0]
        keep = torch.tensor(r.trained[1:])
        trainer_lp.append(lp[keep])
        engine_lp.append(torch.tensor(r.old_logprobs[1:])[keep])
    diff = torch.cat(trainer_lp).detach() - torch.cat(engine_lp)
    assert float(diff.abs().mean()) > 1e-4  # bfloat16 arithmetic: a real gap (float32 copies: about 1e-7)

    def run(**kw):
        return loss_and_backward(model, rows, pad_id=0, total_tokens=n, micro_batch_tokens=64, **kw)

    stats = {}
    grads = {name: _gradient(model, lambda kw=kw, name=name: stats.__setitem__(name, run(**kw)))
             for name, kw in {"engine": {}, "trainer_tis": {"pi_old": "trainer", "tis_cap": 1.0},
                              "trainer_plain": {"pi_old": "trainer", "tis_cap": None}}.items()}
    for s in stats.values():
        assert s["logprob_gap"] == pytest.approx(float(diff.abs().mean()), abs=1e-6)  # batching: float32 rounding
    assert stats["engine"]["ratio_mean"] == pytest.approx(float(diff.exp().mean()), rel=1e-5)
    assert stats["trainer_tis"]["ratio_mean"] == stats["trainer_plain"]["ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert stats["trainer_tis"]["clip_fraction_high"] == stats["trainer_tis"]["clip_fraction_low"] == 0.0

    def reference(weight):
        lp = torch.cat([sequence_logprobs(model, torch.tensor([r.ids]), torch.ones(1, len(r.ids), dtype=torch.long))[0]
                        [torch.tensor(r.trained[1:])] for r in rows])
        (-(weight * 0.7 * lp).sum() / n).backward()

    truncated = diff.exp().clamp(max=1.0)
    assert 0 < int((truncated < 1).sum()) < len(diff)  # the cap binds on some tokens, not all
    torch.testing.assert_close(grads["trainer_tis"], _gradient(model, lambda: reference(truncated)), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(grads["trainer_plain"], _gradient(model, lambda: reference(torch.ones_like(diff))),
                               rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(grads["engine"], _gradient(model, lambda: reference(diff.exp().clamp(0.0, 5.0))),
                               rtol=1e-4, atol=1e-7)
    for a, b in (("trainer_tis", "trainer_plain"), ("engine", "trainer_plain")):  # the checks can tell them apart
        assert not torch.allclose(grads[a], grads[b], rtol=1e-4, atol=1e-7), (a, b)
    with pytest.raises(ValueError, match="pi_old"):
        run(pi_old="sampler")
