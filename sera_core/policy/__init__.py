"""Policies: given token-id prompts, return new token ids, their logprobs and the text.

Backends: ``vllm`` (one engine per process, its CPU build on CPUs and its GPU build on GPUs,
continuous batching, weights pushed from the trainer through
:mod:`sera_core.policy.vllm_worker`; :mod:`sera_core.policy.vllm_backend`, imported lazily),
``hf`` (transformers, CPU or GPU: the reference for parity and the trainer's own model;
:mod:`sera_core.policy.hf`) and ``expert`` (the environments' solvers playing every role;
:mod:`sera_core.policy.expert`). :mod:`sera_core.policy.base` holds the shared
interface, :mod:`sera_core.policy.chat` the token-level chat formatting, and
:mod:`sera_core.policy.tiny` the locally built tiny models and tokenizers.
"""
