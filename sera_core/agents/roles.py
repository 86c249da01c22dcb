"""Token roles: which completion tokens are ``launch``, ``execution``, ``rubric`` or ``score``.

The three objectives (SPEC 3) train disjoint masks over the same trajectory record
(:class:`~sera_core.agents.tree.Turn.roles`). Which tokens of an ``act`` turn are
``launch`` is decided on the decoded completion text and mapped back to tokens without
re-tokenising:

1. :func:`launch_spans` finds the character spans of the delegation statement(s), by the
   benchmark's own rule (:meth:`sera_core.envs.registry.Benchmark.launch_spans`);
2. :func:`token_char_spans` finds each token's character span in ``decode(ids)`` by
   decoding prefixes (robust to characters split across byte-level tokens);
3. a token is ``launch`` when its span overlaps a launch span (:func:`overlap_mask`; a
   token with an empty span takes the span of the next token with a non-empty one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sera_core.agents.tree import KINDS, Turn
from sera_core.envs.registry import BENCHMARKS

Decode = Callable[[list[int]], str]
"""``decode(ids) -> text``, e.g. ``tokenizer.decode``; must be deterministic."""


def _common_prefix_len(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    lo, hi = 0, min(len(a), len(b))  # invariant: a[:lo] is a prefix of b
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _char_spans(ids: Sequence[int], decode: Decode) -> tuple[str, list[tuple[int, int]]]:
    ids = list(ids)
    full = decode(ids)
    n = len(ids)
    ends = [0] * (n + 1)
    ends[n] = len(full)
    for k in range(1, n):
        ends[k] = _common_prefix_len(decode(ids[:k]), full)
    for k in range(n - 1, 0, -1):  # monotone: a prefix never reaches past a later prefix
        ends[k] = min(ends[k], ends[k + 1])
    return full, [(ends[k], ends[k + 1]) for k in range(n)]


def token_char_spans(ids: Sequence[int], decode: Decode) -> list[tuple[int, int]]:
    """The character span ``[start, end)`` of each token in ``decode(ids)``.

    Computed from prefixes: token k ends where the longest common prefix of
    ``decode(ids[:k+1])`` and ``decode(ids)`` ends (made monotone by taking the minimum
    over later prefixes). The spans are contiguous and partition the text, so
    ``"".join(text[s:e] for s, e in spans) == decode(ids)``.

    Byte-level tokens that hold only part of a multi-byte character decode, as a
    prefix, to a replacement character that is not in the full text; such a token gets
    an *empty* span and the character is attributed to the token that completes it
    (a token holding the end of one character and the start of the next gets the first
    one; the next one goes to the token that completes it). See :func:`overlap_mask`
    for how empty spans are resolved. Costs one decode per prefix (O(n^2) tokens).
    """
    return _char_spans(ids, decode)[1]


def overlap_mask(token_spans: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """True for each token whose character range overlaps one of ``spans``.

    Rule: a token with an empty range first takes the range of the next token with a
    non-empty range (so every byte of a split character goes with the token that
    completes it); trailing empty tokens (e.g. an end-of-sequence token that decodes
    to nothing) overlap nothing.
    """
    eff = list(token_spans)
    nxt: tuple[int, int] | None = None
    for k in range(len(eff) - 1, -1, -1):
        s, e = eff[k]
        if e > s:
            nxt = (s, e)
        elif nxt is not None:
            eff[k] = nxt
    targets = [(s, e) for s, e in spans if e > s]
    return [e > s and any(s < te and ts < e for ts, te in targets) for s, e in eff]


def launch_spans(text: str, benchmark: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``text`` that write a delegation, sorted and
    disjoint: the rule of the benchmark ``benchmark`` (TextCraft: the smallest statements of the
    first ``<python>`` block that refer to ``launch_subagent``,
    :mod:`sera_core.envs.textcraft.launch`; TextWorld: every complete ``<delegate>`` block)."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark {benchmark!r} is not one of {tuple(BENCHMARKS)}")
    return BENCHMARKS[benchmark].launch_spans(text)


def roles_for(ids: Sequence[int], decode: Decode, text: str | None, benchmark: str, kind: str) -> list[str]:
    """The role of each completion token.

    ``rubric`` and ``score`` turns: every token has that role. ``act`` turns: tokens
    overlapping a :func:`launch_spans` span of the text are ``launch`` (rule of
    :func:`overlap_mask`), the rest ``execution``. ``text`` must be ``decode(ids)``
    (None: decode here); a mismatch is a programming error (``ValueError``).
    """
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {KINDS}")
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark {benchmark!r} is not one of {tuple(BENCHMARKS)}")
    n = len(ids)
    if kind != "act":
        return [kind] * n
    decoded = decode(list(ids))
    if text is None:
        text = decoded
    elif text != decoded:
        raise ValueError("roles_for: text is not decode(ids); pass the decoded completion (or None)")
    spans = launch_spans(text, benchmark)
    if not spans:
        return ["execution"] * n
    _, tok_spans = _char_spans(ids, decode)
    return ["launch" if hit else "execution" for hit in overlap_mask(tok_spans, spans)]


def build_turn(
    kind: str, prompt_ids: Sequence[int], completion_ids: Sequence[int], logprobs: Sequence[float],
    decode: Decode, benchmark: str, observation: str | None = None, meta: dict | None = None,
) -> Turn:
    """A :class:`Turn` with ``text = decode(completion_ids)`` and roles from :func:`roles_for`."""
    text = decode(list(completion_ids))
    roles = roles_for(completion_ids, decode, text, benchmark, kind)
    return Turn(kind, list(prompt_ids), list(completion_ids), list(logprobs), roles, text, observation, dict(meta or {}))
