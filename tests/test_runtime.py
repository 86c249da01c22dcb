"""The recursive runtime: the expert through it, counterfactual groups, token bookkeeping,
adversarial model output, budgets (depth cap, loop detector, context), ablation variants."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from textworld_records import make_record

from sera_core.agents.actors import Batcher, PolicyActor
from sera_core.agents.corpus import default_tokenizer
from sera_core.agents.runtime import Runtime, RuntimeConfig, looping
from sera_core.agents.summary import read_points, summarize, write_rollouts
from sera_core.agents.tree import ROLES, dumps_tree, read_trees, subtree
from sera_core.envs.textcraft import expert as tc_expert
from sera_core.envs.textworld import expert as tw_expert
from sera_core.envs.textworld.expert import expert_rubric as textworld_rubric
from sera_core.envs.textworld.tasks import TaskConfig as WorldTaskConfig
from sera_core.envs.textworld.tasks import make_task, seed_for
from sera_core.policy.base import Generation, per_prompt
from sera_core.policy.chat import ChatFormat
from sera_core.policy.expert import ExpertPolicy
from sera_core.rubrics import GLOBAL_RUBRIC


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def tw_task(family: str, difficulty: str, index: int = 0) -> dict:
    cfg = WorldTaskConfig()
    return make_task("test", family, difficulty, index, seed_for("test", family, difficulty, index, cfg), cfg)


def pick(tasks: list[dict], difficulty: str, n: int) -> list[dict]:
    return [t for t in tasks if t["misc"]["difficulty"] == difficulty][:n]


class ScriptedPolicy:
    """A deterministic token-level policy: the reply is ``script(prompt_text)``.

    Stands in for a model whose outputs a test must control exactly (adversarial text,
    endless delegation, loops); it goes through the same PolicyActor and batcher."""

    def __init__(self, tokenizer, script):
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer)
        self.script = script

    def generate(self, prompts, params):
        out = []
        for prompt, p in zip(prompts, per_prompt(params, len(prompts)), strict=True):
            ids = self.chat.encode(self.script(self.chat.decode(prompt)))[: p.max_new_tokens]
            out.append(Generation(ids, [-0.5] * len(ids), self.chat.decode(ids), "stop"))
        return out


def role_of(prompt: str) -> str:
    if "You write grading rubrics" in prompt:
        return "rubric"
    if "You grade a sub-agent" in prompt:
        return "score"
    return "root" if "You are the root agent" in prompt else "child"


def turn_number(prompt: str) -> int:
    return prompt.count("<|im_start|>assistant")


# -- the expert through the runtime -------------------------------------------------------------

def test_expert_root_success_equals_solver_textcraft(tokenizer, val_tasks, book):
    tasks = val_tasks[::90]
    rollouts = Runtime("textcraft", ExpertPolicy(tokenizer)).run(tasks)
    solver = [tc_expert.solve_task(t, book, tc_expert.ExpertConfig(mode="delegate"), max_steps=20)["passed"] for t in tasks]
    assert [r.tree.root_reward == 1.0 for r in rollouts] == solver
    assert all(solver)
    deep = max(rollouts, key=lambda r: len(r.tree.nodes)).tree
    assert max(n.depth for n in deep.nodes.values()) == 3 and len(deep.delegation_events()) >= 2
    for node in deep.nodes.values():
        if node.parent_id is not None:  # rubric before the child, score after, both on the parent
            parent = deep.nodes[node.parent_id]
            kinds = [(i, t.kind) for i, t in enumerate(parent.turns) if t.meta.get("child") == node.node_id]
            assert [k for _, k in kinds] == ["rubric", "score"]
            assert kinds[0][0] > node.launch_step and node.rubric is not None and node.score["final_score"] > 0
            assert node.label is True and node.result["reward_source"] == "rubric"


def test_expert_root_success_equals_solver_textworld(tokenizer):
    tasks = [tw_task(f, d) for f, d in (("multi_dish_fork_join", "easy"), ("conflict", "medium"),
                                        ("hierarchical", "hard"), ("resource_constrained", "extreme"))]
    rollouts = Runtime("textworld", ExpertPolicy(tokenizer)).run(tasks)
    solver = [tw_expert.solve_task(t, tw_expert.ExpertConfig(mode="delegate"))["passed"] for t in tasks]
    assert [r.tree.root_reward == 1.0 for r in rollouts] == solver and all(solver)
    assert all(n.rubric is not None for r in rollouts for n in r.tree.nodes.values() if n.parent_id)


# -- counterfactual groups ------------------------------------------------------------------------

def check_groups(rollouts, b_count=8, cap=16):
    points = [p for r in rollouts for p in r.points]
    assert points
    for r in rollouts:
        assert r.tree.meta["forks"] == b_count * len(r.points) <= cap
    for p in points:
        assert len(p.branches) == len(p.labels) == len(p.scores) == b_count
        assert p.rubric is not None and 4 <= len(p.rubric["rubric_items"]) <= 8
        assert all(lab is not None for lab in p.labels)
        assert all(s is not None for s in p.scores)
        tree = next(r.tree for r in rollouts if r.tree.tree_id == p.tree_id)
        child = tree.nodes[p.child_id]
        assert child.label == p.labels[0] and child.score["final_score"] == p.scores[0]
        assert p.branches[0].tree == subtree(tree, child.node_id, p.branches[0].tree.tree_id)
        # detached: only branch 0's scoring call is in the tree
        scored_here = [t for t in tree.nodes[p.parent_id].turns if t.kind == "score" and t.meta["child"] == child.node_id]
        assert len(scored_here) == 1 and scored_here[0] == p.branches[0].score_turn
        assert all(b.score_turn is None or b.score_turn.meta["detached"] for b in p.branches[1:])
        for b in p.branches:  # a forced zero exactly when the branch did not finish or left no output
            output = (b.tree.root.result.get("finish_message") or "").strip()
            assert b.score.forced == (not b.finished or output == "")
    valid = [p for p in points if not p.ranking.skipped]
    assert valid, "no mixed group: the noisy expert must fail some branches"
    assert all(p.ranking.accuracy == 1.0 for p in valid)  # the expert's rubric ranks successes first
    for p in points:
        if p.ranking.skipped:
            assert len(set(p.labels)) == 1
    return points


def test_counterfactual_groups_textcraft(tokenizer, val_tasks):
    actor = ExpertPolicy(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate", waste=0.3, early_finish=0.1))
    rollouts = Runtime("textcraft", actor, RuntimeConfig(counterfactual=8)).run(pick(val_tasks, "medium", 3))
    points = check_groups(rollouts)
    assert len({json.dumps(b.state_after, sort_keys=True) for p in points for b in p.branches}) > 1
    assert all(len({json.dumps(p.state_before, sort_keys=True)}) == 1 for p in points)


def test_rubric_and_scoring_calls_stop_at_their_json_object_and_act_turns_do_not(tokenizer, val_tasks):
    """Every rubric and scoring call asks the policy to stop at the token that closes its
    first JSON object (``SamplingParams.stop_json``); agent turns never do."""
    seen = []

    class Recording(ExpertPolicy):
        async def complete(self, call):
            seen.append((call.kind, call.params.stop_json))
            return await super().complete(call)

    actor = Recording(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate", waste=0.3, early_finish=0.1))
    Runtime("textcraft", actor, RuntimeConfig(counterfactual=4)).run(pick(val_tasks, "medium", 1))
    kinds = {kind for kind, _ in seen}
    assert {"act", "rubric", "score"} <= kinds
    assert all(stop == (kind != "act") for kind, stop in seen)


def test_rescoring_a_point_keeps_its_branches_and_redoes_rubric_and_scores(tokenizer, val_tasks):
    """A fixed set of points, scored again: the same writer and scorer give back the same
    rubric, scores and ranking; another policy's rubric and scores are its own, on the same
    branches; the rubric prompt is exactly what the first writer read."""
    from sera_core.agents.points import DelegationPoint
    from sera_core.agents.prompts import rubric_messages

    actor = ExpertPolicy(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate", waste=0.3, early_finish=0.1))
    rollouts = Runtime("textcraft", actor, RuntimeConfig(counterfactual=8)).run(pick(val_tasks, "medium", 2))
    points = [DelegationPoint.from_json(json.loads(json.dumps(p.to_json()))) for r in rollouts for p in r.points]
    assert points and any(not p.ranking.skipped for p in points)
    for p in points:
        tree = next(r.tree for r in rollouts if r.tree.tree_id == p.tree_id)
        written = tree.nodes[p.parent_id].turns[p.rubric_turn]
        assert actor.chat.prompt(rubric_messages(p.rubric_call["prompt"])) == written.prompt_ids
    again = Runtime("textcraft", actor, RuntimeConfig(seed=5)).rescore_all(points)
    for p, q in zip(points, again, strict=True):
        assert (q.rubric, q.scores, q.labels, q.ranking) == (p.rubric, p.scores, p.labels, p.ranking)
        assert [b.tree for b in q.branches] == [b.tree for b in p.branches]
        assert DelegationPoint.from_json(json.loads(json.dumps(q.to_json()))) == q
    # a policy that writes one fixed rubric and claims every criterion met: every finished
    # branch scores 1 and an unfinished one is a forced 0, whatever the judge said
    rubric_text = json.dumps(GLOBAL_RUBRIC.to_json())

    def script(prompt: str) -> str:
        if "Sub-agent trajectory" not in prompt:
            return rubric_text
        return json.dumps({"success": True, "final_score": 1.0, "reason": "all met", "criterion_scores": [
            {"name": it.name, "score": 1.0, "reason": "met"} for it in GLOBAL_RUBRIC.items]})

    other = Runtime("textcraft", PolicyActor(ScriptedPolicy(tokenizer, script))).rescore_all(points)
    for p, q in zip(points, other, strict=True):
        assert q.rubric == GLOBAL_RUBRIC.to_json() and q.labels == p.labels
        assert q.scores == pytest.approx([1.0 if b.finished and (b.tree.root.result.get("finish_message") or "").strip() else 0.0
                                          for b in p.branches])
    stale = replace(points[0], rubric_call={})
    with pytest.raises(ValueError, match="cannot be rescored"):
        Runtime("textcraft", actor).rescore_all([stale])


def test_counterfactual_groups_textworld_and_fork_cap(tokenizer):
    actor = ExpertPolicy(tokenizer, textworld=tw_expert.ExpertConfig(mode="delegate", mistake=0.15, early_finish=0.05))
    tasks = [tw_task("load_balanced", "medium"), tw_task("critical_path", "hard")]
    rollouts = Runtime("textworld", actor, RuntimeConfig(counterfactual=8)).run(tasks)
    check_groups(rollouts)
    capped = Runtime("textworld", actor, RuntimeConfig(counterfactual=8, fork_cap=8)).run(tasks[:1])[0]
    assert len(capped.points) == 1 and capped.tree.meta["forks"] == 8
    assert any("fork cap" in n.meta.get("counterfactual", "") for n in capped.tree.nodes.values())


# -- a real model: token bookkeeping, batching, determinism, lossless files --------------------------

@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer):
    from sera_core.policy.tiny import TinyModelConfig, init_model

    path = tmp_path_factory.mktemp("tiny_runtime")
    init_model(tokenizer, TinyModelConfig(), seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_model_rollouts_token_bookkeeping(tiny_model, val_tasks, tmp_path):
    from sera_core.policy.hf import HFPolicy

    cfg = RuntimeConfig(max_steps_per_agent=3, max_new_tokens=12, seed=5)

    def run():
        actor = PolicyActor(HFPolicy(tiny_model))
        return Runtime("textcraft", actor, cfg).run(val_tasks[200:202], trees=2), actor

    rollouts, actor = run()
    assert max(actor.batcher.batches) == 4  # four trees' turns generated together
    chat = actor.chat
    for r in rollouts:
        for node in r.tree.nodes.values():
            acts = [t for t in node.turns if t.kind == "act"]
            assert 1 <= len(acts) <= 3
            for prev, turn in zip(acts, acts[1:], strict=False):  # context = previous context + completion + glue
                k = len(prev.prompt_ids) + len(prev.completion_ids)
                assert turn.prompt_ids[:k] == prev.prompt_ids + prev.completion_ids
                assert chat.decode(turn.prompt_ids[k:]).startswith(("<|im_end|>", "\n<|im_start|>user"))
                assert prev.observation in chat.decode(turn.prompt_ids[k:])
            for turn in node.turns:
                assert chat.decode(turn.completion_ids) == turn.text
                assert len(turn.logprobs) == len(turn.roles) == len(turn.completion_ids)
                masks = [turn.mask(role) for role in ROLES]
                assert all(sum(col) == 1 for col in zip(*masks, strict=True))  # roles partition the tokens
    write_rollouts(tmp_path, rollouts)
    again = read_trees(tmp_path / "trees.jsonl")
    assert again == [r.tree for r in rollouts]
    assert [dumps_tree(t) for t in again] == [dumps_tree(r.tree) for r in rollouts]
    text = (tmp_path / "trees.jsonl").read_text()
    assert "prompt_extends" in text  # contexts are stored once, not once per turn
    repeat, _ = run()
    assert [dumps_tree(r.tree) for r in repeat] == [dumps_tree(r.tree) for r in rollouts]  # bit for bit


def test_batcher_batches_concurrent_requests(tokenizer):
    sizes = []

    class Echo(ScriptedPolicy):
        def generate(self, prompts, params):
            sizes.append(len(prompts))
            return super().generate(prompts, params)

    batcher = Batcher(Echo(tokenizer, lambda p: "ok"), max_batch=3)

    async def main():
        from sera_core.policy.base import SamplingParams
        return await asyncio.gather(*(batcher.generate([1, 2, i], SamplingParams()) for i in range(7)))

    outs = asyncio.run(main())
    assert sizes == [3, 3, 1] == batcher.batches and all(o.text == "ok" for o in outs)


def test_an_interruption_in_a_batch_reaches_its_callers_and_the_batcher_serves_on(tokenizer):
    """A ``BaseException`` raised by ``generate`` (an interrupt, pytest-timeout's ``Failed``)
    ends the waiting callers' awaits instead of the flusher alone (a hang before), and the
    next requests start a new flusher."""

    class Interrupted(BaseException):
        pass

    class Once(ScriptedPolicy):
        def __init__(self, *a):
            super().__init__(*a)
            self.failed = False

        def generate(self, prompts, params):
            if not self.failed:
                self.failed = True
                raise Interrupted()
            return super().generate(prompts, params)

    batcher = Batcher(Once(tokenizer, lambda p: "ok"), max_batch=3)

    async def main():
        from sera_core.policy.base import SamplingParams
        calls = asyncio.gather(*(batcher.generate([1, 2, i], SamplingParams()) for i in range(3)))
        return await asyncio.wait_for(calls, timeout=10)

    with pytest.raises(Interrupted):
        asyncio.run(main())
    assert batcher._flusher is None
    assert [o.text for o in asyncio.run(main())] == ["ok"] * 3


def test_a_cancelled_serving_task_cancels_its_callers_and_ends_cancelled():
    """``fail_waiting`` with ``asyncio.CancelledError``: the waiting futures are cancelled (not
    failed with it) and the cancellation goes on up, so the serving task ends cancelled."""
    from sera_core.utils.aio import fail_waiting

    async def main():
        loop = asyncio.get_running_loop()
        waiting, done = loop.create_future(), loop.create_future()
        done.set_result(1)
        with pytest.raises(asyncio.CancelledError):
            fail_waiting([waiting, done], asyncio.CancelledError())
        return waiting.cancelled(), done.result()

    assert asyncio.run(main()) == (True, 1)


def test_a_gate_holds_its_slots_and_admits_round_robin_by_rank():
    """``Gate(2)``: never more than 2 holders; the waiters enter lowest rank first, equal ranks
    in arrival order, and slots are granted only once every coroutine started together has
    queued, so two runs ranked by position enter round robin (a0 b0 a1 b1 ..., not the first
    run's trees into the free slots first); a waiter cancelled before its turn is skipped,
    and one cancelled after its slot was granted hands the slot on instead of keeping it."""
    from sera_core.utils.aio import Gate

    async def main():
        gate, entered, holding = Gate(2), [], [0]
        peak = [0]

        async def job(name: str, rank: int, hold: float = 0.0):
            async with gate.hold(rank):
                entered.append(name)
                holding[0] += 1
                peak[0] = max(peak[0], holding[0])
                await asyncio.sleep(hold)
                holding[0] -= 1

        runs = [job(f"{run}{k}", k, 0.01) for run in "ab" for k in range(3)]
        await asyncio.gather(*runs)
        order = list(entered)
        entered.clear()

        async with gate.hold(), gate.hold():  # both slots taken: the next two must wait
            skipped = asyncio.ensure_future(job("skipped", 0))
            granted = asyncio.ensure_future(job("granted-then-cancelled", 1))
            last = asyncio.ensure_future(job("last", 2))
            await asyncio.sleep(0)
            skipped.cancel()
        granted.cancel()  # its slot was granted as the block released, before it ran
        await asyncio.gather(skipped, granted, last, return_exceptions=True)
        return order, peak[0], entered, gate._free

    order, peak, after, free = asyncio.run(main())
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"] and peak == 2
    assert after == ["last"] and free == 2  # every slot back
    with pytest.raises(ValueError, match="at least 1 slot"):
        Gate(0)
    used = Gate(1)

    async def enter():
        async with used.hold():
            pass

    asyncio.run(enter())
    with pytest.raises(RuntimeError, match="one event loop"):  # another asyncio.run: another loop
        asyncio.run(enter())


# -- adversarial model output ---------------------------------------------------------------------

BAD_RUBRICS = {
    "garbage": "I think the child should do well. No JSON here.",
    "truncated": '{"rubric_items": [{"name": "a", "weight": 0.5, "descr',
    "huge": json.dumps({**textworld_rubric("x"), "rubric_items": [
        {**i, "weight": 1e400 if k == 0 else i["weight"]} for k, i in enumerate(textworld_rubric("x")["rubric_items"])]}
    ).replace("Infinity", "1e400"),
    "nan": json.dumps(textworld_rubric("x")).replace('"weight": 0.5', '"weight": NaN'),
    "nine_items": json.dumps({**textworld_rubric("x"), "rubric_items": textworld_rubric("x")["rubric_items"] * 2}),
    "negative": json.dumps(textworld_rubric("x")).replace('"weight": 0.15', '"weight": -0.15'),
    "no_gate": json.dumps({k: v for k, v in textworld_rubric("x").items() if k != "success_gate"}),
}
GOOD_RUBRIC = json.dumps(textworld_rubric("prepare and eat dish_1"))
ITEMS = [i["name"] for i in textworld_rubric("x")["rubric_items"]]
BAD_SCORES = {
    "garbage": "looks fine to me",
    "truncated": '{"success": true, "criterion_scores": [{"name": "goal',
    "nan": json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 1.0} for n in ITEMS]}).replace("1.0", "NaN", 1),
    "huge": json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 1e308} for n in ITEMS]}),
    "no_success": json.dumps({"criterion_scores": [{"name": n, "score": 1.0} for n in ITEMS]}),
    "all_zero_success": json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 0.0} for n in ITEMS]}),
}


def delegating_script(rubric_text: str, score_text: str):
    def script(prompt: str) -> str:
        role = role_of(prompt)
        if role == "rubric":
            return rubric_text
        if role == "score":
            return score_text
        if role == "root" and turn_number(prompt) == 1:
            return 'I hand dish 1 to a helper. <delegate>{"goal": "prepare and eat dish_1"}</delegate>'
        return "<finish>done</finish>"
    return script


def one_rollout(tokenizer, script, **cfg):
    record = {**make_record(), "task_id": "tw_hand_made"}
    return Runtime("textworld", PolicyActor(ScriptedPolicy(tokenizer, script)), RuntimeConfig(**cfg)).run([record])[0]


@pytest.mark.parametrize("case", sorted(BAD_RUBRICS))
def test_malformed_rubric_is_recorded_never_raised(tokenizer, case):
    out = one_rollout(tokenizer, delegating_script(BAD_RUBRICS[case], "unused"))
    child = out.tree.nodes["0.1"]
    assert "error" not in out.tree.meta
    assert child.rubric is None and child.rubric_error and child.score is None
    rubric_turn = next(t for t in out.tree.root.turns if t.kind == "rubric")
    assert rubric_turn.text == BAD_RUBRICS[case]  # the raw text is kept
    assert child.result["reward"] is None and child.result["reward_source"] == "dropped"


@pytest.mark.parametrize("case", sorted(BAD_SCORES))
def test_malformed_score_is_recorded_never_raised(tokenizer, case):
    out = one_rollout(tokenizer, delegating_script(GOOD_RUBRIC, BAD_SCORES[case]))
    child = out.tree.nodes["0.1"]
    assert child.rubric is not None and child.finished
    assert child.score is None and child.score_error
    assert child.result["reward"] is None


def test_malformed_policies(tokenizer):
    script = delegating_script(BAD_RUBRICS["garbage"], "unused")
    fallback = one_rollout(tokenizer, script, malformed_policy="binary_fallback").tree.nodes["0.1"]
    assert fallback.label is False and fallback.result == {**fallback.result, "reward": 0.0, "reward_source": "binary_fallback"}
    dropped = one_rollout(tokenizer, script, malformed_policy="drop_rollout")
    assert dropped.tree.meta["drop_rollout"] is True


def test_valid_score_and_forced_zero(tokenizer):
    good = json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 0.5} for n in ITEMS], "final_score": 0.9})
    child = one_rollout(tokenizer, delegating_script(GOOD_RUBRIC, good)).tree.nodes["0.1"]
    assert child.score["final_score"] == pytest.approx(0.5) and child.score["claimed_score"] == 0.9

    def never_finishes(prompt):
        return "<action>inventory</action>" if role_of(prompt) == "child" else delegating_script(GOOD_RUBRIC, good)(prompt)
    out = one_rollout(tokenizer, never_finishes, max_steps_per_agent=3)
    child = out.tree.nodes["0.1"]
    assert not child.finished and child.result["end"] == "steps"
    assert child.score["forced"] and child.score["final_score"] == 0.0 and child.score["gate"] == 0
    assert not [t for t in out.tree.root.turns if t.kind == "score"]  # no scoring call

    def finishes_empty(prompt):  # issue 17.7: finish with no usable output
        return "<finish> </finish>" if role_of(prompt) == "child" else delegating_script(GOOD_RUBRIC, good)(prompt)
    out = one_rollout(tokenizer, finishes_empty)
    child = out.tree.nodes["0.1"]
    assert child.finished and child.score["forced"] and child.score["final_score"] == 0.0
    assert child.score["reason"] == "the child finished with no output"
    assert not [t for t in out.tree.root.turns if t.kind == "score"]


# -- budgets --------------------------------------------------------------------------------------

def test_depth_cap_and_told_so(tokenizer, val_tasks):
    task = pick(val_tasks, "easy", 1)[0]
    target = next(iter(task["misc"]["target_items"]))

    def script(prompt):
        if role_of(prompt) == "rubric":
            return GOOD_RUBRIC
        return f"<thought>delegate</thought><python>print(await launch_subagent({{{target!r}: 1}}))</python>"
    out = Runtime("textcraft", PolicyActor(ScriptedPolicy(tokenizer, script)), RuntimeConfig(max_steps_per_agent=1)).run([task])[0]
    depths = sorted(n.depth for n in out.tree.nodes.values())
    assert depths == [0, 1, 2, 3]
    deepest = next(n for n in out.tree.nodes.values() if n.depth == 3)
    chat = ChatFormat(tokenizer)
    assert "cannot delegate" in chat.decode(deepest.turns[0].prompt_ids)
    assert "maximum delegation depth" in deepest.turns[0].observation
    assert all(n.score["forced"] for n in out.tree.nodes.values() if n.parent_id)  # nobody finished
    assert all(t.roles.count("launch") > 0 for n in out.tree.nodes.values() for t in n.turns if t.kind == "act")


def test_loop_detector_and_context_limit(tokenizer, val_tasks):
    task = val_tasks[0]
    loop = Runtime("textcraft", PolicyActor(ScriptedPolicy(tokenizer, lambda p: "<python>print(1)</python>"))).run([task])[0]
    assert loop.tree.root.result["end"] == "loop" and len(loop.tree.root.turns) == 4
    prompt_len = len(loop.tree.root.turns[0].prompt_ids)
    tight = RuntimeConfig(max_context_tokens=prompt_len + 30)
    out = Runtime("textcraft", PolicyActor(ScriptedPolicy(tokenizer, lambda p: "<python>print(view_inventory())</python>")),
                  tight).run([task])[0]
    assert out.tree.root.result["end"] == "context" and out.tree.root_reward == 0.0
    assert all(len(t.prompt_ids) + len(t.completion_ids) <= prompt_len + 30 for t in out.tree.root.turns)
    assert looping(["a", "b"] * 4, 4) and not looping(["a", "b"] * 3 + ["a"], 4)


# -- ablation variants ----------------------------------------------------------------------------

def test_global_rubric_and_external_writer_scorer(tokenizer):
    script = delegating_script(GOOD_RUBRIC, "unused")
    out = one_rollout(tokenizer, script, rubric_writer="global", scorer="policy")
    child = out.tree.nodes["0.1"]
    assert child.rubric == GLOBAL_RUBRIC.to_json() and not [t for t in out.tree.root.turns if t.kind == "rubric"]
    external = ExpertPolicy(tokenizer)
    record = {**make_record(), "task_id": "tw_hand_made"}
    runtime = Runtime("textworld", PolicyActor(ScriptedPolicy(tokenizer, script)),
                      RuntimeConfig(rubric_writer="external", scorer="external"), external=external)
    tree = runtime.run([record])[0].tree
    child = tree.nodes["0.1"]
    assert child.meta["rubric_source"] == "external" and child.rubric is not None and child.score is not None
    assert [t.kind for t in tree.root.turns] == ["act", "act"]  # the external model's tokens are not the policy's
    with pytest.raises(ValueError, match="external"):
        Runtime("textworld", external, RuntimeConfig(scorer="external"))
    with pytest.raises(ValueError, match="rubric_writer"):
        RuntimeConfig(rubric_writer="nobody")


def test_summary_and_files(tokenizer, tmp_path):
    good = json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 1.0} for n in ITEMS]})
    out = one_rollout(tokenizer, delegating_script(GOOD_RUBRIC, good))
    summary = summarize([out])
    assert summary["rubrics"] == {"written": 1, "valid": 1, "validity": 1.0}
    assert summary["scores"]["scored"] == 1 and summary["delegations"] == 1 and summary["groups"]["total"] == 0
    write_rollouts(tmp_path, [out], summary)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert read_points(tmp_path / "delegation_points.jsonl") == []


def test_config_validation():
    for bad in ({"counterfactual": 1}, {"max_steps_per_agent": 0}, {"malformed_policy": "ignore"}, {"temperature": -1}):
        with pytest.raises(ValueError):
            replace(RuntimeConfig(), **bad)


def test_external_model_over_http_writes_and_scores(tokenizer):
    from http_endpoint import Endpoint, completion

    from sera_core.agents.actors import ExternalChatActor
    from sera_core.chat_endpoint import ChatEndpoint, ChatEndpointConfig

    good = json.dumps({"success": True, "criterion_scores": [{"name": n, "score": 1.0} for n in ITEMS]})
    endpoint = Endpoint()
    try:
        endpoint.push(body=completion(GOOD_RUBRIC, usage=(300, 120)))
        endpoint.push(body=completion(good, usage=(500, 40)))
        config = ChatEndpointConfig(base_url=endpoint.url, model="writer", max_retries=0, timeout_s=5.0)
        external = ExternalChatActor(ChatEndpoint(config))
        record = {**make_record(), "task_id": "tw_hand_made"}
        runtime = Runtime("textworld", PolicyActor(ScriptedPolicy(tokenizer, delegating_script("unused", "unused"))),
                          RuntimeConfig(rubric_writer="external", scorer="external"), external=external)
        child = runtime.run([record])[0].tree.nodes["0.1"]
        assert child.rubric == json.loads(json.dumps(parse_rubric_json(GOOD_RUBRIC)))
        assert child.score["final_score"] == pytest.approx(1.0) and child.meta["score_call"]["input_tokens"] == 500
        first, second = (r["body"] for r in endpoint.received)
        assert "Delegated subtask" in first["messages"][1]["content"] and first["temperature"] == 1.0
        assert "Sub-agent trajectory" in second["messages"][1]["content"] and second["temperature"] == 0.0
        assert (external.stats.calls, external.stats.input_tokens, external.stats.output_tokens) == (2, 800, 160)
        endpoint.push(status=500, body={"error": "down"})  # a failed writer: recorded as malformed, never raised
        child = runtime.run([record])[0].tree.nodes["0.1"]
        assert child.rubric is None and child.meta["rubric_call"]["error"].startswith("HTTP 500")
        assert external.stats.failures == 1
    finally:
        endpoint.close()


def parse_rubric_json(text: str) -> dict:
    from sera_core.rubrics import parse_rubric

    return parse_rubric(text).value.to_json()


def test_counterfactual_rollouts_repeat_bit_for_bit(tokenizer):
    actor = ExpertPolicy(tokenizer, textworld=tw_expert.ExpertConfig(mode="delegate", mistake=0.2, early_finish=0.05))
    task = tw_task("conflict", "medium")

    def run(seed):
        out = Runtime("textworld", actor, RuntimeConfig(counterfactual=4, seed=seed)).run([task])[0]
        return dumps_tree(out.tree), json.dumps([p.to_json() for p in out.points], sort_keys=True)

    first = run(0)
    assert run(0) == first
    assert run(1) != first  # the seed reaches the branches' noise
