"""Text helpers shared by prompt builders (:mod:`sera_core.agents.prompts`, the LLM judge)."""

from __future__ import annotations


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters by dropping its middle (the official
    code truncates long context in the middle); ``limit <= 0`` keeps everything."""
    if limit <= 0 or len(text) <= limit:
        return text
    marker = "\n... [{} characters omitted] ...\n"
    keep = max(limit - len(marker.format(len(text))), 0)
    head, tail = keep // 2, keep - keep // 2
    return text[:head] + marker.format(len(text) - keep) + (text[len(text) - tail:] if tail else "")
