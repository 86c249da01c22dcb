"""Which characters of a TextCraft reply write a delegation (the ``launch`` tokens, SPEC 3).

Only the first ``<python>`` block counts (it is the one executed, :func:`~sera_core.envs.textcraft.env.extract_code`'s
rule; the closing tag may be missing). Its code is parsed with ``ast``; every reference
to ``launch_subagent`` (a call, or the function passed along, as in
``map(launch_subagent, ...)``) marks the source of the *smallest statement* containing
it: ``r = await launch_subagent(...)`` inside a ``for`` body marks that line, not the
loop; ``await asyncio.gather(launch_subagent(a), launch_subagent(b))`` over several lines
is one span. A reference in a compound statement's header (``for r in await gather(...):``)
marks only the header, up to the end of that header part. Names in comments or strings
do not count. When the code does not parse, every line containing ``launch_subagent(``
counts, from its first non-blank character to its end.

:func:`sera_core.agents.roles.roles_for` maps these character spans to tokens.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from sera_core.envs.textcraft.env import PYTHON_BLOCK

_NEWLINE = re.compile(r"\r\n|\r|\n")
_LAUNCH_CALL = re.compile(r"launch_subagent\s*\(")
LAUNCH_NAME = "launch_subagent"
"""The TextCraft tool whose statements are ``launch`` tokens."""


def _refers_to_launch(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == LAUNCH_NAME) or (
        isinstance(node, ast.Attribute) and node.attr == LAUNCH_NAME
    )


def _launch_statement_nodes(tree: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    """``(statement, header)`` per reference to ``launch_subagent``: the smallest
    enclosing statement, and for a reference in a compound statement's header (``for``
    iterable, ``if``/``while`` test, ``with`` item, ...) the outermost positioned node
    of that header part (None for a simple statement)."""
    found: list[tuple[ast.AST, ast.AST | None]] = []

    def visit(node: ast.AST, stmt: ast.AST | None, header: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                visit(child, child, None)
                continue
            child_header = header
            if stmt is not None and node is stmt and hasattr(child, "end_col_offset"):
                child_header = child  # a positioned direct part of the statement
            elif stmt is not None and header is None and hasattr(child, "end_col_offset"):
                child_header = child  # first positioned node below an unpositioned part (withitem)
            if _refers_to_launch(child) and stmt is not None:
                found.append((stmt, child_header))
            visit(child, stmt, child_header)

    visit(tree, None, None)
    return found


def launch_spans(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of ``text`` that write a delegation (module docstring), sorted, disjoint."""
    match = PYTHON_BLOCK.search(text)
    if not match:
        return []
    code, base = match.group(1), match.start(1)
    line_starts = [0] + [m.end() for m in _NEWLINE.finditer(code)]
    line_ends = [m.start() for m in _NEWLINE.finditer(code)] + [len(code)]

    def offset(lineno: int, col_bytes: int) -> int:
        start = line_starts[lineno - 1]
        line = code[start:line_ends[lineno - 1]]
        return base + start + len(line.encode("utf-8")[:col_bytes].decode("utf-8", errors="ignore"))

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        spans = []
        for start, end in zip(line_starts, line_ends, strict=True):
            line = code[start:end]
            if _LAUNCH_CALL.search(line):
                lead = len(line) - len(line.lstrip())
                spans.append((base + start + lead, base + end))
        return spans
    spans = []
    for stmt, header in _launch_statement_nodes(tree):
        s = offset(stmt.lineno, stmt.col_offset)  # type: ignore[attr-defined]
        if header is None or not isinstance(stmt, _COMPOUND):
            e = offset(stmt.end_lineno, stmt.end_col_offset)  # type: ignore[attr-defined]
        else:
            s = min(s, offset(header.lineno, header.col_offset))  # type: ignore[attr-defined]
            e = offset(header.end_lineno, header.end_col_offset)  # type: ignore[attr-defined]
        spans.append((s, e))
    return _merge(spans)


_COMPOUND = (
    ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
    ast.AsyncFunctionDef, ast.ClassDef, ast.Match,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
"""Statements with a body: a launch in their header marks only the header."""


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out
