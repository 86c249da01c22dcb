"""The rubric stage on fixed branches (sera_core/tiny/rubric_stage.py): the scorer's share of
the hinge terms, its leave-one-out advantages, and one resumable run on the embedded policy."""

from __future__ import annotations

import csv
import gc
import json
import math
from dataclasses import replace

import pytest

from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime
from sera_core.course import noisy_expert, pick_tasks
from sera_core.eval.points import branch_beliefs, heldout_points
from sera_core.policy.chat import ChatFormat
from sera_core.rubrics import Score, ranking_loss
from sera_core.tiny.rubric_stage import RubricStageConfig, branch_rewards, gate_rows, rubric_ranking, score_advantages, stage_rows


@pytest.fixture(scope="module")
def point():
    """A mixed point of the noisy expert on a medium train task, scored by the expert (1 or 0)."""
    points = heldout_points("textcraft", pick_tasks("textcraft", "train", difficulty="medium", count=4))
    return Runtime("textcraft", noisy_expert()).rescore_all(points[:1])[0]


def with_scores(point, scores):
    """The point with branch ``i`` scored ``scores[i]`` (None: malformed) and its ranking recomputed."""
    branches = [replace(b, score=None if s is None else Score(1, {}, s, s, "")) for b, s in zip(point.branches, scores, strict=True)]
    out = replace(point, branches=branches)
    out.ranking = ranking_loss(out.scores, out.labels)
    return out


def test_branch_rewards_are_each_branchs_share_of_the_hinge_terms(point):
    labels = point.labels
    assert True in labels and False in labels
    scores = [0.9 if y else 0.3 for y in labels]
    scores[labels.index(False)] = 1.0  # one failure scored above every success
    p = with_scores(point, scores)
    rewards = branch_rewards(p)
    good = [s for s, y in zip(scores, labels, strict=True) if y]
    bad = [s for s, y in zip(scores, labels, strict=True) if not y]
    for s, y, r in zip(scores, labels, rewards, strict=True):
        terms = [max(0.0, 0.2 - s + n) for n in bad] if y else [max(0.0, 0.2 - g + s) for g in good]
        assert r == pytest.approx(-sum(terms) / len(terms))
    # every pair counted once from each side: the mean of the pair terms is L_rank
    assert p.ranking.loss == pytest.approx(sum(max(0.0, 0.2 - g + n) for g in good for n in bad) / (len(good) * len(bad)))
    worst = labels.index(False)
    assert rewards[worst] == min(rewards) < max(rewards)
    # a malformed score leaves the ranking: no reward for it, the others computed without it
    scores[worst] = None
    q = with_scores(point, scores)
    assert branch_rewards(q)[worst] is None and all(r is not None for i, r in enumerate(branch_rewards(q)) if i != worst)


def test_score_advantages_are_leave_one_out_and_skip_a_uniform_group(point, monkeypatch):
    labels = point.labels
    # the shipped adapter's scorer: 1.0 for every branch -> every r_b = -0.2 -> nothing to prefer
    assert score_advantages(with_scores(point, [1.0] * len(labels))) == []
    scores = [1.0 if y else 0.0 for y in labels]
    scores[labels.index(False)] = 1.0
    p = with_scores(point, scores)
    assert all(b.score_turn is not None for b in p.branches)  # every branch finished and was scored by a call
    adv = dict(score_advantages(p))
    rewards = branch_rewards(p)
    for b, r in enumerate(rewards):
        others = [x for i, x in enumerate(rewards) if i != b]
        assert adv[b] == pytest.approx(r - sum(others) / len(others))
    assert adv[labels.index(False)] < 0 < max(adv.values())
    # a call the runtime never made (a forced zero) has no tokens to train: no datum
    forced = replace(p, branches=[replace(b, score_turn=None) if b.branch == 0 else b for b in p.branches])
    assert 0 not in dict(score_advantages(forced)) and len(score_advantages(forced)) == len(labels) - 1


def test_the_order_credit_weighs_both_outcomes_alike_where_the_hinge_does_not(point):
    """A scoring call that answers 0 instead of 1: under the hinge a failure's call gains 0.2 and
    a success's loses 1.0 when every other call said 1.0 (the push towards ``true`` the long run
    showed); under ``credit="order"`` each moves by exactly 1/2, whatever the other calls said."""
    import random

    labels = point.labels
    fail, good = labels.index(False), labels.index(True)

    def reward(scores, b, value, credit):
        return branch_rewards(with_scores(point, [value if i == b else s for i, s in enumerate(scores)]), credit=credit)[b]

    ones = [1.0] * len(labels)
    for credit, gain, loss in (("hinge", 0.2, 1.0), ("order", 0.5, 0.5)):
        assert reward(ones, fail, 0.0, credit) - reward(ones, fail, 1.0, credit) == pytest.approx(gain)
        assert reward(ones, good, 1.0, credit) - reward(ones, good, 0.0, credit) == pytest.approx(loss)
    rng = random.Random(3)
    for _ in range(5):  # any answers of the other calls
        others = [float(rng.random() < 0.5) for _ in labels]
        for b, y in enumerate(labels):
            moved = reward(others, b, 1.0, "order") - reward(others, b, 0.0, "order")
            assert moved == pytest.approx(0.5 if y else -0.5)
    # by hand: a failure tied with the successes at 0.9, the rest apart
    scores = [0.9 if y else 0.3 for y in labels]
    scores[fail] = 0.9
    rewards = branch_rewards(with_scores(point, scores), credit="order")
    n_good, n_bad = labels.count(True), labels.count(False)
    assert rewards[fail] == 0.5
    assert all(r == (0.5 if i == fail else 1.0 if not y else (n_bad - 1 + 0.5) / n_bad)
               for i, (r, y) in enumerate(zip(rewards, labels, strict=True)))
    adv = dict(score_advantages(with_scores(point, scores), "order"))
    assert adv[fail] == pytest.approx(0.5 - (sum(rewards) - 0.5) / (n_good + n_bad - 1)) and adv[fail] < 0
    p = with_scores(point, scores)
    rows, count = stage_rows([replace(p, rewritten=p.branches[0].score_turn)], train_scorer=True, credit="order")
    trained = sorted({round(a, 5) for r in rows for a, t in zip(r.advantage, r.trained, strict=True) if t})
    moving = [a for a in adv.values() if abs(a) > 1e-9]  # a success's call tied with its mean: no datum
    assert trained == sorted({round(a, 5) for a in moving}) and count["datums_score"] == len(moving)
    # a malformed call earns the least credit (0) under the order credit, none under the hinge;
    # either way it leaves the other branches' pairs
    broken = list(scores)
    broken[good] = None
    for credit, expected in (("order", 0.0), ("hinge", None)):
        rewards = branch_rewards(with_scores(point, broken), credit=credit)
        assert rewards[good] == expected
    assert branch_rewards(with_scores(point, broken), credit="order")[fail] == 0.5  # still tied with every success left
    assert good in dict(score_advantages(with_scores(point, broken), "order"))  # a datum, its tokens trained away from
    with pytest.raises(ValueError, match="credit"):
        branch_rewards(point, credit="brier")


def test_the_trained_scoring_calls_are_drawn_from_those_that_move(point):
    """``stage_rows`` trains up to ``score_calls`` calls per point, never one whose ``A_b`` is 0."""
    import itertools
    import random

    def zero_and_moving(scores):
        adv = dict(score_advantages(with_scores(point, list(scores))))
        return any(a == 0.0 for a in adv.values()) and any(adv.values())

    # scores on a grid that give some calls exactly their point's mean (A_b = 0) and others not
    scores = next(s for s in itertools.product((0.0, 0.5, 1.0), repeat=len(point.labels)) if zero_and_moving(s))
    p = with_scores(point, list(scores))
    moving = {b for b, a in score_advantages(p) if a != 0.0}
    rewritten = replace(p, rewritten=p.branches[0].score_turn)
    for calls in (2, len(point.labels)):  # a draw, and every call there is
        rows, count = stage_rows([rewritten], train_scorer=True, score_calls=calls, rng=random.Random(0))
        values = [a for r in rows for a, t in zip(r.advantage, r.trained) if t]
        assert count["datums_score"] == min(calls, len(moving)) and values and 0.0 not in values


def with_beliefs(point, beliefs, chat):
    """The point scored 1.0 on every branch (every pair ties) by greedy calls that put
    ``beliefs[i]`` on ``"success": true``, its rubric call kept as ``rewritten``."""
    text = json.dumps({"success": True, "criterion_scores": [], "final_score": 1.0, "reason": ""})
    ids = chat.encode(text)
    gate = next(i for i in range(len(ids)) if chat.decode(ids[:i + 1]).endswith('"success": t'))
    branches = []
    for b, q in zip(with_scores(point, [1.0] * len(beliefs)).branches, beliefs, strict=True):
        logprobs = [0.0] * len(ids)
        logprobs[gate] = math.log(q)
        branches.append(replace(b, score_turn=replace(b.score_turn, completion_ids=ids, logprobs=logprobs,
                                                      roles=["score"] * len(ids), text=text)))
    out = replace(point, branches=branches, rewritten=replace(point.branches[0].score_turn, kind="rubric",
                                                                  roles=["rubric"] * len(point.branches[0].score_turn.roles)))
    out.ranking = ranking_loss(out.scores, out.labels)
    return out


def test_the_belief_arm_rewards_the_writer_by_the_ranking_of_the_gates_probability(point):
    """Where the greedy scores tie (the shipped scorer), ``rubric_belief``'s writer reward
    ``-L_rank(q)`` ranks the branches by ``q_b = P("success": true)``, computed here by hand."""
    chat = ChatFormat(default_tokenizer())
    labels = point.labels
    apart = with_beliefs(point, [0.9 if y else 0.6 for y in labels], chat)  # successes above failures by 0.3
    crossed = with_beliefs(point, [0.7 if y else 0.8 for y in labels], chat)  # failures above successes by 0.1
    for p in (apart, crossed):  # the official readout: every pair ties, every rubric earns -0.2, no datum
        assert rubric_ranking(p).loss == pytest.approx(0.2) and rubric_ranking(p).accuracy == 0.5
    rows, count = stage_rows([apart, crossed], train_scorer=False)
    assert rows == [] and count["datums_rubric"] == 0
    assert rubric_ranking(apart, chat.decode).loss == pytest.approx(max(0.0, 0.2 - 0.9 + 0.6)) == 0.0
    assert rubric_ranking(crossed, chat.decode).loss == pytest.approx(0.2 - 0.7 + 0.8)
    rows, count = stage_rows([apart, crossed], train_scorer=False, decode=chat.decode)
    assert count["datums_rubric"] == 2 and count["datums_score"] == 0
    advantages = [sorted({round(a, 6) for a, t in zip(r.advantage, r.trained, strict=True) if t}) for r in rows]
    assert advantages == [[pytest.approx(0.3)], [pytest.approx(-0.3)]]  # A_g = r_g - r_g'
    # a forced zero keeps the runtime's 0 (no call), a malformed score leaves the ranking
    holes = replace(apart, branches=[replace(b, score_turn=None, score=Score(0, {}, 0.0, None, "", forced=True)) if b.branch == 0
                                     else replace(b, score=None) if b.branch == 1 else b for b in apart.branches])
    beliefs = branch_beliefs(holes, chat.decode)
    assert beliefs[:2] == [0.0, None] and beliefs[2:] == pytest.approx([0.9 if y else 0.6 for y in labels[2:]])


def test_the_label_arm_trains_one_gate_token_per_call_toward_the_label(point):
    """``gate_rows``: a balanced draw of successes and failures, each row the call's prompt and
    text up to its gate with the label's value as the one trained token: a success keeps the
    ``true`` it wrote, a failure gets ``false`` in its place; a call with no gate is never drawn."""
    import random

    chat = ChatFormat(default_tokenizer())
    labels = point.labels
    p = with_beliefs(point, [0.8] * len(labels), chat)  # every call wrote "success": true
    ids = p.branches[0].score_turn.completion_ids  # every call wrote the same text
    gate = next(i for i in range(len(ids)) if chat.decode(ids[:i + 1]).endswith('"success": t'))
    false_id = chat.encode(" false")[0]
    assert chat.decode([false_id]).strip().startswith("f") and false_id != ids[gate]
    expected = {tuple(b.score_turn.prompt_ids) + tuple(ids[:gate]): ids[gate] if b.label else false_id for b in p.branches}
    k = min(labels.count(True), labels.count(False))
    for calls, pairs in ((2, 1), (64, k)):
        rows = gate_rows([p], decode=chat.decode, encode=chat.encode, calls=calls, rng=random.Random(0), weight=0.5)
        assert len(rows) == 2 * pairs
        for r in rows:
            assert r.tokens == 1 and r.trained[-1] and r.advantage[-1] == 0.5 and sum(r.advantage) == 0.5
            assert expected[r.ids[:-1]] == r.ids[-1]
        assert sorted(r.ids[-1] for r in rows) == sorted([ids[gate]] * pairs + [false_id] * pairs)
    # a call with no gate in its text (malformed) is never drawn: the failures have none, so no pair
    cut = chat.encode('{"succ')
    broken = replace(p, branches=[replace(b, score_turn=replace(b.score_turn, completion_ids=cut, logprobs=[0.0] * len(cut),
                                                                roles=["score"] * len(cut), text='{"succ'))
                                  if b.label is False else b for b in p.branches])
    assert gate_rows([broken], decode=chat.decode, encode=chat.encode, calls=8, rng=random.Random(0)) == []


def test_config_refuses_bad_settings_before_any_work():
    with pytest.raises(ValueError, match="arm must be one of"):
        RubricStageConfig(arm="scorer")
    with pytest.raises(ValueError, match="points_per_update must be >= 1"):
        RubricStageConfig(points_per_update=0)
    with pytest.raises(ValueError, match="heldout_limit"):
        RubricStageConfig(heldout_limit=-1)
    with pytest.raises(ValueError, match="score_temperature must be >= 0"):
        RubricStageConfig(score_temperature=-0.5)
    with pytest.raises(ValueError, match="gate_weight must be > 0"):
        RubricStageConfig(arm="rubric_scorer_label", gate_weight=0.0)
    # the belief arm reads the greedy call unless told otherwise; the others sample at 1
    assert RubricStageConfig(arm="rubric_belief").scoring_temperature == 0.0
    assert RubricStageConfig(arm="rubric").scoring_temperature == 1.0 == RubricStageConfig(arm="rubric_scorer_order").scoring_temperature
    assert RubricStageConfig(arm="rubric_belief", score_temperature=0.7).scoring_temperature == 0.7


def read(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_run_trains_both_calls_and_resumes_after_an_interruption(tmp_path):
    """The embedded policy on vLLM, the label arm: one point per update, one held-out point.
    Each gate row trains one token, its old log-probability the model's own and its advantage
    ``lambda * N / n``. Stopped after its first update and started again, the run continues at
    update 1 (the checkpoint's version), measures once at the end, and no row is written twice.

    Its points are the noisy expert's mixed groups of 4 on easy tasks, written into the
    stage's points cache before it starts (the experiments' are groups of 8 on medium tasks):
    the same code, with half the branches and shorter children's trajectories to rescore. It
    took 19 minutes on an AVX2-only machine with the medium groups of 8 (issue 57)."""
    from sera_core.policy.checkpoints import read_checkpoint
    from sera_core.tiny.rubric_stage import RubricStage
    from sera_core.utils.jsonio import write_jsonl

    cfg = RubricStageConfig(arm="rubric_scorer_label", seed=3, updates=2, points_per_update=1, pool_tasks=4, eval_every=2, heldout_tasks=1,
                            heldout_limit=1, score_calls=2, kv_cache_gib=2.0, measure_step=True, out=str(tmp_path / "run"),
                            points_dir=str(tmp_path))
    for name, split in ((f"pool_textcraft_{cfg.pool_tasks}.jsonl", "train"), (f"heldout_textcraft_{cfg.heldout_tasks}.jsonl", "val")):
        points = heldout_points("textcraft", pick_tasks("textcraft", split, difficulty="easy", count=8), counterfactual=4)
        write_jsonl(tmp_path / name, [p.to_json() for p in points[:2]])
    first = RubricStage(cfg, progress=False)
    done = first.run(stop_after=1)
    if first.last_rows:  # measure_step: the rows rescored around the step; before it, what the update itself measured
        moved = first.last_moved
        assert moved["before"]["weighted"] == pytest.approx(first.last_stats["logprob_weighted_mean"], abs=2e-3)
        assert moved["after"]["weighted"] != moved["before"]["weighted"]
    assert [r["version"] for r in done["updates"]] == ["0"] and [r["version"] for r in done["heldout"]] == ["0"]
    row = done["updates"][0]
    assert int(row["datums_rubric"]) + int(row["datums_score"]) > 0 or float(row["loss"]) == 0.0
    assert int(row["tokens_score"]) == int(row["datums_score"])  # one gate token a call
    gates = [r for r in first.last_rows if r.tokens == 1]
    assert len(gates) == int(row["datums_score"]) and len(gates) % 2 == 0  # as many successes as failures
    n_tokens = sum(r.tokens for r in first.last_rows)
    for r in gates:
        assert r.old_logprobs[-1] < 0.0 and r.advantage[-1] == pytest.approx(n_tokens / len(gates))
    assert read_checkpoint(tmp_path / "run" / "checkpoint")["version"] == 1
    start = json.loads(first.start_file.read_text())
    assert start["points"] == 1 and start["version"] == 0
    assert 0.0 <= start["belief_accuracy"] <= 1.0  # the greedy calls' probability of "success: true", ranked
    assert 0.5 <= start["gate_ceiling"] <= 1.0  # the best threshold on it: all ties (1/2) at worst
    del first
    gc.collect()
    again = RubricStage(cfg, progress=False).run()
    assert [r["version"] for r in again["updates"]] == ["0", "1"] and [r["version"] for r in again["heldout"]] == ["0", "2"]
    assert [r["version"] for r in read(tmp_path / "run" / "updates.csv")] == ["0", "1"]
    assert all(0.0 <= float(r["belief_accuracy"]) <= 1.0 for r in again["heldout"] + again["updates"])
    assert all(0.5 <= float(r["gate_ceiling"]) <= 1.0 for r in again["heldout"])
    assert read_checkpoint(tmp_path / "run" / "checkpoint")["version"] == 2
