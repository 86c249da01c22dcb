"""The hf policy backend on a tiny Qwen3 model built here (real tokenizer, real model)."""

from __future__ import annotations

import random

import pytest
import torch

from sera_core.policy.base import SamplingParams
from sera_core.policy.hf import HFPolicy
from sera_core.policy.tiny import TinyModelConfig, build_tiny

TEXTS = [
    "<thought>I check the inventory.</thought><python>print(view_inventory())</python>",
    "Craft the following items: 3x a1_i5, 2x m3_i5_13",
    "<action>take red apple</action> <delegate>{\"goal\": \"prepare and eat dish_2\"}</delegate>",
    "café – naïve ✓ 12345",
] * 40


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("tiny"), TEXTS, vocab_size=400, cfg=TinyModelConfig(), seed=0)
    return HFPolicy(path, device="cpu")


def prompt_of(policy, text):
    return policy.chat_prompt([{"role": "user", "content": text}])


def test_chat_template_is_chatml(policy):
    ids = prompt_of(policy, "Craft the following items: 3x a1_i5")
    assert policy.decode(ids) == "<|im_start|>user\nCraft the following items: 3x a1_i5<|im_end|>\n<|im_start|>assistant\n"
    assert policy.decode(policy.tokenizer("café – naïve ✓")["input_ids"]) == "café – naïve ✓"  # byte-level round trip


def test_greedy_is_deterministic_and_matches_a_full_forward(policy):
    prompt = prompt_of(policy, "Craft the following items: 3x a1_i5")
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    policy.store.clear()
    a = policy.generate([prompt], params)[0]
    policy.store.clear()
    b = policy.generate([prompt], params)[0]  # the same state gives the same bits
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and a.finish_reason in ("length", "eos")
    c = policy.generate([prompt], params)[0]  # the prompt's key/value states kept: float rounding of other shapes
    assert c.token_ids == a.token_ids and c.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    assert a.text == policy.decode(a.token_ids)
    with torch.no_grad():  # the KV-cached logprobs equal a plain forward over prompt + completion
        full = torch.tensor([prompt + a.token_ids])
        logp = torch.log_softmax(policy.model(input_ids=full).logits[0].float(), dim=-1)
    expected = [float(logp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(a.token_ids)]
    assert a.logprobs == pytest.approx(expected, abs=1e-4)
    assert all(lp <= 0 for lp in a.logprobs)
    greedy = [int(logp[len(prompt) - 1 + t].argmax()) for t in range(len(a.token_ids))]
    assert a.token_ids == greedy


def test_left_padding_does_not_change_results(policy):
    long, short = prompt_of(policy, "Craft the following items: 3x a1_i5, 2x m3_i5_13"), prompt_of(policy, "hi")
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    batched = policy.generate([long, short], params)
    alone = [policy.generate([p], params)[0] for p in (long, short)]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    assert batched[1].logprobs == pytest.approx(alone[1].logprobs, abs=1e-4)


def test_seeded_sampling_is_independent_of_the_batch(policy):
    p = prompt_of(policy, "Craft the following items: 3x a1_i5")
    params = [SamplingParams(temperature=1.0, max_new_tokens=16, seed=s) for s in (1, 2, 1)]
    out = policy.generate([p, p, p], params)
    assert out[0].token_ids == out[2].token_ids != out[1].token_ids
    assert policy.generate([p], params[0])[0].token_ids == out[0].token_ids


def test_stop_strings_and_length(policy):
    p = prompt_of(policy, "Craft the following items: 3x a1_i5")
    free = policy.generate([p], SamplingParams(temperature=0.0, max_new_tokens=20))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 20 or free.finish_reason == "eos"
    stop = free.text[len(policy.decode(free.token_ids[:2])):][:3] or free.text[:1]
    stopped = policy.generate([p], SamplingParams(temperature=0.0, max_new_tokens=20, stop=(stop,)))[0]
    assert stopped.finish_reason == "stop" and stopped.stop_string == stop
    assert stopped.text.endswith(stop) or stop in stopped.text[-(len(stop) + 8):]
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)] and len(stopped.token_ids) < 20


def test_json_object_closed_only_when_the_first_object_is_complete():
    """True exactly when the object at the first ``{`` is complete: the first object the
    parsers read is then fixed whatever follows; an open or invalid first object runs on."""
    from sera_core.policy.base import json_object_closed
    from sera_core.rubrics import extract_json_object

    assert not json_object_closed("") and not json_object_closed("no object yet")
    assert not json_object_closed('{"s": [{"n": 1}')  # an inner object is complete, the first is not
    assert json_object_closed('```json\n{"s": [{"n": 1}], "t": "}"}')
    done = 'I score it: {"a": {"b": [1, 2]}, "c": "x}"}'
    assert json_object_closed(done)
    for tail in ("", "\n```", ' garbage {"a": 2}', "}}}"):
        assert extract_json_object(done + tail) == {"a": {"b": [1, 2]}, "c": "x}"}
    assert not json_object_closed('use {item} first, then {"a": 1}')  # invalid first object: never stops early


def test_stop_json_ends_at_the_closing_token_and_both_backends_cut_the_same(tmp_path):
    """A model that writes a JSON object and runs on stops at the token that closes it
    (finish reason ``json``), its tokens and log-probabilities a prefix of the free run;
    the first prefix of the free run that ``json_closed_by_last`` accepts has the same length."""
    from sera_core.policy.base import json_closed_by_last, json_object_closed

    text = 'Score: {"success": true, "final_score": 1.0} and then it goes on and on'
    path = build_tiny(tmp_path / "m", [text] * 20, vocab_size=300, cfg=TinyModelConfig(), seed=0)
    model = HFPolicy(path, device="cpu")
    ids = model.tokenizer(text)["input_ids"]
    optimizer = torch.optim.Adam(model.model.parameters(), lr=3e-3)
    batch = torch.tensor([ids])
    for _ in range(150):  # memorise the one line
        optimizer.zero_grad()
        model.model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
    model.model.eval()
    model.store.clear()
    prompt = ids[:next(i for i in range(len(ids)) if "{" in model.decode(ids[:i + 1]))]  # "Score:"
    free = model.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=40))[0]
    assert "{" not in model.decode(prompt) and "} and then" in free.text  # it runs on past the object
    stopped = model.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=40, stop_json=True))[0]
    assert stopped.finish_reason == "json" and stopped.text.endswith("1.0}")
    assert stopped.token_ids == free.token_ids[:len(stopped.token_ids)]
    assert stopped.logprobs == pytest.approx(free.logprobs[:len(stopped.token_ids)], abs=1e-5)
    first = next(n for n in range(1, len(free.token_ids) + 1) if json_closed_by_last(free.token_ids[:n], model.decode))
    assert first == len(stopped.token_ids)
    assert json_object_closed(stopped.text) and not json_object_closed(model.decode(stopped.token_ids[:-1]))


def test_bad_inputs_fail_clearly(policy):
    with pytest.raises(ValueError, match="at least one token"):
        policy.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        policy.generate([[1]], [SamplingParams(), SamplingParams()])
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    assert policy.generate([], SamplingParams()) == []


def test_an_owned_model_is_laid_out_for_decoding_and_a_shared_one_is_left_alone(tmp_path):
    """A policy that loads its model stores every linear weight transposed in memory (same
    values; the tied output layer becomes its own copy); a trainer's shared model keeps its
    layout; both write the same greedy tokens."""
    from sera_core.policy.models import load_model

    path = build_tiny(tmp_path, TEXTS, vocab_size=400, cfg=TinyModelConfig(), seed=0)
    owned = HFPolicy(path, device="cpu")
    model, tokenizer = load_model(path, device="cpu")
    shared = HFPolicy.from_model(model, tokenizer)
    lin = [n for n, m in owned.model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert "lm_head" in lin and len(lin) == 1 + 7 * TinyModelConfig().num_hidden_layers
    for name in lin:
        w, plain = owned.model.get_submodule(name).weight, model.get_submodule(name).weight
        assert w.stride() == (1, w.shape[0]) and plain.is_contiguous() and torch.equal(w, plain)
    assert owned.model.lm_head.weight is not owned.model.model.embed_tokens.weight
    assert model.lm_head.weight is model.model.embed_tokens.weight  # shared: untouched, still tied
    prompts = [prompt_of(owned, t) for t in ("Craft the following items: 3x a1_i5", "hi", "take red apple")]
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    fast, slow = owned.generate(prompts, params), shared.generate(prompts, params)
    assert [g.token_ids for g in fast] == [g.token_ids for g in slow]
    for f, g in zip(fast, slow, strict=True):
        assert f.logprobs == pytest.approx(g.logprobs, abs=1e-4)


def test_kept_prefixes_give_the_same_greedy_tokens_as_recomputing(policy):
    """Four turns of three conversations, each turn's prompt extending the last prompt and
    completion (as the runtime's): the kept path feeds only the new tokens and writes the
    same tokens as a policy that recomputes every prompt."""
    plain = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    policy.store.clear()
    params = SamplingParams(temperature=0.0, max_new_tokens=9)
    glue = policy.tokenizer.encode("<|im_end|>\n<|im_start|>user\nThe result was 3.<|im_end|>\n<|im_start|>assistant\n")
    prompts = [prompt_of(policy, u) for u in ["Craft the following items: 3x a1_i5", "hi", "Craft 2x m3_i5_13"]]
    for turn in range(4):
        if turn:  # all but the glue and the last completion token are kept
            kept = [policy.store.lookup(torch.tensor(p).numpy())[1] for p in prompts]
            assert kept == [len(p) - len(glue) - 1 for p in prompts]
        fast, slow = policy.generate(prompts, params), plain.generate(prompts, params)
        assert [g.token_ids for g in fast] == [g.token_ids for g in slow]
        assert [g.finish_reason for g in fast] == [g.finish_reason for g in slow]
        for f, s in zip(fast, slow, strict=True):
            assert f.logprobs == pytest.approx(s.logprobs, abs=1e-4)
        prompts = [p + g.token_ids + glue for p, g in zip(prompts, fast, strict=True)]
    assert len(plain.store.entries) == 0 and len(policy.store.entries) == 3  # one per conversation


def test_a_fresh_prompt_reuses_a_shared_prefix_and_seeded_sampling_is_unchanged(policy):
    plain = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    system = {"role": "system", "content": "You are an agent. Craft the following items with python tools."}
    first = policy.chat_prompt([system, {"role": "user", "content": "3x a1_i5"}])
    second = policy.chat_prompt([system, {"role": "user", "content": "2x m3_i5_13"}])
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    policy.generate([first], params)
    shared = policy.store.lookup(torch.tensor(second).numpy())[1]
    common = next(k for k, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert shared == common > len(first) // 2  # the system message's states are reused
    assert policy.generate([second], params)[0].token_ids == plain.generate([second], params)[0].token_ids


def test_weight_changes_empty_the_store_and_the_budget_holds(policy):
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    prompt = prompt_of(policy, "Craft the following items: 3x a1_i5")
    policy.generate([prompt], params)
    assert policy.store.entries
    with torch.no_grad():
        w = next(policy.model.parameters())
        w.add_(0.5)  # an in-place update, as an optimizer step does
        changed = policy.generate([prompt], params)[0]
        w.sub_(0.5)
    fresh = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    with torch.no_grad():
        w.add_(0.5)
        expected = fresh.generate([prompt], params)[0]
        w.sub_(0.5)
    assert changed.token_ids == expected.token_ids and changed.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    small = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=60_000)
    for text in ("one", "two two", "three three three", "four four four four"):
        small.generate([prompt_of(small, text)], params)
        assert small.store.nbytes <= 60_000
    assert 0 < len(small.store.entries) < 4


def test_a_batch_of_fresh_agents_runs_its_shared_system_prompt_once(policy):
    plain = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    policy.store.clear()
    system = {"role": "system", "content": "You are an agent. Craft the following items with python tools. " * 3}
    prompts = [policy.chat_prompt([system, {"role": "user", "content": g}]) for g in ("3x a1_i5", "2x m3_i5_13", "hi")]
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    shapes = []
    hook = policy.model.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    fast = policy.generate(prompts, params)
    hook.remove()
    shared = next(k for k, col in enumerate(zip(*prompts, strict=False)) if len(set(col)) > 1)
    assert shapes[0] == (1, shared + 1)  # the shared prefix, once
    assert shapes[1] == (3, max(map(len, prompts)) - shared)  # then only what follows it
    assert [g.token_ids for g in fast] == [g.token_ids for g in plain.generate(prompts, params)]
    assert len(policy.store.entries) == 3  # the shared prefix's entry was superseded by the three sequences



def test_the_cache_grows_past_its_first_allocation(policy, monkeypatch):
    import sera_core.policy.hf as hf

    plain = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    prompts = [prompt_of(policy, "Craft the following items: 3x a1_i5"), prompt_of(policy, "hi")]
    want = plain.generate(prompts, params)
    monkeypatch.setattr(hf, "GROW", 2)  # room for 2 new tokens, then doublings
    policy.store.clear()
    got = policy.generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert all(len(g.token_ids) == 12 or g.finish_reason == "eos" for g in got)


def test_a_long_prompt_block_runs_in_chunks_with_the_same_result_and_last_logits_only(policy, monkeypatch):
    """Prefill in column chunks (bounded attention memory) gives the same greedy tokens and
    logprobs as one block, and no forward computes logits for more than its last position."""
    import sera_core.policy.hf as hf

    assert hf.prefill_chunk(64, 9, 2_000) * 64 * 9 * 2_000 * 4 <= hf.PREFILL_SCORE_BYTES  # 64 rescoring prompts
    assert hf.prefill_chunk(1, 9, 10**9) == 1
    prompts = [prompt_of(policy, TEXTS[0] + TEXTS[1]), prompt_of(policy, "hi")]
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    whole = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0).generate(prompts, params)
    widths, logits = [], []
    hooks = [policy.model.register_forward_pre_hook(lambda m, args, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True),
             policy.model.lm_head.register_forward_hook(lambda m, args, out: logits.append(out.shape[1]))]
    monkeypatch.setattr(hf, "PREFILL_SCORE_BYTES", 2 * policy.model.config.num_attention_heads * len(prompts[0]) * 4 * 3)
    chunked = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0).generate(prompts, params)
    for h in hooks:
        h.remove()
    width = len(prompts[0])  # the block: the longest prompt (nothing kept)
    chunks = -(-width // 3)  # 3 columns a forward, then one token a step
    assert widths == [3] * (chunks - 1) + [width - 3 * (chunks - 1)] + [1] * (len(widths) - chunks)
    assert set(logits) == {1}
    assert [g.token_ids for g in chunked] == [g.token_ids for g in whole]
    for a, b in zip(chunked, whole, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_the_batch_plan_bounds_memory_and_keeps_short_agents_apart_from_a_long_one():
    """plan_batch: every part's cache fits the budget (a row alone always runs); similar rows
    stay one batch when the weights dominate; a long root is not padded onto short branches;
    the plan is the cheapest by its cost (weights once a part + rows x longest)."""
    import itertools

    import sera_core.policy.hf as hf

    def cost(parts, lengths, tb, wb):
        return sum(wb + len(p) * max(lengths[i] for i in p) * tb for p in parts)

    parts = hf.plan_batch([10, 10, 10], 1, budget=20)
    assert sorted(i for p in parts for i in p) == [0, 1, 2] and max(map(len, parts)) == 2
    assert hf.plan_batch([10, 30, 10, 10], 1, budget=40) == [[0, 2, 3], [1]]  # sorted by length first
    assert hf.plan_batch([100], 1, budget=1) == [[0]] and hf.plan_batch([5] * 4, 1, budget=10**6) == [[0, 1, 2, 3]]
    smol_token, smol_weights = 46_080, 538_060_032  # SmolLM2-135M, float32
    assert hf.plan_batch([260] * 32, smol_token, smol_weights) == [list(range(32))]  # fresh agents: one batch
    tree = [9_000, 400, 4_000, 1_200, 3_100, 700, 2_500, 3_900, 1_800]  # a root and its 8 branches
    plan = hf.plan_batch(tree, smol_token, smol_weights)
    assert [0] in plan and cost(plan, tree, smol_token, smol_weights) < cost([list(range(9))], tree, smol_token, smol_weights)
    rng = random.Random(0)
    for _ in range(30):  # optimal among all splits into consecutive runs of the sorted rows
        lengths = [rng.randint(1, 50) for _ in range(rng.randint(1, 7))]
        wb, budget = rng.choice([0, 20, 200]), rng.choice([60, 10**6])
        plan = hf.plan_batch(lengths, 1, wb, budget)
        assert sorted(i for p in plan for i in p) == list(range(len(lengths)))
        assert all(len(p) == 1 or len(p) * max(lengths[i] for i in p) <= budget for p in plan)
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        best = min(cost(c, lengths, 1, wb) for c in (
            [order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)), strict=True)]
            for k in range(len(order)) for cuts in itertools.combinations(range(1, len(order)), k))
            if all(len(p) == 1 or len(p) * max(lengths[i] for i in p) <= budget for p in c))
        assert cost(plan, lengths, 1, wb) == best


def test_a_batch_generated_in_parts_gives_the_same_result_in_order(policy, monkeypatch):
    """A batch planned into parts (by the cache budget, or by length) is generated part by
    part, each part's rows together, and the answers come back in the prompts' order with
    the tokens and logprobs of the whole batch (greedy and sampled: each row has its seed)."""
    import sera_core.policy.hf as hf

    prompts = [prompt_of(policy, t) for t in (TEXTS[0] + TEXTS[1], "hi", TEXTS[2], "hi there")]
    plain = HFPolicy.from_model(policy.model, policy.tokenizer, prefix_cache_bytes=0)
    for params in (SamplingParams(temperature=0.0, max_new_tokens=8),
                   [SamplingParams(temperature=1.0, max_new_tokens=8, seed=s) for s in range(4)]):
        whole = plain.generate(prompts, params)
        for patch in (("CALL_CACHE_BYTES", 2 * (len(prompts[0]) + 8) * hf._token_bytes(policy.model)),  # two rows a part
                      ("_weight_bytes", lambda model: 0)):  # nothing shared: every distinct length apart
            rows: list[int] = []
            hook = policy.model.register_forward_pre_hook(lambda m, args, kw, rows=rows: rows.append(kw["input_ids"].shape[0]),
                                                          with_kwargs=True)
            with monkeypatch.context() as m:
                m.setattr(hf, *patch)
                parted = plain.generate(prompts, params)
            hook.remove()
            assert max(rows) <= 2 and [g.token_ids for g in parted] == [g.token_ids for g in whole]
            for a, b in zip(parted, whole, strict=True):
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_sampling_follows_the_distribution_and_the_nucleus():
    """The inverse-CDF sampler: frequencies match softmax(logits / T) (a chi-square bound),
    a zero-probability token is never drawn, and top_p keeps only the nucleus."""
    from sera_core.policy.hf import _sample

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    params = SamplingParams(temperature=0.7, max_new_tokens=1)
    g = torch.Generator().manual_seed(0)
    n = 20_000
    counts = torch.bincount(torch.tensor([_sample(logits, params, g) for _ in range(n)]), minlength=5).double()
    expected = torch.softmax(logits / 0.7, dim=-1).double() * n
    assert counts[4] == 0
    chi2 = float(((counts[:4] - expected[:4]) ** 2 / expected[:4]).sum())
    assert chi2 < 16.3, chi2  # 3 degrees of freedom, p = 0.001
    nucleus = SamplingParams(temperature=1.0, top_p=0.7, max_new_tokens=1)
    drawn = {_sample(logits, nucleus, g) for _ in range(2_000)}
    assert drawn == {0, 1}  # p = .64, .24, .09, ...: the smallest set reaching 0.7 is the first two
    assert _sample(logits, SamplingParams(temperature=0.0, max_new_tokens=1), g) == 0


def test_a_tokenizer_without_a_pad_token_pads_with_its_end_of_sequence_token(tmp_path):
    """transformers 5.17 reads no pad token from the embedded base's GGUF file (5.19 does): a
    folder whose tokenizer names none loads padding with its end-of-sequence token, and an update
    over rows of different lengths (padded) runs, where ``pad_token_id=None`` failed on a GPU machine."""
    import json

    from sera_core.policy.models import load_model
    from sera_core.train.update import TokenRow, loss_and_backward

    path = build_tiny(tmp_path, TEXTS, vocab_size=400, cfg=TinyModelConfig(), seed=0)
    config = json.loads((path / "tokenizer_config.json").read_text())
    del config["pad_token"]
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    model, tokenizer = load_model(path, trainable=True, device="cpu")
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id
    rows = [TokenRow((5, 6, 7, 8), (False, False, True, True), (0.0, 0.0, -1.0, -1.0), (0.0, 0.0, 1.0, 1.0)),
            TokenRow((5, 9), (False, True), (0.0, -1.0), (0.0, -1.0))]
    stats = loss_and_backward(model, rows, pad_id=tokenizer.pad_token_id, total_tokens=3, micro_batch_tokens=64)
    assert stats["tokens"] == 3
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
