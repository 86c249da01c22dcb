"""Chat formatting in token space: first prompts, and the glue between turns.

An agent's context grows turn by turn *without re-tokenising what the policy wrote*:

    context_{t+1} = context_t + completion_ids_t + glue(observation_t)

``glue`` is the tokenizer's chat template around one new user message: the end of the
assistant message (unless the completion already ended with the end-of-turn token),
the user header, the observation, the end of the user message and the assistant
header. It is found once by rendering a conversation with marker strings through the
template (:meth:`ChatFormat.__init__`), so any tokenizer with a chat template works
(the tiny model's ChatML, Qwen3's). Only template text and observations are ever
tokenised; completions keep the exact ids the policy produced.
"""

from __future__ import annotations

from typing import Any

_ASSISTANT = "\u2063ASSISTANT_TEXT\u2063"
_OBSERVATION = "\u2063OBSERVATION_TEXT\u2063"


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` under ``tokenizer``'s chat template, ending with the assistant header."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
        ids = ids["input_ids"]
    return [int(i) for i in ids]


class ChatFormat:
    """Token-level chat formatting for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "u"}, {"role": "assistant", "content": _ASSISTANT},
             {"role": "user", "content": _OBSERVATION}],
            add_generation_prompt=True, tokenize=False,
        )
        glue = rendered[rendered.index(_ASSISTANT) + len(_ASSISTANT):]
        self._before, self._after = glue.split(_OBSERVATION)
        eos = tokenizer.eos_token
        self._eos_text = eos if eos and self._before.startswith(eos) else ""
        self.eos_id = tokenizer.eos_token_id
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        """A fast tokenizer's Rust core: the same ids and text as the Python wrapper, without its overhead."""

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` under the chat template, ending with the assistant header."""
        return chat_ids(self.tokenizer, messages)

    def glue(self, observation: str, completion_ids: list[int]) -> list[int]:
        """The ids that follow ``completion_ids`` in the context: end of turn (unless the
        completion ended with it), the observation as a user message, the assistant header."""
        before = self._before
        if self._eos_text and completion_ids and completion_ids[-1] == self.eos_id:
            before = before[len(self._eos_text):]
        return self.encode(before + observation + self._after)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` (special-token strings in it become their tokens; no BOS added)."""
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept, no clean-up of spaces (lossless)."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
