"""The benchmark registry: everything the rest of the workbook knows about a benchmark.

Each benchmark implements :class:`Benchmark` once, in its own folder
(``envs/<name>/benchmark.py``); :data:`BENCHMARKS` maps its name to the class and
:func:`benchmark` builds one. Nothing outside ``envs/`` switches on a benchmark's name: the
runtime, the expert policy, the trainer, the evaluator, the report and the front ends read
what they need from the class. A benchmark provides:

* **tasks**: its splits (``generate_split``, ``eval_split``), record validation
  (generated and official formats), ids, difficulty, statistics, the warm start's
  demonstration tasks (``demo_tasks``), its own words for the scripted tokenizer
  (``vocabulary``) and, if it has one, its world as a file (``export_world``);
* **names and the agent interface**: ``title`` and ``short_title`` (figures and tables), the
  agent's introduction, tools and delegation tool (``agent_intro``, ``agent_tools``,
  ``delegate_tool``: :func:`sera_core.agents.prompts.system_prompt`), the levels ``sera
  tiny measure`` plays (``measured_levels``, ``measured_spread``), the evaluation pool and
  its average (``eval_counts``, ``pool_weighted``);
* **the expert**: solving a task alone (``solver``), and as an actor's agent, rubric
  writer and scorer (``expert_config``, ``noisy_expert_config``, ``expert_agent``,
  ``expert_rubric``, ``expert_item_scores``, ``expert_check``, ``perturbation``,
  ``after_mistake``);
* **judging**: the root checker (``root_result``) and the children's judge
  (``make_judge``: the program checker, or TextWorld's LLM judge);
* **the reply format**: generation stop strings, the well-formed test of an act reply,
  and the character spans that write a delegation (``launch_spans``: the ``launch`` tokens);
* **the runtime's hooks**: root agents from task records, the delegation hook,
  children on the live world (shared) or a forked world (a counterfactual branch),
  committing a branch, what an agent can observe (rubric inputs, the scorer's final
  state), a finished child's facts for the expert scorer.

A new benchmark is a folder ``envs/<name>/`` with its environment and a ``benchmark.py``
whose class implements every member of :class:`Benchmark` (tests/test_registry.py checks
that), and one line in :data:`BENCHMARKS` (docs/architecture.md, "A third benchmark").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from random import Random
from typing import Any, ClassVar, Protocol

from sera_core.envs import DIFFICULTIES
from sera_core.envs.textcraft.benchmark import TextCraftBenchmark
from sera_core.envs.textworld.benchmark import TextWorldBenchmark
from sera_core.utils.errors import UserInputError


class Benchmark(Protocol):
    """What every benchmark provides (module docstring). :class:`TextCraftBenchmark` and
    :class:`TextWorldBenchmark` implement it; their docstrings say what each member is for them.
    ``env`` below is a live agent's environment (the benchmark's own class), ``spec`` a
    delegation as the benchmark's environment hands it to the runtime's hook."""

    name: ClassVar[str]
    """The benchmark's key (a tree's, a config's and an evaluation's ``env``)."""
    title: ClassVar[str]
    """The full name (figures)."""
    short_title: ClassVar[str]
    """The name in table headings."""
    agent_intro: ClassVar[str]
    """The opening of every agent's system message, up to its tools."""
    agent_tools: ClassVar[str]
    """The tools (or reply blocks) every agent has."""
    delegate_tool: ClassVar[str]
    """The delegation tool, shown only to agents that may delegate."""
    measured_levels: ClassVar[tuple[str, ...]]
    """The difficulties ``sera tiny measure`` plays."""
    measured_spread: ClassVar[bool]
    """Whether the measured tasks are spread over each level (else its first ones)."""
    splits: ClassVar[tuple[str, ...]]
    """The splits ``generate_split`` writes."""
    eval_split: ClassVar[str]
    """The split the paper evaluates on."""
    difficulties: ClassVar[tuple[str, ...]]
    """The difficulty levels: :data:`~sera_core.envs.DIFFICULTIES` (one scale for every benchmark)."""
    expert_modes: ClassVar[tuple[str, ...]]
    """``sera solve`` modes of :meth:`solver`."""
    judges: ClassVar[tuple[str, ...]]
    """The children's judges :meth:`make_judge` offers (``program`` first)."""
    sorted_keys: ClassVar[bool]
    """Whether a task file is written with sorted keys."""
    eval_counts: ClassVar[dict[str, int]]
    """Tasks per difficulty of the evaluation pool (the benchmark average's weights)."""
    pool_weighted: ClassVar[bool]
    """Whether the benchmark average weighs each difficulty by :attr:`eval_counts` (else a macro average)."""
    stop: ClassVar[tuple[str, ...]]
    """Stop strings of an act turn's generation."""
    loop_repeats: ClassVar[int | None]
    """A reply pattern repeated this many times ends the agent (None: no loop detector)."""
    max_context_tokens: ClassVar[int]
    """An agent's context limit."""
    max_new_tokens: ClassVar[int]
    """Completion cap per act turn."""
    export_world: ClassVar[Callable[..., dict[str, int]] | None]
    """``export_world(path, *, world_seed, items_per_tier) -> counts``: write the benchmark's
    generated world as JSON (``sera world``); None: it has no world of its own."""
    official: bool
    """Whether task records are in the official format (the constructor's ``official``)."""

    # -- tasks -------------------------------------------------------------------------
    def generate_split(self, split: str, *, progress: bool = False, **options: Any) -> list[dict]:
        """The generated task records of ``split`` (``options``: the benchmark's generator settings)."""

    def validate_record(self, record: dict, where: str = "record") -> None:
        """Raise ValueError naming ``where`` unless ``record`` is a task record."""

    def split_stats(self, records: list[dict]) -> dict:
        """Counts of a task file (``sera tasks``' summary)."""

    def task_id(self, record: dict) -> str:
        """A task record's id."""

    def solver(self, mode: str) -> tuple[Callable[[dict], dict], tuple[str, ...]]:
        """``(solve(record) -> result row, the row keys to break results down by)``: the expert
        alone (``sera solve``) in ``mode``."""

    def demo_tasks(self, cfg: Any) -> list[dict]:
        """The warm start's demonstration tasks for ``cfg`` (a :class:`~sera_core.tiny.demos.DemoConfig`)."""

    def vocabulary(self, seed: int = 0) -> list[str]:
        """Texts of the benchmark's own words, for the scripted policies' tokenizer."""

    # -- the reply format ----------------------------------------------------------------
    def well_formed(self, text: str) -> bool:
        """Whether an act reply is in the benchmark's format."""

    def launch_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of an act reply that write a delegation (its ``launch`` tokens)."""

    # -- the expert and the judge ----------------------------------------------------------
    def make_judge(self, kind: str = "program", **options: Any) -> Any:
        """The children's judge ``kind`` (one of :attr:`judges`): ``judge(env) -> JudgeVerdict``."""

    def expert_config(self, config: Any = None, *, explain: bool = False) -> Any:
        """The expert's settings as an actor plays it: ``config`` or the delegating expert without noise."""

    def noisy_expert_config(self, noise: float | None = None, **rates: float) -> Any:
        """The delegating expert's settings with seeded mistakes: ``noise`` p mapped to the
        benchmark's mistake rates, None for its default noisy expert; ``rates`` set fields directly."""

    def expert_agent(self, config: Any, info: dict) -> Any:
        """The scripted expert playing one runtime agent (``act(observation) -> reply``)."""

    def expert_rubric(self, info: dict) -> dict:
        """The expert's rubric for a child's sub-goal (the official JSON)."""

    def expert_item_scores(self, outcome: dict, item_names: set[str]) -> tuple[bool, dict[str, float], str]:
        """Gate, per-item scores and a reason from a finished child's :meth:`outcome`."""

    def expert_check(self, outcome: dict) -> str:
        """The gate's check in words (the explaining scorer writes it before its verdict)."""

    def perturbation(self, observation: str | None, info: dict, rng: Random) -> str:
        """A plausible mistaken reply that changes nothing in the world."""

    def after_mistake(self, held: str | None, current: str | None) -> str | None:
        """What the expert reads after a :meth:`perturbation` (its own last result, the world as it is now)."""

    # -- the runtime's hooks on a live agent (agents/runtime.py) ------------------------------
    def root_env(self, record: dict, *, max_steps: int, max_depth: int, child_max_steps: int) -> Any:
        """The root agent's environment for a task record."""

    def root_result(self, env: Any) -> tuple[bool, dict]:
        """The root checker: whether the task is solved, and its verdict as JSON."""

    def install_hook(self, env: Any, hook: Any) -> None:
        """Route ``env``'s delegations to ``await hook(env, spec)``, which plays the child and
        returns the report the parent reads."""

    def goal(self, env: Any) -> str:
        """The agent's goal, as its first user message states it."""

    def first_observation(self, env: Any) -> str | None:
        """What the agent sees before its first turn (None: nothing)."""

    def spec_goal(self, parent: Any, spec: Any) -> str:
        """The goal a child of ``parent`` with delegation ``spec`` would have (the rubric's subject)."""

    def spawn(self, parent: Any, spec: Any) -> Any:
        """The child's environment on the parent's live world (shared)."""

    def fork_child(self, parent: Any, spec: Any) -> Any:
        """The child's environment on a fork of the parent's world (a counterfactual branch)."""

    def commit(self, parent: Any, branch: Any) -> None:
        """Make a forked branch's world the parent's (the branch the runtime keeps)."""

    def observable(self, env: Any) -> str:
        """What the parent can see of the world now (the rubric writer's state section)."""

    def final_state(self, env: Any) -> str:
        """The child's world when it ended, as the scorer reads it."""

    def world_json(self, env: Any) -> dict:
        """The world as JSON, recorded on the tree."""

    def child_budget(self, parent: Any, spec: Any) -> str:
        """The child's step budget in words (the rubric writer's budget section)."""

    def spec_json(self, spec: Any) -> dict:
        """A delegation spec as JSON, recorded on the child's node."""

    def start_facts(self, env: Any) -> dict:
        """What :meth:`outcome` needs from the child's start (taken before it runs)."""

    def outcome(self, env: Any, start: dict, observations: list[str | None]) -> dict:
        """A finished child's facts for the expert scorer (:meth:`expert_item_scores`); its ``env`` is :attr:`name`."""

    def expert_info(self, env: Any) -> dict:
        """What the expert agent needs about ``env`` besides its observation."""


def protocol_members() -> set[str]:
    """The names :class:`Benchmark` declares: its annotated attributes and its methods."""
    methods = {n for n, v in vars(Benchmark).items() if callable(v) and not n.startswith("_")}
    return set(Benchmark.__annotations__) | methods


def check(cls: type[Benchmark]) -> None:
    """Raise ValueError unless a ``cls(official=False)`` has every member of :class:`Benchmark`
    and the difficulties :data:`~sera_core.envs.DIFFICULTIES` (one scale for every benchmark, SPEC 5)."""
    if missing := sorted(protocol_members() - set(dir(cls(official=False)))):
        raise ValueError(f"{cls.__name__} lacks the Benchmark members {missing}")
    if tuple(cls.difficulties) != DIFFICULTIES:
        raise ValueError(f"{cls.__name__}.difficulties must be {DIFFICULTIES}, not {cls.difficulties}")


BENCHMARKS: dict[str, type[Benchmark]] = {
    "textcraft": TextCraftBenchmark,
    "textworld": TextWorldBenchmark,
}
"""Every benchmark, by name: one line each (:func:`register` adds one from elsewhere)."""
for _cls in BENCHMARKS.values():
    check(_cls)


def register(cls: type[Benchmark]) -> type[Benchmark]:
    """Add the benchmark class ``cls`` under ``cls.name``, after :func:`check` (a benchmark
    defined outside this module, such as a test's toy); ``BENCHMARKS.pop(cls.name)`` removes
    it again. Raises ValueError when the name is taken or the check fails."""
    if cls.name in BENCHMARKS:
        raise ValueError(f"a benchmark named {cls.name!r} is registered already")
    check(cls)
    BENCHMARKS[cls.name] = cls
    return cls


def benchmark(env: str, *, official: bool = False) -> Benchmark:
    """The benchmark named ``env`` (``official``: its task records are in the official format)."""
    if env not in BENCHMARKS:
        raise ValueError(f"env must be one of {list(BENCHMARKS)}, got {env!r}")
    return BENCHMARKS[env](official=official)


def record_value(record: dict, key: str) -> Any:
    """A task record's ``key`` (``difficulty``, ``task_family``): top level first, then under
    ``misc`` (TextCraft's generated and official records keep it there); None if absent."""
    return record.get(key, (record.get("misc") or {}).get(key))


def select_tasks(benchmark: str, records: Sequence[dict], *, difficulty: str | Sequence[str] | None = None,
                 family: str | None = None, per_level: int | None = None, spread: bool = False,
                 count: int | None = None, source: str = "the task records") -> list[dict]:
    """The one task selection: of ``benchmark``'s ``records``, in file order, those of ``difficulty``
    (one level or several; default every level) and ``family`` (TextWorld), the first
    ``per_level`` of each level (levels in the order given; ``spread``: ``per_level`` spread
    evenly over the level instead), then the first ``count`` of all.

    A difficulty or family that matches no record of a non-empty ``records`` is a
    :class:`~sera_core.utils.errors.UserInputError` naming ``source``, not an empty selection."""
    levels = (difficulty,) if isinstance(difficulty, str) else tuple(difficulty or BENCHMARKS[benchmark].difficulties)
    if family is not None:
        records = [r for r in records if record_value(r, "task_family") == family]
    by_level = {level: [r for r in records if record_value(r, "difficulty") == level] for level in levels}
    if records and difficulty is not None and not any(by_level.values()):
        wanted = ", ".join(levels) + (f" (family {family})" if family else "")
        raise UserInputError(f"{source}: no task of difficulty {wanted}")
    if per_level is None:  # the file order across levels (every record when no level is asked for)
        picked = list(records) if difficulty is None else [r for r in records if record_value(r, "difficulty") in by_level]
    else:
        picked = [r for level in levels
                  for r in (by_level[level][::max(1, len(by_level[level]) // per_level)] if spread else by_level[level])[:per_level]]
    return picked[:count]


def pick_tasks(env: str, split: str | None = None, *, official: bool = False, **selection: Any) -> list[dict]:
    """Task records of ``env``, selected by :func:`select_tasks` (``selection``: ``difficulty``,
    ``family``, ``per_level``, ``spread``, ``count``). ``split`` is a split name (generated
    records; default the benchmark's evaluation split, TextCraft val / TextWorld test) or a
    JSONL file of task records (each validated; ``official``: in the official format)."""
    bench = benchmark(env, official=official)
    split = split or bench.eval_split
    if split in ("train", "val", "dev", "test") and split not in bench.splits:
        raise UserInputError(f"{env} has splits {', '.join(bench.splits)}, not {split!r}")
    if split in bench.splits:
        records = bench.generate_split(split)
    else:
        from sera_core.utils.jsonio import read_jsonl

        records = list(read_jsonl(split))
        for i, rec in enumerate(records):
            bench.validate_record(rec, f"{split}:{i + 1}")
    return select_tasks(env, records, source=split, **selection)
