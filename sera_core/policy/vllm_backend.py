"""The ``vllm`` policy backend (GPU): the same interface over vLLM, imported lazily.

Install with the ``[gpu]`` extra; nothing on the CPU path imports vLLM. Prompts go in
as token ids (``TokensPrompt``), so the runtime's token bookkeeping is exact;
``logprobs=0`` asks vLLM for the sampled token's log-probability (vLLM's default
``raw_logprobs`` mode: the unmodified model distribution, as in
:mod:`sera_core.policy.base`); ``include_stop_str_in_output=True`` keeps the tokens
that complete a stop string, as the ``hf`` backend does. ``stop_json`` has no vLLM
counterpart: the completion is generated to its own end and then cut after the token that
closes its first JSON object (:func:`~sera_core.policy.base.json_stop_length`), so both
backends return the same tokens (vLLM spends the GPU time of the rest).

:meth:`VLLMPolicy.load_weights` pushes a trainer's state dict into the running engine
in place (after every optimizer update), through ``LLM.apply_model`` and the model's
own ``load_weights``. Exercised by ``scripts/gpu_check.py`` (``make gpu-check``) on a GPU machine;
not yet run (no GPU was lent to the session that wrote it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sera_core.policy.base import Generation, SamplingParams, json_stop_length, per_prompt
from sera_core.policy.chat import chat_ids


class VLLMPolicy:
    """A local checkpoint served by an in-process vLLM engine."""

    def __init__(self, path: str | os.PathLike, **engine_kwargs):
        try:
            from vllm import LLM
        except ImportError as exc:  # pragma: no cover - only on machines without the [gpu] extra
            raise ImportError("the vllm backend needs the [gpu] extra: pip install -e '.[gpu]'") from exc
        engine_kwargs.setdefault("enable_prefix_caching", True)
        self.llm = LLM(model=str(path), tokenizer=str(path), **engine_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return chat_ids(self.tokenizer, messages)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Generation]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        ps = per_prompt(params, len(prompts))
        vparams = [
            VSamplingParams(temperature=p.temperature, top_p=p.top_p, max_tokens=p.max_new_tokens, stop=list(p.stop),
                            seed=p.seed, logprobs=0, include_stop_str_in_output=True, skip_special_tokens=False)
            for p in ps
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], vparams, use_tqdm=False)
        result = []
        for out, p in zip(outputs, ps, strict=True):
            o = out.outputs[0]
            ids = list(o.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(o.logprobs, ids, strict=True)]
            stop = o.stop_reason if isinstance(o.stop_reason, str) else None
            reason = "stop" if stop is not None else ("length" if o.finish_reason == "length" else "eos")
            if p.stop_json and (cut := json_stop_length(ids, self.decode)) is not None:
                ids, logprobs, reason, stop = ids[:cut], logprobs[:cut], "json", None  # where the hf backend stops
            result.append(Generation(ids, logprobs, self.decode(ids), reason, stop))
        return result

    def load_weights(self, state_dict: Mapping[str, "object"]) -> None:
        """Replace the engine's weights in place with a trainer's (HF-named) state dict."""
        weights = [(name, tensor) for name, tensor in state_dict.items()]
        self.llm.apply_model(lambda model: model.load_weights(weights))
        self.llm.reset_prefix_cache()
