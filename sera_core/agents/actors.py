"""Actors: how the runtime asks a policy for one completion, batched across agents.

The runtime makes three kinds of calls (:class:`Call`): an agent's next step (``act``),
a rubric for a child (``rubric``) and a score for a child (``score``). An actor answers
each with a :class:`~sera_core.policy.base.Generation` (token ids, logprobs, text).

* :class:`PolicyActor` wraps a token-level policy (``hf``, ``vllm``): every call is just
  its ``prompt_ids`` and sampling settings. Calls from all running agents of all trees
  are collected by a :class:`Batcher` and sent to the policy together, so generation is
  never one sequence at a time.
* :class:`sera_core.policy.expert.ExpertPolicy` plays every role from the environments'
  solvers; it reads the observation text (``act``) or the structured inputs the runtime
  also puts in ``info`` (``rubric``, ``score``) and answers in the model's formats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sera_core.chat_endpoint import ChatEndpoint, ChatEndpointConfig
from sera_core.policy.base import Generation, Policy, SamplingParams
from sera_core.policy.chat import ChatFormat
from sera_core.utils.aio import fail_waiting, settle
from sera_core.utils.errors import UserInputError

CALL_KINDS = ("act", "rubric", "score")


@dataclass
class Call:
    """One request to an actor."""

    kind: str
    """``act``, ``rubric`` or ``score``."""
    prompt_ids: list[int]
    """The exact context, in the actor's token space."""
    params: SamplingParams
    agent: str = ""
    """Unique key of the agent (act) or of the child the call is about (rubric, score)."""
    observation: str | None = None
    """act: the latest observation text (the first prompt's user text on turn one, or None)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Structured facts for scripted actors (ignored by model policies): see the runtime."""
    messages: list[dict[str, str]] | None = None
    """rubric, score: the chat messages ``prompt_ids`` encode (for text-level actors)."""

    def __post_init__(self) -> None:
        if self.kind not in CALL_KINDS:
            raise ValueError(f"call kind {self.kind!r} is not one of {CALL_KINDS}")


class Actor(Protocol):
    """What the runtime needs from whoever answers its calls."""

    chat: ChatFormat | None
    """Token-level chat formatting in the actor's token space (None: a text-level actor,
    only usable as the external rubric writer or scorer)."""
    enforce_context: bool
    """Whether the runtime's context limit applies (a scripted expert needs none)."""

    async def complete(self, call: Call) -> Generation:
        """The completion of one call."""
        ...

    def release(self, agent: str) -> None:
        """The agent ``agent`` has ended (drop any per-agent state)."""
        ...


class Batcher:
    """Collects concurrent ``generate`` requests and serves them in batched policy calls.

    A request waits until the event loop has gone ``settle`` rounds without a new
    request arriving (every agent that can reach its next call has done so), then all
    waiting requests (at most ``max_batch``) go to ``policy.generate`` together. The
    schedule depends only on the order of events in the loop, so runs repeat exactly.
    """

    def __init__(self, policy: Policy, max_batch: int = 64, settle: int = 3):
        if max_batch < 1 or settle < 1:
            raise ValueError("max_batch and settle must be >= 1")
        self.policy, self.max_batch, self.settle = policy, max_batch, settle
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._flusher: asyncio.Task | None = None
        self.batches: list[int] = []
        """Size of every batch sent, in order (for measuring batching)."""

    async def generate(self, prompt: list[int], params: SamplingParams) -> Generation:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, params, future))
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._pending:
                await settle(lambda: len(self._pending), self.settle, self.max_batch)
                batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
                self.batches.append(len(batch))
                try:
                    outs = self.policy.generate([b[0] for b in batch], [b[1] for b in batch])
                except BaseException as exc:  # noqa: BLE001 - every waiting caller gets the failure (fail_waiting)
                    fail_waiting([fut for *_, fut in batch], exc)
                else:
                    for (*_, fut), out in zip(batch, outs, strict=True):
                        fut.set_result(out)
        finally:
            self._flusher = None


class PolicyActor:
    """A token-level policy as an actor. A policy that batches continuously (``agenerate``:
    the ``vllm`` backend) gets each call as its own request; any other is batched through one
    :class:`Batcher`."""

    enforce_context = True

    def __init__(self, policy: Policy, *, max_batch: int = 64):
        self.policy = policy
        self.chat = ChatFormat(policy.tokenizer)
        self.batcher = Batcher(policy, max_batch)
        self._continuous = getattr(policy, "agenerate", None)

    async def complete(self, call: Call) -> Generation:
        if self._continuous is not None:
            return await self._continuous(call.prompt_ids, call.params)
        return await self.batcher.generate(call.prompt_ids, call.params)

    def release(self, agent: str) -> None:
        return None


class ExternalChatActor:
    """An external model behind an OpenAI-compatible endpoint, as the rubric writer and/or
    scorer of the Table 3 ablations (``RuntimeConfig.rubric_writer/scorer = "external"``).

    It answers ``rubric`` and ``score`` calls from their chat messages through its
    :class:`~sera_core.chat_endpoint.ChatEndpoint` (timeouts, retries with backoff), at the
    call's temperature and output cap; it has no token space (``chat = None``), so its
    outputs are text, recorded on the child's node with the call's error and tokens
    (``meta``). A failed request gives empty text, which the runtime records as malformed
    output. ``stats`` is the endpoint's :class:`~sera_core.chat_endpoint.EndpointStats`
    (calls, requests, failures, tokens): external supervision cost, like a judge's."""

    chat = None
    enforce_context = False

    def __init__(self, endpoint: ChatEndpoint):
        self.endpoint = endpoint
        self.stats = endpoint.stats

    async def complete(self, call: Call) -> Generation:
        if call.kind == "act" or call.messages is None:
            raise ValueError("an external chat model only writes or scores rubrics (it needs the call's messages)")
        reply = await asyncio.to_thread(self.endpoint.chat, call.messages, temperature=call.params.temperature,
                                        max_tokens=call.params.max_new_tokens)
        meta = {"error": reply.error, "input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens}
        return Generation([], [], reply.content or "", "stop" if reply.content is not None else "error", meta=meta)

    def release(self, agent: str) -> None:
        return None


def external_actor(rubric_writer: str, scorer: str, url: str | None, model: str | None) -> ExternalChatActor | None:
    """The external rubric writer/scorer (an OpenAI-compatible endpoint at ``url``, key in
    ``SERA_EXTERNAL_API_KEY``) when ``rubric_writer`` or ``scorer`` is ``"external"``; else None."""
    if "external" not in (rubric_writer, scorer):
        return None
    if not url:
        raise UserInputError("an external rubric writer or scorer needs an endpoint URL (and a model name)")
    return ExternalChatActor(ChatEndpoint(ChatEndpointConfig(base_url=url, model=model,
                                                             api_key_env="SERA_EXTERNAL_API_KEY")))


def as_actor(policy: Any, *, max_batch: int = 64) -> Any:
    """An actor for ``policy``: the policy itself when it already answers calls (the scripted
    expert has ``complete``), else a :class:`PolicyActor` batching a token-level policy."""
    return policy if hasattr(policy, "complete") else PolicyActor(policy, max_batch=max_batch)


def noisy_expert(noise: float | None = None, *, tokenizer: Any = None, perturb: float = 0.0, explain: bool = False,
                 lenient: float = 0.0, **rates: Mapping[str, float]):
    """The delegating expert with seeded mistakes on every benchmark, the one constructor of
    it: each benchmark's settings are its
    :meth:`~sera_core.envs.registry.Benchmark.noisy_expert_config` of ``noise`` (None: the
    benchmark's default noisy expert, TextCraft wasting crafts and TextWorld using wrong
    preparations; p: its mistake rate p with early finishes p / 2), with the fields a
    benchmark's ``rates`` set (``textcraft={"waste": 0.15}``). Each agent's mistakes are
    seeded by the runtime, so the branches of a group differ. ``perturb``, ``explain`` and
    ``lenient`` (the chance that a scoring call gives full marks whatever the child did: the
    embedded policy's scoring mistake; 0, an honest scorer, by default) are
    :class:`~sera_core.policy.expert.ExpertPolicy`'s; ids in ``tokenizer`` (default: the
    scripted policies' tokenizer)."""
    from sera_core.agents.corpus import default_tokenizer
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.policy.expert import ExpertPolicy

    if unknown := sorted(set(rates) - set(BENCHMARKS)):
        raise ValueError(f"no benchmark named {', '.join(unknown)}; mistake rates are given for {list(BENCHMARKS)}")
    configs = {name: bench.noisy_expert_config(noise, **rates.get(name, {})) for name, bench in BENCHMARKS.items()}
    return ExpertPolicy(tokenizer if tokenizer is not None else default_tokenizer(), perturb=perturb, explain=explain,
                        lenient=lenient, **configs)


def make_actor(spec: str, *, max_batch: int = 64, noise: float = 0.0, tokenizer: str | None = None,
               engine: Any = None) -> Any:
    """The actor a policy spec names (the CLI's ``--policy``, a notebook's ``POLICY``):

    * ``expert``: :func:`noisy_expert` delegating on every benchmark, with ``noise`` its
      chance of a mistake (TextCraft: wasted crafts, TextWorld: wrong preparations; half as
      many early finishes), in the ids of ``tokenizer`` (a folder; default: the scripted
      policies' own tokenizer);
    * ``tiny``: the embedded policy (SmolLM2-135M-Instruct with its LoRA warm start) served by
      vLLM's CPU build (``vllm:tiny``: on 2 cores an easy task in 8 s against 63 s on the
      ``hf`` backend, docs/benchmarks.md); ``hf:tiny`` names the ``hf`` backend;
    * ``hf:PATH``: a Hugging Face model folder, an adapter folder, or a ``sera train`` run or
      checkpoint (its starting model with the checkpoint's weights, hashes checked), through
      the ``hf`` backend (``hf:tiny``: the embedded policy);
    * ``vllm:PATH``: the same served by a vLLM engine (:mod:`sera_core.policy.vllm_backend`;
      its CPU build on CPUs): an adapter merged into its base, a checkpoint's weights pushed.

    Token-level policies are batched (``hf``: ``max_batch`` sequences per call; ``vllm``:
    continuously, its engine started with ``engine``, an
    :class:`~sera_core.policy.vllm_backend.EngineConfig`, default its defaults). A spec that names nothing loadable raises
    :class:`~sera_core.utils.errors.UserInputError` saying what was expected."""
    if spec == "expert":
        tok = None
        if tokenizer:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tokenizer))
        return noisy_expert(noise, tokenizer=tok)
    if spec == "tiny":
        spec = "vllm:tiny"
    backend, _, name = spec.partition(":")
    if backend not in ("hf", "vllm") or not name:
        raise UserInputError(f"a policy is 'expert', 'tiny', 'hf:PATH' or 'vllm:PATH', not {spec!r}")
    from sera_core.policy.checkpoints import checkpoint_engine, checkpoint_folder, checkpoint_policy
    from sera_core.policy.models import is_adapter, model_folder

    path = model_folder(name)
    checkpoint = checkpoint_folder(path)
    if not (checkpoint / "state.json").is_file():
        checkpoint = None
        if not (path / "config.json").is_file() and not is_adapter(path):
            raise UserInputError(f"{spec}: {path} is neither a Hugging Face model folder (config.json), "
                                 "an adapter folder (adapter_config.json) nor a training checkpoint (state.json)")
    if backend == "hf":
        from sera_core.policy.hf import HFPolicy

        if checkpoint is not None:  # a run's checkpoint
            return PolicyActor(checkpoint_policy(checkpoint), max_batch=max_batch)
        return PolicyActor(HFPolicy(path), max_batch=max_batch)
    from sera_core.policy.vllm_backend import VLLMPolicy

    if checkpoint is None:
        return PolicyActor(VLLMPolicy(path, engine), max_batch=max_batch)
    return PolicyActor(checkpoint_engine(checkpoint, engine), max_batch=max_batch)
