"""The evaluator: the paper's contract for any policy, resumable, shardable (SPEC 5, 8).

**Contract** (SPEC 5): temperature 0 (agents, rubrics and scores), one recursive tree per
task, 20 steps per agent, depth 3; the root checker decides; an evaluation error (a
rollout that raised) is a failure. ``seeds`` runs the whole task list once per runtime
seed ``0..seeds-1`` and reports mean and standard deviation over them (at temperature 0
the seeds matter only where something samples, e.g. test-time selection's candidates;
the paper's 3 seeds are 3 *trained* models: evaluate each checkpoint and let the report
combine their summaries). ``select = N > 1`` turns on test-time selection (SPEC 8,
:class:`~sera_core.agents.runtime.RuntimeConfig.select`).

**Files** in ``out``: ``plan.json`` (task ids, seeds, shard count, settings, label and
policy: a rerun with any of them changed is refused, so two models never mix); one row per finished task, appended and flushed as soon as it
finishes, to ``seed{s}.shard{i}of{n}.jsonl`` (a crash loses at most the tasks in flight;
a half-written last line is dropped on reopening); after all shards finished,
:func:`merge` checks that every task has exactly one row per seed and writes
``seed{s}.jsonl`` (plan order) and ``summary.json`` (``format: sera.eval/1``, see
docs/evaluation.md). ``resume`` skips finished tasks and reruns errored ones (the rerun's
row replaces the errored one); without it, existing rows are an error, never silently
mixed. ``shard=(i, n)`` plays the tasks whose plan index is ``i`` mod ``n``: run the
shards as separate processes or machines on a shared folder, then :func:`merge`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from sera_core.agents.runtime import Rollout, Runtime, RuntimeConfig
from sera_core.envs import DIFFICULTIES
from sera_core.envs.registry import BENCHMARKS
from sera_core.eval.aggregate import summarize_runs
from sera_core.utils.aio import run_sync
from sera_core.utils.errors import UserInputError
from sera_core.utils.jsonio import JsonlCheckpoint, write_atomic, write_jsonl

PLAN_FORMAT = "sera.eval-plan/1"
"""The ``format`` of ``plan.json`` (``summary.json``: :data:`~sera_core.eval.aggregate.SUMMARY_FORMAT`)."""


class EvalError(UserInputError):
    """A refused evaluation: mismatched plan, existing results without resume, missing or doubled rows."""


@dataclass(frozen=True)
class EvalConfig:
    """One evaluation (defaults: the paper's contract)."""

    env: str
    """``textcraft`` or ``textworld``."""
    seeds: int = 1
    """Runs over the task list (runtime seeds ``0..seeds-1``)."""
    select: int = 1
    """Test-time selection: candidates per delegation (1: plain evaluation)."""
    select_temperature: float = 1.0
    """Sampling temperature of selection candidates."""
    select_fork_cap: int = 32
    """Most forked worlds per task for selection."""
    scorer: str = "policy"
    """Who scores selection candidates: ``policy`` or ``external`` (a judge model)."""
    max_steps_per_agent: int = 20
    """Steps of every agent (the runtime's ``max_steps_per_agent``; ``max_steps`` in ``plan.json``
    and in the summary's ``contract``, as written before the rename)."""
    max_depth: int = 3
    """Depth cap."""
    max_new_tokens: int | None = None
    """Per-turn completion cap (None: the benchmark's, as in the contract; smaller only
    for quick looks, e.g. a notebook's smoke run)."""
    concurrency: int = 16
    """Tasks played at once (their model calls are batched together)."""
    label: str = ""
    """What was evaluated, model and scale (e.g. ``SmolLM2-135M + LoRA (CPU), SERA tiny run``): the report's row name."""
    method: str | None = None
    """The method row it stands for (``sera``, ``rao``, ...), if any."""
    policy: str = ""
    """The policy spec it was run with (``expert``, ``hf:PATH``, ...), recorded only."""
    judge: str = "program"
    """Who labels the ordinary children (each row's ``children_passed``; the root checker
    alone decides success): ``program`` (the benchmarks' checkers) or ``llm`` (TextWorld:
    free-form subgoals go to an OpenAI-compatible judge, canonical ones to the checker;
    pass the judge object to :func:`evaluate`)."""
    judge_model: str | None = None
    """The LLM judge's model name (recorded in the plan: two judges never mix)."""

    def __post_init__(self) -> None:
        if self.env not in BENCHMARKS:
            raise EvalError(f"env must be one of {list(BENCHMARKS)}, got {self.env!r}")
        if self.judge not in BENCHMARKS[self.env].judges or (self.judge == "llm" and not self.judge_model):
            raise EvalError(f"judge must be one of {', '.join(BENCHMARKS[self.env].judges)} for {self.env} "
                            "('llm' with a judge model)")
        if self.seeds < 1 or self.select < 1 or self.concurrency < 1:
            raise EvalError("seeds, select and concurrency must be >= 1")
        self.runtime(0)  # the runtime's own checks, before any work

    def runtime(self, seed: int) -> RuntimeConfig:
        """The runtime settings of one run (the contract, plus selection)."""
        return RuntimeConfig(temperature=0.0, rubric_temperature=0.0, score_temperature=0.0, max_steps_per_agent=self.max_steps_per_agent,
                             max_depth=self.max_depth, max_new_tokens=self.max_new_tokens, select=self.select,
                             select_temperature=self.select_temperature,
                             select_fork_cap=self.select_fork_cap, scorer=self.scorer, seed=seed)


def shard_file(out: Path, seed: int, shard: tuple[int, int]) -> Path:
    return out / f"seed{seed}.shard{shard[0]}of{shard[1]}.jsonl"


def task_row(rollout: Rollout, index: int, seed: int) -> dict[str, Any]:
    """One task's result: success (the root checker; False on error), error, size, the
    judge's labels of the children (``children_labelled``, ``children_passed``) and time."""
    tree = rollout.tree
    error = tree.meta.get("error")
    acts = sum(1 for n in tree.nodes.values() for t in n.turns if t.kind == "act")
    labels = [n.label for n in tree.nodes.values() if n.label is not None]
    return {"task_id": tree.task_id, "index": index, "seed": seed, "difficulty": tree.meta.get("difficulty"),
            "family": tree.meta.get("task_family"), "success": bool(tree.root_reward == 1.0 and error is None),
            "error": error, "agents": len(tree.nodes), "steps": acts, "forks": tree.meta.get("forks", 0),
            "children_labelled": len(labels), "children_passed": sum(labels), "seconds": rollout.seconds}


def eval_plan(cfg: EvalConfig, ids: list[str], shards: int) -> dict[str, Any]:
    """The ``plan.json`` that :func:`evaluate` writes for ``cfg`` on the task ids ``ids`` in
    ``shards`` shards: what an evaluation folder is an evaluation of."""
    config = {("max_steps" if k == "max_steps_per_agent" else k): v  # plan.json keeps its key
              for k, v in asdict(cfg).items() if k not in ("concurrency", "label", "policy")}
    return {"format": PLAN_FORMAT, "env": cfg.env, "tasks": ids, "seeds": list(range(cfg.seeds)), "shards": shards,
            "config": config, "label": cfg.label, "policy": cfg.policy}


_PLAN_FIELDS = {"env": str, "tasks": list, "seeds": list, "shards": int, "config": dict, "label": str, "policy": str}
_ROW_FIELDS = {"task_id": (str,), "success": (bool,), "error": (str, type(None)), "difficulty": (str,),
               "seconds": (int, float)}


def read_plan(out: Path) -> dict[str, Any]:
    """The ``plan.json`` of an evaluation folder, checked (:class:`EvalError` naming the file
    and the first bad field otherwise)."""
    path = Path(out) / "plan.json"
    try:
        plan = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EvalError(f"{path}: not a JSON plan ({exc})") from None
    if not isinstance(plan, dict) or plan.get("format") != PLAN_FORMAT:
        raise EvalError(f"{path}: not an evaluation plan (format {PLAN_FORMAT!r} expected)")
    for key, kind in _PLAN_FIELDS.items():
        value = plan.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 1):
            raise EvalError(f"{path}: {key!r} must be {kind.__name__}{' >= 1' if kind is int else ''}, got {value!r}")
    if plan["env"] not in BENCHMARKS:
        raise EvalError(f"{path}: 'env' must be one of {list(BENCHMARKS)}, got {plan['env']!r}")
    if not plan["tasks"] or not plan["seeds"] or not all(isinstance(t, str) for t in plan["tasks"]) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in plan["seeds"]):
        raise EvalError(f"{path}: 'tasks' must be task ids and 'seeds' integers (neither empty)")
    missing = [k for k in ("select", "max_steps", "max_depth", "max_new_tokens") if k not in plan["config"]]
    if missing:
        raise EvalError(f"{path}: 'config' lacks {', '.join(missing)}")
    return plan


def _check_row(row: dict[str, Any], path: Path) -> None:
    """One result row's fields have their types, its difficulty is a level (:class:`EvalError`
    naming the file and task)."""
    for key, kinds in _ROW_FIELDS.items():
        value = row.get(key)
        if key not in row or not isinstance(value, kinds) or (kinds == (int, float) and isinstance(value, bool)) or (
                key == "difficulty" and value not in DIFFICULTIES):
            raise EvalError(f"{path}: the row of task {row.get('task_id')!r} has a bad {key!r} ({value!r})")


def plan_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The fields of an evaluation plan (``env``, ``tasks``, ``seeds``, ``shards``, ``config``,
    ``label``, ``policy``) in which the plans ``old`` and ``new`` differ (empty: the same evaluation)."""
    return [k for k in _PLAN_FIELDS if old.get(k) != new.get(k)]


def _check_plan(out: Path, plan: dict[str, Any]) -> None:
    """Write ``plan.json``, or check that an existing one describes the same evaluation."""
    path = out / "plan.json"
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(plan, indent=1).encode())
        return
    diff = plan_differences(read_plan(out), plan)
    if diff:
        raise EvalError(f"{out} holds an evaluation with other {', '.join(diff)}; use another --out")


async def _play(runtime: Runtime, todo: list[tuple[int, dict]], seed: int, ckpt: JsonlCheckpoint, bar, limit: int) -> None:
    """Play ``todo`` (index, record) with at most ``limit`` at once; write each row as it finishes."""
    gate = asyncio.Semaphore(limit)
    passed = [0, 0]

    async def one(index: int, record: dict) -> None:
        async with gate:
            rollout = await runtime.rollout(record, f"{runtime.benchmark.task_id(record)}/s{seed}")
        row = task_row(rollout, index, seed)
        ckpt.add(row)
        passed[0] += row["success"]
        passed[1] += 1
        bar.update(1)
        bar.set_postfix(success=f"{passed[0] / passed[1]:.1%}")

    await asyncio.gather(*(one(i, r) for i, r in todo))


def evaluate(records: list[dict], actor: Any, out: str | Path, cfg: EvalConfig, *, shard: tuple[int, int] = (0, 1),
             resume: bool = False, external: Any = None, judge: Any = None, official: bool = False,
             progress: bool = True) -> dict[str, Any]:
    """Evaluate ``actor`` on ``records`` into ``out`` (module docstring). ``actor`` is an actor
    or a policy spec (``expert``, ``tiny``, ``hf:PATH``, ``vllm:PATH``:
    :func:`~sera_core.agents.actors.make_actor`); ``judge`` labels the
    children (default: the benchmark's program checker; :meth:`~sera_core.envs.registry.Benchmark.make_judge`
    builds the one ``cfg.judge`` names). Returns the
    summary when the evaluation is complete (one shard, or the last shard to finish
    merges), else ``{"shard": ..., "complete": False}``; either with ``played``: the
    rollouts this call played (resumed rows not counted)."""
    out = Path(out)
    if isinstance(actor, str):
        from sera_core.agents.actors import make_actor

        actor = make_actor(actor)
    i, n = shard
    if not (0 <= i < n):
        raise EvalError(f"shard must be i/n with 0 <= i < n, got {i}/{n}")
    if (judge is None) != (cfg.judge == "program"):
        raise EvalError(f"cfg.judge is {cfg.judge!r}: pass the judge object exactly when it is 'llm'")
    probe = Runtime(cfg.env, actor, cfg.runtime(0), external=external, judge=judge, official=official)
    ids = [probe.benchmark.task_id(r) for r in records]
    if len(set(ids)) != len(ids):
        raise EvalError("task ids are not unique")
    _check_plan(out, eval_plan(cfg, ids, n))
    mine = [(k, r) for k, r in enumerate(records) if k % n == i]
    played = 0
    for seed in range(cfg.seeds):
        ckpt = JsonlCheckpoint(shard_file(out, seed, shard), key="task_id")
        if ckpt.records and not resume:
            raise EvalError(f"{ckpt.path} already holds {len(ckpt.records)} results; pass --resume or use another --out")
        todo = [(k, r) for k, r in mine if ids[k] not in ckpt.records or ckpt.records[ids[k]]["error"] is not None]
        played += len(todo)
        runtime = Runtime(cfg.env, actor, cfg.runtime(seed), external=external, judge=judge, official=official)
        bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc=f"eval {cfg.env} seed {seed}",
                   disable=not progress, unit="task")
        try:
            run_sync(partial(_play, runtime, todo, seed, ckpt, bar, cfg.concurrency))
        finally:
            bar.close()
    done = all(shard_file(out, s, (j, n)).exists() for s in range(cfg.seeds) for j in range(n))
    if done:
        try:
            return {**merge(out), "played": played}
        except EvalError:
            if n == 1:
                raise
    return {"shard": f"{i}/{n}", "complete": False, "out": str(out), "played": played}


def merge(out: str | Path) -> dict[str, Any]:
    """Combine the shards of ``out``: exactly one row per task and seed (a task found in
    two shards, or missing, is an :class:`EvalError`); write ``seed{s}.jsonl`` and
    ``summary.json``; return the summary."""
    out = Path(out)
    plan_path = out / "plan.json"
    if not plan_path.exists():
        raise EvalError(f"{out} has no plan.json: not an evaluation folder")
    plan = read_plan(out)
    ids, n = plan["tasks"], plan["shards"]
    per_seed: dict[int, list[dict]] = {}
    for seed in plan["seeds"]:
        rows: dict[str, dict] = {}
        for j in range(n):
            path = shard_file(out, seed, (j, n))
            if not path.exists():
                raise EvalError(f"{out}: shard {j}/{n} of seed {seed} has not run ({path.name} is missing)")
            for task_id, row in JsonlCheckpoint(path, key="task_id").records.items():
                _check_row(row, path)
                if task_id in rows:
                    raise EvalError(f"{out}: task {task_id} has results in two shards (seed {seed}): counted twice")
                rows[task_id] = row
        missing = [t for t in ids if t not in rows]
        if missing:
            raise EvalError(f"{out}: seed {seed}: {len(missing)} task(s) have no result yet (first: {missing[0]}); "
                            "rerun with --resume")
        per_seed[seed] = [rows[t] for t in ids]
        write_jsonl(out / f"seed{seed}.jsonl", per_seed[seed])
    summary = {**summarize_runs(per_seed, plan["env"], label=plan["label"], method=plan["config"].get("method")),
               "policy": plan["policy"], "select": plan["config"]["select"],
               "contract": {"temperature": 0.0, "trees_per_task": 1,
                            **{k: plan["config"][k] for k in ("max_steps", "max_depth", "max_new_tokens")}},
               "judge": {"kind": plan["config"].get("judge", "program"), "model": plan["config"].get("judge_model"),
                         **{k: sum(r.get(k, 0) for rows in per_seed.values() for r in rows)
                            for k in ("children_labelled", "children_passed")}},
               "rollout_seconds": round(sum(r["seconds"] for rows in per_seed.values() for r in rows), 2)}
    write_atomic(out / "summary.json", json.dumps(summary, indent=1).encode())
    return summary
