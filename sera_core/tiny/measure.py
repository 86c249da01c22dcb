"""What a (tiny) model does through the real runtime: the figures its manifest reports.

:func:`measure` plays tasks at temperature 0 (the evaluation contract) and counts:

* ``well_formed``: share of act turns in the benchmark's format (TextCraft: a
  ``<python>`` block whose code parses; TextWorld: exactly one valid block);
* ``rubric_validity`` / ``score_validity``: rubrics that parse (4-8 items, ...) over
  rubrics written; scores that parse over scoring calls made;
* ``success``: root success per benchmark and difficulty;
* ``delegating_tasks``: per difficulty, the share of tasks whose tree has a child.

With ``groups > 0`` it also plays that many tasks of the benchmark's hardest measured level
(TextCraft medium: easy tasks need no delegation, so they have no delegation points) at
temperature 1 with counterfactual groups of 8 and reports ``mixed_groups`` (the share of groups with both outcomes: the
branches really differ) and the scorer's ``pairwise_accuracy`` on them against the
checker's labels.

With ``points > 0`` it also measures the scorer on fixed held-out delegation points
(:func:`~sera_core.eval.points.heldout_points`: the noisy expert's mixed groups of B = 8 on
the last ``points`` tasks of the hardest measured level, disjoint from the tasks played):
the model writes each rubric again at temperature 0 and scores the stored branches
(:meth:`~sera_core.agents.runtime.Runtime.rescore`), so its pairwise accuracy, belief accuracy
(:func:`~sera_core.eval.points.success_belief`), ranking loss and rubric and score validity are
measured even where it never delegates itself.

Tasks are played one difficulty at a time (all tasks of a difficulty concurrently, batched);
``seconds_per_task`` is each run's wall time over its task count (2 cores: what a user waits).
With ``save``, each tree goes to ``SAVE.<env>.<difficulty>.jsonl`` (counterfactual-group trees:
``SAVE.<env>.groups.jsonl``) as soon as it ends (:func:`play_kept`), and the figures to ``SAVE``
after each benchmark and each group run; a rerun with the same file skips what is already
there: a measurement of hours (a medium TextCraft tree of a delegating policy can take an hour
on one core) resumes after an interruption, losing at most the trees in progress. The
held-out points are rescored :data:`POINTS_CHUNK` at a time and each chunk is kept in
``SAVE.<env>.points.jsonl`` as it ends (:func:`rescore_points`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from tqdm.auto import tqdm

from sera_core.agents.actors import PolicyActor
from sera_core.agents.points import DelegationPoint
from sera_core.agents.runtime import Rollout, Runtime, RuntimeConfig
from sera_core.agents.summary import summarize
from sera_core.agents.tree import Tree
from sera_core.envs.registry import BENCHMARKS, pick_tasks, record_value
from sera_core.eval.points import heldout_points, point_metrics
from sera_core.policy.hf import HFPolicy
from sera_core.utils.aio import Gate, run_sync
from sera_core.utils.errors import UserInputError
from sera_core.utils.jsonio import read_jsonl, write_atomic, write_jsonl

POINTS_CHUNK = 4
"""Held-out points rescored at once (about 33 calls, one batch): the unit a rerun resumes from."""

TREES_IN_FLIGHT = 32
"""Trees a protocol measurement plays at a time across its sets (:func:`measure_protocol`)."""


def well_formed(text: str, benchmark: str) -> bool:
    """Whether one act reply is in the benchmark's format (:meth:`~sera_core.envs.registry.Benchmark.well_formed`)."""
    return BENCHMARKS[benchmark].well_formed(text)


def points_tasks(benchmark: str, count: int) -> list[dict]:
    """The last ``count`` tasks of the benchmark's hardest measured level (``measured_levels``) in its
    evaluation split: where ``measure(points=...)`` (and ``scripts/tiny_experiment.py``) build
    the held-out delegation points."""
    return pick_tasks(benchmark, difficulty=BENCHMARKS[benchmark].measured_levels[-1])[-count:] if count else []


def measured_tasks(benchmark: str, per_level: int) -> list[dict]:
    """The held-out tasks ``sera tiny measure`` plays: ``per_level`` tasks of each of the
    benchmark's ``measured_levels`` from its evaluation split (the first ones, or with
    ``measured_spread`` spread evenly over the level: TextWorld's test file is ordered by family)."""
    bench = BENCHMARKS[benchmark]
    return pick_tasks(benchmark, difficulty=bench.measured_levels, per_level=per_level, spread=bench.measured_spread)


def _figures(rollouts: list, benchmark: str) -> dict[str, Any]:
    """The figures of one benchmark; rubric, score and delegation counts come from :func:`summarize`."""
    summary = summarize(rollouts)
    acts = [t for r in rollouts for n in r.tree.nodes.values() for t in n.turns if t.kind == "act"]
    scores = summary["scores"]
    calls = scores["scored"] + scores["malformed"]
    by: dict[str, list[float]] = defaultdict(list)
    delegated: dict[str, list[bool]] = defaultdict(list)
    for r in rollouts:
        by[str(r.tree.meta.get("difficulty"))].append(r.tree.root_reward or 0.0)
        delegated[str(r.tree.meta.get("difficulty"))].append(len(r.tree.nodes) > 1)
    return {
        "tasks": len(rollouts),
        "well_formed": round(fmean([well_formed(t.text, benchmark) for t in acts]), 4) if acts else None,
        "delegations": summary["delegations"],
        "rubric_validity": summary["rubrics"]["validity"],
        "score_validity": round(scores["scored"] / calls, 4) if calls else None,
        "success": {d: round(fmean(v), 4) for d, v in sorted(by.items())},
        "delegating_tasks": {d: round(fmean(v), 4) for d, v in sorted(delegated.items())},
    }


def results_table(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A manifest's ``results`` (what notebook 00 shows) as table columns, one per measured entry:
    for a played entry (one with ``success``) its tasks, well-formed turns, rubric and score
    validity, success and share of delegating roots per difficulty, and its ``role`` (dev or
    test) when it has one; for a held-out points entry its greedy pairwise accuracy and ranking
    loss. Both shapes a manifest holds: one entry per benchmark (:func:`measure`, the adapter
    shipped before the protocols) or one per protocol set (:func:`measure_protocol`, written by
    ``sera tiny ship``); the ``note`` is left out."""
    table: dict[str, dict[str, Any]] = {}
    for name, r in results.items():
        if name == "note" or not isinstance(r, dict):
            continue
        role = {"role": r["role"]} if "role" in r else {}
        if "success" in r:
            table[name] = {**role, "tasks": r["tasks"], "well-formed turns": r["well_formed"],
                           "valid rubrics": r["rubric_validity"], "valid scores": r["score_validity"],
                           **{f"success {d}": v for d, v in r["success"].items()},
                           **{f"delegating {d}": v for d, v in r["delegating_tasks"].items()}}
        elif "pairwise_accuracy" in r:
            table[name] = {**role, "points": r["points"], "greedy pairwise accuracy": r["pairwise_accuracy"],
                           "ranking loss": r["ranking_loss"]}
    return table


def measure(model: str | os.PathLike, tasks: dict[str, list[dict]], *, groups: int = 0, points: int = 0, seed: int = 0,
            max_batch: int = 64, progress: bool = False, save: str | os.PathLike | None = None) -> dict[str, Any]:
    """Figures of ``model`` on ``tasks`` (``{benchmark name: [task records]}``, e.g.
    :func:`measured_tasks` of each);
    ``groups`` and ``points`` add the counterfactual-group and held-out-point figures;
    ``progress`` shows a progress bar per run; ``save`` keeps partial results (module docstring)."""
    save = Path(save) if save is not None else None
    out: dict[str, Any] = json.loads(save.read_text()) if save is not None and save.exists() else {}
    policy = None

    def keep() -> None:
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(save, json.dumps(out, indent=1).encode())

    for benchmark, benchmark_tasks in tasks.items():
        if benchmark in out and (not groups or "mixed_groups" in out[benchmark]) and (not points or "points" in out[benchmark]):
            continue
        policy = policy or HFPolicy(model)  # a model or adapter folder (the embedded policy is an adapter)
        if benchmark not in out:
            rollouts, seconds = [], {}
            greedy = RuntimeConfig(temperature=0.0, rubric_temperature=0.0, seed=seed)
            for level in dict.fromkeys(_difficulty(t) for t in benchmark_tasks):
                part = [t for t in benchmark_tasks if _difficulty(t) == level]
                kept = save.with_name(f"{save.name}.{benchmark}.{level}.jsonl") if save is not None else None
                played, wall = play_kept(Runtime(benchmark, PolicyActor(policy, max_batch=max_batch), greedy), part,
                                         progress=progress, kept=kept)
                rollouts += played
                seconds[level] = round(wall / len(part), 1)
            out[benchmark] = _figures(rollouts, benchmark) | {"seconds_per_task": seconds}
            keep()
        if groups and "mixed_groups" not in out[benchmark]:
            kept = save.with_name(f"{save.name}.{benchmark}.groups.jsonl") if save is not None else None
            counted = summarize(play_groups(PolicyActor(policy, max_batch=max_batch), benchmark, group_tasks(benchmark_tasks, groups),
                                            seed=seed, progress=progress, kept=kept))
            total, valid = counted["groups"]["total"], counted["groups"]["valid"]
            out[benchmark]["groups"] = total
            out[benchmark]["mixed_groups"] = round(valid / total, 4) if total else None
            out[benchmark]["pairwise_accuracy"] = counted["mean_pairwise_accuracy"]
            keep()
        if points and "points" not in out[benchmark]:
            kept = save.with_name(f"{save.name}.{benchmark}.points.jsonl") if save is not None else None
            rescored, seconds = rescore_points(policy, benchmark, points, seed=seed, max_batch=max_batch, progress=progress,
                                               kept=kept)
            out[benchmark]["points"] = point_metrics(rescored, policy.decode) | {"tasks": points, "seconds": seconds}
            keep()
    return out


def rescore_points(policy: Any, benchmark: str, tasks: int | list[dict], *, seed: int = 0, max_batch: int = 64,
                   progress: bool = False, kept: Path | None = None,
                   chunk: int = POINTS_CHUNK) -> tuple[list[DelegationPoint], float]:
    """The held-out points of the last ``tasks`` tasks (:func:`points_tasks`), or of the task
    records ``tasks``, rescored by ``policy`` (a token-level policy, or an actor: anything with
    ``complete``) at temperature 0, ``chunk`` points at a time, and the seconds it took.

    With ``kept``, each finished chunk is added to that JSON-lines file (one rescored point
    and its share of the chunk's seconds a line; the file is replaced atomically) and a rerun
    starts after the points already there, so an interrupted run of hours loses at most one
    chunk. A line whose point is not the held-out point expected at its position (another
    ``tasks``, ``seed`` or code version) is an error, not a silent mix. :func:`rescore_points_async`
    is the same inside a running event loop."""
    return run_sync(lambda: rescore_points_async(policy, benchmark, tasks, seed=seed, max_batch=max_batch,
                                                 progress=progress, kept=kept, chunk=chunk))


async def rescore_points_async(policy: Any, benchmark: str, tasks: int | list[dict], *, seed: int = 0,
                               max_batch: int = 64, progress: bool = False, kept: Path | None = None,
                               chunk: int = POINTS_CHUNK) -> tuple[list[DelegationPoint], float]:
    """:func:`rescore_points` as a coroutine: its chunks' calls join whatever else the loop
    plays through the same actor (a protocol measurement's sets, :func:`measure_protocol`).
    The noisy expert's points are played in a worker thread, so the loop goes on meanwhile."""
    records = points_tasks(benchmark, tasks) if isinstance(tasks, int) else tasks
    held = await asyncio.to_thread(heldout_points, benchmark, records, seed=seed)
    rows = list(read_jsonl(kept)) if kept is not None and kept.exists() else []
    done = [DelegationPoint.from_json(row["point"]) for row in rows]
    if len(done) > len(held):
        raise UserInputError(f"{kept}: {len(done)} points kept, only {len(held)} held out: remove it")
    for i, (point, want) in enumerate(zip(done, held[:len(done)], strict=True)):
        if (point.tree_id, point.child_id) != (want.tree_id, want.child_id):
            raise UserInputError(f"{kept}: line {i + 1} holds point {point.tree_id}/{point.child_id}, expected "
                                 f"{want.tree_id}/{want.child_id}: it was written for other held-out points; remove it")
    seconds = sum(row["seconds"] for row in rows)
    greedy = RuntimeConfig(temperature=0.0, rubric_temperature=0.0, seed=seed)
    actor = policy if hasattr(policy, "complete") else PolicyActor(policy, max_batch=max_batch)
    runtime = Runtime(benchmark, actor, greedy)
    for start in tqdm(range(len(done), len(held), chunk), desc=f"rescore {benchmark} points ({chunk} at a time)",
                      disable=not progress):
        t0 = time.perf_counter()
        part = await runtime.rescore_many(held[start:start + chunk])
        share = (time.perf_counter() - t0) / len(part)
        seconds += share * len(part)
        done += part
        if kept is not None:  # the whole file again, atomically: an interruption never leaves half a line
            rows += [{"seconds": round(share, 2), "point": p.to_json()} for p in part]
            write_jsonl(kept, rows)
    return done, round(seconds, 1)


def play_kept(runtime: Runtime, tasks: list[dict], *, progress: bool = False,
              kept: Path | None = None, trees: int = 1) -> tuple[list[Rollout], float]:
    """Synchronous :func:`play_kept_async`."""
    return run_sync(lambda: play_kept_async(runtime, tasks, progress=progress, kept=kept, trees=trees))


async def play_kept_async(runtime: Runtime, tasks: list[dict], *, progress: bool = False, kept: Path | None = None,
                          trees: int = 1, gate: Gate | None = None,
                          desc: str | None = None) -> tuple[list[Rollout], float]:
    """``tasks`` played concurrently through ``runtime``, ``trees`` trees each: their rollouts
    (trees and delegation points) in task order, and the wall seconds the playing took, summed
    over the runs that played them.

    With ``kept``, each rollout is added to that JSON-lines file as soon as its tree ends (a
    line: the tree, its points, its own seconds, and ``wall``: the run's seconds since it
    started or its previous tree ended; the file is replaced atomically), and a rerun plays
    only the tasks not there. One tree can take an hour on one core, so an interruption loses
    at most the trees in progress; a tree's seed derives from its id, so the kept trees are
    the ones a single run would play. A line for a task not in ``tasks`` is an error, not a
    silent mix. ``gate`` and ``desc``: :meth:`~sera_core.agents.runtime.Runtime.rollouts`'s."""
    rows = list(read_jsonl(kept)) if kept is not None and kept.exists() else []
    ids = [f"{runtime.benchmark.task_id(t)}/t{k}" for t in tasks for k in range(trees)]  # Runtime.rollouts' tree ids
    done = {row["tree"]["tree_id"]: Rollout(Tree.from_json(row["tree"]), [DelegationPoint.from_json(p) for p in row["points"]],
                                            row["seconds"]) for row in rows}
    if set(done) - set(ids):
        raise UserInputError(f"{kept}: holds trees {sorted(set(done) - set(ids))}, not among the tasks "
                             f"{ids}: it was written for other tasks; remove it")
    last = time.perf_counter()

    def keep(rollout: Rollout) -> None:
        nonlocal last
        now = time.perf_counter()
        rows.append({"tree": rollout.tree.to_json(), "points": [p.to_json() for p in rollout.points],
                     "seconds": rollout.seconds, "wall": round(now - last, 2)})
        last = now
        if kept is not None:
            write_jsonl(kept, rows)

    todo = [t for t in tasks if any(f"{runtime.benchmark.task_id(t)}/t{k}" not in done for k in range(trees))]
    kept_ids = set(done)  # a task with some trees kept plays them all again (the same trees: seeds follow ids)

    def keep_new(rollout: Rollout) -> None:
        if rollout.tree.tree_id not in kept_ids:
            keep(rollout)

    played = await runtime.rollouts(todo, trees=trees, progress=progress, on_done=keep_new, gate=gate, desc=desc)
    done |= {r.tree.tree_id: r for r in played if r.tree.tree_id not in kept_ids}
    return [done[i] for i in ids], sum(row["wall"] for row in rows)


def measure_protocol(spec: str, protocol: str, sets: list[str] | None = None, *, out: str | os.PathLike,
                     progress: bool = False, actor: Any = None, trees_in_flight: int | None = None,
                     engine: Any = None) -> dict[str, Any]:
    """The policy ``spec`` (:func:`~sera_core.agents.actors.make_actor`: ``vllm:tiny``,
    ``vllm:FOLDER``, ``hf:FOLDER``) measured on ``sets`` (default: :func:`default_sets`) of the frozen
    ``protocol`` (docs/protocol.md), at its contract's caps, into ``out/results.json``:

    * a set named for delegation points (``scorer_points``, ``points_dev``, ``points_test``): the noisy
      expert's mixed groups of 8 on its tasks, rescored at temperature 0: greedy pairwise
      accuracy, belief accuracy, ranking loss, rubric and score validity (:func:`point_metrics`);
    * any other set: its tasks played with ``trees`` trees each at its ``temperature`` (seed
      ``seed``, default 0): root success, trees solved, well-formed act turns, delegations
      (:func:`_figures`).

    The sets not yet measured play together in one event loop through one actor, at most
    ``trees_in_flight`` trees at a time (default :data:`TREES_IN_FLIGHT`) entering round robin
    across the sets (:class:`~sera_core.utils.aio.Gate`), the points' chunks beside them: one
    set's last slow trees no longer leave the engine a batch of one or two while other sets
    wait (docs/embedded.md, "Generation speed"). A set's ``seconds`` is the wall time from the
    start of the run that finished it to its last tree or point: sets played together overlap.

    Each set's trees or points are kept in ``out`` as they end (:func:`play_kept_async`,
    :func:`rescore_points_async`) and each finished set is written at once, so an interrupted
    measurement resumes; ``out`` is bound to the protocol's hash and sets
    (:func:`~sera_core.eval.protocol.bind_protocol`): a changed protocol is refused before any work.
    ``results.json`` also records the adapter the spec plays (:func:`measured_adapter`: the
    sha256 of its weights, its recipe hash); a rerun whose spec now names other weights (the
    shipped adapter replaced since) is refused rather than mixing two adapters in one file.
    ``actor``: an actor already made (e.g. a noisy expert), recorded under the name ``spec``;
    else ``engine`` (an :class:`~sera_core.policy.vllm_backend.EngineConfig`) starts the spec's
    vLLM engine (``sera tiny measure --kv-cache-gib``)."""
    from sera_core.agents.actors import make_actor
    from sera_core.eval.protocol import bind_protocol, load_protocol, protocol_tasks

    chosen = load_protocol(protocol)
    sets = sets or default_sets(chosen)
    if trees_in_flight is not None and trees_in_flight < 1:
        raise UserInputError(f"trees in flight: at least 1, not {trees_in_flight}")
    gate = Gate(trees_in_flight or TREES_IN_FLIGHT)
    out = Path(out)
    record = bind_protocol(out, protocol, *sets)
    path = out / "results.json"
    adapter = measured_adapter(spec)
    results = (json.loads(path.read_text()) if path.exists()
               else {"policy": spec, "adapter": adapter, "protocol": record, "sets": {}})
    if results["policy"] != spec:
        raise UserInputError(f"{path} measures {results['policy']}, not {spec}: use another folder")
    if results.get("adapter") != adapter:
        raise UserInputError(f"{path} measured {spec} when it named {adapter_words(results.get('adapter'))}; it names "
                             f"{adapter_words(adapter)} now: measure it into another folder")
    todo = [name for name in sets if name not in results["sets"]]
    if not todo:
        return results
    actor = actor or make_actor(spec, engine=engine)
    contract = chosen["contract"]
    t0 = time.perf_counter()

    async def play_set(name: str) -> None:
        set_spec, tasks = chosen["sets"][name], protocol_tasks(chosen, name)
        bench = set_spec["benchmark"]
        if "points" in name:
            rescored, _ = await rescore_points_async(actor, bench, tasks, progress=progress,
                                                     kept=out / f"{name}.points.jsonl")
            figures = point_metrics(rescored, getattr(getattr(actor, "policy", None), "decode", None))
        else:
            rollouts, _ = await play_kept_async(Runtime(bench, actor, set_runtime(set_spec, contract)), tasks,
                                                progress=progress, kept=out / f"{name}.trees.jsonl",
                                                trees=set_spec["trees"], gate=gate, desc=name)
            figures = _figures(rollouts, bench) | {"tasks": len(tasks), "trees": len(rollouts),  # trees: tasks x trees each
                                                   "trees_solved": sum(1 for r in rollouts if (r.tree.root_reward or 0) >= 1)}
        results["sets"][name] = figures | {"role": set_spec["role"], "seconds": round(time.perf_counter() - t0, 1)}
        results["sets"] = {n: results["sets"][n] for n in chosen["sets"] if n in results["sets"]}  # the file's order
        write_atomic(path, json.dumps(results, indent=1).encode())  # one loop, one thread: no write races

    async def play_all() -> None:
        await asyncio.gather(*(play_set(name) for name in todo))

    run_sync(play_all)
    return results


def set_runtime(set_spec: dict[str, Any], contract: dict[str, Any]) -> RuntimeConfig:
    """How a protocol set's tasks are played: at the set's temperature (rubric calls too) and
    seed (default 0), within the protocol contract's depth, steps per agent and tokens a turn."""
    return RuntimeConfig(temperature=set_spec["temperature"], rubric_temperature=set_spec["temperature"],
                         seed=set_spec.get("seed", 0), max_depth=contract["max_depth"],
                         max_steps_per_agent=contract["max_steps_per_agent"], max_new_tokens=contract["max_new_tokens"])


def measured_adapter(spec: str) -> dict | None:
    """The adapter a policy spec plays (``vllm:tiny``, ``vllm:FOLDER``, ``hf:FOLDER``), as
    :func:`~sera_core.policy.models.adapter_identity` names it, so that a measurement records
    which weights it measured and a resume or a ``ship`` can refuse others; None for anything
    that is no adapter folder (a scripted expert, a checkpoint, a plain model folder)."""
    from sera_core.policy.models import adapter_identity, model_folder

    return adapter_identity(model_folder(spec.partition(":")[2] or spec))


def bind_start(out: str | os.PathLike, spec: str) -> dict[str, Any]:
    """The start of an experiment folder's runs: ``{"spec", "adapter"}``, the adapter ``spec``
    plays (:func:`measured_adapter`; None for a checkpoint or a plain model), kept in
    ``out/start.json`` by the first call. A later call whose ``spec`` names other weights (the
    shipped adapter replaced since, by ``sera tiny ship``), or, for a start that is no adapter,
    another spec (:func:`same_start`), is refused before any work, naming both, so that one folder never holds runs from two starts and its results can say which
    adapter they started from (issue 60: "say which")."""
    record = start_record(spec)
    path = Path(out) / "start.json"
    if path.exists():
        old = json.loads(path.read_text())
        if not same_start(old, record):
            raise UserInputError(f"{out}: its runs started from {start_words(old)}; {spec} "
                                 f"names {adapter_words(record['adapter'])} now: use another folder")
        return old
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(record, indent=1) + "\n").encode())
    return record


def start_record(spec: str) -> dict[str, Any]:
    """The start a policy spec names, as :func:`bind_start` records it: ``{"spec", "adapter"}``."""
    return {"spec": spec, "adapter": measured_adapter(spec)}


def start_words(start: dict[str, Any] | None) -> str:
    """A start record (:func:`start_record`) in a few words, for messages; None is a start that
    was not recorded (runs made before :func:`bind_start`)."""
    return "an unrecorded start" if start is None else f"{start['spec']}, {adapter_words(start['adapter'])}"


def same_start(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two start records (:func:`bind_start`) name the same start: the same adapter
    weights, or, where neither is an adapter (a checkpoint, a plain model), the same spec."""
    if a is None or b is None:
        return a is b
    return a["adapter"] == b["adapter"] and (a["adapter"] is not None or a["spec"] == b["spec"])


def read_start(out: str | os.PathLike) -> dict[str, Any] | None:
    """The start :func:`bind_start` recorded in ``out``, or None where none was (runs made before it)."""
    path = Path(out) / "start.json"
    return json.loads(path.read_text()) if path.exists() else None


def adapter_words(adapter: dict | None) -> str:
    """An adapter identity (:func:`measured_adapter`) in a few words, for messages and tables."""
    return "no adapter" if adapter is None else f"adapter {adapter['adapter_sha256'][:12]} (recipe {adapter['recipe_hash']})"


def default_sets(protocol: dict[str, Any]) -> list[str]:
    """What a protocol's measurement plays by default: every test set, and every set one of its
    ``measures`` reads (``warmstart``'s long tasks at T=1 are a dev set, since training tasks
    are, yet its rule counts them), in the file's order."""
    named = {m["set"] for m in protocol.get("measures", [])}
    return [name for name, spec in protocol["sets"].items() if spec["role"] == "test" or name in named]


def play_groups(actor: Any, benchmark: str, tasks: list[dict], *, seed: int = 0, progress: bool = False,
                kept: Path | None = None) -> list[Rollout]:
    """``tasks`` played concurrently by ``actor`` (what :class:`Runtime` takes: a
    :class:`PolicyActor`) at temperature 1 with counterfactual groups of B = 8: their rollouts
    (trees and delegation points), in task order; ``kept`` keeps each tree as it ends
    (:func:`play_kept`)."""
    sampled = RuntimeConfig(temperature=1.0, counterfactual=8, seed=seed)
    return play_kept(Runtime(benchmark, actor, sampled), tasks, progress=progress, kept=kept)[0]


def group_tasks(tasks: list[dict], groups: int) -> list[dict]:
    """The first ``groups`` tasks of the last task's level (the hardest measured: tasks are
    listed level by level), which ``measure`` plays with counterfactual groups."""
    return [t for t in tasks if _difficulty(t) == _difficulty(tasks[-1])][:groups] if tasks else []


def _difficulty(task: dict) -> str:
    return str(record_value(task, "difficulty"))
