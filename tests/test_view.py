"""Text views of trees, rubrics and branch groups, and the notebook TreeBrowser."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict

import pytest

from sera_core.agents.points import DelegationPoint
from sera_core.agents.tree import Tree, Turn
from sera_core.agents.view import TreeBrowser, render_point, render_rubric, render_tree
from sera_core.rubrics import GLOBAL_RUBRIC, forced_zero, parse_score, ranking_loss

RUBRIC = GLOBAL_RUBRIC.to_json()
ITEM_SCORES = {"goal achieved": 1.0, "correct details": 0.5, "no damage": 1.0, "clear report": 0.0}


def _act(text: str, obs: str | None = "ok", n: int = 3) -> Turn:
    return Turn("act", [1, 2, 3], list(range(10, 10 + n)), [-0.25] * n, ["execution"] * n, text, obs)


def _call(kind: str, child: str, n: int = 2) -> Turn:
    return Turn(kind, [4], list(range(20, 20 + n)), [-0.5] * n, [kind] * n, f"{{\"{kind}\": 1}}", None, {"child": child})


def _score(items: dict[str, float] = ITEM_SCORES, success: bool = True) -> dict:
    text = json.dumps({"success": success, "criterion_scores": [{"name": k, "score": v} for k, v in items.items()],
                       "final_score": 0.9, "reason": "mostly done"})
    parsed = parse_score(text, GLOBAL_RUBRIC)
    assert parsed.ok, parsed.error
    return asdict(parsed.value)


def _tree(tree_id: str = "t1") -> Tree:
    """Root 0 launches 0.1 (scored, PASS) at turn 0 and 0.2 (forced zero, FAIL) at turn 2;
    0.1 launches 0.1.1 (malformed rubric and score, no label)."""
    tree = Tree.new(tree_id, "textcraft", "tc-17", "Craft 1 wooden pickaxe\nsecond line is hidden")
    tree.root_reward = 1
    root = tree.root
    root.turns.append(_act("<python>\nr = await launch_subagent({'stick': 2})\n</python>", "sticks: 2"))
    a = tree.add_child("0", "Craft 2 sticks", 0)
    root.turns += [_call("rubric", "0.1", 5), _act("<python>\nlaunch_subagent({'plank': 3})\n</python>", None)]
    b = tree.add_child("0", "Make <b>bread</b> & jam", 2)
    root.turns += [_call("score", "0.1"), _call("rubric", "0.2")]
    root.finished, root.result = True, {"steps": 3, "max_steps": 20, "end": "finish"}
    a.rubric, a.score, a.label, a.finished = RUBRIC, _score(), True, True
    a.result = {"steps": 2, "max_steps": 10, "end": "finish", "finish_message": "done"}
    a.turns.append(_act("\n  <thought>need planks</thought>\n<python>craft()</python>", "Crafted 4 planks"))
    c = tree.add_child("0.1", "Get planks", 0)
    a.turns.append(_act("finish('done')", "Finished."))
    c.rubric_error, c.score_error = "no JSON object found", "`success` must be true or false"
    c.turns.append(_act("look", "You see a tree."))
    b.rubric, b.score, b.label = RUBRIC, asdict(forced_zero()), False
    b.result = {"steps": 10, "max_steps": 10, "end": "steps"}
    b.turns += [_act("<python>get_info(['bread'])</python>", "<recipe> bread </recipe>") for _ in range(2)]
    tree.validate()
    return tree


def _point(tree: Tree, child_id: str, labels: list[bool | None]) -> DelegationPoint:
    branches, scores = [], []
    for k, label in enumerate(labels):
        sub = Tree.new(f"{tree.tree_id}/b{k}", tree.env, tree.task_id, "Craft 2 sticks")
        sub.root.turns += [_act(f"branch {k} step {j} <tag>", "obs") for j in range(k % 3 + 1)]
        score = _score() if label else asdict(forced_zero()) if label is False else None
        branches.append({"branch": k, "tree": sub.to_json(), "finished": bool(label), "steps": k % 3 + 1,
                         "end": "finish" if label else "steps", "state_after": {}, "label": label, "label_reason": "",
                         "score": score, "score_error": None if score else "no JSON object found", "score_turn": None})
        scores.append(None if score is None else score["final_score"])
    rank = ranking_loss(scores, labels)
    return DelegationPoint.from_json({"format": "sera.delegation/1", "tree_id": tree.tree_id, "env": tree.env, "task_id": tree.task_id,
            "parent_id": tree.nodes[child_id].parent_id, "child_id": child_id, "event_id": tree.nodes[child_id].event_id,
            "launch_step": tree.nodes[child_id].launch_step, "parent_prefix": {"prompt_ids": [], "completion_ids": [], "text": ""},
            "subtask": tree.nodes[child_id].task, "rubric": RUBRIC, "rubric_error": None, "rubric_turn": 1,
            "state_before": {}, "branches": branches, "labels": labels, "scores": scores,
            "ranking": {"loss": rank.loss, "pairs": rank.pairs, "accuracy": rank.accuracy, "skipped": rank.skipped,
                        "reward": rank.reward}})


# ---------------------------------------------------------------------------------
# render_tree
# ---------------------------------------------------------------------------------
def test_render_tree_lines_and_annotations():
    tree = _tree()
    out = render_tree(tree)
    lines = out.splitlines()
    assert lines[0] == "tree t1 | env textcraft | task tc-17 | root PASS | 4 nodes | 3 delegation events"
    assert len(lines) == 1 + len(tree.nodes)
    assert lines[1].startswith("0 [d0] Craft 1 wooden pickaxe | steps 3/20 | finished (finish)")
    assert "second line" not in out and "rubric" not in lines[1]
    assert lines[2] == ("├─ 0.1 [d1] Craft 2 sticks | steps 2/10 | finished (finish) | rubric: 4 items"
                        " | s=0.70 g=1 | label PASS")
    assert lines[3] == ("│  └─ 0.1.1 [d2] Get planks | steps 1 | unfinished | rubric: malformed (no JSON object found)"
                        " | score: malformed (`success` must be true or false) | label ?")
    assert lines[4].startswith("└─ 0.2 [d1] Make <b>bread</b> & jam | steps 10/10 | unfinished (steps)")
    assert lines[4].endswith("| s=0 (forced) | label FAIL")


def test_render_tree_turns_cut_and_deterministic():
    tree = _tree()
    out = render_tree(tree, turns=True, max_chars=20)
    assert out == render_tree(tree, turns=True, max_chars=20)
    assert all(line == line.rstrip() for line in out.splitlines())
    turn_lines = [line for line in out.splitlines() if re.search(r"#\d+ (act|rubric|score) ", line)]
    assert len(turn_lines) == sum(len(n.turns) for n in tree.nodes.values())
    lines = out.splitlines()
    assert lines[2:7] == ["│  #0 act 3 tok: <python> -> sticks: 2",  # the root's turns, its children below
                          "│  #1 rubric 5 tok (child 0.1)",
                          "│  #2 act 3 tok: <python>",  # no observation
                          "│  #3 score 2 tok (child 0.1)",
                          "│  #4 rubric 2 tok (child 0.2)"]
    assert lines[7].startswith("├─ 0.1 [d1] Craft 2 sticks |")
    assert lines[8] == "│  │  #0 act 3 tok: <thought>need plank… -> Crafted 4 planks"  # first non-blank line, cut
    assert lines[-1] == "      #1 act 3 tok: <python>get_info(['… -> <recipe> bread </re…"  # last child: no bar
    assert lines[1].startswith("0 [d0] Craft 1 wooden pick… |") and "0.2 [d1] Make <b>bread</b> &… |" in out
    assert "score: malformed (`success` must be t…)" in out  # errors are cut too


def test_render_tree_unchecked_root_without_children():
    tree = Tree.new("solo", "textworld", "tw-3", "Cook the meal")
    tree.root.turns += [_act("<action>look</action>", "kitchen"), _act("<action>eat meal</action>", "won")]
    lines = render_tree(tree, turns=True).splitlines()
    assert lines == ["tree solo | env textworld | task tw-3 | root unchecked | 1 nodes | 0 delegation events",
                     "0 [d0] Cook the meal | steps 2 | unfinished",
                     "   #0 act 3 tok: <action>look</action> -> kitchen",
                     "   #1 act 3 tok: <action>eat meal</action> -> won"]


# ---------------------------------------------------------------------------------
# render_rubric / render_point
# ---------------------------------------------------------------------------------
def test_render_rubric_table_and_arithmetic():
    score = _score()
    out = render_rubric(RUBRIC, score)
    for item in RUBRIC["rubric_items"]:
        row = next(line for line in out.splitlines() if f" {item['name']} " in line)
        assert row.split()[-2:] == [f"{item['weight']:.2f}", f"{ITEM_SCORES[item['name']]:.2f}"]
    assert f"gate: {RUBRIC['success_gate']}" in out
    assert all(f"  - {cond}" in out for cond in RUBRIC["failure_conditions"])
    line = next(line for line in out.splitlines() if line.startswith("s = g * sum w c"))
    m = re.fullmatch(r"s = g \* sum w c = (\d) \* \((.*)\) = ([\d.]+) \(scorer claimed 0\.90\)", line)
    assert m, line
    terms = [tuple(map(float, t.split("*"))) for t in m.group(2).split(" + ")]
    assert int(m.group(1)) * sum(w * c for w, c in terms) == pytest.approx(float(m.group(3)), abs=1e-4)
    assert float(m.group(3)) == pytest.approx(score["final_score"], abs=1e-4) == pytest.approx(0.70)
    assert "recorded" not in line  # computed and stored scores agree


def test_render_rubric_gate_zero_forced_and_none():
    failed = render_rubric(RUBRIC, _score(success=False))
    assert re.search(r"^s = g \* sum w c = 0 \* \(.*\) = 0\.0000", failed, re.MULTILINE)
    forced = render_rubric(RUBRIC, asdict(forced_zero()))
    assert "s = 0 (forced: the child did not finish)" in forced and "score" not in forced.splitlines()[1]
    plain = render_rubric(RUBRIC)
    assert plain.splitlines()[1].split() == ["#", "item", "weight"] and "s = " not in plain
    assert render_rubric(None) == "rubric: none"
    tampered = dict(_score(), final_score=0.5)
    assert "(recorded 0.5000)" in render_rubric(RUBRIC, tampered)


def test_render_point_eight_branches():
    tree = _tree()
    labels = [True, False, True, False, None, True, False, True]
    point = _point(tree, "0.1", labels)
    out = render_point(point)
    lines = out.splitlines()
    assert lines[0].startswith("branch group | tree t1 | 0 -> 0.1 | event 0@0 | launch step 0")
    assert "subtask: Craft 2 sticks" in out and "rubric (4 items)" in out
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["branch", "label"])
    rows = [line.split() for line in lines[header + 1: header + 9]]
    assert [r[0] for r in rows] == [str(k) for k in range(8)]
    assert [r[1] for r in rows] == ["PASS", "FAIL", "PASS", "FAIL", "?", "PASS", "FAIL", "PASS"]
    assert rows[0][2:] == ["0.70", "g=1", "yes", "1", "finish"]
    assert rows[1][2:] == ["0", "(forced)", "no", "2", "steps"]
    assert rows[4][2:] == ["malformed", "no", "2", "steps"]
    assert lines[-1] == "ranking loss 0.000 over 12 pairs, pairwise accuracy 1.00"
    assert all(line == line.rstrip() for line in lines)


def test_a_delegation_point_round_trips_through_its_json_line():
    point = _point(_tree(), "0.1", [True, False, True, False, None, True, False, True])
    line = json.dumps(point.to_json())
    again = DelegationPoint.from_json(json.loads(line))
    assert again == point and json.dumps(again.to_json()) == line
    assert [None if s is None else round(s, 6) for s in point.scores] == [0.7, 0.0, 0.7, 0.0, None, 0.7, 0.0, 0.7]
    assert point.labels[4] is None
    assert point.ranking.accuracy == 1.0 and point.branches[0].score.gate == 1
    with pytest.raises(ValueError, match="sera.delegation/1"):
        DelegationPoint.from_json({**point.to_json(), "format": "sera.tree/1"})


def test_render_point_skipped_and_malformed_rubric():
    point = _point(_tree(), "0.2", [False] * 8)
    point.rubric, point.rubric_error = None, "`rubric_items` must be a list"
    out = render_point(point)
    assert out.splitlines()[-1] == "ranking skipped (homogeneous group)"
    assert "rubric: malformed (`rubric_items` must be a list)" in out
    assert sum(" FAIL " in line for line in out.splitlines()) == 8


# ---------------------------------------------------------------------------------
# TreeBrowser
# ---------------------------------------------------------------------------------
needs_widgets = pytest.mark.skipif(importlib.util.find_spec("ipywidgets") is None, reason="ipywidgets is not installed")


@needs_widgets
def test_browser_nodes_detail_and_escaping():
    tree = _tree()
    browser = TreeBrowser([tree])
    labels = [label for label, _ in browser.node_select.options]
    assert [v for _, v in browser.node_select.options] == ["0", "0.1", "0.1.1", "0.2"]
    assert labels[2].startswith("\u00a0" * 4 + "0.1.1") and labels[0].startswith("0\u00a0\u00a0Craft 1 wooden")
    html_root = browser.detail_html()
    assert "node 0 (depth 0)" in html_root and "launch_subagent" in html_root and "<b>rubric</b>" not in html_root
    browser.select_node("0.2")
    assert browser.node_select.value == "0.2"
    html = browser.detail_html()
    assert "Make &lt;b&gt;bread&lt;/b&gt; &amp; jam" in html and "<b>bread</b>" not in html
    assert "&lt;recipe&gt; bread &lt;/recipe&gt;" in html and "s = 0 (forced" in html and "label</b> FAIL" in html
    browser.select_node("0.1")
    html = browser.detail_html()
    assert "s = g * sum w c = 1 * (" in html and "label</b> PASS" in html and "Crafted 4 planks" in html
    browser.node_select.value = "0.1.1"  # the widget's own selection updates the panel too
    assert "rubric: malformed (no JSON object found)" in browser.detail_html()
    with pytest.raises(KeyError):
        browser.select_node("0.9")


@needs_widgets
def test_browser_branch_columns_only_where_a_point_is():
    tree, other = _tree("t1"), _tree("t2")
    point = _point(tree, "0.1", [True, False, True, False, None, True, False, True])
    browser = TreeBrowser([tree, other], [point])
    assert browser.branch_columns() == []  # root: no group launched there
    browser.select_node("0.1")
    cols = browser.branch_columns()
    assert len(cols) == 8
    assert "branch 0" in cols[0].value and "label PASS" in cols[0].value and "score 0.70 g=1" in cols[0].value
    assert "label ?" in cols[4].value and "score malformed" in cols[4].value
    assert cols[2].value.count("#") == 3 and "branch 2 step 2 &lt;tag&gt;" in cols[2].value
    assert "ranking loss 0.000 over 12 pairs" in browser.branches.children[0].children[0].value
    browser.select_node("0.2")
    assert browser.branch_columns() == []
    browser.select_tree(1)  # same node id in another tree: the point belongs to t1 only
    assert browser.tree is other and browser.node_select.value == "0"
    browser.select_node("0.1")
    assert browser.branch_columns() == [] and "Craft 2 sticks" in browser.detail_html()
    browser.select_tree(0)
    browser.select_node("0.1")
    assert len(browser.branch_columns()) == 8


@needs_widgets
def test_browser_select_tree_and_display():
    first, second = _tree("t1"), Tree.new("t2", "textworld", "tw-9", "Cook <dinner>")
    browser = TreeBrowser([first, second])
    browser.select_node("0.2")
    browser.select_tree(-1)
    assert browser.tree_dropdown.value == 1 and browser.tree is second
    assert [v for _, v in browser.node_select.options] == ["0"]
    assert "Cook &lt;dinner&gt;" in browser.detail_html() and "bread" not in browser.detail_html()
    browser.tree_dropdown.value = 0  # the dropdown itself switches trees as well
    assert browser.tree is first and "wooden pickaxe" in browser.detail_html()
    with pytest.raises(IndexError):
        browser.select_tree(2)
    bundle = browser._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == browser.widget.model_id
    with pytest.raises(ValueError):
        TreeBrowser([])


@needs_widgets
def test_a_stored_notebook_shows_the_browser_as_html_not_a_widget_repr():
    """Where no widget runs (a notebook on GitHub), the bundle's HTML shows what the browser
    shows: the node list with the shown node in bold, the node panel, the branch columns side
    by side; the plain text names the browser instead of ``VBox(children=...)``."""
    tree = _tree("t1")
    point = _point(tree, "0.1", [True, False, True, False, None, True, False, True])
    browser = TreeBrowser([tree], [point])
    browser.select_node("0.1")
    bundle = browser._repr_mimebundle_()
    html = bundle["text/html"]
    assert bundle["text/plain"] == "TreeBrowser: 1 trees, showing t1 node 0.1" and "VBox" not in html
    assert browser.detail_html() in html and "<b>\u00a0\u00a00.1" in html
    assert html.count("flex: 1 1 0%; min-width: 10em") == 8 and all(c.value in html for c in browser.branch_columns())
    assert "ranking loss 0.000 over 12 pairs" in html
