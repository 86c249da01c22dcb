"""The evaluator: contract, per-task files, resume after a crash, errored tasks retried, shards."""

from __future__ import annotations

import json

import pytest

from sera_core.agents.corpus import default_tokenizer
from sera_core.envs.textcraft import expert as tc_expert
from sera_core.eval.evaluator import EvalConfig, EvalError, evaluate, merge, shard_file
from sera_core.policy.expert import ExpertPolicy
from sera_core.utils.jsonio import read_jsonl


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


@pytest.fixture(scope="module")
def tasks(val_tasks):
    """Two tasks of each difficulty of the val pool."""
    return [t for d in ("easy", "medium", "hard", "extreme") for t in [x for x in val_tasks if x["misc"]["difficulty"] == d][:2]]


def expert(tokenizer, **noise):
    return ExpertPolicy(tokenizer, textcraft=tc_expert.ExpertConfig(mode="delegate", **noise))


class Crashing:
    """The expert, except that its ``after``-th call raises ``exc`` (once, or for ``task`` only)."""

    def __init__(self, actor, after: int, exc: BaseException, task: str | None = None):
        self.actor, self.after, self.exc, self.task, self.calls = actor, after, exc, task, 0
        self.chat, self.enforce_context = actor.chat, actor.enforce_context

    async def complete(self, call):
        self.calls += 1
        if (self.task is None and self.calls == self.after) or (self.task is not None and call.agent.startswith(self.task + "/")):
            raise self.exc
        return await self.actor.complete(call)

    def release(self, agent):
        self.actor.release(agent)


def without_times(summary):
    return {k: v for k, v in summary.items() if k not in ("rollout_seconds", "played")}


def test_expert_scores_100_through_the_evaluator(tokenizer, tasks, tmp_path):
    summary = evaluate(tasks, expert(tokenizer), tmp_path, EvalConfig("textcraft", label="expert"), progress=False)
    assert summary["average"]["mean"] == 100.0 and summary["errors"] == 0
    assert set(summary["by_difficulty"]) == {"easy", "medium", "hard", "extreme"}
    rows = list(read_jsonl(tmp_path / "seed0.jsonl"))
    assert [r["task_id"] for r in rows] == [t["id"] for t in tasks] and all(r["success"] for r in rows)
    assert json.loads((tmp_path / "summary.json").read_text()) == without_times(summary) | {"rollout_seconds": summary["rollout_seconds"]}
    with pytest.raises(EvalError, match="--resume"):  # existing results are never silently mixed
        evaluate(tasks, expert(tokenizer), tmp_path, EvalConfig("textcraft", label="expert"), progress=False)
    with pytest.raises(EvalError, match="config"):  # nor results of another evaluation
        evaluate(tasks, expert(tokenizer), tmp_path, EvalConfig("textcraft", select=2), resume=True, progress=False)
    by_spec = evaluate(tasks[:2], "expert", tmp_path / "spec", EvalConfig("textcraft", label="expert"), progress=False)
    assert by_spec["average"]["mean"] == 100.0  # a policy spec names the actor (make_actor)
    with pytest.raises(EvalError, match="policy"):  # nor of another model
        evaluate(tasks, expert(tokenizer), tmp_path, EvalConfig("textcraft", label="expert", policy="hf:other"),
                 resume=True, progress=False)


def test_crash_mid_run_resumes_without_loss_or_double_counting(tokenizer, tasks, tmp_path):
    noisy = {"waste": 0.1, "early_finish": 0.05}
    reference = evaluate(tasks, expert(tokenizer, **noisy), tmp_path / "ref", EvalConfig("textcraft", concurrency=2),
                         progress=False)
    assert 0 < reference["average"]["mean"] < 100  # a mix of outcomes, so a lost or doubled row would show
    cfg = EvalConfig("textcraft", concurrency=2)
    with pytest.raises(KeyboardInterrupt):
        evaluate(tasks, Crashing(expert(tokenizer, **noisy), 40, KeyboardInterrupt()), tmp_path / "run", cfg, progress=False)
    written = list(read_jsonl(shard_file(tmp_path / "run", 0, (0, 1))))
    assert 0 < len(written) < len(tasks) and not (tmp_path / "run" / "summary.json").exists()
    resumed = evaluate(tasks, expert(tokenizer, **noisy), tmp_path / "run", cfg, resume=True, progress=False)
    assert resumed["played"] == len(tasks) - len(written) and reference["played"] == len(tasks)
    assert without_times(resumed) == without_times(reference)
    assert len(list(read_jsonl(shard_file(tmp_path / "run", 0, (0, 1))))) == len(tasks)


def test_errored_tasks_count_as_failures_and_are_retried(tokenizer, tasks, tmp_path):
    cfg = EvalConfig("textcraft")
    broken = Crashing(expert(tokenizer), 0, RuntimeError("backend fell over"), task=tasks[0]["id"])
    first = evaluate(tasks, broken, tmp_path, cfg, progress=False)
    assert first["errors"] == 1 and first["average"]["mean"] < 100
    row = next(read_jsonl(tmp_path / "seed0.jsonl"))
    assert row["task_id"] == tasks[0]["id"] and not row["success"] and "backend fell over" in row["error"]
    second = evaluate(tasks, expert(tokenizer), tmp_path, cfg, resume=True, progress=False)
    assert second["errors"] == 0 and second["average"]["mean"] == 100.0


def test_shards_merge_to_the_unsharded_result(tokenizer, tasks, tmp_path):
    noisy = {"waste": 0.1, "early_finish": 0.05}
    whole = evaluate(tasks, expert(tokenizer, **noisy), tmp_path / "whole", EvalConfig("textcraft", seeds=2), progress=False)
    out = tmp_path / "sharded"
    part = evaluate(tasks, expert(tokenizer, **noisy), out, EvalConfig("textcraft", seeds=2), shard=(1, 3), progress=False)
    assert part["complete"] is False
    with pytest.raises(EvalError, match="has not run"):
        merge(out)
    evaluate(tasks, expert(tokenizer, **noisy), out, EvalConfig("textcraft", seeds=2), shard=(0, 3), progress=False)
    merged = evaluate(tasks, expert(tokenizer, **noisy), out, EvalConfig("textcraft", seeds=2), shard=(2, 3), progress=False)
    assert without_times(merged) == without_times(whole) and merged["average"]["n"] == 2
    # a row copied into a second shard is counted twice: refused
    extra = next(read_jsonl(shard_file(out, 0, (0, 3))))
    with open(shard_file(out, 0, (1, 3)), "a") as f:
        f.write(json.dumps(extra) + "\n")
    with pytest.raises(EvalError, match="two shards"):
        merge(out)


def test_bad_settings_fail_before_any_work(tmp_path):
    with pytest.raises(EvalError):
        EvalConfig("minecraft")
    with pytest.raises(ValueError, match="select"):
        EvalConfig("textcraft", select=0)
    with pytest.raises(EvalError, match="shard"):
        evaluate([], None, tmp_path, EvalConfig("textcraft"), shard=(3, 2))


def test_selection_through_the_evaluator(tokenizer, val_tasks, tmp_path):
    medium = [t for t in val_tasks if t["misc"]["difficulty"] == "medium"][:3]
    noisy = {"waste": 0.1, "early_finish": 0.05}
    plain = evaluate(medium, expert(tokenizer, **noisy), tmp_path / "n1", EvalConfig("textcraft"), progress=False)
    picked = evaluate(medium, expert(tokenizer, **noisy), tmp_path / "n2", EvalConfig("textcraft", select=2), progress=False)
    assert picked["select"] == 2 and plain["select"] == 1
    rows = list(read_jsonl(tmp_path / "n2" / "seed0.jsonl"))
    assert any(r["forks"] > 0 for r in rows) and all(r["forks"] <= 32 for r in rows)


def test_an_llm_judge_labels_children_in_evaluation_and_is_recorded(tokenizer, tmp_path, capsys):
    """``sera eval --judge llm`` (TextWorld): the judge built from the flags labels the children
    (canonical goals stay with its program checker: no request), the rows count the labels,
    the plan records the judge (another judge is refused) and a judge without a URL exits 2."""
    from http_endpoint import Endpoint

    from sera_core.cli import main
    from sera_core.envs.registry import benchmark
    from sera_core.envs.textworld.expert import ExpertConfig as WorldConfig
    from sera_core.envs.textworld.tasks import generate_split
    from sera_core.envs.textworld.verifier import CanonicalOrLLM

    records = [t for t in generate_split("test") if t["difficulty"] == "easy"][:2]
    actor = ExpertPolicy(tokenizer, textworld=WorldConfig(mode="delegate", split_dishes="always"))
    endpoint = Endpoint()
    try:
        judge = benchmark("textworld").make_judge("llm", url=endpoint.url, model="kimi-test", max_retries=0)
        assert isinstance(judge, CanonicalOrLLM)
        cfg = EvalConfig("textworld", judge="llm", judge_model="kimi-test")
        summary = evaluate(records, actor, tmp_path / "llm", cfg, judge=judge, progress=False)
    finally:
        endpoint.close()
    rows = list(read_jsonl(tmp_path / "llm" / "seed0.jsonl"))
    labelled = sum(r["children_labelled"] for r in rows)
    assert labelled > 0 and judge.stats_snapshot()["calls"] == labelled and endpoint.count == 0
    assert summary["judge"] == {"kind": "llm", "model": "kimi-test", "children_labelled": labelled,
                                "children_passed": sum(r["children_passed"] for r in rows)}
    with pytest.raises(EvalError, match="config"):
        evaluate(records, actor, tmp_path / "llm", EvalConfig("textworld"), resume=True, progress=False)
    with pytest.raises(EvalError, match="judge"):
        EvalConfig("textcraft", judge="llm", judge_model="m")
    with pytest.raises(EvalError, match="judge object"):
        evaluate(records, actor, tmp_path / "other", cfg, progress=False)
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["eval", "--env", "textworld", "--tasks", str(task_file), "--judge", "llm", "--judge-model", "m",
                 "--out", str(tmp_path / "cli")]) == 2
    assert "base URL" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert not (tmp_path / "cli").exists()  # refused before any work
