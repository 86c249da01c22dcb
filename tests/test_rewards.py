"""The three rewards and their advantages on hand-made trees (SPEC 3, 4, 8), and on real rollouts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.points import Branch, DelegationPoint
from sera_core.agents.runtime import Runtime, RuntimeConfig
from sera_core.agents.tree import Tree, Turn
from sera_core.envs.textcraft import expert as tc_expert
from sera_core.policy.expert import ExpertPolicy
from sera_core.rewards import Datum
from sera_core.rewards.execution import execution_datums
from sera_core.rewards.leaf_credit import leaf_datums
from sera_core.rewards.rubric_ranking import group_spread, kept_points, rubric_datums
from sera_core.rubrics import RankingResult, Score
from sera_core.train.advantages import (
    depth_weighted,
    execution_advantages,
    leaf_advantages,
    naive_per_event_advantages,
    rubric_advantages,
    zero_variance,
)


def act(*roles: str) -> Turn:
    return Turn("act", [1, 2], [7] * len(roles), [-0.5] * len(roles), list(roles))


def call(kind: str, child: str) -> Turn:
    return Turn(kind, [3], [8, 9], [-0.1, -0.2], [kind, kind], meta={"child": child})


EXEC, LAUNCH = ("execution", "execution"), ("execution", "launch", "launch")


def tree_with_delegations(tree_id: str = "t0", task_id: str = "task", root_reward: float = 1.0) -> Tree:
    """Root: step 1 launches 0.1 and 0.2 together; step 3 is a launch that made no child
    (invalid attempt); step 4 launches 0.3. 0.1's step 1 launches 0.1.1 and 0.1.2.
    Leaves: 0.1.1, 0.1.2, 0.2, 0.3 (four)."""
    tree = Tree.new(tree_id, "textcraft", task_id, "root task")
    root = tree.root
    root.turns += [act(*EXEC), act(*LAUNCH), call("rubric", "0.1"), act(*EXEC), act(*LAUNCH), act(*LAUNCH)]
    # turn indices: 0 exec, 1 launch, 2 rubric call, 3 exec, 4 launch (invalid), 5 launch
    a = tree.add_child("0", "sub a", launch_step=1)
    b = tree.add_child("0", "sub b", launch_step=1)
    a.turns += [act(*EXEC), act(*LAUNCH)]
    a1 = tree.add_child(a.node_id, "sub a1", launch_step=1)
    a2 = tree.add_child(a.node_id, "sub a2", launch_step=1)
    c = tree.add_child("0", "sub c", launch_step=5)
    for node, reward, label, gate in ((a, 0.75, True, True), (b, 0.4, False, False), (a1, 1.0, True, True),
                                      (a2, 0.0, False, False), (c, None, True, None)):
        if node is not a:
            node.turns.append(act(*EXEC))
        node.result["reward"] = reward
        node.label = label
        node.score = None if gate is None else {"gate": gate, "final_score": reward}
    tree.root_reward = root_reward
    return tree


def single_agent(tree_id: str, task_id: str, r: float) -> Tree:
    tree = Tree.new(tree_id, "textcraft", task_id, "root task")
    tree.root.turns += [act(*EXEC), act(*EXEC)]
    tree.root_reward = r
    return tree


# -- execution ---------------------------------------------------------------------

def test_execution_rewards_root_verdict_children_scores_or_labels():
    tree = tree_with_delegations()
    got = {d.node_id: d.reward for d in execution_datums(tree)}
    assert got == {"0": 1.0, "0.1": 0.75, "0.2": 0.4, "0.1.1": 1.0, "0.1.2": 0.0}  # 0.3's score dropped: no datum
    labels = {d.node_id: d.reward for d in execution_datums(tree, source="label")}
    assert labels == {"0": 1.0, "0.1": 1.0, "0.2": 0.0, "0.1.1": 1.0, "0.1.2": 0.0, "0.3": 1.0}  # RAO
    assert all(d.turn is None and d.role == "execution" for d in execution_datums(tree))
    assert {d.node_id: d.depth for d in execution_datums(tree)}["0.1.2"] == 2
    tree.meta["drop_rollout"] = True
    assert execution_datums(tree) == []
    with pytest.raises(ValueError, match="source"):
        execution_datums(tree, source="judge")


def test_execution_loo_baseline_over_the_other_trees_of_the_task():
    trees = [single_agent("a", "x", 1.0), single_agent("b", "x", 0.0), tree_with_delegations("c", "x", 1.0),
             single_agent("d", "x", 1.0), single_agent("e", "y", 1.0)]
    datums = [d for t in trees for d in execution_datums(t)]
    adv = {(a.datum.tree_id, a.datum.node_id): a.advantage for a in execution_advantages(datums, trees, filter_zero_variance=False)}
    assert adv[("b", "0")] == pytest.approx(0.0 - 1.0)  # others of task x: 1, 1, 1
    assert adv[("a", "0")] == pytest.approx(1.0 - 2 / 3)  # others: 0, 1, 1
    assert adv[("c", "0.2")] == pytest.approx(0.4 - 2 / 3)  # a child's s_v against the other roots
    assert adv[("e", "0")] == 0.0 + 1.0  # a group of one: baseline 0
    filtered = execution_advantages(datums, trees)  # task y has one reward value only: filtered
    assert {a.datum.task_id for a in filtered} == {"x"}


# -- leaf coverage --------------------------------------------------------------------

def test_leaf_coverage_events_parallel_children_and_invalid_attempts():
    tree = tree_with_delegations()
    got = {(d.node_id, d.turn): d.reward for d in leaf_datums(tree)}
    assert got == {("0", 1): 3 / 4,   # 0.1 and 0.2 in one step: leaves 0.1.1, 0.1.2, 0.2
                   ("0", 4): 0.0,     # launch tokens, no child: an invalid attempt
                   ("0", 5): 1 / 4,   # 0.3
                   ("0.1", 1): 2 / 4}  # 0.1.1 and 0.1.2
    assert all(d.role == "launch" for d in leaf_datums(tree))
    assert {(d.node_id, d.turn): d.depth for d in leaf_datums(tree)}[("0.1", 1)] == 1
    gated = {(d.node_id, d.turn): d.reward for d in leaf_datums(tree, gate_filter=True)}
    assert gated == {("0", 1): 1 / 4, ("0", 4): 0.0, ("0", 5): 0.0, ("0.1", 1): 1 / 4}  # only 0.1.1 passed its gate


def test_leaf_coverage_is_zero_in_failed_trees_and_absent_without_delegation():
    assert all(d.reward == 0.0 for d in leaf_datums(tree_with_delegations(root_reward=0.0)))
    assert leaf_datums(single_agent("a", "x", 1.0)) == []  # the root is the only leaf, no launch tokens
    tree = tree_with_delegations()
    tree.meta["drop_rollout"] = True
    assert leaf_datums(tree) == []


def test_leaf_advantage_reward_first_root_balanced():
    trees = [tree_with_delegations("a", "x", 1.0), tree_with_delegations("b", "x", 0.0), single_agent("c", "x", 1.0)]
    datums = [d for t in trees for d in leaf_datums(t)]
    adv = leaf_advantages(datums, trees, filter_zero_variance=False)
    m = {"a": (3 / 4 + 0 + 1 / 4 + 2 / 4) / 4, "b": 0.0, "c": 0.0}  # c never delegated: m = 0
    for a in adv:
        baseline = (sum(m.values()) - m[a.datum.tree_id]) / 2
        assert a.advantage == pytest.approx(a.datum.reward - baseline)
    assert len(adv) == 8
    # filtering: a task whose launch rewards are all equal is dropped
    failed = [tree_with_delegations("d", "y", 0.0)]
    assert leaf_advantages([d for t in failed for d in leaf_datums(t)], failed) == []



def test_leaf_advantage_keeps_a_launching_tree_beside_trees_that_never_delegated():
    """Issue 17.6: one tree's launches all earned 1.0, seven trees never delegated (m = 0):
    the launch rewards are equal, but the group is not zero-variance (A = 1.0)."""
    from sera_core.rewards import Datum

    trees = [tree_with_delegations("a", "z", 1.0)] + [single_agent(f"n{i}", "z", 0.0) for i in range(7)]
    datums = [Datum("a", "z", "0", 1, "launch", 0, 1.0), Datum("a", "z", "0", 3, "launch", 0, 1.0)]
    adv = leaf_advantages(datums, trees)
    assert [a.advantage for a in adv] == [1.0, 1.0]
    everyone = [tree_with_delegations(t, "z", 1.0) for t in "ab"]  # every tree's m equal: every A = 0, dropped
    assert leaf_advantages([Datum(t, "z", "0", 1, "launch", 0, 1.0) for t in "ab"], everyone) == []



def test_the_naive_per_event_baseline_weighs_trees_by_their_events():
    """The comparison of notebook 06: each other tree's events count once, so a tree with many
    events sets the baseline and one that launched nothing is left out of it."""
    from sera_core.rewards import Datum

    many = [Datum("many", "x", "0", k, "launch", 0, 0.0) for k in range(3)]
    few, mine = Datum("few", "x", "0", 1, "launch", 0, 1.0), Datum("me", "x", "0", 1, "launch", 0, 0.5)
    trees = [single_agent(t, "x", 1.0) for t in ("many", "few", "me", "none")]
    naive = {(a.datum.tree_id, a.datum.turn): a.advantage for a in naive_per_event_advantages(many + [few, mine])}
    assert naive["me", 1] == pytest.approx(0.5 - 1 / 4)  # (0 + 0 + 0 + 1) / 4 events
    assert naive["few", 1] == pytest.approx(1.0 - 0.5 / 4) and naive["many", 0] == pytest.approx(0.0 - 1.5 / 2)
    balanced = [a for a in leaf_advantages(many + [few, mine], trees, filter_zero_variance=False) if a.datum is mine]
    assert balanced[0].advantage == pytest.approx(0.5 - (0.0 + 1.0 + 0.0) / 3)  # per tree, "none" with m = 0
    alone = Datum("a", "y", "0", 1, "launch", 0, 0.4)  # the other trees launched nothing: baseline 0
    assert [a.advantage for a in naive_per_event_advantages([alone])] == [0.4]
    trees = [tree_with_delegations("a", "x", 1.0), tree_with_delegations("b", "x", 0.0), single_agent("c", "x", 1.0)]
    datums = [d for t in trees for d in leaf_datums(t)]
    got = {(a.datum.tree_id, a.datum.node_id, a.datum.turn): a.advantage for a in naive_per_event_advantages(datums)}
    assert got["b", "0", 1] == pytest.approx(0.0 - (3 / 4 + 0 + 1 / 4 + 2 / 4) / 4)  # a's four events; c left out
    assert got["a", "0", 1] == pytest.approx(3 / 4) and got["a", "0.1", 1] == pytest.approx(2 / 4)  # b's earned 0


def test_a_dropped_rollout_leaves_every_baseline_and_gives_no_rubric_datums():
    """Issue 17.7: a tree marked drop_rollout gives no datums and is not one of the K trees."""
    from sera_core.agents.runtime import Rollout

    trees = [single_agent("a", "x", 1.0), single_agent("b", "x", 0.0), single_agent("c", "x", 0.0)]
    trees[2].meta["drop_rollout"] = True
    datums = [d for t in trees for d in execution_datums(t)]
    assert {d.tree_id for d in datums} == {"a", "b"}
    adv = {a.datum.tree_id: a.advantage for a in execution_advantages(datums, trees)}
    assert adv == {"a": 1.0, "b": -1.0}  # baselines over a and b only (with c: 0.5 and -0.5)
    launch = [Datum("a", "x", "0", 1, "launch", 0, 1.0)]
    assert [a.advantage for a in leaf_advantages(launch, trees)] == [1.0]  # K = 2: (1 + 0 - 1) / 1
    point = DelegationPoint("c", "textcraft", "x", "0", "0.1", None, None, {}, "", None, None, 2, {}, [],
                            RankingResult(0.1, 1, 1.0, False))
    rollouts = [Rollout(trees[0], [replace(point, tree_id="a")]), Rollout(trees[2], [point])]
    assert [p.tree_id for p in kept_points(rollouts)] == ["a"]
    assert len(rubric_datums(kept_points(rollouts))) == 1


# -- rubric ranking -------------------------------------------------------------------

def point(scores, labels, loss, skipped=False, parent="0", child="0.1", turn=2, tree="t0"):
    branches = [Branch(b, Tree.new(f"{tree}/b{b}", "textcraft", "x", "sub-goal"), True, 1, "finish", {}, y, "",
                       Score(int(y), {}, s, None, ""), None, None) for b, (s, y) in enumerate(zip(scores, labels, strict=True))]
    return DelegationPoint(tree, "textcraft", "x", parent, child, None, None, {}, "sub-goal", None, None, turn, {},
                           branches, RankingResult(loss, 1, None, skipped))


def test_rubric_rewards_are_negative_ranking_loss_and_skip_homogeneous_groups():
    pts = [point([0.9, 0.2, 0.5], [True, False, True], 0.0),
           point([0.3, 0.6], [True, False], 0.5, parent="0.1", child="0.1.1", turn=1),
           point([0.9, 0.8], [True, True], None, skipped=True),
           point([0.9, 0.1], [True, False], 0.0, turn=None)]  # global rubric: no policy tokens
    got = rubric_datums(pts)
    assert [(d.node_id, d.turn, d.depth, d.reward) for d in got] == [("0", 2, 0, -0.0), ("0.1", 1, 1, -0.5)]
    spread = group_spread(pts[0])
    assert spread == pytest.approx((((0.9 - 1.6 / 3) ** 2 + (0.2 - 1.6 / 3) ** 2 + (0.5 - 1.6 / 3) ** 2) / 3) ** 0.5)
    disc = rubric_datums(pts, variant="discriminative", spread_weight=2.0)
    assert disc[0].reward == pytest.approx(2.0 * spread) and disc[1].reward == pytest.approx(-0.5 + 2.0 * 0.15)
    with pytest.raises(ValueError, match="variant"):
        rubric_datums(pts, variant="spread")


def test_rubric_advantage_loo_across_groups():
    ds = [Datum("t", "x", "0", 1, "rubric", 0, r) for r in (-0.1, -0.5, 0.0)]
    adv = [a.advantage for a in rubric_advantages(ds)]
    assert adv == pytest.approx([-0.1 + 0.25, -0.5 + 0.05, 0.0 + 0.3])
    assert rubric_advantages(ds[:1], filter_zero_variance=False)[0].advantage == -0.1  # one group: baseline 0
    assert rubric_advantages([ds[0], ds[0]]) == [] and zero_variance([ds[0], ds[0]])
    # groups whose every pair ties: -L_rank is 0.2 up to float rounding, which is no preference
    from dataclasses import replace as swap

    tie = 0.2 - 1.0 + 1.0  # one pair's hinge when both branches score 1.0: 0.19999999999999996
    assert tie != 0.2 and tie == pytest.approx(0.2)
    rounded = [swap(ds[0], reward=-tie), swap(ds[0], reward=-0.2)]
    assert zero_variance(rounded) and rubric_advantages(rounded) == []
    assert not zero_variance([swap(ds[0], reward=-0.2), swap(ds[0], reward=-0.2 + 1e-6)])


# -- depth weighting ------------------------------------------------------------------

def test_depth_weights_are_inverse_counts_and_sum_to_the_number_of_datums():
    tree = tree_with_delegations()
    adv = execution_advantages(execution_datums(tree), [tree], filter_zero_variance=False)
    weighted = depth_weighted(adv)  # depths: 0 (one datum), 1 (two), 2 (two)
    w = {a.datum.node_id: a.weight for a in weighted}
    assert w == pytest.approx({"0": 5 / 3, "0.1": 5 / 6, "0.2": 5 / 6, "0.1.1": 5 / 6, "0.1.2": 5 / 6})
    assert sum(w.values()) == pytest.approx(len(weighted))
    assert all(a.value == pytest.approx(a.weight * a.advantage) for a in weighted)


# -- real rollouts --------------------------------------------------------------------

def test_rewards_of_real_counterfactual_rollouts(val_tasks):
    medium = [t for t in val_tasks if t["misc"]["difficulty"] == "medium"][:2]
    actor = ExpertPolicy(default_tokenizer(), textcraft=tc_expert.ExpertConfig(mode="delegate", waste=0.3, early_finish=0.1))
    rollouts = Runtime("textcraft", actor, RuntimeConfig(counterfactual=4)).run(medium, trees=2)
    trees = [r.tree for r in rollouts]
    for tree in trees:
        leaves = len(tree.leaves())
        for d in leaf_datums(tree):  # R_i times a whole number of the tree's leaves
            covered = d.reward * leaves
            assert d.reward == 0.0 if tree.root_reward == 0 else (covered == pytest.approx(round(covered)) and 0 <= covered <= leaves)
        assert any(d.node_id == "0" for d in execution_datums(tree))
    assert any(d.reward > 0 for t in trees for d in leaf_datums(t))
    points = [p for r in rollouts for p in r.points]
    datums = rubric_datums(points)
    assert [d.reward for d in datums] == [-p.ranking.loss for p in points if not p.ranking.skipped]
    for d in datums:  # the datum names the rubric-writing call
        tree = next(t for t in trees if t.tree_id == d.tree_id)
        assert tree.nodes[d.node_id].turns[d.turn].kind == "rubric"
