"""What the notebooks share, so each opens with a short setup cell and then its lesson.

* :func:`setup`: a notebook's set-up in one call: the smoke switch resolved (``SERA_SMOKE=1``
  in CI), the run config loaded and checked before any work (a bad one fails here), pandas'
  display settings; it returns a :class:`Lesson`;
* :func:`pick_tasks` (from :mod:`sera_core.envs.registry`): task records of a benchmark's
  split by difficulty, family and count;
* :func:`noisy_expert` (from :mod:`sera_core.agents.actors`): the scripted expert with seeded
  mistakes (failed branches to rank, rewards that differ between trees);
* :func:`eval_row`: one row of an evaluation summary for a results table;
* :func:`rollout_policy`: a run config's rollout policy on its starting model;
* :func:`record_fixture` (``sera course record``) and :func:`load_fixture`: the course's
  shared recorded rollouts (:data:`FIXTURE`), which notebooks 04-07 read instead of playing
  trees in their set-up: the noisy expert's trees with counterfactual groups and a few of
  their mixed delegation points, the same points rescored by the policy, and the policy's
  own execution trees.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sera_core.agents.actors import noisy_expert
from sera_core.envs.registry import pick_tasks
from sera_core.utils.errors import UserInputError

__all__ = ["FIXTURE", "Fixture", "Lesson", "config_hash", "eval_row", "load_fixture", "noisy_expert", "pick_tasks",
           "record_fixture", "rollout_policy", "setup"]

FIXTURE = Path(__file__).resolve().parents[1] / "notebooks" / "fixture"
"""The course's recorded fixture (``sera course record --out notebooks/fixture``)."""
FIXTURE_FORMAT = "sera.course-fixture/1"
"""The ``format`` tag of a fixture's ``manifest.json``."""
FIXTURE_CONFIG = "textcraft/sera_tiny.yaml"
"""The run config the course's fixture is recorded with (the embedded policy's)."""
FIXTURE_POLICY_SEED = 0
"""The runtime seed of the policy's trees in the course's fixture: one at which the root
rewards of a task's trees differ (notebook 07 trains on that difference)."""
FIXTURE_POLICY_STEPS = 8
"""Steps per agent of the policy's trees in the course's fixture (notebook 07's smoke setting:
solved trees end early and failed ones run to the cap, so a short cap keeps both outcomes and
the recording short; the trainer's is the config's ``max_steps_per_agent``)."""
FIXTURE_DELEGATING_TASKS = 8
"""Medium training tasks the policy plays greedily for the fixture's delegating tree (notebooks
00 and 07 show the first tree whose root delegated: the policy's own rubrics and scores)."""
DELEGATING_FILE = "policy_delegating.jsonl.gz"
"""The fixture's file of the policy's delegating tree (one tree, or none when no task delegated);
absent from fixtures recorded before it."""


@dataclass(frozen=True)
class Lesson:
    """What a notebook's set-up cell gets from :func:`setup`."""

    config: Any
    """The run config (:class:`~sera_core.train.config.TrainConfig`), loaded and checked; None
    for a notebook without one (10 reads only published numbers)."""
    smoke: bool
    """The smoke switch: the notebook's ``SMOKE`` parameter or ``SERA_SMOKE=1`` (CI)."""

    def scale(self, full: Any, smoke: Any) -> Any:
        """``smoke`` in the smoke setting, else ``full`` (a task count, a step count, ...)."""
        return smoke if self.smoke else full

    def settings(self, *, branches: bool = True, **changes: Any) -> Any:
        """The config's rollout settings (``branches=False``: no counterfactual branches)."""
        return self.config.rollout_settings(branches=branches, **changes)

    def tasks(self, split: str | None = None, **selection: Any) -> list[dict]:
        """Task records of the config's benchmark (:func:`pick_tasks`: ``split`` default its
        evaluation split; ``difficulty``, ``family``, ``per_level``, ``spread``, ``count``)."""
        return pick_tasks(self.config.env, split, **selection)

    def runtime(self, policy: Any, *, branches: bool = True, **changes: Any) -> Any:
        """A :class:`~sera_core.agents.runtime.Runtime` on the config's benchmark playing
        ``policy`` (an actor, or a generating policy wrapped as one) with :meth:`settings`."""
        from sera_core.agents.actors import PolicyActor
        from sera_core.agents.runtime import Runtime

        actor = policy if hasattr(policy, "complete") else PolicyActor(policy)
        return Runtime(self.config.env, actor, self.settings(branches=branches, **changes))


def setup(config: str | None, smoke: bool, *, benchmark: str | None = None, loss: str | None = None,
          native: bool = False, **overrides: Any) -> Lesson:
    """A notebook's set-up: the smoke switch (``smoke`` or ``SERA_SMOKE=1``), the run config
    ``config`` loaded with ``overrides`` (a shipped name or a YAML path; unknown or bad keys fail
    here, naming the key) and checked against what the notebook teaches (``benchmark``, ``loss``,
    ``native``: generated task records, not the official format), and pandas' display width.
    vLLM's log is kept to errors (``VLLM_LOGGING_LEVEL=ERROR`` unless the environment sets
    it; read when vLLM is first imported, which comes after this call in every notebook)."""
    import pandas as pd

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    pd.set_option("display.max_colwidth", 120)
    smoke = bool(smoke) or os.environ.get("SERA_SMOKE") == "1"
    if config is None:
        return Lesson(None, smoke)
    from sera_core.train.config import load_config

    cfg = load_config(config, **overrides)
    wanted = {"env": benchmark, "loss": loss, "task_format": "native" if native else None}
    for key, value in wanted.items():
        if value is not None and getattr(cfg, key) != value:
            raise UserInputError(f"{config}: this notebook needs {key}: {value} (the config has {getattr(cfg, key)!r})")
    return Lesson(cfg, smoke)


def eval_row(summary: dict[str, Any]) -> dict[str, Any]:
    """An evaluation summary (``sera.eval/1``) as one table row: success % per difficulty,
    the benchmark average and the errored rollouts."""
    row = {d: v["mean"] for d, v in summary["by_difficulty"].items()}
    return row | {"average": summary["average"]["mean"], "errors": summary["errors"]}


def rollout_policy(cfg: Any, *, dtype: str | None = None) -> Any:
    """The policy that plays ``cfg``'s rollouts, on the config's starting model: a vLLM engine
    with the config's engine settings (``dtype`` overrides ``engine_dtype``: ``float32`` for
    logprobs equal to a float32 trainer's within 1e-3) for ``backend: vllm``, else the ``hf``
    backend."""
    from dataclasses import replace

    from sera_core.policy.checkpoints import model_path

    if cfg.backend == "vllm":
        from sera_core.policy.vllm_backend import VLLMPolicy

        engine = cfg.engine_settings()
        return VLLMPolicy(model_path(cfg), replace(engine, dtype=dtype) if dtype else engine)
    from sera_core.policy.hf import HFPolicy

    return HFPolicy(model_path(cfg))


def config_hash(cfg: Any) -> str:
    """The first 16 hex digits of the sha256 of a run config's settings, keys sorted:
    ``utils.jsonio.hashed_settings(cfg)``, which is ``cfg.to_json()`` less the keys added after
    fixtures were recorded while they hold their default. Two configs with the same hash play and
    train alike."""
    from sera_core.utils.jsonio import hashed_settings, settings_hash

    return settings_hash(hashed_settings(cfg))


def code_version() -> dict[str, Any]:
    """The package version and, in a git checkout, its commit and whether tracked files differ
    from it (``dirty``); ``commit`` None outside a checkout."""
    from sera_core import __version__

    root, out = Path(__file__).resolve().parents[1], {"sera_version": __version__, "commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True)
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return out
    return out | {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def model_identity(cfg: Any) -> dict[str, Any]:
    """What names a run config's starting model: ``model`` and ``backend``, and for an adapter
    folder (the embedded policy) its recipe hash, base weights and the sha256 of its weights file."""
    from sera_core.policy.checkpoints import model_path
    from sera_core.policy.models import adapter_identity

    return {"model": cfg.model, "backend": cfg.backend} | (adapter_identity(model_path(cfg)) or {})


@dataclass(frozen=True)
class Fixture:
    """The course's recorded rollouts (:func:`record_fixture`), as :func:`load_fixture` reads them."""

    path: Path
    manifest: dict
    """How it was made: command, config and hash, seeds, model, code version, files, seconds."""
    expert_tasks: list[dict]
    """The medium tasks of the benchmark's evaluation split the noisy expert played."""
    expert_trees: list[Any]
    """K (``trees_per_task``) trees of each, with counterfactual groups of B branches (ids ``{task}/t{k}``)."""
    expert_points: list[Any]
    """A few of their *mixed* delegation points (both outcomes among the branches): the expert's
    frozen rubric and its scores of the B branches."""
    policy_points: list[Any]
    """The same points (same order, same branches and labels) rescored by the policy at temperature
    0: the rubric it wrote from the stored prompt and its scores of the stored branches."""
    policy_tasks: list[dict]
    """The easy training tasks the policy played."""
    policy_trees: list[Any]
    """K trees of each, played by the policy at temperature 1 without branches (the trainer's
    execution rollouts), with its float32 log-probabilities."""
    policy_delegating: Any = None
    """The first of the policy's greedy trees on medium training tasks whose root delegated: its
    own frozen rubrics, its own scores and the checker's labels. None when none of the tasks
    tried delegated, or the fixture was recorded without them (``manifest["delegating"]`` says
    which and how many were tried)."""

    def delegating_words(self) -> str:
        """One sentence on :attr:`policy_delegating`: which tree it is, of how many medium tasks
        tried and how many delegated; or why there is none (no task delegated, or the fixture was
        recorded without the step, and the command that records it)."""
        tried = self.manifest.get("delegating")
        if tried is None:
            return (f"not recorded: this fixture was recorded without the policy's delegating tree (before the "
                    f"step existed, or with --delegating-tasks 0); `{self.manifest['command']} --delegating-tasks "
                    f"{FIXTURE_DELEGATING_TASKS}` records one")
        n, delegated = len(tried["tasks"]), len(tried["delegated"])
        if self.policy_delegating is None:
            return f"none: the policy's greedy root delegated on none of the {n} {tried['difficulty']} tasks tried"
        return (f"tree {tried['kept']}: the first of the {delegated} greedy trees, of {n} {tried['difficulty']} "
                f"{tried['split']} tasks tried, whose root delegated")

    def delegating_view(self) -> str:
        """What notebooks 00 and 07 print of :attr:`policy_delegating`: :meth:`delegating_words`,
        then, when there is a tree, the tree (:func:`~sera_core.agents.view.render_tree`) and the
        first child it graded against a rubric it wrote, with that rubric and score
        (:func:`~sera_core.agents.view.render_rubric`)."""
        from sera_core.agents.view import render_rubric, render_tree

        lines = [self.delegating_words()]
        own = self.policy_delegating
        if own is not None:
            lines.append(render_tree(own))
            graded = [n for n in own.nodes.values() if n.parent_id is not None and n.rubric]
            if graded:
                lines += [f"\nChild {graded[0].node_id}, graded by the policy against its own rubric:",
                          render_rubric(graded[0].rubric, graded[0].score)]
        return "\n".join(lines)

    def rollouts(self, part: str = "expert") -> list[Any]:
        """The trees of ``part`` (``expert`` or ``policy``) as :class:`~sera_core.agents.runtime.Rollout` s,
        each with its kept delegation points."""
        from sera_core.agents.runtime import Rollout

        trees = {"expert": self.expert_trees, "policy": self.policy_trees}[part]
        return [Rollout(t, [p for p in self.expert_points if p.tree_id == t.tree_id] if part == "expert" else [])
                for t in trees]

    def settings(self, part: str = "expert") -> Any:
        """The :class:`~sera_core.agents.runtime.RuntimeConfig` ``part`` was played with
        (``expert``, ``rescore`` or ``policy``)."""
        from sera_core.agents.runtime import RuntimeConfig

        settings = self.manifest[part]["settings"]
        if "max_steps" in settings:
            raise UserInputError(f"{self.path}/manifest.json: the {part} settings' key 'max_steps' was renamed "
                             f"'max_steps_per_agent'; remake the fixture with `{self.manifest['command']}`")
        return RuntimeConfig(**settings)


FIXTURE_FILES = {"expert_tasks": "expert_tasks.jsonl.gz", "expert_trees": "expert_trees.jsonl.gz",
                 "expert_points": "expert_points.jsonl.gz", "policy_points": "policy_points.jsonl.gz",
                 "policy_tasks": "policy_tasks.jsonl.gz", "policy_trees": "policy_trees.jsonl.gz"}
"""The fixture's files (gzip'd JSON lines), by the :class:`Fixture` field they fill."""


def record_fixture(out: str | os.PathLike, config: str = FIXTURE_CONFIG, *, overrides: dict[str, Any] | None = None,
                   expert_tasks: int = 2, points: int = 4, policy_tasks: int = 2, seed: int | None = None,
                   policy_seed: int = FIXTURE_POLICY_SEED, policy_max_steps: int | None = FIXTURE_POLICY_STEPS,
                   policy: Any = None, policy_split: str = "train", delegating_tasks: int = FIXTURE_DELEGATING_TASKS,
                   seed_tries: int = 1, progress: bool = False) -> dict[str, Any]:
    """Record the course's fixture into the folder ``out`` (written whole, then swapped in) and
    return its manifest. With the run config ``config`` (``overrides`` on top):

    1. the policy plays ``trees_per_task`` trees of each of the first ``policy_tasks`` easy
       tasks of ``policy_split`` (the trainer's: ``train``) at the config's temperature without
       branches (runtime seed ``policy_seed``; ``policy_max_steps`` steps per agent, None: the config's).
       If every task's trees end alike the seed is refused and the next is tried, up to
       ``seed_tries`` seeds (``policy_seed``, ``policy_seed + 1``, ...; the manifest's command
       names the one kept); when none serves, UserInputError before the rest is played:
       notebook 07 trains on their difference;
    2. the noisy expert plays ``trees_per_task`` trees of each of the first ``expert_tasks``
       medium tasks of the benchmark's evaluation split with the config's counterfactual groups
       (B branches; runtime seed ``seed``, default the config's); of their mixed groups the
       ``points`` smallest (fewest bytes: the fixture stays small) are kept, in rollout order;
    3. the policy rescores those points (:meth:`~sera_core.agents.runtime.Runtime.rescore`:
       it writes the rubric from the stored prompt and scores the stored branches, both at
       temperature 0);
    4. the policy plays the first ``delegating_tasks`` medium tasks of ``policy_split`` greedily
       (temperature 0 for every call, one tree each, concurrently, seed ``policy_seed``), and the
       first tree in task order whose root delegated is kept (:data:`DELEGATING_FILE`: that tree,
       or none; the manifest's ``delegating`` lists the tasks tried and the trees that
       delegated). 0 skips the step.

    ``policy`` is the actor (or generating policy) of steps 1 and 3; default the config's
    rollout policy on its starting model in float32 (:func:`rollout_policy`), so the recorded
    log-probabilities match a float32 trainer's within 1e-3. The manifest holds the command
    that remakes the fixture, the config and its hash, the seeds, the model's identity, the
    code version, each file's sha256 and size, and the seconds each step took."""
    from sera_core.agents.actors import as_actor
    from sera_core.agents.runtime import Runtime
    from sera_core.agents.tree import write_trees
    from sera_core.eval.points import point_metrics
    from sera_core.train.config import load_config
    from sera_core.utils.folders import sha256_file, swap_in
    from sera_core.utils.jsonio import write_jsonl

    if seed_tries < 1:
        raise UserInputError(f"seed tries: at least 1, not {seed_tries}")
    t_start, seconds = time.perf_counter(), {}
    overrides = dict(overrides or {})
    cfg = load_config(config, **overrides)
    seed, k = cfg.seed if seed is None else seed, cfg.trees_per_task
    expert_settings = cfg.rollout_settings(seed=seed)
    if expert_settings.counterfactual < 2:
        raise UserInputError(f"{config}: counterfactual must be >= 2 to record delegation points")
    actor = as_actor(policy if policy is not None else rollout_policy(cfg, dtype="float32"))

    t0 = time.perf_counter()
    policy_records = pick_tasks(cfg.env, policy_split, difficulty="easy", count=policy_tasks)
    steps = {"max_steps_per_agent": policy_max_steps} if policy_max_steps else {}
    first = policy_seed
    for policy_seed in range(first, first + seed_tries):  # the seed kept is the one the manifest records
        policy_settings = cfg.rollout_settings(branches=False, seed=policy_seed, **steps)
        own = Runtime(cfg.env, actor, policy_settings).run(policy_records, trees=k, progress=progress)
        rewards = {t: [r.tree.root_reward for r in own if r.tree.task_id == t]
                   for t in dict.fromkeys(r.tree.task_id for r in own)}
        if any(len(set(v)) > 1 for v in rewards.values()):
            break
    else:
        raise UserInputError(f"at policy seed{f's {first} to' if seed_tries > 1 else ''} {policy_seed} every task's trees "
                             f"end alike (root rewards {rewards}): notebook 07 needs trees whose rewards differ; "
                             "try other seeds")
    seconds["policy"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    expert_records = pick_tasks(cfg.env, difficulty="medium", count=expert_tasks)
    expert = Runtime(cfg.env, noisy_expert(), expert_settings).run(expert_records, trees=k, progress=progress)
    played = [p for r in expert for p in r.points]
    mixed = [p for p in played if not p.ranking.skipped]
    if not mixed:
        raise UserInputError(f"the noisy expert's {len(played)} delegation points have no mixed group: play more tasks")
    smallest = sorted(range(len(mixed)), key=lambda i: len(json.dumps(mixed[i].to_json())))[:points]
    kept = [mixed[i] for i in sorted(smallest)]
    seconds["expert"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rescore_settings = cfg.rollout_settings(seed=seed, temperature=0.0, rubric_temperature=0.0)
    rescored = Runtime(cfg.env, actor, rescore_settings).rescore_all(kept, progress=progress)
    seconds["rescore"] = time.perf_counter() - t0

    delegating, delegating_tree = None, []
    if delegating_tasks:
        t0 = time.perf_counter()
        tried = pick_tasks(cfg.env, policy_split, difficulty="medium", count=delegating_tasks)
        greedy = cfg.rollout_settings(branches=False, seed=policy_seed, temperature=0.0, rubric_temperature=0.0)
        trees = [r.tree for r in Runtime(cfg.env, actor, greedy).run(tried, progress=progress)]
        delegated = [t for t in trees if t.delegation_events()]
        delegating = {"tasks": [t.task_id for t in trees], "split": policy_split, "difficulty": "medium",
                      "settings": asdict(greedy), "delegated": [t.tree_id for t in delegated],
                      "kept": delegated[0].tree_id if delegated else None,
                      "root_rewards": {t.tree_id: t.root_reward for t in trees},
                      "seconds": round(time.perf_counter() - t0, 1)}
        delegating_tree = delegated[:1]

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    content = {"expert_tasks": expert_records, "expert_trees": [r.tree for r in expert], "expert_points": kept,
               "policy_points": rescored, "policy_tasks": policy_records, "policy_trees": [r.tree for r in own]}
    for field_name, name in FIXTURE_FILES.items():
        items = content[field_name]
        if field_name.endswith("_trees"):
            write_trees(tmp / name, items)
        else:
            write_jsonl(tmp / name, [x.to_json() if hasattr(x, "to_json") else x for x in items])
    names = list(FIXTURE_FILES.values())
    if delegating is not None:
        write_trees(tmp / DELEGATING_FILE, delegating_tree)
        names.append(DELEGATING_FILE)
    files = {name: {"sha256": sha256_file(tmp / name), "bytes": (tmp / name).stat().st_size} for name in names}
    command = ["sera course record", f"--out {out}", f"--config {config}",
               *(f"--set {k}={json.dumps(v)}" for k, v in overrides.items()), f"--expert-tasks {expert_tasks}",
               f"--points {points}", f"--policy-tasks {policy_tasks}",
               f"--policy-split {policy_split}", f"--seed {seed}", f"--policy-seed {policy_seed}",
               f"--policy-max-steps {policy_max_steps or 0}", f"--delegating-tasks {delegating_tasks}"]
    metrics = {"expert": point_metrics(kept), "policy": point_metrics(rescored)}
    manifest = {
        "format": FIXTURE_FORMAT, "command": " ".join(command),
        "arguments": recording_arguments(config, overrides, expert_tasks=expert_tasks, points=points,
                                         policy_tasks=policy_tasks, policy_split=policy_split, seed=seed,
                                         policy_max_steps=policy_max_steps, delegating_tasks=delegating_tasks),
        "config": {"name": config, "overrides": overrides, "hash": config_hash(cfg), "values": cfg.to_json()},
        "seeds": {"expert": seed, "rescore": seed, "policy": policy_seed, "engine": cfg.seed},
        "model": model_identity(cfg) | {"dtype": "float32"} if policy is None else {"actor": type(policy).__name__},
        "code": code_version(),
        "expert": {"tasks": list(dict.fromkeys(r.tree.task_id for r in expert)), "difficulty": "medium",
                   "trees_per_task": k, "settings": asdict(expert_settings),
                   "root_rewards": {r.tree.tree_id: r.tree.root_reward for r in expert},
                   "groups": {"played": len(played), "mixed": len(mixed), "kept": len(kept)},
                   "points": [f"{p.tree_id}/{p.child_id}" for p in kept], "seconds": round(seconds["expert"], 1)},
        "rescore": {"settings": asdict(rescore_settings), "metrics": metrics, "seconds": round(seconds["rescore"], 1)},
        "policy": {"tasks": list(rewards), "split": policy_split, "difficulty": "easy", "trees_per_task": k,
                   "settings": asdict(policy_settings), "root_rewards": rewards,
                   "seconds": round(seconds["policy"], 1)},
        "delegating": delegating,
        "files": files, "bytes": sum(f["bytes"] for f in files.values()),
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    swap_in(tmp, out)
    return manifest


def recording_arguments(config: str, overrides: dict[str, Any], *, expert_tasks: int, points: int, policy_tasks: int,
                        policy_split: str, seed: int, policy_max_steps: int | None,
                        delegating_tasks: int) -> dict[str, Any]:
    """What a fixture was recorded with (its manifest's ``arguments``), but where it went and
    the policy seed kept: what :func:`stale_fixture` compares."""
    return {"config": config, "overrides": dict(overrides), "expert_tasks": expert_tasks, "points": points,
            "policy_tasks": policy_tasks, "policy_split": policy_split, "seed": seed,
            "policy_max_steps": policy_max_steps or 0, "delegating_tasks": delegating_tasks}


def stale_fixture(out: str | os.PathLike, config: str = FIXTURE_CONFIG, *, overrides: dict[str, Any] | None = None,
                  expert_tasks: int = 2, points: int = 4, policy_tasks: int = 2, seed: int | None = None,
                  policy_seed: int = FIXTURE_POLICY_SEED, seed_tries: int = 1,
                  policy_max_steps: int | None = FIXTURE_POLICY_STEPS, policy_split: str = "train",
                  delegating_tasks: int = FIXTURE_DELEGATING_TASKS) -> str | None:
    """Why the fixture at ``out`` is not the one :func:`record_fixture` with these arguments
    would record, or None when it is (``sera course record --unless-current``): it is missing,
    damaged, recorded with another config or played by another adapter than the shipped one
    (:func:`load_fixture`'s reasons), recorded with other arguments (an older fixture records
    none), or kept a policy seed these arguments would not try."""
    from sera_core.train.config import load_config

    overrides = dict(overrides or {})
    cfg = load_config(config, **overrides)
    try:
        manifest = load_fixture(out, cfg).manifest
        kept = manifest["seeds"]["policy"]
        recorded = manifest.get("arguments")
    except (ValueError, KeyError, OSError) as why:  # UserInputError is a ValueError; so is a damaged JSON file
        return str(why) or type(why).__name__
    want = recording_arguments(config, overrides, expert_tasks=expert_tasks, points=points, policy_tasks=policy_tasks,
                               policy_split=policy_split, seed=cfg.seed if seed is None else seed,
                               policy_max_steps=policy_max_steps, delegating_tasks=delegating_tasks)
    if recorded != want:
        return f"{out} was recorded with {recorded or 'arguments it does not record'}, not {want}"
    if not policy_seed <= kept < policy_seed + seed_tries:
        return f"{out} kept policy seed {kept}, not one of the {seed_tries} tried from {policy_seed}"
    return None


def load_fixture(path: str | os.PathLike = FIXTURE, config: Any = None) -> Fixture:
    """The fixture :func:`record_fixture` wrote to ``path``, each file checked against the sha256
    and size in its manifest (a changed or damaged file is a UserInputError naming it); trees are
    :class:`~sera_core.agents.tree.Tree` s, points
    :class:`~sera_core.agents.points.DelegationPoint` s, tasks records. With ``config`` (a
    run config), it must be the one the fixture was recorded with (same :func:`config_hash`),
    and its starting model the one that played (same weights): else the recorded scores and
    log-probabilities would not be that model's."""
    from sera_core.agents.summary import read_points
    from sera_core.agents.tree import read_trees
    from sera_core.utils.folders import sha256_file
    from sera_core.utils.jsonio import read_jsonl

    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path}: no course fixture here (no manifest.json); make one with "
                         f"`sera course record --out {path}`") from None
    if manifest.get("format") != FIXTURE_FORMAT:
        raise UserInputError(f"{path}/manifest.json: format {manifest.get('format')!r}, expected {FIXTURE_FORMAT!r}")
    remake = f"remake the fixture with `{manifest['command']}`"
    for name, want in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise UserInputError(f"{file}: missing from the fixture; {remake}")
        if file.stat().st_size != want["bytes"] or sha256_file(file) != want["sha256"]:
            raise UserInputError(f"{file}: its sha256 differs from the manifest's (the file was changed or damaged); "
                             f"{remake}")
    if config is not None:
        recorded = manifest["config"]
        if config_hash(config) != recorded["hash"]:
            raise UserInputError(f"{path} was recorded with the config {recorded['name']} (hash {recorded['hash']}), "
                             f"not this one (hash {config_hash(config)}): use that config, play fresh trees, or {remake}")
        model = manifest["model"]
        if "adapter_sha256" in model and model_identity(config).get("adapter_sha256") != model["adapter_sha256"]:
            raise UserInputError(f"{path} was played by another adapter (sha256 {model['adapter_sha256'][:12]}...) than "
                             f"{config.model}'s now: {remake}")
    files = {field_name: path / name for field_name, name in FIXTURE_FILES.items()}
    delegating = read_trees(path / DELEGATING_FILE) if DELEGATING_FILE in manifest["files"] else []
    return Fixture(path, manifest, policy_delegating=delegating[0] if delegating else None,
                   expert_tasks=list(read_jsonl(files["expert_tasks"])), expert_trees=read_trees(files["expert_trees"]),
                   expert_points=read_points(files["expert_points"]), policy_points=read_points(files["policy_points"]),
                   policy_tasks=list(read_jsonl(files["policy_tasks"])), policy_trees=read_trees(files["policy_trees"]))
