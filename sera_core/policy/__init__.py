"""Policies: given token-id prompts, return new token ids, their logprobs and the text.

Backends: ``hf`` (transformers, CPU or GPU; :mod:`sera_core.policy.hf`), ``vllm`` (GPU,
weights pushed from the trainer; :mod:`sera_core.policy.vllm_backend`, imported lazily,
``[gpu]`` extra) and ``expert`` (the environments' solvers playing every role;
:mod:`sera_core.policy.expert`). :mod:`sera_core.policy.base` holds the shared
interface, :mod:`sera_core.policy.chat` the token-level chat formatting, and
:mod:`sera_core.policy.tiny` the locally built tiny models and tokenizers.
"""
