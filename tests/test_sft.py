"""The SFT loop: loss falls, runs are bit-identical, resume is exact, batches mask the prompt."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random

import pytest
import torch

from sera_core.policy.tiny import TinyModelConfig, init_model, train_tokenizer
from sera_core.tiny.sft import (IGNORE, SFTConfig, Sample, batch_indices, build_batch, fit, lr_factor, packed_steps, samples_sha256,
                                 sft_loss, train_sft)

TINY = TinyModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=16, max_position_embeddings=256)
CFG = SFTConfig(steps=60, batch_size=16, lr=1e-2, warmup_steps=5, log_every=5, checkpoint_every=10, max_len=64)


@pytest.fixture(scope="module")
def data():
    """A tokenizer and "copy: <word>" -> "<word><|im_end|>" samples."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 7))) for _ in range(200)]
    tok = train_tokenizer([f"copy: {w}\n{w}" for w in words], vocab_size=300)
    samples = [Sample(tok(f"copy: {w}\n")["input_ids"], tok(w)["input_ids"] + [tok.eos_token_id]) for w in words]
    return tok, samples


def run(data, out, cfg=CFG, **kw):
    tok, samples = data
    model = init_model(tok, TINY, seed=0)
    summary = train_sft(model, samples, cfg, out, progress=False, pad_id=tok.pad_token_id, **kw)
    return model.state_dict(), summary


def csv_rows(out):
    """``loss.csv`` without its wall-clock ``seconds`` column."""
    return [line.rsplit(",", 1)[0] for line in (out / "loss.csv").read_text().splitlines()]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    weights, summary = run(data, out)
    return out, weights, summary


def test_loss_falls_and_outputs(data, reference):
    out, weights, summary = reference
    assert summary["steps"] == 60 and summary["resumed_from"] == 0
    assert summary["final_loss"] < 0.6 * summary["first_loss"], summary  # about 5.7 -> 2.8
    rows = csv_rows(out)
    assert rows[0] == "step,loss,lr,tokens,positions" and [int(r.split(",")[0]) for r in rows[1:]] == list(range(5, 61, 5))
    assert float(rows[-1].split(",")[1]) == summary["final_loss"]
    assert int(rows[-1].split(",")[3]) == summary["tokens"] > 60 * 16  # at least one completion token per sample
    assert math.isclose(float(rows[-1].split(",")[2]), CFG.lr * CFG.min_lr_ratio)  # cosine ends at min_lr_ratio * lr
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint", "loss.csv"]  # no leftover tmp/old folders
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 60 and state["config"] == json.loads(json.dumps(dataclasses.asdict(CFG)))
    # The saved model (tied embeddings stored once) reloads to the trained weights.
    tok, _ = data
    fresh = init_model(tok, TINY, seed=1)
    from safetensors.torch import load_model
    load_model(fresh, out / "checkpoint" / "model.safetensors")
    assert_same_weights(fresh.state_dict(), weights)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()


def test_two_runs_are_bit_identical(data, reference, tmp_path):
    out, weights, summary = reference
    weights2, summary2 = run(data, tmp_path)
    assert_same_weights(weights, weights2)
    assert csv_rows(tmp_path) == csv_rows(out)
    assert summary2["final_loss"] == summary["final_loss"] and summary2["tokens"] == summary["tokens"]


@pytest.mark.parametrize("crash_mid_swap", [False, True])
def test_interrupted_run_resumes_exactly(data, reference, tmp_path, crash_mid_swap):
    out, weights, summary = reference
    part, _ = run(data, tmp_path, stop_after=35)  # last checkpoint at step 30; csv rows for 35 must go
    assert not all(torch.equal(part[k], weights[k]) for k in weights)
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 30
    assert csv_rows(tmp_path)[-1].startswith("35,")
    if crash_mid_swap:  # killed between moving checkpoint/ aside and renaming a half-written checkpoint.tmp/
        os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.old")
        (tmp_path / "checkpoint.tmp").mkdir()
        (tmp_path / "checkpoint.tmp" / "state.json").write_text("{")
    resumed, summary2 = run(data, tmp_path)
    assert summary2["resumed_from"] == 30 and summary2["steps"] == 60
    assert_same_weights(resumed, weights)
    assert csv_rows(tmp_path) == csv_rows(out)
    assert {k: summary2[k] for k in ("first_loss", "final_loss", "tokens")} == {k: summary[k] for k in ("first_loss", "final_loss", "tokens")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "loss.csv"]


def test_resume_refuses_other_config_or_samples(data, tmp_path):
    cfg = dataclasses.replace(CFG, steps=10)
    run(data, tmp_path, cfg)
    with pytest.raises(ValueError, match=r"config \(lr\)"):
        run(data, tmp_path, dataclasses.replace(cfg, lr=2e-2))
    tok, samples = data
    with pytest.raises(ValueError, match="samples"):
        train_sft(init_model(tok, TINY), samples[:-1], cfg, tmp_path, progress=False)
    _, summary = run(data, tmp_path, dataclasses.replace(cfg, lr=2e-2), resume=False)  # explicit fresh start
    assert summary["resumed_from"] == 0 and len(csv_rows(tmp_path)) == 1 + 2
    _, summary = run(data, tmp_path, dataclasses.replace(cfg, lr=2e-2))  # already complete: nothing to do
    assert summary["resumed_from"] == summary["steps"] == 10


def test_build_batch_masks_prompt_and_padding_and_truncates():
    samples = [Sample((5, 6, 7), (8, 9)), Sample((), (3,), weight=2.0), Sample((1, 2, 3, 4), (10, 11, 12, 13, 14, 15))]
    b = build_batch(samples, pad_id=0, max_len=8)
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0], [3, 0, 0, 0, 0, 0, 0, 0], [3, 4, 10, 11, 12, 13, 14, 15]]
    assert b["attention_mask"].tolist() == [[1] * 5 + [0] * 3, [1] + [0] * 7, [1] * 8]
    X = IGNORE
    assert b["labels"].tolist() == [[X, X, X, 8, 9, X, X, X], [3, X, X, X, X, X, X, X], [X, X, 10, 11, 12, 13, 14, 15]]
    assert b["weights"].tolist() == [1.0, 2.0, 1.0]
    # A completion of max_len tokens or more keeps its first max_len tokens and no prompt.
    b = build_batch([Sample((1, 2), (10, 11, 12, 13))], pad_id=0, max_len=3)
    assert b["input_ids"].tolist() == [[10, 11, 12]] and b["labels"].tolist() == [[10, 11, 12]]


def test_packed_samples_learn_their_spans_and_truncation_keeps_what_fits():
    s = Sample((1, 2, 3, 4, 5, 6), (7, 8), learn=((1, 3), (4, 5)))
    X = IGNORE
    b = build_batch([s, Sample((9,), (10,))], pad_id=0, max_len=16)
    assert b["labels"].tolist() == [[X, 2, 3, X, 5, X, 7, 8], [X, 10, X, X, X, X, X, X]]
    # Cut on the left: the span (1, 3) loses its first token, (4, 5) shifts.
    b = build_batch([s], pad_id=0, max_len=6)
    assert b["input_ids"].tolist() == [[3, 4, 5, 6, 7, 8]] and b["labels"].tolist() == [[3, X, 5, X, 7, 8]]
    assert build_batch([s], pad_id=0, max_len=4)["labels"].tolist() == [[5, X, 7, 8]]  # (1, 3) cut away
    assert build_batch([s], pad_id=0, max_len=3)["labels"].tolist() == [[X, 7, 8]]  # both spans cut away
    assert samples_sha256([s]) != samples_sha256([Sample(s.prompt_ids, s.completion_ids)])


def test_loss_is_weighted_mean_over_completion_tokens():
    torch.manual_seed(0)
    b = build_batch([Sample((5, 6), (7, 8)), Sample((1,), (2, 3, 4), weight=3.0)], pad_id=0, max_len=16)
    logits = torch.randn(2, b["input_ids"].shape[1], 20)
    loss = sft_loss(logits, b["labels"], b["weights"])
    logp = logits.log_softmax(-1)
    terms = [(1.0, logp[0, 1, 7]), (1.0, logp[0, 2, 8]), (3.0, logp[1, 0, 2]), (3.0, logp[1, 1, 3]), (3.0, logp[1, 2, 4])]
    assert torch.allclose(loss, -sum(w * lp for w, lp in terms) / sum(w for w, _ in terms))
    # Logits at positions predicting prompt or padding tokens do not matter; those predicting completions do.
    changed = logits.clone()
    changed[0, 0] += 5 * torch.randn(20)  # predicts prompt token 6
    changed[0, 3:] += 5 * torch.randn(20)  # last completion token (predicts nothing) and padding
    changed[1, 3] += 5 * torch.randn(20)  # predicts padding
    assert torch.equal(sft_loss(changed, b["labels"], b["weights"]), loss)
    changed[1, 1] += 5 * torch.randn(20)
    assert not torch.equal(sft_loss(changed, b["labels"], b["weights"]), loss)


def test_schedule_and_curriculum():
    cfg = SFTConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1, batch_size=4)
    assert lr_factor(0, cfg) == 0.1 and lr_factor(9, cfg) == 1.0 and lr_factor(10, cfg) == 1.0
    assert math.isclose(lr_factor(99, cfg), 0.1) and lr_factor(30, cfg) > lr_factor(60, cfg)
    order = list(range(100))
    assert max(batch_indices(order, 0, cfg)) < 25 and max(batch_indices(order, 2, cfg)) < 28  # q(2) = 0.28
    assert max(i for s in range(50, 100) for i in batch_indices(order, s, cfg)) >= 90
    assert batch_indices(order, 7, cfg) == batch_indices(order, 7, cfg) != batch_indices(order, 8, cfg)
    assert len(set(batch_indices(order, 0, cfg))) == 4  # without replacement when the pool allows
    assert max(batch_indices(order, 0, dataclasses.replace(cfg, curriculum=False)) + batch_indices(order, 1, dataclasses.replace(cfg, curriculum=False))) >= 25


@pytest.mark.parametrize("field,value", [
    ("steps", 0), ("batch_size", 1.5), ("lr", 0.0), ("warmup_steps", -1), ("min_lr_ratio", 1.5),
    ("weight_decay", float("nan")), ("betas", (0.9, 1.0)), ("grad_clip", -1.0), ("max_len", 1), ("seed", -3),
    ("log_every", 0), ("checkpoint_every", True), ("curriculum", "yes"), ("mixed_precision", "fp8"),
])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SFTConfig\.{field} must be"):
        SFTConfig(**{field: value})


def test_sample_validation():
    assert Sample([1, 2], [3]).prompt_ids == (1, 2)
    with pytest.raises(ValueError, match="completion_ids"):
        Sample((1,), ())
    with pytest.raises(ValueError, match="weight"):
        Sample((1,), (2,), weight=-1.0)
    for bad in (((1, 1),), ((2, 3), (0, 1)), ((0, 2), (1, 3)), ((0, 3),), ((-1, 1),)):
        with pytest.raises(ValueError, match="learn"):
            Sample((1, 2), (3,), learn=bad)


def test_a_cut_keeps_the_head_and_the_completion_and_cuts_the_middle():
    """:func:`fit` on a sample longer than ``max_len``: the head, the marker, then the tail;
    learnt spans in the head and the tail survive (shifted), those in the middle go."""
    X = IGNORE
    s = Sample(tuple(range(1, 13)), (20, 21), learn=((1, 2), (5, 7), (10, 11)), head=3)  # 14 tokens
    ids, spans = fit(s, 9, marker=(99,))
    assert ids == (1, 2, 3, 99) + (10, 11, 12, 20, 21)
    assert spans == [(1, 2), (5, 6), (7, 9)]  # (1, 2) in the head; (10, 11) -> (5, 6); the completion last
    b = build_batch([s], pad_id=0, max_len=9, marker=(99,))
    assert b["labels"].tolist() == [[X, 2, X, X, X, 11, X, 20, 21]]
    assert fit(s, 14) == (s.prompt_ids + s.completion_ids, list(s.learn) + [(12, 14)])  # fits: whole
    # head + marker + completion too long for max_len: the tail only, as with head 0
    assert fit(s, 5, marker=(99,)) == ((10, 11, 12, 20, 21), [(1, 2), (3, 5)])
    with pytest.raises(ValueError, match="head"):
        Sample((1, 2), (3,), head=3)


def test_a_long_scoring_sample_keeps_its_rubric_and_task():
    """A real scoring call (the runtime's prompt, the embedded tokenizer's stand-in) longer than
    ``max_len``: the cut keeps the system prompt, the frozen rubric and the delegated task (its
    head, found by :func:`~sera_core.tiny.demos.call_head`) and the verdict, and shortens the
    transcript. Keeping only the tail (the cut before 2026-12-07) lost the rubric and the task,
    which is what the verdict is checked against."""
    from sera_core.agents.corpus import default_tokenizer
    from sera_core.agents.prompts import SCORE_SYSTEM, build_score_prompt
    from sera_core.policy.chat import ChatFormat
    from sera_core.rubrics import parse_rubric, rubric_item
    from sera_core.tiny.demos import call_head

    tok = default_tokenizer()
    chat = ChatFormat(tok)
    rubric = parse_rubric(json.dumps({"rubric_items": [
        rubric_item("crafted", 0.6, "net gain of oak_planks reaches 4", "none", "4"),
        rubric_item("errors", 0.2, "no failing craft", "many", "none"),
        rubric_item("finished", 0.1, "finish() called", "no", "yes"), rubric_item("budget", 0.1, "within budget", "no", "yes")],
        "success_gate": "4 oak_planks more than at the start", "failure_conditions": ["finish without the target"],
        "scoring_procedure": "weighted sum"})).value
    trajectory = "\n".join(f"turn {i}: craft 1 oak_planks -> ok" for i in range(120))
    prompt = chat.prompt([{"role": "system", "content": SCORE_SYSTEM},
                          {"role": "user", "content": build_score_prompt(rubric, "Craft 4 oak_planks.", trajectory, "oak_planks: 4")}])
    verdict = chat.encode('{"success": true, "final_score": 1.0}') + [chat.eos_id]
    head = call_head(tuple(prompt), "score", tok.decode)
    text = tok.decode(prompt[:head])
    assert "oak_planks reaches 4" in text and "Craft 4 oak_planks." in text and "turn 0" not in text
    sample = Sample(prompt, verdict, role="score", head=head)
    max_len = head + 400
    assert len(prompt) > max_len
    marker = tuple(chat.encode("\n... [tokens omitted] ...\n"))
    ids, spans = fit(sample, max_len, marker)
    assert len(ids) == max_len and ids[:head] == sample.prompt_ids[:head] and ids[head:head + len(marker)] == marker
    assert ids[-len(verdict):] == tuple(verdict) and spans == [(max_len - len(verdict), max_len)]
    kept = tok.decode(list(ids))
    assert "success_gate" in kept and "Craft 4 oak_planks." in kept and "## Final environment state" in kept
    assert "turn 119" in kept and "turn 0:" not in kept


def test_packed_epochs_see_every_sample_once_in_steps_that_fit():
    lengths = [5, 9, 3, 7, 2, 8, 6, 4, 1, 10]
    cfg = SFTConfig(max_len=10, tokens_per_step=12, epochs=3, seed=4)
    steps = packed_steps(lengths, cfg)
    assert steps == packed_steps(lengths, cfg)  # a function of the seed alone
    per_epoch, start = [], 0
    for _ in range(3):  # cut the steps into epochs: each epoch holds every index once
        seen = []
        while len(seen) < len(lengths):
            seen += steps[start]
            start += 1
        per_epoch.append(seen)
        assert sorted(seen) == list(range(len(lengths)))
    assert start == len(steps) and per_epoch[0] != per_epoch[1]  # shuffled anew each epoch
    assert all(sum(lengths[i] for i in step) <= 12 for step in steps)
    # a greedy fill: a step closes only when the next sample would not fit
    flat = [i for step in steps for i in step]
    bounds = [len(step) for step in steps]
    k = 0
    for n in bounds[:-1]:
        if k + n < len(flat) and (k + n) % len(lengths):
            assert sum(lengths[i] for i in flat[k:k + n + 1]) > 12
        k += n
    for bad in (dict(tokens_per_step=8, epochs=1), dict(tokens_per_step=12), dict(epochs=2)):
        with pytest.raises(ValueError):
            SFTConfig(max_len=10, **bad)


def test_a_packed_step_has_the_padded_batch_gradient(data):
    """The samples of a packed step run one by one, unpadded, each with its share of the step's
    loss (:func:`step_backward`): the summed gradient equals that of the same samples as one
    padded batch."""
    from sera_core.tiny.sft import chunked_sft_loss, step_backward
    from sera_core.utils.hardware import make_accelerator

    tok, samples = data
    picked = [samples[3], Sample(samples[7].prompt_ids, samples[7].completion_ids, weight=2.0), samples[11]]
    model = init_model(tok, TINY, seed=0)
    batch = build_batch(picked, pad_id=tok.pad_token_id, max_len=64)
    chunked_sft_loss(model, batch).backward()
    padded = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    parts = [build_batch([s], pad_id=tok.pad_token_id, max_len=64) for s in picked]
    _, tokens, positions = step_backward(model, parts, make_accelerator("no"))
    assert tokens == int((batch["labels"][:, 1:] != IGNORE).sum()) and positions == int(batch["attention_mask"].sum())
    for a, b in zip(padded, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


PACKED = SFTConfig(max_len=64, tokens_per_step=160, epochs=2, lr=1e-2, warmup_steps=3, log_every=3, checkpoint_every=4,
                   mixed_precision="auto")


def test_a_packed_run_learns_and_resumes_to_the_uninterrupted_run(data, tmp_path):
    """Two packed epochs: every sample trained twice; stopped after step 10 (last checkpoint at
    8) and resumed, the run ends with the uninterrupted run's weights and loss rows."""
    tok, samples = data
    whole, summary = run(data, tmp_path / "whole", PACKED)
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    assert summary["total_steps"] == len(packed_steps(lengths, PACKED)) == summary["steps"] and summary["epochs"] == 2.0
    assert summary["positions"] == 2 * sum(lengths)  # every position of every sample, twice, no padding
    assert summary["tokens"] == 2 * sum(len(s.completion_ids) for s in samples)
    assert summary["final_loss"] < 0.6 * summary["first_loss"]
    assert [p[1] for p in summary["precision"]] == ["bf16" if __import__("sera_core.utils.hardware", fromlist=["x"]).native_bf16() else "no"]
    part, stopped = run(data, tmp_path / "part", PACKED, stop_after=10)
    assert stopped["steps"] == 10 and 0 < stopped["epochs"] < 2
    resumed, again = run(data, tmp_path / "part", PACKED)
    assert again["resumed_from"] == 8 and again["steps"] == summary["steps"]
    assert_same_weights(resumed, whole)
    assert csv_rows(tmp_path / "part") == csv_rows(tmp_path / "whole")
    assert again["precision"] == summary["precision"]  # one stretch: the same machine and precision throughout


def test_a_carried_checkpoint_is_taken_only_where_it_is_further_on(data, tmp_path):
    """``carry`` mirrors each checkpoint; :func:`adopt_carried` takes it into a work folder that
    has none or an older one, and never replaces a checkpoint further on than it."""
    from sera_core.tiny.sft import adopt_carried

    carry = tmp_path / "carry"
    run(data, tmp_path / "a", PACKED, stop_after=10, carry=carry)  # checkpoint 8, mirrored
    assert json.loads((carry / "checkpoint" / "state.json").read_text())["step"] == 8
    _, done = run(data, tmp_path / "a", PACKED)  # on to the end here, without the carry
    assert not adopt_carried(tmp_path / "a", carry)  # the local checkpoint (the last step) is further on
    assert json.loads((tmp_path / "a" / "checkpoint" / "state.json").read_text())["step"] == done["steps"]
    assert adopt_carried(tmp_path / "fresh", carry) and csv_rows(tmp_path / "fresh") == csv_rows(carry)
    assert not adopt_carried(tmp_path / "fresh", carry)  # taken once: now equal, not further on
