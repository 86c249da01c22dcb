"""The rollout record: token spans and roles, masks, structure, validation, JSONL."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from sera_core.agents.roles import build_turn, launch_spans, overlap_mask, roles_for, token_char_spans
from sera_core.agents.tree import ROLES, Tree, Turn, dumps_tree, read_trees, write_trees

tokenizers = pytest.importorskip("tokenizers")

ITEMS = ["a1_i5", "b2_i3", "oak_plank", "stick", "iron_ingot", "c3_i9"]
CONTEXTS = ["", "use the planks first", "café – naïve ✓", "日本語のメモ", "be quick 🙂", "ß and ø"]
DISHES = ["dish_1", "dish_2", "dish_3"]
ACTIONS = ["take red apple", "go to kitchen", "slice carrot", "cook potato in oven", "prepare dish_1",
           "eat dish_2", "open door", "read cookbook", "inventory"]


def _tc_reply(rng: random.Random) -> str:
    item, n, ctx = rng.choice(ITEMS), rng.randint(1, 4), rng.choice(CONTEXTS)
    item2 = rng.choice(ITEMS)
    thought = f"<thought>I need {n}x {item}; {rng.choice(CONTEXTS) or 'plan'}.</thought>"
    bodies = [
        "inv = view_inventory()\nprint(inv)",
        f"info = get_info([\"{item}\"])\nprint(info[0][\"recipes\"])",
        f"print(craft({{\"{item2}\": 2}}, (\"{item}\", {n})))",
        f"r = await launch_subagent({{\"{item}\": {n}}}, context=\"{ctx}\")\nprint(r)",
        (f"res = await asyncio.gather(\n    launch_subagent({{\"{item}\": {n}}}),\n"
         f"    launch_subagent({{\"{item2}\": 1}}, context=\"{ctx}\"),\n)\nprint(res)"),
        (f"for t in [\"{item}\", \"{item2}\"]:\n    print(get_info([t]))\n"
         f"    r = await launch_subagent({{t: 1}})\n    print(r)\nfinish(\"done\")"),
        f"# maybe launch_subagent later\nnote = \"launch_subagent is {ctx}\"\nprint(note)",
        f"r = await launch_subagent({{\"{item}\": {n}}}\nprint(r  # broken",
        f"finish(\"crafted {n}x {item} {ctx}\")",
    ]
    return f"{thought}\n<python>\n{rng.choice(bodies)}\n</python>"


def _tw_reply(rng: random.Random) -> str:
    dish, ctx = rng.choice(DISHES), rng.choice(CONTEXTS)
    goals = [{"goal": f"prepare and eat {d}", "max_steps": rng.randint(5, 20)} for d in rng.sample(DISHES, 2)]
    blocks = [
        f"<action>{rng.choice(ACTIONS)}</action>",
        f"<delegate>{json.dumps({'goal': f'prepare and eat {dish} {ctx}'}, ensure_ascii=False)}</delegate>",
        f"<delegate>{json.dumps({'delegations': goals})}</delegate>",
        f"<finish>all dishes eaten {ctx}</finish>",
    ]
    return f"I am in the kitchen; {ctx or 'next step'}.\n{rng.choice(blocks)}"


def _rubric_text(rng: random.Random) -> str:
    items = [{"name": f"c{i}", "weight": rng.randint(1, 3), "description": f"crafted {rng.choice(ITEMS)}",
              "score_0": "nothing", "score_full": "all ✓"} for i in range(4)]
    return json.dumps({"rubric_items": items, "success_gate": "targets present",
                       "failure_conditions": ["gave up"], "scoring_procedure": "weighted"}, ensure_ascii=False)


def _score_text(rng: random.Random) -> str:
    scores = [{"name": f"c{i}", "score": rng.choice([0.0, 0.5, 1.0]), "reason": "ok"} for i in range(4)]
    return json.dumps({"success": rng.random() < 0.5, "criterion_scores": scores, "final_score": 0.5,
                       "reason": "naïve check"}, ensure_ascii=False)


def _corpus() -> list[str]:
    rng = random.Random(1234)
    lines = []
    for _ in range(120):
        lines += [_tc_reply(rng), _tw_reply(rng), _rubric_text(rng), _score_text(rng)]
    lines += ["café – naïve ✓ déjà vu", "Craft the following items: 3x a1_i5", "asyncio.gather(launch_subagent(x))"]
    return lines


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer


def _encode(tok, text: str) -> list[int]:
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text  # byte-level BPE round-trips exactly
    return ids


def _runs(mask: list[bool]) -> list[tuple[int, int]]:
    """Maximal runs [i, j) of True."""
    out, start = [], None
    for k, m in enumerate([*mask, False]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            out.append((start, k))
            start = None
    return out


def _random_tree(tok, seed: int) -> Tree:
    rng = random.Random(seed)
    env = rng.choice(["textcraft", "textworld"])
    reply = _tc_reply if env == "textcraft" else _tw_reply
    decode = tok.decode
    tree = Tree.new(f"tree{seed}", env, f"{env}.train.{seed}", "Craft the following items: 3x a1_i5", seed=seed)
    max_depth = rng.randint(0, 3)

    def turn(kind: str, text: str, prompt: str) -> Turn:
        ids = _encode(tok, text)
        logprobs = [-rng.expovariate(2.0) for _ in ids]
        return build_turn(kind, _encode(tok, prompt), ids, logprobs, decode, env,
                          observation="ok ✓" if kind == "act" else None, meta={"prompt": prompt})

    frontier = [tree.root_id]
    while frontier:
        node = tree.nodes[frontier.pop(0)]
        for _ in range(rng.randint(1, 4)):
            node.turns.append(turn("act", reply(rng), f"Task: {node.task}\nStep {len(node.turns)}"))
            if node.depth < max_depth and rng.random() < 0.5:
                step = len(node.turns) - 1
                for _ in range(rng.randint(1, 2)):
                    child = tree.add_child(node.node_id, f"Craft the following items: 1x {rng.choice(ITEMS)}", step)
                    node.turns.append(turn("rubric", _rubric_text(rng), f"Write a rubric for {child.task}"))
                    child.rubric = json.loads(node.turns[-1].text)
                    frontier.append(child.node_id)
        node.finished = rng.random() < 0.7
        node.result = {"message": "done", "verdict": {"passed": node.finished}}
        node.label = rng.choice([True, False, None])
        if node.parent_id is not None:
            parent = tree.nodes[node.parent_id]
            parent.turns.append(turn("score", _score_text(rng), f"Score {node.node_id}"))
            node.score = {"g": 1, "item_scores": {"c0": 0.5}, "final_score": rng.random() / 3, "forced": False}
    tree.root_reward = float(rng.random() < 0.5)
    return tree


SEEDS = list(range(16))


@pytest.fixture(scope="module")
def trees(tok):
    return [_random_tree(tok, s) for s in SEEDS]


def test_random_trees_have_depth_and_launches(trees):
    # the generator exercises what the other tests rely on
    assert max(max(n.depth for n in t.nodes.values()) for t in trees) >= 2
    assert sum(t.token_count("launch") for t in trees) > 0
    assert {t.env for t in trees} == {"textcraft", "textworld"}


def test_token_char_spans_partition_the_decoded_text(tok, trees):
    empty = 0
    for tree in trees:
        for node in tree.walk():
            for turn in node.turns:
                spans = token_char_spans(turn.completion_ids, tok.decode)
                assert len(spans) == len(turn.completion_ids)
                assert "".join(turn.text[s:e] for s, e in spans) == turn.text
                assert all(s <= e for s, e in spans) and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
                empty += sum(1 for s, e in spans if s == e)
    assert empty > 0  # multi-byte characters split across byte-level tokens were exercised


def test_ids_decode_to_recorded_texts(tok, trees):
    for tree in trees:
        for node in tree.walk():
            for turn in node.turns:
                assert tok.decode(turn.prompt_ids) == turn.meta["prompt"]
                assert tok.decode(turn.completion_ids) == turn.text
                assert tok.decode(turn.prompt_ids + turn.completion_ids) == turn.meta["prompt"] + turn.text


def test_masks_partition_completion_tokens(trees):
    for tree in trees:
        per_turn = {}
        for role in ROLES:
            for node_id, i, mask in tree.masks(role):
                turn = tree.nodes[node_id].turns[i]
                assert len(mask) == len(turn.completion_ids) and any(mask)
                assert [r == role for r in turn.roles] == mask
                per_turn.setdefault((node_id, i), []).append(mask)
        for node in tree.nodes.values():
            for i, turn in enumerate(node.turns):
                masks = per_turn.get((node.node_id, i), [])
                cover = [sum(col) for col in zip(*masks, strict=True)] if masks else []
                assert cover == [1] * len(turn.completion_ids)  # disjoint and complete
        assert sum(tree.token_count(r) for r in ROLES) == tree.token_count()
        assert sum(tree.token_count(None, d) for d in range(4)) == tree.token_count()


def test_role_tokens_decode_to_their_statements(tok, trees):
    seen = 0
    for tree in trees:
        marker = "launch_subagent" if tree.env == "textcraft" else "<delegate>"
        for node in tree.nodes.values():
            for turn in node.turns:
                if turn.kind != "act":
                    assert set(turn.roles) == {turn.kind}
                    continue
                launch = [r == "launch" for r in turn.roles]
                run_texts = [tok.decode(turn.completion_ids[i:j]) for i, j in _runs(launch)]
                for text in run_texts:
                    assert marker in text
                for s, e in launch_spans(turn.text, tree.env):
                    assert any(turn.text[s:e] in text for text in run_texts)  # whole statement covered
                    seen += 1
                if not any(launch):
                    assert not launch_spans(turn.text, tree.env)
    assert seen > 5


def test_jsonl_round_trip_is_lossless(tmp_path, trees):
    path = tmp_path / "trees.jsonl"
    assert write_trees(path, trees) == len(trees)
    back = read_trees(path)
    assert back == trees
    for a, b in zip(back, trees, strict=True):
        assert list(a.nodes) == list(b.nodes)
        for na, nb in zip(a.walk(), b.walk(), strict=True):
            for ta, tb in zip(na.turns, nb.turns, strict=True):
                assert ta.logprobs == tb.logprobs
                assert [x.hex() for x in ta.logprobs] == [x.hex() for x in tb.logprobs]  # bit for bit
    again = tmp_path / "again.jsonl"
    write_trees(again, back)
    assert again.read_bytes() == path.read_bytes()
    assert path.read_text().splitlines()[0] == dumps_tree(trees[0])
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_tree_equality_sees_node_order(trees):
    tree = max(trees, key=lambda t: len(t.nodes))
    assert len(tree.nodes) > 1
    other = Tree.from_json(json.loads(dumps_tree(tree)))
    assert other == tree
    other.nodes = dict(reversed(list(other.nodes.items())))
    assert other != tree


def _act(n: int = 2) -> Turn:
    return Turn("act", [1, 2], list(range(n)), [-0.5] * n, ["execution"] * n, "xy")


def test_hand_built_tree_leaves_and_events():
    lone = Tree.new("t0", "textcraft", "task", "goal")
    assert [n.node_id for n in lone.leaves()] == ["0"]
    assert lone.delegation_events() == []

    tree = Tree.new("t1", "textworld", "task", "root goal")
    root = tree.root
    root.turns += [_act(), _act()]
    a = tree.add_child("0", "dish_1", launch_step=1)
    b = tree.add_child("0", "dish_2", launch_step=1)
    a.turns.append(_act())
    g = tree.add_child(a.node_id, "take carrot", launch_step=0)
    root.turns.append(_act())
    c = tree.add_child("0", "dish_3", launch_step=2, event_id="late")
    assert [a.node_id, b.node_id, g.node_id, c.node_id] == ["0.1", "0.2", "0.1.1", "0.3"]
    assert [n.node_id for n in tree.walk()] == ["0", "0.1", "0.1.1", "0.2", "0.3"]
    assert [n.node_id for n in tree.leaves()] == ["0.1.1", "0.2", "0.3"]
    assert [n.node_id for n in tree.leaves_under("0.1")] == ["0.1.1"]
    assert [n.node_id for n in tree.leaves_under("0.2")] == ["0.2"]
    assert tree.depth_of("0.1.1") == 2
    events = tree.delegation_events()
    assert events == [("0", "0@1", ["0.1", "0.2"]), ("0.1", "0.1@0", ["0.1.1"]), ("0", "late", ["0.3"])]
    assert [n.node_id for n in tree.event_leaves(events[0])] == ["0.1.1", "0.2"]
    tree.validate()
    with pytest.raises(ValueError, match="already belongs"):
        tree.add_child("0.1", "x", launch_step=0, event_id="late")
    with pytest.raises(ValueError, match="root"):
        tree.add_node("another root")


def test_validate_catches_bad_structure():
    tree = Tree.new("t", "textcraft", "task", "goal")
    tree.add_child("0", "sub", launch_step=0)  # the parent has no turn 0 yet
    with pytest.raises(ValueError, match="launch_step"):
        tree.validate()
    tree.root.turns.append(Turn("rubric", [], [5], [-1.0], ["rubric"], "{"))
    with pytest.raises(ValueError, match="not 'act'"):
        tree.to_json()
    tree.root.turns[0] = _act()
    tree.validate()
    tree.root_reward = 0.5
    with pytest.raises(ValueError, match="root_reward"):
        tree.validate()
    tree.root_reward = 1.0
    tree.nodes["0.1"].meta["x"] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        tree.to_json()
    tree.nodes["0.1"].meta["x"] = (1, 2)
    with pytest.raises(ValueError, match="tuple"):
        tree.to_json()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logprobs": [-0.1]}, "2 completion tokens but 1 logprobs"),
        ({"roles": ["execution"]}, "2 completion tokens but 1 roles"),
        ({"roles": ["execution", "planning"]}, "roles\\[1\\] = 'planning' is not one of"),
        ({"roles": ["execution", "rubric"]}, "in a 'act' turn"),
        ({"logprobs": [-0.1, float("nan")]}, "logprobs\\[1\\] = nan is not finite"),
        ({"logprobs": [-0.1, float("-inf")]}, "not finite"),
        ({"logprobs": [-0.1, 0.3]}, "positive"),
        ({"completion_ids": [1, -2]}, "non-negative"),
        ({"completion_ids": [1, 2.5]}, "integers"),
        ({"kind": "plan"}, "kind 'plan'"),
    ],
)
def test_turn_validation_errors(kwargs, message):
    fields = {"kind": "act", "prompt_ids": [1], "completion_ids": [3, 4], "logprobs": [-0.1, -2.0],
              "roles": ["execution", "launch"], "text": "ab"}
    fields.update(kwargs)
    with pytest.raises(ValueError, match=message):
        Turn(**fields)


def test_turn_validate_after_mutation():
    turn = _act()
    turn.logprobs.append(-1.0)
    with pytest.raises(ValueError, match="logprobs"):
        turn.validate()


def _span_texts(text: str, env: str = "textcraft") -> list[str]:
    return [text[s:e] for s, e in launch_spans(text, env)]


def test_launch_spans_gather_is_one_multiline_span():
    code = ("<thought>two at once</thought>\n<python>\nx = 1\nres = await asyncio.gather(\n"
            "    launch_subagent({'a': 1}),\n    launch_subagent({'b': 2}, context='naïve'),\n)\nprint(res)\n</python>")
    expected = ("res = await asyncio.gather(\n    launch_subagent({'a': 1}),\n"
                "    launch_subagent({'b': 2}, context='naïve'),\n)")
    assert _span_texts(code) == [expected]


def test_launch_spans_smallest_statement_in_loop_and_header():
    code = ("<python>\nfor t in ['a', 'b']:\n    print(t)\n    r = await launch_subagent({t: 1}, context='日本 ✓')\n"
            "    print(r)\nfor x in await asyncio.gather(*map(launch_subagent, ts)):\n    print(x)\n</python>")
    assert _span_texts(code) == ["r = await launch_subagent({t: 1}, context='日本 ✓')",
                                 "for x in await asyncio.gather(*map(launch_subagent, ts))"]


def test_launch_spans_ignores_comments_strings_and_later_blocks():
    code = ("<python>\n# call launch_subagent(x) later\ns = 'launch_subagent({})'\nprint(s)  # launch_subagent(\n</python>"
            "\n<python>\nawait launch_subagent({'a': 1})\n</python>")
    assert launch_spans(code, "textcraft") == []
    assert launch_spans("no code launch_subagent(x)", "textcraft") == []


def test_launch_spans_syntax_error_falls_back_to_lines():
    code = "<python>\nr = await launch_subagent({'a': 1}\n  y = launch_subagent ({'b': 2})  \nprint(r\n"  # unclosed
    assert _span_texts(code) == ["r = await launch_subagent({'a': 1}", "y = launch_subagent ({'b': 2})  "]


def test_launch_spans_textworld_blocks():
    text = 'think <delegate>{"goal": "eat dish_1"}</delegate> then <action>go to garden</action>'
    assert _span_texts(text, "textworld") == ['<delegate>{"goal": "eat dish_1"}</delegate>']
    assert launch_spans('<delegate>{"goal": "x"}', "textworld") == []  # never closed: no delegation
    with pytest.raises(ValueError, match="benchmark"):
        launch_spans(text, "minecraft")


def _byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def test_token_char_spans_split_characters():
    ids = list("aé✓".encode())  # one token per byte: 1 + 2 + 3 bytes
    assert token_char_spans(ids, _byte_decode) == [(0, 1), (1, 1), (1, 2), (2, 2), (2, 2), (2, 3)]
    # empty spans take the next non-empty one: all bytes of ✓ go with it
    assert overlap_mask(token_char_spans(ids, _byte_decode), [(2, 3)]) == [False, False, False, True, True, True]
    assert overlap_mask([(0, 1), (1, 1)], [(0, 1)]) == [True, False]  # a trailing empty token overlaps nothing


def test_roles_for_split_characters_at_span_edges():
    text = "<python>\nawait launch_subagent({'a': 1}, context='🙂')\n</python>🙂"
    ids = list(text.encode())
    roles = roles_for(ids, _byte_decode, text, "textcraft", "act")
    (start, end), = launch_spans(text, "textcraft")
    launch_bytes = bytes(i for i, r in zip(ids, roles, strict=True) if r == "launch")
    assert launch_bytes == text[start:end].encode()  # every byte of the emoji inside, none outside
    assert roles[-4:] == ["execution"] * 4
    assert roles_for(ids, _byte_decode, None, "textcraft", "rubric") == ["rubric"] * len(ids)
    with pytest.raises(ValueError, match="decode"):
        roles_for(ids, _byte_decode, text + "x", "textcraft", "act")
