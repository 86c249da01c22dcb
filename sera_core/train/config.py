"""One typed config for every method and scale (CleanRL style), loaded from YAML.

A config file is a flat mapping of :class:`TrainConfig` fields. It may name a base file
with ``extends: other.yaml`` (a path relative to the file): the base is loaded first
and the file's keys override it, so each method's file states only what makes it that
method. Validation happens before any work starts: an unknown key, a value of the wrong
type or outside its range, or an inconsistent combination (for example a
rubric-generation stage without counterfactual branches) raises :class:`ConfigError`
naming the key.

The shipped configs live in ``sera_core/configs/<env>/<method>_<scale>.yaml``
(:func:`shipped_configs`); ``scale`` is ``tiny`` (the embedded model on a CPU, minutes) or
``full`` (Qwen3-4B-Instruct-2507 on H200s, the paper's settings).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sera_core.envs import DIFFICULTIES
from sera_core.envs.registry import BENCHMARKS
from sera_core.rubrics import MalformedPolicy
from sera_core.train.stages import StageController
from sera_core.utils.errors import UserInputError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
"""The configs shipped in the package."""
CHILD_REWARDS = ("rubric", "label")
LOSSES = ("cispo", "grpo")
PI_OLD = ("engine", "trainer")
"""Where ``log pi_old`` of the importance ratio comes from (:attr:`TrainConfig.pi_old`)."""
RUBRIC_VARIANTS = ("ranking", "discriminative")
BACKENDS = ("hf", "vllm")


class ConfigError(UserInputError):
    """A config that cannot run (the message names the key)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs (SPEC 3, 4, 6, 8).

    A key added after the course fixture (``notebooks/fixture``) was recorded carries
    ``field(..., metadata={"hashed_when_set": True})``: the fixture's config hash then leaves it
    out while it holds its default, so the fixture stays valid (``course.config_hash``;
    ``tests/test_course.py`` checks the committed fixture still loads)."""

    method: str = "sera"
    """The row of the paper's tables this run reproduces (a label for logs and tables)."""
    env: str = "textcraft"
    """``textcraft`` or ``textworld``."""
    model: str = "tiny"
    """``tiny`` (the shipped embedded model) or a local Hugging Face model folder (e.g.
    Qwen3-4B-Instruct-2507 downloaded beforehand)."""
    backend: str = "hf"
    """Rollout generation: ``hf`` (transformers, the training model itself) or ``vllm``
    (one vLLM engine per process, its CPU build on CPUs, whose weights are replaced after
    every update: :mod:`sera_core.policy.vllm_backend`)."""
    engine_max_model_len: int | None = None
    """vllm: the engine's longest sequence (None: the benchmark's context cap plus its
    completion cap, TextCraft 10,752, TextWorld 16,384)."""
    engine_gpu_memory_utilization: float = 0.35
    """vllm on GPUs: the share of each device's memory its engine takes (the rest trains)."""
    engine_kv_cache_gib: float = 2.0
    """vllm on CPUs: GiB of KV cache each engine reserves."""
    engine_dtype: str = "auto"
    """vllm: ``auto`` (bfloat16 where the device runs it natively: GPUs, CPUs with AVX512_BF16
    or AMX; else float32), ``float32`` or ``bfloat16``."""
    init_from: str | None = field(default=None, metadata={"hashed_when_set": True})
    """A trained checkpoint (``RUN`` or ``RUN/checkpoint``, e.g. a rubric-stage run's) whose
    weights this run starts from instead of ``model``'s own; it must have been trained from the
    same ``model``. Only the weights are taken: the optimizer starts fresh and the run's
    version at 0 (``resume`` continues a run's own checkpoint instead)."""
    tasks: str = "train"
    """A generated split (``train``, ``val``, ``test``) or a JSONL task file."""
    difficulties: tuple[str, ...] | None = None
    """The training pool: only root tasks of these difficulties (``null``: every task of
    ``tasks``). The paper trains TextCraft on the 852 medium train tasks (SPEC 3)."""
    task_format: str = "native"
    """``native`` or ``official`` task records (a task file only)."""
    tasks_per_update: int = 8
    """Root tasks per update (paper: 8)."""
    trees_per_task: int = 8
    """K: rollouts (trees) per root task; the leave-one-out group (paper: 8)."""
    schedule: str = "execution:16,delegation:2,rubric_generation:2"
    """Stages and their update counts per cycle (:class:`~sera_core.train.stages.StageController`)."""
    child_reward: str = "rubric"
    """A child's execution reward: its ``rubric`` score ``s_v`` (SERA) or the external
    binary ``label`` (RAO rows)."""
    max_depth: int = 3
    """Deepest agent (0: single agent, no delegation)."""
    max_steps_per_agent: int = 20
    """Turns per agent (the runtime's ``max_steps_per_agent``)."""
    counterfactual: int = 8
    """B: branches per delegation point in rubric-generation rollouts (0: none)."""
    fork_cap: int = 16
    """Most forked worlds per root rollout (soft cap)."""
    rubric_writer: str = "policy"
    """``policy``, ``global`` (one fixed rubric; ablation) or ``external`` (ablation)."""
    scorer: str = "policy"
    """``policy`` or ``external`` (ablation)."""
    external_url: str | None = None
    """OpenAI-compatible endpoint of the external writer/scorer (``external`` only)."""
    external_model: str | None = None
    """Model name sent to the external endpoint."""
    judge: str = "program"
    """Who labels children and branches: ``program`` (TextCraft's checker; TextWorld's
    canonical-goal checker, which leaves free-form goals unlabelled) or ``llm`` (TextWorld:
    canonical goals by the program, free-form ones by an OpenAI-compatible LLM judge, the
    paper's Kimi; key in ``$SERA_JUDGE_API_KEY``)."""
    judge_url: str | None = None
    """Base URL of the LLM judge's endpoint (``judge: llm``)."""
    judge_model: str | None = None
    """Model name sent to the LLM judge."""
    judge_cache: str | None = None
    """JSONL response cache of the LLM judge (reruns and resumes ask nothing twice)."""
    judge_timeout_s: float = 60.0
    """Seconds per LLM judge request."""
    judge_max_retries: int = 4
    """Retries of an LLM judge request (timeouts, 429, 5xx); then the branch has no label."""
    malformed_policy: str = "drop_trajectory"
    """What a malformed rubric or score does: ``drop_trajectory``, ``drop_rollout`` or ``binary_fallback``."""
    rubric_variant: str = "ranking"
    """Rubric-generation reward: ``ranking`` (-L_rank) or ``discriminative`` (plus score spread; ablation)."""
    spread_weight: float = 1.0
    """lambda of the discriminative variant."""
    leaf_gate_filter: bool = False
    """Count only leaves that passed their success gate (full SERA: False)."""
    filter_zero_variance: bool = True
    """Drop groups whose rewards are all equal (official ``filter_zero_variance_groups``)."""
    depth_weighting: bool = True
    """Multiply each datum's advantage by ``w_d`` (inverse count of datums at its depth)."""
    datum_balance: bool = field(default=False, metadata={"hashed_when_set": True})
    """An extension, not SPEC 4 (off: the paper's token mean): weigh every datum the same in the
    loss, ``(1/D) sum_d (1/T_d) sum_{t in d} loss_t`` instead of ``(1/N) sum_t loss_t``, so
    that a long failure pushes no harder than a short success
    (:func:`~sera_core.train.update.token_rows`)."""
    loss: str = "cispo"
    """``cispo`` (SERA and the RAO rows) or ``grpo`` (PPO-style clipped ratio; the single-agent GRPO row)."""
    clip_low: float = 0.0
    """CISPO: absolute lower bound of the importance ratio."""
    clip_high: float = 5.0
    """CISPO: absolute upper bound of the importance ratio."""
    grpo_eps: float = 0.2
    """GRPO: the ratio is clipped to [1 - eps, 1 + eps]."""
    pi_old: str = field(default="engine", metadata={"hashed_when_set": True})
    """What the importance ratio divides by (:func:`~sera_core.train.update.loss_and_backward`):
    ``engine``, the rollout engine's recorded logprobs (the paper's: CISPO's clipped weight
    absorbs the engine-trainer gap), or ``trainer``, the trainer's own before its step (ratio 1;
    the gap corrected by truncated importance sampling at ``tis_cap``)."""
    tis_cap: float | None = field(default=2.0, metadata={"hashed_when_set": True})
    """``pi_old: trainer``: the advantage is scaled by ``min(pi_theta / pi_engine, tis_cap)``
    (truncated importance sampling); None: not corrected. Unused under ``pi_old: engine``."""
    lr: float = 3e-6
    """Adam learning rate (paper: 3e-6)."""
    weight_decay: float = 0.017
    """Decoupled weight decay (official: 0.017)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam moment decay rates (official beta2: 0.95)."""
    grad_clip: float = 1.0
    """Maximum global gradient norm."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    max_new_tokens: int | None = None
    """Completion cap per agent turn (None: the benchmark's, TextCraft 512, TextWorld 3,072)."""
    max_context_tokens: int | None = None
    """Context cap per agent (None: the benchmark's, TextCraft 10,240, TextWorld 13,312)."""
    micro_batch_tokens: int = 16384
    """Tokens per forward/backward chunk of an update (gradient accumulation; memory only)."""
    total_updates: int = 250
    """Optimizer updates in all (paper: TextCraft 250, TextWorld 400). Formerly ``max_steps``;
    an agent's turn budget is :attr:`max_steps_per_agent`."""
    checkpoint_every: int = 10
    """A checkpoint every this many updates (and at the end)."""
    save_rollouts: bool = field(default=False, metadata={"hashed_when_set": True})
    """Keep what each update trained on: its trees in ``out/rollouts/v{version:05d}.jsonl.gz``
    (:func:`~sera_core.agents.tree.read_trees` reads them; on TextCraft a few KB a tree,
    compressed). A resumed run rewrites the versions it redoes."""
    log_with: str = "none"
    """Experiment tracker beside ``metrics.csv``, through Accelerate's tracker API on the
    main process: ``none``, ``tensorboard`` (``out/tensorboard``; the ``[tracking]``
    extra) or ``wandb`` (installed and logged in by you)."""
    mixed_precision: str = "no"
    """``no`` (float32), ``bf16`` (bfloat16 autocast: GPUs) or ``auto`` (``bf16`` where the device
    runs bfloat16 natively, :func:`~sera_core.utils.hardware.native_bf16`: on 2 CPU cores with
    AVX512_BF16 the update's forward and backward run 3x faster; else ``no``)."""
    seed: int = 0
    """Base of every derived seed (tasks, rollouts)."""
    out: str = "runs/sera"
    """Run folder: ``metrics.csv``, ``checkpoint/``, and ``rollouts/`` with :attr:`save_rollouts`."""
    accelerate_config: str | None = None
    """Accelerate config for multi-GPU launches (shipped: ``accelerate/1xh200.yaml``,
    ``accelerate/2x8xh200.yaml``); informational for ``--dry-run``."""
    gpus: int = 0
    """GPUs the run expects (0: CPU); informational for ``--dry-run``."""

    @property
    def stages(self) -> StageController:
        return StageController(self.schedule)

    @property
    def accelerate_file(self) -> Path | None:
        """The Accelerate config file of ``accelerate_config`` (a relative path is a shipped
        one, under :data:`CONFIGS`), or None without one."""
        if not self.accelerate_config:
            return None
        path = Path(self.accelerate_config)
        return path if path.is_absolute() else CONFIGS / path

    def to_json(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    def replace(self, **changes: Any) -> TrainConfig:
        for old in sorted(set(changes) & set(RENAMED)):
            raise ConfigError(f"config key {old!r} was renamed {RENAMED[old][0]!r} ({RENAMED[old][1]})")
        return validate(dataclasses.replace(self, **changes))

    def precision(self) -> str:
        """``mixed_precision`` with ``auto`` resolved on this machine: ``no`` or ``bf16``."""
        if self.mixed_precision != "auto":
            return self.mixed_precision
        from sera_core.utils.hardware import native_bf16

        return "bf16" if native_bf16() else "no"

    def engine_settings(self):
        """The :class:`~sera_core.policy.vllm_backend.EngineConfig` of this config's vLLM
        engines (``engine_*`` keys; the engine's seed derived from ``seed``)."""
        from sera_core.envs.registry import benchmark
        from sera_core.policy.vllm_backend import EngineConfig

        bench = benchmark(self.env)
        longest = (self.max_context_tokens or bench.max_context_tokens) + (self.max_new_tokens or bench.max_new_tokens)
        return EngineConfig(max_model_len=self.engine_max_model_len or longest,
                            gpu_memory_utilization=self.engine_gpu_memory_utilization,
                            kv_cache_gib=self.engine_kv_cache_gib, dtype=self.engine_dtype, seed=self.seed)

    def task_pool(self) -> list[dict]:
        """The task records of ``tasks`` (a generated split, or a JSONL file whose records are
        validated), those of ``difficulties`` (all when None); a difficulty no record has is an error."""
        from sera_core.envs.registry import pick_tasks

        return pick_tasks(self.env, self.tasks, official=self.task_format == "official", difficulty=self.difficulties)

    def rollout_settings(self, *, branches: bool = True, seed: int | None = None, **changes: Any):
        """The :class:`~sera_core.agents.runtime.RuntimeConfig` of this config's rollouts.

        Taken from the config: ``max_depth``, ``max_steps_per_agent``, ``temperature``,
        ``max_new_tokens``, ``max_context_tokens``, ``counterfactual`` (B; 0 when
        ``branches`` is false: the execution and delegation stages fork nothing),
        ``fork_cap``, ``rubric_writer``, ``scorer``, ``malformed_policy``, and ``seed``
        (``self.seed`` unless given). ``changes`` set any other runtime field on top, e.g.
        ``temperature=0.0, rubric_temperature=0.0`` for greedy play. The trainer and the
        notebooks both build their runtimes here, so a notebook run with a config plays
        with exactly the settings a training run of that config would.
        """
        from sera_core.agents.runtime import RuntimeConfig

        values = dict(max_depth=self.max_depth, max_steps_per_agent=self.max_steps_per_agent, temperature=self.temperature,
                      max_new_tokens=self.max_new_tokens, max_context_tokens=self.max_context_tokens,
                      counterfactual=self.counterfactual if branches else 0, fork_cap=self.fork_cap,
                      rubric_writer=self.rubric_writer, scorer=self.scorer, malformed_policy=self.malformed_policy,
                      seed=self.seed if seed is None else seed)
        return RuntimeConfig(**(values | changes))


_CHOICES = {
    "backend": BACKENDS, "task_format": ("native", "official"), "child_reward": CHILD_REWARDS,
    "rubric_writer": ("policy", "global", "external"), "scorer": ("policy", "external"),
    "malformed_policy": tuple(p.value for p in MalformedPolicy),
    "rubric_variant": RUBRIC_VARIANTS, "loss": LOSSES, "mixed_precision": ("no", "bf16", "auto"),
    "log_with": ("none", "tensorboard", "wandb"), "judge": ("program", "llm"),
    "engine_dtype": ("auto", "float32", "bfloat16"),
    "pi_old": PI_OLD,
}
RENAMED = {"max_steps": ("total_updates", "it counts optimizer updates; an agent's turn budget is max_steps_per_agent"),
           "tasks_per_step": ("tasks_per_update", "a training iteration is an update")}
"""Keys of older configs: ``old -> (new, why)``; a config that uses one fails with this message."""
_POSITIVE_INTS = ("tasks_per_update", "trees_per_task", "max_steps_per_agent", "micro_batch_tokens", "total_updates",
                  "checkpoint_every")
_NONNEG_INTS = ("max_depth", "counterfactual", "fork_cap", "seed", "gpus", "judge_max_retries")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_TYPES: dict[str, tuple[Any, str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "str | None": (lambda v: v is None or isinstance(v, str), "null or a string"),
    "int": (lambda v: _is_int(v), "an integer"),
    "int | None": (lambda v: v is None or _is_int(v), "null or an integer"),
    "float": (lambda v: _is_num(v), "a finite number"),
    "float | None": (lambda v: v is None or _is_num(v), "null or a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
}
"""The check of each declared field type (tuples have their own rules below)."""


def validate(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` if it can run; :class:`ConfigError` naming the first bad key otherwise."""
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"config key {key!r}: {why} (got {getattr(cfg, key)!r})")

    for f in fields(cfg):  # every value of the type its field declares, before any rule reads it
        expected = _TYPES.get(str(f.type))
        if expected is not None and not expected[0](getattr(cfg, f.name)):
            raise bad(f.name, f"must be {expected[1]}")
    for key, options in {"env": tuple(BENCHMARKS), **_CHOICES}.items():
        if getattr(cfg, key) not in options:
            raise bad(key, f"must be one of {options}")
    if cfg.log_with != "none" and importlib.util.find_spec(cfg.log_with) is None:
        raise bad("log_with", f"the {cfg.log_with} package is not installed (pip install {cfg.log_with})")
    for key in _POSITIVE_INTS:
        if not (_is_int(getattr(cfg, key)) and getattr(cfg, key) >= 1):
            raise bad(key, "must be an integer >= 1")
    for key in _NONNEG_INTS:
        if not (_is_int(getattr(cfg, key)) and getattr(cfg, key) >= 0):
            raise bad(key, "must be an integer >= 0")
    for key in ("max_new_tokens", "max_context_tokens", "engine_max_model_len"):
        if getattr(cfg, key) is not None and not (_is_int(getattr(cfg, key)) and getattr(cfg, key) >= 1):
            raise bad(key, "must be null or an integer >= 1")
    for key in ("lr", "grad_clip", "temperature", "grpo_eps", "judge_timeout_s", "engine_kv_cache_gib"):
        if not (_is_num(getattr(cfg, key)) and getattr(cfg, key) > 0):
            raise bad(key, "must be a finite number > 0")
    for key in ("weight_decay", "spread_weight", "clip_low"):
        if not (_is_num(getattr(cfg, key)) and getattr(cfg, key) >= 0):
            raise bad(key, "must be a finite number >= 0")
    if cfg.tis_cap is not None and not (_is_num(cfg.tis_cap) and cfg.tis_cap >= 1):
        raise bad("tis_cap", "must be null or a finite number >= 1 (a cap below 1 would shrink on-policy tokens)")
    if not (_is_num(cfg.clip_high) and cfg.clip_high > cfg.clip_low):
        raise bad("clip_high", "must be a finite number > clip_low")
    if not (isinstance(cfg.betas, tuple) and len(cfg.betas) == 2 and all(_is_num(b) and 0 <= b < 1 for b in cfg.betas)):
        raise bad("betas", "must be two numbers in [0, 1)")
    for key in ("method", "model", "tasks", "out"):
        if not (isinstance(getattr(cfg, key), str) and getattr(cfg, key)):
            raise bad(key, "must be a non-empty string")
    levels = DIFFICULTIES
    if cfg.difficulties is not None and not (isinstance(cfg.difficulties, tuple) and cfg.difficulties
                                             and all(d in levels for d in cfg.difficulties)):
        raise bad("difficulties", f"must be null or a non-empty list of {levels}")
    try:
        stages = StageController(cfg.schedule)
    except ValueError as exc:
        raise bad("schedule", str(exc)) from None
    counts = stages.counts(stages.cycle_length)
    # -- consistency -----------------------------------------------------------------
    if cfg.max_depth == 0 and (counts["delegation"] or counts["rubric_generation"]):
        raise bad("schedule", "a single agent (max_depth 0) has no delegation or rubric-generation stage")
    if counts["rubric_generation"] and cfg.counterfactual < 2:
        raise bad("counterfactual", "a rubric_generation stage needs counterfactual branches (>= 2)")
    if counts["rubric_generation"] and cfg.rubric_writer != "policy":
        raise bad("rubric_writer", "a rubric_generation stage trains the policy's rubrics: the writer must be 'policy'")
    if "external" in (cfg.rubric_writer, cfg.scorer) and not cfg.external_url:
        raise bad("external_url", "an external rubric writer or scorer needs an endpoint")
    if cfg.judge not in BENCHMARKS[cfg.env].judges:
        raise bad("judge", f"{cfg.env} offers the judges {', '.join(BENCHMARKS[cfg.env].judges)} "
                           "(an LLM judge labels TextWorld subtasks; TextCraft is always checked by its program)")
    if cfg.judge == "llm" and not (cfg.judge_url and cfg.judge_model):
        raise bad("judge_url", "judge 'llm' needs judge_url and judge_model")
    if not (_is_num(cfg.engine_gpu_memory_utilization) and 0 < cfg.engine_gpu_memory_utilization <= 1):
        raise bad("engine_gpu_memory_utilization", "must be a number in (0, 1]")
    if cfg.backend == "hf" and cfg.accelerate_file is not None and uses_fsdp(cfg.accelerate_file):
        raise bad("backend", "FSDP shards the model, and the hf backend would generate on the shards (a collective "
                             "whose length differs by process: it hangs); use backend: vllm, or an Accelerate "
                             "config without FSDP")
    if cfg.task_format == "official" and cfg.tasks in ("train", "val", "test"):
        raise bad("task_format", "official records come from a task file, not a generated split")
    return cfg


def uses_fsdp(accelerate_file: Path) -> bool:
    """Whether the Accelerate config file shards the model with FSDP (a missing file: no)."""
    try:
        values = yaml.safe_load(Path(accelerate_file).read_text()) or {}
    except OSError:
        return False
    return str(values.get("distributed_type", "")).upper() == "FSDP"


def config_file(path: str | Path) -> Path:
    """The YAML file ``path`` names: the file itself when it exists, else a shipped config
    of that name relative to :data:`CONFIGS` (``textcraft/sera_tiny.yaml``); a name that is
    neither raises :class:`ConfigError`."""
    path = Path(path)
    if path.is_file() or path.is_absolute():
        return path
    if (CONFIGS / path).is_file():
        return CONFIGS / path
    raise ConfigError(f"no such config file: {path} (nor a shipped config {CONFIGS / path}; shipped: "
                      f"{', '.join(str(p.relative_to(CONFIGS)) for p in shipped_configs())})")


def load_config(path: str | Path, **overrides: Any) -> TrainConfig:
    """The config of a YAML file or shipped config name (:func:`config_file`; following
    ``extends``), with ``overrides`` on top, validated."""
    path = config_file(path)
    values = _read(path, seen=())
    values.update(overrides)
    names = {f.name for f in fields(TrainConfig)}
    for old in sorted(set(values) & set(RENAMED)):
        raise ConfigError(f"{path}: config key {old!r} was renamed {RENAMED[old][0]!r} ({RENAMED[old][1]})")
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{path}: unknown config key {unknown[0]!r} (known keys: {', '.join(sorted(names))})")
    for key in ("betas", "difficulties"):
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    try:
        return validate(TrainConfig(**values))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _read(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: 'extends' forms a cycle")
    if not path.is_file():
        raise ConfigError(f"no such config file: {path}")
    try:
        data = yaml.safe_load(path.read_bytes().decode("utf-8")) or {}
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config is a mapping of keys to values")
    base = data.pop("extends", None)
    if base is not None and not isinstance(base, str):
        raise ConfigError(f"{path}: 'extends' must name a config file, got {base!r}")
    if base and not (path.parent / base).is_file():
        raise ConfigError(f"{path}: extends {base!r}, but there is no such config file: {path.parent / base}")
    values = _read(path.parent / base, (*seen, path)) if base else {}
    values.update(data)
    return values


def shipped_configs() -> list[Path]:
    """Every method config shipped in the package (bases excluded: files not starting with ``_``)."""
    return sorted(p for env in BENCHMARKS for p in (CONFIGS / env).glob("*.yaml") if not p.name.startswith("_"))


__all__ = ["TrainConfig", "ConfigError", "config_file", "load_config", "validate", "shipped_configs", "CONFIGS"]
