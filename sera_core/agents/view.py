"""Human-readable views of rollout trees, rubrics and branch groups.

Three plain-text renderers (deterministic, no trailing spaces, safe to diff or log):

* :func:`render_tree` - one header line per agent, drawn as a tree: node id, depth,
  task, steps used, how it ended and, for delegated children, the parent's rubric,
  the child's score (``s=0.83 g=1``, ``s=0 (forced)`` or malformed) and the external
  label; optionally one line per turn (kind, tokens, first line of text and observation).
* :func:`render_rubric` - a rubric's weighted items, success gate and failure
  conditions; given a score, each item's c_j and the arithmetic ``s = g * sum w c``.
* :func:`render_point` - one delegation point (counterfactual branch group,
  ``sera.delegation/1``): the subtask, its rubric, a row per branch (label, score,
  finished, steps, end) and the group's ranking loss.

:class:`TreeBrowser` puts them in a notebook widget (ipywidgets, imported only when a
browser is built): pick a tree and a node, read the node's turns in full, and see the
branch group launched at that node, one column per branch, side by side.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from sera_core.agents.points import Branch, DelegationPoint
from sera_core.agents.tree import Node, Tree, Turn
from sera_core.rubrics import RankingResult

_NBSP = "\u00a0"
"""Indentation in the node list (browsers collapse ordinary spaces in ``<option>``)."""
_PRE = '<pre style="white-space: pre-wrap; margin: 2px 0">{}</pre>'


def _first_line(text: str | None) -> str:
    """The first non-blank line of ``text``, stripped ("" when there is none)."""
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def _cut(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters, ending in "…" when cut."""
    return text if len(text) <= max_chars else text[: max(max_chars - 1, 0)] + "…"


def _verdict(value: bool | float | None, unknown: str = "?") -> str:
    """PASS / FAIL for a label or 0/1 reward, ``unknown`` for None."""
    return unknown if value is None else "PASS" if value else "FAIL"


def _score_text(score: dict | None, error: str | None, max_chars: int = 160) -> str:
    """``s=0.83 g=1``, ``s=0 (forced)``, ``score: malformed (...)`` or ``score: none``."""
    if score is not None:
        return "s=0 (forced)" if score.get("forced") else f"s={score['final_score']:.2f} g={score['gate']}"
    if error is not None:
        return f"score: malformed ({_cut(_first_line(error), max_chars)})"
    return "score: none"


def _rubric_text(rubric: dict | None, error: str | None, max_chars: int = 160) -> str:
    """``rubric: N items``, ``rubric: malformed (...)`` or ``rubric: none``."""
    if rubric is not None:
        return f"rubric: {len(rubric.get('rubric_items', []))} items"
    if error is not None:
        return f"rubric: malformed ({_cut(_first_line(error), max_chars)})"
    return "rubric: none"


def _node_header(node: Node, max_chars: int = 160) -> str:
    """One line: id, depth, task, steps, end and (for children) rubric, score, label."""
    steps = node.result.get("steps")
    if steps is None:
        steps = sum(turn.kind == "act" for turn in node.turns)
    max_steps = node.result.get("max_steps")
    end = node.result.get("end")
    parts = [
        f"{node.node_id} [d{node.depth}] {_cut(_first_line(node.task), max_chars)}",
        f"steps {steps}" + (f"/{max_steps}" if max_steps is not None else ""),
        ("finished" if node.finished else "unfinished") + (f" ({end})" if end else ""),
    ]
    if node.parent_id is not None:
        parts += [_rubric_text(node.rubric, node.rubric_error, max_chars),
                  _score_text(node.score, node.score_error, max_chars), f"label {_verdict(node.label)}"]
    return " | ".join(parts)


def _turn_line(index: int, turn: Turn, max_chars: int) -> str:
    """One line per turn: index, kind, completion tokens, text -> observation (act) or child."""
    line = f"#{index} {turn.kind} {len(turn.completion_ids)} tok"
    if turn.kind != "act":
        return line + (f" (child {turn.meta['child']})" if "child" in turn.meta else "")
    line += f": {_cut(_first_line(turn.text), max_chars)}"
    return line if turn.observation is None else line + f" -> {_cut(_first_line(turn.observation), max_chars)}"


def render_tree(tree: Tree, *, turns: bool = False, max_chars: int = 160) -> str:
    """The tree as text: a summary line, then one header line per node drawn with
    ``├─``/``└─``/``│``; with ``turns=True`` one indented line per turn under each node.
    Texts are cut to ``max_chars`` characters."""
    lines = [
        (f"tree {tree.tree_id} | env {tree.env} | task {tree.task_id} | root {_verdict(tree.root_reward, 'unchecked')}"
         f" | {len(tree.nodes)} nodes | {len(tree.delegation_events())} delegation events"),
    ]

    def visit(node_id: str, lead: str, branch: str, below: str) -> None:
        node = tree.nodes[node_id]
        lines.append(lead + branch + _node_header(node, max_chars))
        body = lead + below
        if turns:
            bar = "│  " if node.children else "   "
            lines.extend(body + bar + _turn_line(i, t, max_chars) for i, t in enumerate(node.turns))
        for k, child in enumerate(node.children):
            last = k == len(node.children) - 1
            visit(child, body, "└─ " if last else "├─ ", "   " if last else "│  ")

    visit(tree.root_id, "", "", "")
    return "\n".join(line.rstrip() for line in lines)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Left-aligned columns (two spaces apart), trailing spaces removed."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [(indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
            for r in [header, *rows]]


def render_rubric(rubric: dict | None, score: dict | None = None) -> str:
    """The rubric's items (name, weight, and c_j when ``score`` is given), success gate,
    failure conditions and scoring procedure; with a score, ``s = g * sum w c = ...``
    with the numbers (a forced zero says so instead)."""
    if rubric is None:
        return "rubric: none"
    items = rubric.get("rubric_items", [])
    scored = score is not None and not score.get("forced")
    c = score.get("item_scores", {}) if scored else {}
    header = ["#", "item", "weight"] + (["score"] if scored else [])
    rows = [[str(i + 1), item["name"], f"{item['weight']:.2f}"]
            + ([f"{c[item['name']]:.2f}" if item["name"] in c else "-"] if scored else [])
            for i, item in enumerate(items)]
    lines = [f"rubric ({len(items)} items)", *_table(header, rows)]
    lines.append(f"gate: {rubric.get('success_gate', '')}")
    lines.append("failure conditions:")
    lines.extend(f"  - {cond}" for cond in rubric.get("failure_conditions", []))
    if rubric.get("scoring_procedure"):
        lines.append(f"procedure: {rubric['scoring_procedure']}")
    if score is not None and score.get("forced"):
        lines.append(f"s = 0 (forced: {score.get('reason', '')})")
    elif score is not None:
        terms = [(item["weight"], c.get(item["name"], 0.0)) for item in items]
        total = score["gate"] * sum(w * v for w, v in terms)
        sums = " + ".join(f"{w:.2f}*{v:.2f}" for w, v in terms)
        line = f"s = g * sum w c = {score['gate']} * ({sums}) = {total:.4f}"
        if abs(total - score["final_score"]) > 1e-9:
            line += f" (recorded {score['final_score']:.4f})"
        if score.get("claimed_score") is not None:
            line += f" (scorer claimed {score['claimed_score']:.2f})"
        lines.append(line)
        if score.get("reason"):
            lines.append(f"reason: {score['reason']}")
    return "\n".join(line.rstrip() for line in lines)


def _branch_score(branch: Branch) -> str:
    """A branch's score cell: ``0.83 g=1``, ``0 (forced)``, ``malformed`` or ``-``."""
    score = branch.score
    if score is not None:
        return "0 (forced)" if score.forced else f"{score.final_score:.2f} g={score.gate}"
    return "malformed" if branch.score_error else "-"


def _ranking_line(ranking: RankingResult | None) -> str:
    """``ranking loss 0.000 over 12 pairs, pairwise accuracy 1.00`` or ``... skipped``."""
    if ranking is None or ranking.skipped or ranking.loss is None:
        return "ranking skipped (homogeneous group)"
    return f"ranking loss {ranking.loss:.3f} over {ranking.pairs} pairs, pairwise accuracy {ranking.accuracy:.2f}"


def render_point(point: DelegationPoint) -> str:
    """A delegation point (branch group) as text: header, subtask, rubric, one row per
    branch (label, score, finished, steps, end) and the ranking line."""
    lines = [
        (f"branch group | tree {point.tree_id} | {point.parent_id} -> {point.child_id}"
         f" | event {point.event_id} | launch step {point.launch_step}"),
        f"subtask: {point.subtask}",
    ]
    if point.rubric is None and point.rubric_error:
        lines.append(f"rubric: malformed ({point.rubric_error})")
    else:
        lines.append(render_rubric(point.rubric))
    rows = [[str(b.branch), _verdict(b.label), _branch_score(b), "yes" if b.finished else "no", str(b.steps), str(b.end)]
            for b in point.branches]
    lines += _table(["branch", "label", "score", "finished", "steps", "end"], rows)
    lines.append(_ranking_line(point.ranking))
    return "\n".join(line.rstrip() for line in lines)


def _branch_html(branch: Branch, max_chars: int = 240) -> str:
    """One branch column: label, score, steps and the branch root's act turns, abbreviated."""
    acts = [t for t in branch.tree.root.turns if t.kind == "act"]
    head = (f"<b>branch {branch.branch}</b><br>label {_verdict(branch.label)}<br>"
            f"score {html.escape(_branch_score(branch))}<br>steps {branch.steps} "
            f"({'finished' if branch.finished else 'unfinished'}, {html.escape(str(branch.end))})")
    body = "".join(_PRE.format(html.escape(f"#{i} " + _cut(t.text.strip(), max_chars))) for i, t in enumerate(acts))
    return head + body


def _static_html(widget: Any) -> str:
    """The HTML that a tree of ipywidgets (``HTML`` leaves in ``VBox``/``HBox`` boxes) shows:
    an ``HBox``'s children side by side, a ``VBox``'s one under another."""
    if hasattr(widget, "children"):
        row = type(widget).__name__ == "HBox"
        style = "display: flex; gap: 4px; overflow: auto" if row else ""
        cell = "flex: 1 1 0%; min-width: 10em; border: 1px solid #ccc; padding: 4px" if row else ""
        return f'<div style="{style}">' + "".join(f'<div style="{cell}">{_static_html(c)}</div>' for c in widget.children) + "</div>"
    return getattr(widget, "value", "")


class TreeBrowser:
    """A notebook browser over trees and their delegation points (ipywidgets).

    A dropdown picks the tree, a list picks the node (indented by depth), a panel shows
    the node in full (header, task, rubric with score, label, result, every turn's text
    and observation), and below it the branch groups whose ``child_id`` is that node:
    the :func:`render_point` summary and one column per branch. ``display(browser)``
    shows :attr:`widget`.
    """

    def __init__(self, trees: Sequence[Tree], points: Sequence[DelegationPoint] = ()) -> None:
        import ipywidgets as w

        if not trees:
            raise ValueError("TreeBrowser needs at least one tree")
        self._w = w
        self.trees = list(trees)
        self._points: dict[tuple[str, str], list[DelegationPoint]] = {}
        for point in points:
            self._points.setdefault((point.tree_id, point.child_id), []).append(point)
        self.tree_dropdown = w.Dropdown(
            options=[(f"{t.tree_id} ({t.env} {t.task_id})", i) for i, t in enumerate(self.trees)],
            value=0, description="tree", layout=w.Layout(width="60%"))
        self.node_select = w.Select(options=[], rows=16, layout=w.Layout(width="32%"))
        self.detail = w.HTML(layout=w.Layout(width="66%"))
        self.branches = w.VBox()
        self._columns: list[Any] = []
        self.widget = w.VBox([self.tree_dropdown, w.HBox([self.node_select, self.detail]),
                              w.HTML("<b>branch groups</b>"), self.branches])
        self.tree = self.trees[0]
        self._switching = False
        self.tree_dropdown.observe(lambda change: self._show_tree(change["new"]), names="value")
        self.node_select.observe(lambda change: self._switching or self._show_node(change["new"]), names="value")
        self._show_tree(0)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The live widgets for a running kernel, and :meth:`snapshot_html` beside them for a
        stored notebook, where no widget runs (GitHub, nbviewer: they would show only
        ``VBox(children=...)``)."""
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/html"] = self.snapshot_html()
        bundle["text/plain"] = f"TreeBrowser: {len(self.trees)} trees, showing {self.tree.tree_id} node {self.node_select.value}"
        return bundle

    def snapshot_html(self) -> str:
        """The browser as it shows now, as static HTML: the tree's nodes (indented by depth,
        the shown one in bold) beside the node panel, then the branch groups at that node."""
        esc = html.escape
        rows = [f"<b>{esc(label)}</b>" if value == self.node_select.value else esc(label)
                for label, value in self.node_select.options]
        nodes = _PRE.format("<br>".join(rows)).replace("white-space: pre-wrap", "white-space: pre")
        return (f"<div><b>tree</b> {esc(self.tree.tree_id)} ({esc(self.tree.env)} {esc(self.tree.task_id)}), "
                f"{len(self.trees)} in this browser<div style=\"display: flex; gap: 1em\">"
                f"<div style=\"flex: 0 0 32%; overflow: auto\">{nodes}</div>"
                f"<div style=\"flex: 1 1 0%\">{self.detail.value}</div></div>"
                f"<b>branch groups</b>{_static_html(self.branches)}</div>")

    def select_tree(self, index: int) -> None:
        """Show ``trees[index]`` (its root node selected)."""
        self.tree_dropdown.value = range(len(self.trees))[index]

    def select_node(self, node_id: str) -> None:
        """Show node ``node_id`` of the current tree."""
        if node_id not in self.tree.nodes:
            raise KeyError(f"tree {self.tree.tree_id} has no node {node_id!r}")
        self.node_select.value = node_id

    def detail_html(self) -> str:
        """The HTML of the node panel, as shown."""
        return self.detail.value

    def branch_columns(self) -> list[Any]:
        """The branch column widgets (``ipywidgets.HTML``) shown for the current node."""
        return list(self._columns)

    def _show_tree(self, index: int) -> None:
        self.tree = self.trees[index]
        options = [(_NBSP * 2 * n.depth + f"{n.node_id}{_NBSP * 2}{_cut(_first_line(n.task), 60)}", n.node_id)
                   for n in self.tree.walk()]
        self._switching = True  # new options may reselect a node of the old tree: render once, below
        try:
            self.node_select.options = options
            self.node_select.value = self.tree.root_id
        finally:
            self._switching = False
        self._show_node(self.tree.root_id)

    def _show_node(self, node_id: str) -> None:
        node = self.tree.nodes[node_id]
        esc = html.escape
        parts = [f"<h4>node {esc(node.node_id)} (depth {node.depth})</h4>", _PRE.format(esc(_node_header(node))),
                 "<b>task</b>", _PRE.format(esc(node.task))]
        if node.parent_id is not None:
            rubric = (f"rubric: malformed ({node.rubric_error})" if node.rubric is None and node.rubric_error
                      else render_rubric(node.rubric, node.score))
            parts += ["<b>rubric</b>", _PRE.format(esc(rubric))]
            if node.score_error:
                parts.append(f"<b>score malformed:</b> {esc(node.score_error)}<br>")
            parts.append(f"<b>label</b> {_verdict(node.label)}<br>")
        if node.result:
            parts.append(f"<b>result</b> {esc(json.dumps(node.result, sort_keys=True))}<br>")
        for i, turn in enumerate(node.turns):
            child = f", child {esc(str(turn.meta['child']))}" if "child" in turn.meta else ""
            parts.append(f"<hr><b>#{i} {turn.kind}</b> ({len(turn.completion_ids)} tokens{child})")
            parts.append(_PRE.format(esc(turn.text)))
            if turn.observation is not None:
                parts += ["<i>observation</i>", _PRE.format(esc(turn.observation))]
        self.detail.value = "".join(parts)
        w = self._w
        groups, self._columns = [], []
        for point in self._points.get((self.tree.tree_id, node_id), []):
            cols = [w.HTML(_branch_html(b), layout=w.Layout(flex="1 1 0%", min_width="10em", padding="4px",
                                                            border="1px solid #ccc"))
                    for b in point.branches]
            self._columns += cols
            groups.append(w.VBox([w.HTML(_PRE.format(esc(render_point(point)))),
                                  w.HBox(cols, layout=w.Layout(overflow="auto"))]))
        self.branches.children = groups or [w.HTML("<i>no branch group launched at this node</i>")]
