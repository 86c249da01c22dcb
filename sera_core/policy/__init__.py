"""Policies: given token-id prompts, return new token ids, their logprobs and the text.

Backends: ``hf`` (transformers, CPU or GPU; :mod:`sera_core.policy.hf`) and ``vllm``
(GPU, weights pushed from the trainer; :mod:`sera_core.policy.vllm_backend`, imported
lazily, ``[gpu]`` extra). :mod:`sera_core.policy.base` holds the shared interface.
"""
