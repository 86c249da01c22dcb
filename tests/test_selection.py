"""Test-time selection (SPEC 6/8, Table 4): N candidates per delegation, bottom-up, best score kept."""

from __future__ import annotations

import pytest

from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig, pick_candidate
from sera_core.agents.tree import Tree, graft, subtree
from sera_core.envs.textcraft import expert as tc_expert
from sera_core.envs.textworld import expert as tw_expert
from sera_core.envs.textworld.tasks import TaskConfig as WorldTaskConfig
from sera_core.envs.textworld.tasks import make_task, seed_for
from sera_core.policy.expert import ExpertPolicy


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def noisy_craft(tokenizer):
    return ExpertPolicy(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate", waste=0.3, early_finish=0.2))


def medium(val_tasks, n):
    return [t for t in val_tasks if t["misc"]["difficulty"] == "medium"][:n]


def test_pick_candidate_best_valid_first_on_ties_else_zero():
    assert pick_candidate([0.2, 0.9, 0.5]) == 1
    assert pick_candidate([0.7, None, 0.7]) == 0  # first on ties
    assert pick_candidate([None, 0.0, 0.0]) == 1  # a valid zero beats an invalid score
    assert pick_candidate([None, None]) == 0  # nothing valid: candidate 0
    assert pick_candidate([0.1]) == 0


def test_select_one_is_plain_evaluation(tokenizer, val_tasks):
    tasks = medium(val_tasks, 2)
    plain = Runtime("textcraft", noisy_craft(tokenizer), RuntimeConfig(temperature=0.0)).run(tasks)
    one = Runtime("textcraft", noisy_craft(tokenizer), RuntimeConfig(temperature=0.0, select=1)).run(tasks)
    assert [r.tree for r in one] == [r.tree for r in plain]


def selections(rollouts):
    return [(r.tree, n) for r in rollouts for n in r.tree.nodes.values() if n.meta.get("selection", {}).get("candidates", 1) > 1]


def test_select_two_keeps_the_higher_score_bottom_up(tokenizer, val_tasks):
    cfg = RuntimeConfig(temperature=0.0, select=2)
    rollouts = Runtime("textcraft", noisy_craft(tokenizer), cfg).run(medium(val_tasks, 4))
    chosen = selections(rollouts)
    assert chosen
    for tree, node in chosen:
        sel = node.meta["selection"]
        assert len(sel["scores"]) == 2 and sel["chosen"] == pick_candidate(sel["scores"])
        if sel["scores"][sel["chosen"]] is not None:  # the kept child carries the kept score
            assert node.score["final_score"] == sel["scores"][sel["chosen"]]
        # exactly one scoring turn (the kept candidate's) on the parent for this child
        parent = tree.nodes[node.parent_id]
        assert sum(1 for t in parent.turns if t.kind == "score" and t.meta["child"] == node.node_id) == (node.score is not None and not node.score.get("forced"))
    differing = [n.meta["selection"] for _, n in chosen if len(set(n.meta["selection"]["scores"])) > 1]
    assert differing, "the noisy expert must make some candidates differ"
    assert any(s["chosen"] == 1 for s in differing)  # a later candidate can win
    for s in differing:
        assert s["scores"][s["chosen"]] == max(v for v in s["scores"] if v is not None)
    nested = [n for _, n in chosen if n.depth >= 2]
    assert nested, "candidates' own delegations select too (bottom-up)"
    for r in rollouts:
        r.tree.validate()
        assert r.tree.meta["forks"] <= 32


def test_selection_improves_on_a_noisy_policy_and_respects_the_fork_cap(tokenizer, val_tasks):
    tasks = medium(val_tasks, 6)
    plain = Runtime("textcraft", noisy_craft(tokenizer), RuntimeConfig(temperature=0.0)).run(tasks)
    picked = Runtime("textcraft", noisy_craft(tokenizer), RuntimeConfig(temperature=0.0, select=2)).run(tasks)
    assert sum(r.tree.root_reward for r in picked) >= sum(r.tree.root_reward for r in plain)
    task = next(t for t, r in zip(tasks, picked, strict=True) if len(selections([r])) > 1)
    capped = Runtime("textcraft", noisy_craft(tokenizer), RuntimeConfig(temperature=0.0, select=2, select_fork_cap=2)).run([task])[0]
    assert capped.tree.meta["forks"] == 2
    assert any("fork cap" in n.meta.get("selection", {}).get("note", "") for n in capped.tree.nodes.values())


def test_selection_on_textworld(tokenizer):
    cfg = WorldTaskConfig()
    task = make_task("test", "load_balanced", "medium", 0, seed_for("test", "load_balanced", "medium", 0, cfg), cfg)
    actor = ExpertPolicy(tokenizer, textworld=tw_expert.ExpertConfig(mode="delegate", mistake=0.15, early_finish=0.05))
    rollout = Runtime("textworld", actor, RuntimeConfig(temperature=0.0, select=2)).run([task])[0]
    rollout.tree.validate()
    assert selections([rollout]) and rollout.tree.root_reward is not None


def test_graft_is_the_inverse_of_subtree(tokenizer, val_tasks):
    actor = ExpertPolicy(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate"))
    tree = Runtime("textcraft", actor, RuntimeConfig(temperature=0.0)).run(medium(val_tasks, 1))[0].tree
    child = next(n for n in tree.nodes.values() if n.depth == 1 and n.children)
    cut = subtree(tree, child.node_id, "cut")
    fresh = Tree.from_json(tree.to_json())
    for node_id in [n.node_id for n in fresh.walk(child.node_id)][1:]:
        del fresh.nodes[node_id]
    top = fresh.nodes[child.node_id]
    top.turns, top.children, top.finished, top.result = [], [], False, {}
    graft(fresh, child.node_id, cut)
    assert [n.to_json() for n in fresh.walk()] == [n.to_json() for n in tree.walk()]
    fresh.validate()
    with pytest.raises(ValueError, match="already ran"):
        graft(fresh, child.node_id, subtree(tree, child.node_id, "again"))
