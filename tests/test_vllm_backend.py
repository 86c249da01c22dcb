"""The ``vllm`` backend against the real engine (vLLM's CPU build, ``make setup``) on the
embedded policy, with the ``hf`` backend as the reference.

Engines run in float32 here: vLLM's bf16 CPU kernels round differently from transformers'
float32, and greedy tokens then part at near-ties (40 of 41 sequences equal in the issue's
trial); in float32 both backends agree token for token and their logprobs within 1e-3
(measured: 2.5e-5).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm backend's tests need vLLM's CPU build (make setup)")

from sera_core.agents.runtime import Runtime, RuntimeConfig  # noqa: E402
from sera_core.envs.registry import benchmark, record_value  # noqa: E402
from sera_core.policy.base import SamplingParams  # noqa: E402
from sera_core.policy.hf import HFPolicy  # noqa: E402
from sera_core.policy.models import EMBEDDED, merged_folder  # noqa: E402
from sera_core.utils.hardware import native_bf16  # noqa: E402
from sera_core.policy.vllm_backend import (  # noqa: E402
    EngineConfig,
    EngineStartError,
    VLLMPolicy,
    cpu_supported,
    engine_kwargs,
)

LOGPROB_TOL = 1e-3
"""Largest difference between the two backends' float32 logprobs of one token."""


@pytest.fixture(scope="module")
def engine():
    policy = VLLMPolicy(EMBEDDED, EngineConfig(max_model_len=8192, kv_cache_gib=1.0, dtype="float32"))
    yield policy
    del policy


@pytest.fixture(scope="module")
def hf():
    return HFPolicy(merged_folder(EMBEDDED))


class Recorder:
    """The delegating expert as an actor, recording every call the runtime makes (kind,
    prompt ids, sampling parameters): real act, rubric and score prompts of both benchmarks."""

    def __init__(self, tokenizer):
        from sera_core.agents.actors import make_actor

        self.inner = make_actor("expert", tokenizer=str(merged_folder(EMBEDDED)))
        self.chat, self.enforce_context, self.calls = self.inner.chat, self.inner.enforce_context, []

    async def complete(self, call):
        self.calls.append(call)
        return await self.inner.complete(call)

    def release(self, agent):
        return self.inner.release(agent)


@pytest.fixture(scope="module")
def role_calls(hf):
    """The first call of each kind (act, rubric, score) from one easy tree of each benchmark."""
    picked = []
    for env in ("textcraft", "textworld"):
        bench = benchmark(env)
        split = "val" if env == "textcraft" else "dev"
        task = next(r for r in bench.generate_split(split) if record_value(r, "difficulty") == "easy")
        rec = Recorder(hf.tokenizer)
        Runtime(env, rec, RuntimeConfig(counterfactual=0, seed=0)).run([task])
        for kind in ("act", "rubric", "score"):
            calls = [c for c in rec.calls if c.kind == kind]
            assert calls, f"{env} played no {kind} call"
            picked.append((env, calls[0]))
    return picked


@pytest.mark.timeout(1200)  # the module's engine starts here; hf generates the reference on one thread
def test_greedy_tokens_logprobs_and_stops_equal_the_hf_backend_on_both_benchmarks_and_all_roles(engine, hf, role_calls):
    """The runtime's own prompts and settings (act: its stop strings; rubric and score:
    ``stop_json``), greedy, 48 new tokens: the same tokens, the same finish reason, logprobs
    within LOGPROB_TOL."""
    params = [SamplingParams(temperature=0.0, max_new_tokens=48, stop=c.params.stop, stop_json=c.params.stop_json)
              for _, c in role_calls]
    prompts = [c.prompt_ids for _, c in role_calls]
    ours, ref = engine.generate(prompts, params), hf.generate(prompts, params)
    for (env, call), a, b in zip(role_calls, ours, ref, strict=True):
        assert a.token_ids == b.token_ids, (env, call.kind, a.text, b.text)
        assert a.finish_reason == b.finish_reason and a.stop_string == b.stop_string, (env, call.kind)
        assert a.text == b.text
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < LOGPROB_TOL, (env, call.kind)


def test_stop_json_ends_inside_the_engine_even_for_a_nested_object(engine, hf):
    """A nested object: the first ``}`` does not close it, the request continues and ends at
    the closing brace, where hf ends; the engine never generates towards the cap (old code:
    to ``max_new_tokens``, then cut)."""
    prompt = hf.chat_prompt([{"role": "user", "content": 'Craft 1 stick. Answer in JSON like {"a": {"b": 1}}.'}])
    params = SamplingParams(temperature=0.0, max_new_tokens=200, stop_json=True)
    before, engine.step_log = engine.requests, []
    [a], [b] = engine.generate([prompt], params), hf.generate([prompt], params)
    assert a.finish_reason == b.finish_reason == "json" and a.token_ids == b.token_ids
    assert a.text.count("}") >= 2 and engine.requests - before >= 2  # continued past an inner brace
    assert len(engine.step_log) <= len(a.token_ids) + 2 * (engine.requests - before)  # not 200 steps


def test_seeds_repeat_and_differ_as_documented(engine, hf):
    """What a seed guarantees (module docstring of vllm_backend): the same seeded requests
    submitted the same way give the same tokens; other seeds give other samples."""
    prompt = hf.chat_prompt([{"role": "user", "content": "Write a short poem about crafting."}])
    params = [SamplingParams(temperature=1.0, max_new_tokens=24, seed=s) for s in (1, 1, 2, 3)]
    first = engine.generate([prompt] * 4, params)
    again = engine.generate([prompt] * 4, params)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert first[0].token_ids == first[1].token_ids  # the same seed in one batch
    assert len({tuple(g.token_ids) for g in first[1:]}) == 3  # seeds 1, 2, 3 sample differently


def test_seeded_prompts_longer_than_a_step_together_are_prefilled_whole(engine, hf):
    """vLLM 0.32's CPU runner crashed ("CPU Generator does not use offset") when a seeded
    request's prompt was prefilled in parts; the engine prefills each prompt in one step
    (``engine_kwargs``), so six seeded 1,800-token prompts at once (10,800 tokens, more than
    one step's budget of ``max_model_len`` = 8,192) sample, and repeat with the same seeds."""
    body = hf.tokenizer.encode(" The crafting table holds" + " planks and sticks," * 400)
    prompts = [(hf.tokenizer.encode(f"Inventory {i}:") + body)[:1800] for i in range(6)]  # no shared prefix to cache
    params = [SamplingParams(temperature=1.0, max_new_tokens=8, seed=10 + i) for i in range(6)]
    first = engine.generate(prompts, params)
    assert all(1 <= len(g.token_ids) <= 8 for g in first)
    assert [g.token_ids for g in engine.generate(prompts, params)] == [g.token_ids for g in first]


def test_at_most_max_num_seqs_requests_are_open_and_the_rest_wait_their_turn(engine, hf):
    """``_admit``: beyond ``max_num_seqs`` open requests a job waits in the policy (not in the
    engine, where a few hundred long prompts evicted each other's cached blocks between the
    rounds of a ``stop_json`` call); the waiting ones run as others end, to the same tokens."""
    from dataclasses import replace

    prompts = [hf.chat_prompt([{"role": "user", "content": f"Count to {n}."}]) for n in range(3, 8)]
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    free = engine.generate(prompts, params)
    kept = engine.engine_config
    engine.engine_config, engine.step_log = replace(kept, max_num_seqs=2), []
    try:
        capped = engine.generate(prompts, params)
        log = engine.step_log
    finally:
        engine.engine_config, engine.step_log = kept, None
    assert max(n for n, _ in log) == 2 and not engine._waiting
    assert [g.token_ids for g in capped] == [g.token_ids for g in free]


def test_continuous_batching_lets_a_late_request_join_and_gives_the_batch_tokens(engine, hf):
    """Requests submitted 5 engine steps apart: the late one joins the running batch (steps
    with both open), and every completion equals the batch-at-once greedy result."""
    prompts = [hf.chat_prompt([{"role": "user", "content": text}]) for text in ("Name three tools.", "Count to ten.")]
    params = SamplingParams(temperature=0.0, max_new_tokens=32)

    async def staggered():
        first = asyncio.ensure_future(engine.agenerate(prompts[0], params))
        for _ in range(5 * 4):  # the driver steps the engine between these yields
            await asyncio.sleep(0)
        second = asyncio.ensure_future(engine.agenerate(prompts[1], params))
        return await first, await second

    engine.step_log = []
    got = asyncio.run(staggered())
    log = engine.step_log
    assert log[0][0] == 1 and max(n for n, _ in log) == 2  # the second joined a running batch
    assert [g.token_ids for g in got] == [g.token_ids for g in engine.generate(prompts, params)]


class Interrupted(BaseException):
    """An interruption raised inside an engine step, as pytest-timeout's ``Failed`` or a
    notebook's interrupt is: a ``BaseException``, not an ``Exception``."""


def test_an_interruption_in_an_engine_step_reaches_every_waiting_caller(engine, hf, monkeypatch):
    """Raised in the middle of ``engine.step``, the interruption ends every caller's await (the
    driver once caught only ``Exception``, so it ended alone and the callers waited forever:
    CI's 90 minutes ran out after a test's timeout fired there). Afterwards the policy serves
    the next requests as before."""
    prompts = [hf.chat_prompt([{"role": "user", "content": text}]) for text in ("Name three tools.", "Count to ten.")]
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    step = engine.engine.step
    calls = []

    def interrupted_second_step():
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted()
        return step()

    async def both():
        return await asyncio.wait_for(asyncio.gather(*(engine.agenerate(p, params) for p in prompts)), timeout=60)

    monkeypatch.setattr(engine.engine, "step", interrupted_second_step)
    with pytest.raises(Interrupted):
        asyncio.run(both())
    monkeypatch.setattr(engine.engine, "step", step)
    assert not engine._open and not engine._waiting and engine._driver is None
    assert engine.engine.get_num_unfinished_requests() == 0  # the interrupted requests were aborted
    assert [g.token_ids for g in asyncio.run(both())] == [g.token_ids for g in engine.generate(prompts, params)]


def test_a_weight_push_reaches_the_engine_tied_embedding_included(engine, hf):
    """Perturbed weights pushed through the worker extension: the engine's greedy tokens and
    logprobs follow the perturbed hf model (its output layer tied to the embedding, which is
    pushed once as ``model.embed_tokens.weight``); the originals pushed back restore the
    engine's logprobs exactly."""
    prompt = hf.chat_prompt([{"role": "user", "content": "Craft 1 oak planks."}])
    params = SamplingParams(temperature=0.0, max_new_tokens=16)
    [before] = engine.generate([prompt], params)
    original = {k: v.detach().clone() for k, v in hf.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.02 * v.std() * torch.randn(v.shape, generator=g) if v.dim() == 2 else v for k, v in original.items()}
    noisy.pop("lm_head.weight", None)
    hf.model.load_state_dict(noisy, strict=False)
    hf.model.lm_head.weight = hf.model.model.embed_tokens.weight  # tied, as in the model
    try:
        assert engine.load_weights(noisy) == len(noisy) + 1  # lm_head added for the tie
        [ours], [ref] = engine.generate([prompt], params), hf.generate([prompt], params)
        assert ours.token_ids == ref.token_ids
        assert max(abs(x - y) for x, y in zip(ours.logprobs, ref.logprobs, strict=True)) < LOGPROB_TOL
        assert ours.logprobs != before.logprobs
    finally:
        engine.load_weights(original)
        hf.model.load_state_dict(original)
    [after] = engine.generate([prompt], params)
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs


class RecordingLLM:
    """The real ``vllm.LLM`` with its sleep and wake calls recorded instead of run (on CPU
    vLLM's sleep mode is a no-op, so a GPU's call order is checked by recording it), and its
    weight pushes and prefix-cache resets recorded and run."""

    def __init__(self, llm, calls: list):
        self.llm, self.calls = llm, calls

    def sleep(self, level: int = 1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def collective_rpc(self, method, args=()):
        import inspect

        self.calls.append(("collective_rpc", method, "streamed" if inspect.isgenerator(args[0]) else type(args[0]).__name__))
        return self.llm.collective_rpc(method, args=args)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return self.llm.reset_prefix_cache()


def test_an_update_sleeps_at_level_2_and_the_push_wakes_weights_then_kv_cache(engine, hf, monkeypatch):
    """The GPU order around an update, recorded on the CPU engine taken for a GPU one: sleep
    level 2; then the device cache emptied, ``wake_up(["weights"])``, the weights streamed
    (a generator, not a list), the prefix cache reset, ``wake_up(["kv_cache"])``; device memory
    recorded at each step. Asleep, and with its weights discarded, the engine refuses to
    generate; after the push it generates what it did before."""
    from sera_core.policy import vllm_backend

    prompt = hf.chat_prompt([{"role": "user", "content": "Craft 1 oak planks."}])
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    [before] = engine.generate([prompt], params)
    calls: list = []
    monkeypatch.setattr(engine, "cuda", True)
    monkeypatch.setattr(engine, "llm", RecordingLLM(engine.llm, calls))
    monkeypatch.setattr(vllm_backend, "empty_device_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(vllm_backend, "device_memory", lambda: (float(len(calls)), 0.5))
    engine.memory_log = []
    weights = {k: v for k, v in hf.model.state_dict().items() if k != "lm_head.weight"}
    try:
        engine.sleep()
        with pytest.raises(RuntimeError, match="asleep"):
            engine.generate([prompt], params)
        engine.sleep()  # asleep already: nothing more
        assert engine.push(weights) == len(weights) + 1  # lm_head added for the tie
        order, memory = list(calls), list(engine.memory_log)
        calls.clear()
        engine.sleep()
        engine.wake_up()  # awake, but the weights hold nothing until a push
        with pytest.raises(RuntimeError, match="discarded"):
            engine.generate([prompt], params)
        engine.push(weights)
    finally:
        engine.memory_log = None
    assert order == [("sleep", 2), ("empty_cache",), ("wake_up", ["weights"]), ("collective_rpc", "sera_reload", "streamed"),
                     ("reset_prefix_cache",), ("wake_up", ["kv_cache"])]
    assert [m[0] for m in memory] == ["before sleep", "asleep", "cache emptied", "weights awake", "pushed", "kv_cache awake"]
    assert calls == [("sleep", 2), ("wake_up", ["kv_cache", "weights"]), ("collective_rpc", "sera_reload", "streamed"),
                     ("reset_prefix_cache",)]
    assert not engine.asleep and not engine.stale
    [after] = engine.generate([prompt], params)
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs


def test_an_engine_that_cannot_start_says_why_before_any_rollout(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineStartError, match="config.json"):
        VLLMPolicy(tmp_path / "empty")
    with pytest.raises(EngineStartError, match="no such model folder"):
        VLLMPolicy(tmp_path / "missing")
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig(max_model_len=0)
    assert cpu_supported(" fpu sse2 ") == "this CPU has neither AVX2 nor AVX-512"
    assert cpu_supported(" fpu avx2 ") is None and cpu_supported(" avx512f avx512bw ") is None
    assert native_bf16(cuda=False, flags=" fpu avx512f avx512_bf16 ") and native_bf16(cuda=False, flags=" amx_bf16 ")
    assert not native_bf16(cuda=False, flags=" fpu avx512f avx512_vnni ") and not native_bf16(cuda=False, flags="")


def test_the_machine_line_names_the_flags_the_kernels_and_the_precision():
    """``python -m sera_core.utils.hardware`` (printed by ``make test``, so by CI): what decides
    the kernels and the ``auto`` precision, agreeing with :func:`native_bf16` on this machine."""
    import json
    import platform
    import subprocess
    import sys

    from sera_core.utils.hardware import FLAGS_THAT_MATTER, cpu_flags, cpu_vendor, cpuinfo

    line = json.loads(subprocess.run([sys.executable, "-m", "sera_core.utils.hardware"], capture_output=True, text=True,
                                     check=True).stdout)
    assert list(line["flags"]) == list(FLAGS_THAT_MATTER)
    assert line["flags"]["avx512_bf16"] == (" avx512_bf16 " in f" {cpu_flags()} ")
    assert line["native_bf16"] == native_bf16() and line["auto_precision"] == ("bf16" if native_bf16() else "float32")
    assert line["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability() and line["cores"] >= 1
    assert line["vendor"] == cpu_vendor() != "" and line["cpu"] == (cpuinfo("model name") or platform.processor())
    # torch forced to AVX2 kernels (the stand-in for an AVX2-only machine) takes float32 like one, whatever the flags
    forced = json.loads(subprocess.run([sys.executable, "-m", "sera_core.utils.hardware"], capture_output=True, text=True,
                                       check=True, env={**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}).stdout)
    if platform.machine() == "x86_64":
        assert forced["torch_cpu_capability"] == "AVX2"
        assert not forced["native_bf16"] and forced["auto_precision"] == "float32" and forced["flags"] == line["flags"]


def test_engine_arguments_bound_memory_and_pin_one_engine_per_process(tmp_path):
    """Faults C and D of the old backend: every engine gets ``max_model_len`` (the config's,
    capped by the model) and its memory share; several processes use ``external_launcher``
    (one engine each, in its process); GPUs may sleep; CPUs reserve a stated KV cache."""
    cfg = EngineConfig(max_model_len=9000, gpu_memory_utilization=0.3, kv_cache_gib=0.5)
    gpu = engine_kwargs(tmp_path, cfg, cuda=True, distributed=True, max_model_len=8192, bf16=True)
    assert gpu["max_model_len"] == 8192 and gpu["gpu_memory_utilization"] == 0.3 and gpu["enable_sleep_mode"]
    assert gpu["distributed_executor_backend"] == "external_launcher" and gpu["tensor_parallel_size"] == 1
    assert gpu["dtype"] == "bfloat16" and not gpu["enforce_eager"] and gpu["enable_prefix_caching"]
    cpu = engine_kwargs(tmp_path, cfg, cuda=False, distributed=False, max_model_len=8192, bf16=False)
    assert cpu["kv_cache_memory_bytes"] == 1 << 29 and cpu["dtype"] == "float32" and cpu["enforce_eager"]
    assert cpu["enable_chunked_prefill"] is False and cpu["max_num_batched_tokens"] == 8192  # a prompt prefilled whole
    assert "enable_chunked_prefill" not in gpu
    # auto precision follows the hardware: bfloat16 on a CPU that runs it natively; a set dtype wins
    assert engine_kwargs(tmp_path, cfg, cuda=False, distributed=False, max_model_len=8192, bf16=True)["dtype"] == "bfloat16"
    f32 = EngineConfig(dtype="float32")
    assert engine_kwargs(tmp_path, f32, cuda=True, distributed=False, max_model_len=8192, bf16=True)["dtype"] == "float32"
    assert "distributed_executor_backend" not in cpu and "gpu_memory_utilization" not in cpu
    assert cpu["worker_extension_cls"] == "sera_core.policy.vllm_worker.WeightLoader"


def test_merged_lora_state_equals_peft_merge(tmp_path):
    """The trainer's merge on plain tensors (every process, sharded or not) equals peft's
    ``merge_and_unload`` of the embedded adapter."""
    from sera_core.policy.models import load_model, merge_lora_state, merged

    model, _ = load_model(EMBEDDED, trainable=True, device="cpu")
    for name, p in model.named_parameters():  # a trained-looking adapter: B away from its start
        if "lora_B" in name:
            p.data += 0.01
    ours = merge_lora_state(model.state_dict(), model.peft_config["default"].to_dict())
    ref = merged(model).state_dict()
    assert ours.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(ours[k], ref[k], rtol=1e-5, atol=1e-6, msg=k)


VLLM_RUN = __import__("pathlib").Path(__file__).parent / "vllm_run.py"


def _vllm_run(out, processes: int, run=VLLM_RUN, *args: str) -> list[dict]:
    """Run ``run OUT ARGS...`` on ``processes`` processes (torchrun when several); each process's
    ``OUT/result.<rank>.json``."""
    import json
    import os
    import sys

    from launching import run_launch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
           if processes > 1 else [sys.executable]) + [str(run), str(out), *args]
    done = run_launch(cmd, env=env, timeout=1100)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"result.{r}.json").read_text()) for r in range(processes)]


@pytest.mark.timeout(1200)
def test_training_with_the_engine_pushes_every_update_and_the_resume(tmp_path):
    """``backend: vllm`` with ``model: tiny`` (an adapter, served merged): after an update on
    the noisy expert's trees, after an update on the engine's own rollouts and after a
    resume, the engine's logprobs equal the trainer model's; a fresh engine does not (it holds
    the starting weights until the checkpoint is loaded and pushed)."""
    [r] = _vllm_run(tmp_path, 1)
    assert r["processes"] == 1 and r["expert_update"]["datums"] > 0 and r["own_update"]["tokens_trained"] > 0
    for key in ("start", "expert_update", "own_update", "resumed"):
        assert r[key]["max_diff"] < LOGPROB_TOL, key
    error = max(r[key]["max_diff"] for key in ("start", "expert_update", "own_update", "resumed"))
    moved = max(abs(a - b) for a, b in zip(r["own_update"]["model"], r["start"]["model"]))
    assert moved > 10 * error  # the updates moved the model far more than engine and model differ
    assert 0 <= r["own_update"]["logprob_gap"] < LOGPROB_TOL  # float32 engine and trainer: no gap to correct
    stale = max(abs(a - b) for a, b in zip(r["fresh"]["engine"], r["resumed"]["model"]))
    assert stale > 10 * error  # a fresh engine is stale until the checkpoint is pushed


@pytest.mark.timeout(1200)
def test_two_processes_each_own_an_engine_and_both_get_the_weights(tmp_path):
    """Two gloo processes (torchrun), one vLLM CPU engine each (``external_launcher``): after
    each update both engines sample from the new weights (the old trainer pushed an empty
    dict on every process but the first)."""
    results = _vllm_run(tmp_path, 2)
    assert [r["processes"] for r in results] == [2, 2]
    for r in results:
        for key in ("start", "expert_update", "own_update"):
            assert r[key]["max_diff"] < LOGPROB_TOL, (r["rank"], key)
        error = max(r[key]["max_diff"] for key in ("start", "expert_update", "own_update"))
        assert max(abs(a - b) for a, b in zip(r["own_update"]["model"], r["start"]["model"])) > 10 * error
    assert results[0]["own_update"]["engine"] == pytest.approx(results[1]["own_update"]["engine"], abs=LOGPROB_TOL)


FSDP_ENGINE_RUN = VLLM_RUN.parent / "fsdp_engine_run.py"


@pytest.mark.timeout(1200)
def test_fsdp2_processes_push_every_engine_the_trained_weights_and_the_old_push_left_one_stale(tmp_path):
    """Fault B on CPU: two processes shard a tiny random Qwen3 with torch's own FSDP2
    (``fully_shard`` over gloo, no Accelerate), train two updates at a large learning rate,
    and push into their own vLLM CPU engines (``external_launcher``; tests/fsdp_engine_run.py).

    With the push the trainer makes (:func:`~sera_core.policy.models.engine_state`: full tensors
    on every process) both engines' greedy logprobs equal the sharded model's within
    LOGPROB_TOL, the two engines agree, and the training moved the model's logprobs of those
    tokens far more than that (so an engine left on the folder's weights could not pass).
    With the old push (the rank-0 gather, an empty dict elsewhere) the first engine agrees and
    the second still serves the folder's weights: this test fails on the old push code."""
    new = _vllm_run(tmp_path / "new", 2, FSDP_ENGINE_RUN, "new")
    cpu = not torch.cuda.is_available()
    for r in new:
        assert r["processes"] == 2 and r["sharded"] and r["device"].startswith("cpu" if cpu else "cuda"), r["rank"]
        assert r["new"]["max_diff"] < LOGPROB_TOL, (r["rank"], r["new"]["pushed"])
        assert r["new"]["pushed"] == new[0]["new"]["pushed"] > 0  # every process pushes the whole model
        moved = max(abs(a - b) for m, o in zip(r["new"]["model"], r["new"]["original"], strict=True)
                    for a, b in zip(m, o, strict=True))
        assert moved > 100 * LOGPROB_TOL, (r["rank"], moved)
    assert new[0]["new"]["tokens"] == new[1]["new"]["tokens"]
    for a, b in zip(new[0]["new"]["engine"], new[1]["new"]["engine"], strict=True):
        assert a == pytest.approx(b, abs=LOGPROB_TOL)
    first, second = (r["old"] for r in _vllm_run(tmp_path / "old", 2, FSDP_ENGINE_RUN, "old"))
    assert first["pushed"] == new[0]["new"]["pushed"] and second["pushed"] == 0  # what the old push gave each
    assert first["max_diff"] < LOGPROB_TOL
    assert second["max_diff"] > 100 * LOGPROB_TOL  # the second engine disagrees with the trained model ...
    for e, o in zip(second["engine"], second["original"], strict=True):  # ... and serves the folder's weights
        assert e == pytest.approx(o, abs=LOGPROB_TOL)


@pytest.mark.timeout(900)
def test_a_bfloat16_engine_beside_a_float32_trainer_shows_its_gap_and_pi_old_from_the_trainer_sets_the_ratio_to_1(tmp_path):
    """A forced engine-trainer gap on CPU: the engine samples in bfloat16, the trainer computes
    in float32. One update on the engine's own rollouts with ``pi_old: trainer``: metrics.csv
    records the gap (far above the float32 engine's, in the test above) and a ratio of exactly 1
    with nothing clipped (the gap goes into the truncated importance weights instead)."""
    import csv

    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.train.config import load_config
    from sera_core.train.trainer import Trainer
    from sera_core.utils.jsonio import write_jsonl

    tasks = tmp_path / "tasks.jsonl"
    write_jsonl(tasks, [t for t in generate_split("train") if t["misc"]["difficulty"] == "easy"][:2])
    cfg = load_config("textcraft/sera_tiny.yaml", backend="vllm", tasks=str(tasks), difficulties=None, tasks_per_update=2,
                      trees_per_task=2, schedule="execution:1", counterfactual=0, max_new_tokens=32,
                      max_steps_per_agent=2, micro_batch_tokens=2048, total_updates=1, checkpoint_every=1,
                      filter_zero_variance=False, engine_kv_cache_gib=0.5, engine_max_model_len=4096,
                      engine_dtype="bfloat16", mixed_precision="no", pi_old="trainer", tis_cap=2.0,
                      out=str(tmp_path / "run"))
    try:
        trainer = Trainer(cfg, progress=False)
    except EngineStartError as exc:  # vLLM's CPU kernels without bfloat16 on this machine
        pytest.skip(f"no bfloat16 vLLM engine here: {exc}")
    trainer.run()
    trainer.close()
    with (tmp_path / "run" / "metrics.csv").open(newline="") as f:
        [row] = list(csv.DictReader(f))
    assert int(row["tokens_trained"]) > 0
    assert float(row["logprob_gap"]) > LOGPROB_TOL  # bfloat16 sampling against float32 scoring (measured 8.8e-3)
    assert float(row["ratio_mean"]) == 1.0
    assert float(row["clip_fraction_low"]) == float(row["clip_fraction_high"]) == 0.0
