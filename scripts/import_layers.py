"""The layers of ``sera_core`` as its imports draw them (docs/architecture.md, "The layers").

Reads every module's imports of ``sera_core`` (those at the top and the lazy ones inside
functions alike) and prints:

* the **upward imports**: a module importing from a layer below its own in :data:`LAYERS`;
* the **loops**: chains of modules that import each other (strongly connected components of
  the module graph with more than one module).

Both are 0 in the workbook; ``tests/test_import_layers.py`` keeps them there.

    python scripts/import_layers.py            # this checkout
    python scripts/import_layers.py --root DIR # another checkout
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utilities", ("utils", "rubrics", "chat_endpoint")),
    ("benchmarks", ("envs", "judges")),
    ("policies", ("policy",)),
    ("agents", ("agents",)),
    ("rewards", ("rewards",)),
    ("training", ("train",)),
    ("evaluation and report", ("eval", "report")),
    ("front ends", ("cli", "tiny", "course", "__main__")),
)
"""Each layer, top first, and the first name under ``sera_core`` of its modules; a module
may import its own layer and the layers listed before it."""


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``sera_core.X...`` (None: the package itself)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, (_, names) in enumerate(LAYERS):
        if parts[1] in names:
            return i
    raise ValueError(f"{module}: in no layer of LAYERS; add its package there")


def imports(root: Path) -> dict[str, set[tuple[str, int]]]:
    """``{module: {(imported sera_core module, line)}}`` for every module under ``root/sera_core``;
    ``from sera_core.x import y`` counts ``sera_core.x.y`` when that is a module itself."""
    package = root / "sera_core"
    modules = {".".join(("sera_core", *f.relative_to(package).with_suffix("").parts)).removesuffix(".__init__"): f
               for f in sorted(package.rglob("*.py"))}
    out: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sera_core"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out[name].add((sub if sub in modules else node.module, node.lineno))
            elif isinstance(node, ast.Import):
                out[name] |= {(a.name, node.lineno) for a in node.names if a.name.startswith("sera_core")}
    return out


def upward(graph: dict[str, set[tuple[str, int]]]) -> list[str]:
    """``module:line -> imported (layer -> lower layer)`` for every import of a lower layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target, line in sorted(targets):
            mine, theirs = layer_of(module), layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module}:{line} -> {target} ({LAYERS[mine][0]} -> {LAYERS[theirs][0]})")
    return found


def loops(graph: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """The sets of modules that import each other, directly or around a chain (Tarjan's
    strongly connected components of more than one module), each sorted."""
    edges = {m: sorted({t for t, _ in ts if t != m}) for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, []):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="the checkout")
    graph = imports(parser.parse_args().root)
    up, cycles = upward(graph), loops(graph)
    print(f"{len(up)} upward imports", *up, sep="\n  ")
    print(f"{len(cycles)} loops", *(" <-> ".join(c) for c in cycles), sep="\n  ")


if __name__ == "__main__":
    main()
