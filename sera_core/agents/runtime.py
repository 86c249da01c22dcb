"""The recursive rollout engine: one policy decomposes, delegates, writes rubrics, acts,
grades.

:class:`Runtime` plays root tasks as trees of agents (SPEC 1, 2, 3, 8):

* **Agents.** The root gets the task; every agent has ``max_steps_per_agent`` steps (20; SPEC 5)
  and a fresh context: a system prompt (its tools, depth, whether it may delegate; at
  the depth cap it is told it cannot) and its goal. Each turn the actor completes the
  context; the completion's exact ids, logprobs and roles become a :class:`Turn`; the
  environment runs the reply; the observation is appended as
  ``context += completion_ids + glue(observation)`` (:class:`~sera_core.policy.chat.ChatFormat`),
  so completions are never re-tokenised. An agent ends on finish, out of steps, when
  the context is full (``context``), or, in TextCraft, when the official loop detector
  sees a reply pattern repeated 4 times (``loop``).
* **Delegation.** A launch (``await launch_subagent(...)`` in TextCraft, a ``<delegate>``
  block in TextWorld) calls the runtime's hook. Before the child runs, the parent's
  policy writes its rubric from exactly the SPEC 2/8 inputs (parent task, metadata,
  trajectory before the delegation, the launch statement, the observable state before
  the call, the subtask, the child's tools and budget) - never the child's future; the
  parsed rubric is frozen on the child's node. The child runs (several children of one
  step concurrently, unless ``sequential_children``). Then a separate scoring call sees
  the frozen rubric, the child's trajectory and its final state and returns
  s = g * sum_j w_j c_j; a child that did not finish gets g = 0, s = 0 with no call.
  Malformed rubric or score output is recorded (raw text in the turn, reason on the
  node) and resolved by ``malformed_policy``; nothing raises. Rubric and score turns
  live on the parent's node (``meta["child"]`` names the child).
* **Counterfactual branches** (``counterfactual = B``, SPEC 3): at a delegation, while
  the rollout has forked fewer than ``fork_cap`` worlds (soft cap: B more must fit;
  otherwise an ordinary child), the runtime forks the world B times and runs B children
  of the same sub-goal from the same start concurrently. Each branch is labelled by the
  judge and scored with the frozen rubric (branches 1..B-1 are *detached*: their scoring
  calls live only in the delegation-point record, never in the tree). Branch 0 is the
  real child: its world is committed to the parent and its subtree is the child's node.
  Each group becomes one :class:`~sera_core.agents.points.DelegationPoint` with the
  ranking loss and pairwise accuracy. Discarded branches open no groups themselves.
  With counterfactuals on, the children of one parent step run one after another
  (``sequential_children``), so a group's fork and commit never overwrite a sibling's
  concurrent work: the sequential order is one valid interleaving of the shared world.
* **Test-time selection** (``select = N``, SPEC 6/8, Table 4): at a delegation, while
  fewer than ``select_fork_cap`` worlds were forked for the task, N candidate children
  run on cloned worlds (sampled at ``select_temperature``; their own delegations select
  too, so selection is bottom-up), each is scored with the frozen rubric once its
  subtree has finished, and the best valid score wins (first on ties; candidate 0 when
  none is valid): its world is committed and its subtree grafted into the tree.
* **Batching.** Many trees run concurrently in one event loop; a
  :class:`~sera_core.agents.actors.PolicyActor` batches every waiting call.
* **Seeds.** Every agent's seed is ``derive_seed(seed, tree_id, node_id)`` (branch trees
  have their own ids), and every call's seed derives from it: runs repeat exactly.

The runtime's agents, delegation, rubric and scoring calls, branch groups and selection
share one event loop and one tree, so they stay one module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from sera_core.agents.actors import Actor, Call
from sera_core.agents.points import Branch, DelegationPoint
from sera_core.agents.prompts import (
    RubricInputs,
    agent_messages,
    build_rubric_prompt,
    build_score_prompt,
    rubric_messages,
    score_messages,
    tools_text,
)
from sera_core.agents.roles import build_turn
from sera_core.agents.tree import Node, Tree, graft, subtree
from sera_core.envs import registry
from sera_core.envs.registry import record_value
from sera_core.policy.base import SamplingParams
from sera_core.rubrics import (
    GLOBAL_RUBRIC,
    MalformedPolicy,
    Parsed,
    Rubric,
    Score,
    forced_zero,
    parse_rubric,
    parse_score,
    ranking_loss,
    resolve_child_reward,
)
from sera_core.utils.aio import Gate, run_sync
from sera_core.utils.errors import UserInputError
from sera_core.utils.seeding import derive_seed

RUBRIC_WRITERS = ("policy", "global", "external")
SCORERS = ("policy", "external")
@dataclass(frozen=True)
class RuntimeConfig:
    """How rollouts are played (defaults: the paper's evaluation contract, SPEC 5)."""

    max_depth: int = 3
    """Depth cap: agents at this depth cannot delegate (and are told so)."""
    max_steps_per_agent: int = 20
    """Steps (turns) of every agent: the agent's turn budget, one name in every config
    (``TrainConfig`` and ``EvalConfig`` too). An environment holds the budget of the agent it
    serves as ``env.state.max_steps`` (the same meaning, set from this); TextWorld's shared
    world budget (``shared_environment_max_steps``) is another thing: it counts every action
    of every agent on the world."""
    root_max_steps: int | None = None
    """The root's steps when different from ``max_steps_per_agent``."""
    temperature: float = 1.0
    """Sampling temperature of agent turns (training 1.0; evaluation 0)."""
    rubric_temperature: float = 1.0
    """Temperature of rubric writing (official: 1.0)."""
    score_temperature: float = 0.0
    """Temperature of scoring calls (official: 0.0)."""
    max_new_tokens: int | None = None
    """Completion cap per agent turn (None: the benchmark's, TextCraft 512, TextWorld 3,072)."""
    call_max_new_tokens: int = 1024
    """Completion cap of rubric and scoring calls (they also end at the token that closes
    their first JSON object: ``SamplingParams.stop_json``, a departure listed in docs/fidelity.md)."""
    max_context_tokens: int | None = None
    """An agent's context limit (None: the benchmark's, TextCraft 10,240, TextWorld 13,312)."""
    counterfactual: int = 0
    """B: branches per counterfactual group (0: none; the paper uses 8)."""
    fork_cap: int = 16
    """Most forked worlds per root rollout (soft: a group is opened only if all B fit)."""
    sequential_children: bool | None = None
    """Run the children of one parent step one after another (None: only when
    ``counterfactual`` is on)."""
    rubric_writer: str = "policy"
    """``policy``, ``global`` (one fixed rubric for every subtask; ablation) or ``external``."""
    scorer: str = "policy"
    """``policy`` or ``external`` (a second actor grades; ablation)."""
    malformed_policy: str = "drop_trajectory"
    """What a malformed rubric or score does to the child's reward: ``drop_trajectory``,
    ``drop_rollout`` or ``binary_fallback``."""
    select: int = 1
    """N: test-time selection (SPEC 6, Table 4). At each delegation, N candidate children
    run on fully cloned worlds, each subtree finished (its own delegations selected the
    same way: bottom-up) before the frozen rubric scores it; the best valid score is kept
    (first on ties; candidate 0 when none is valid) and its world is committed. 1: off."""
    select_temperature: float = 1.0
    """Sampling temperature of the candidates' agents (our decision: the paper samples N
    candidate resolutions; at temperature 0 they would all be the same)."""
    select_fork_cap: int = 32
    """Most forked worlds per root task for selection (N per selecting delegation); past
    it a delegation runs an ordinary child (SPEC 8: 32)."""
    label_children: bool = True
    """Label every ordinary child with the judge too (RAO's rewards, the tree view);
    branches of counterfactual groups are always labelled."""
    max_section_chars: int = 6000
    """Rubric/scoring prompt sections longer than this are truncated in the middle."""
    seed: int = 0
    """Base of every derived seed."""

    def __post_init__(self) -> None:
        if self.max_depth < 0 or self.max_steps_per_agent < 1 or (self.root_max_steps is not None and self.root_max_steps < 1):
            raise UserInputError("max_depth >= 0 and max_steps_per_agent, root_max_steps >= 1 are required")
        if self.counterfactual < 0 or self.counterfactual == 1 or self.fork_cap < 0:
            raise UserInputError("counterfactual is 0 (off) or a group size >= 2; fork_cap >= 0")
        if self.select < 1 or self.select_fork_cap < 0:
            raise UserInputError("select (candidates per delegation) must be >= 1 and select_fork_cap >= 0")
        if self.select > 1 and self.counterfactual:
            raise UserInputError("test-time selection (select > 1) and counterfactual groups (training) do not mix")
        if self.rubric_writer not in RUBRIC_WRITERS:
            raise UserInputError(f"rubric_writer must be one of {RUBRIC_WRITERS}, got {self.rubric_writer!r}")
        if self.scorer not in SCORERS:
            raise UserInputError(f"scorer must be one of {SCORERS}, got {self.scorer!r}")
        MalformedPolicy(self.malformed_policy)
        for name in ("temperature", "rubric_temperature", "score_temperature", "select_temperature"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{name} must be >= 0")

    @property
    def labels_children(self) -> bool:
        """Whether an ordinary (or selected) child is labelled by the judge: asked for, or
        needed by the binary fallback of a malformed rubric or score."""
        return self.label_children or self.malformed_policy == MalformedPolicy.BINARY_FALLBACK.value

    @property
    def sequential(self) -> bool:
        if self.sequential_children is not None:
            return self.sequential_children
        return self.counterfactual > 0 or self.select > 1


@dataclass
class Rollout:
    """One played root task: its tree and its delegation-point records."""

    tree: Tree
    points: list[DelegationPoint] = field(default_factory=list)
    seconds: float = 0.0

    def __repr__(self) -> str:  # short (asyncio may repr a finished task's result)
        return f"Rollout({self.tree!r}, points={len(self.points)}, seconds={self.seconds})"


@dataclass
class _Shared:
    """Per root rollout: forked worlds so far and the delegation points."""

    forks: int = 0
    points: list[DelegationPoint] = field(default_factory=list)


@dataclass
class _Scope:
    """Where an agent's nodes are recorded: the main tree or a discarded branch's tree."""

    tree: Tree
    shared: _Shared
    in_branch: bool = False
    temperature: float | None = None
    """The agents' sampling temperature here (None: ``RuntimeConfig.temperature``)."""


@dataclass
class _Agent:
    """A running agent: its env, node and the index of its current act turn."""

    env: Any
    node: Node
    scope: _Scope
    key: str
    seed: int
    act_index: int = -1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def render_trajectory(node: Node, upto: int | None = None) -> str:
    """An agent's act turns (reply, observation) as text, those before ``upto`` only if given."""
    parts = []
    for i, turn in enumerate(node.turns[:upto]):
        if turn.kind == "act":
            parts.append(f"Step {i}:\n{turn.text.strip()}\nObservation:\n{(turn.observation or '').strip()}")
    return "\n\n".join(parts) or "(no steps yet)"


def pick_candidate(scores: Sequence[float | None]) -> int:
    """Test-time selection's choice: the index of the highest valid score (None: invalid),
    the first one on ties, 0 when no score is valid (SPEC 8)."""
    valid = [(s, -i) for i, s in enumerate(scores) if s is not None]
    return -max(valid)[1] if valid else 0


def branch_score(score: Score | Parsed | None) -> tuple[Score | None, str | None]:
    """A scoring result as a branch's ``(score, score_error)``: the score, or why there is none
    (the parse error, or ``no valid rubric`` when there was nothing to score against)."""
    if isinstance(score, Score):
        return score, None
    return None, score.error if score else "no valid rubric"


def score_json(score: Score) -> dict:
    """A :class:`Score` as the node's JSON."""
    return asdict(score)


def looping(texts: Sequence[str], repeats: int, max_period: int = 5) -> bool:
    """True when the replies end with one block of 1..``max_period`` replies repeated ``repeats`` times."""
    for k in range(1, max_period + 1):
        if len(texts) < k * repeats:
            break
        block = list(texts[-k:])
        if all(list(texts[len(texts) - (i + 1) * k: len(texts) - i * k]) == block for i in range(repeats)):
            return True
    return False


class Runtime:
    """Plays root tasks of one benchmark with one actor (see the module docstring)."""

    def __init__(self, benchmark: str, actor: Actor, cfg: RuntimeConfig | None = None, *, judge: Any = None,
                 external: Actor | None = None, official: bool = False):
        """``benchmark`` names the benchmark (``textcraft``, ``textworld``); :attr:`benchmark` is
        then its :class:`~sera_core.envs.registry.Benchmark`, which makes the environments (``env``)."""
        self.cfg = cfg or RuntimeConfig()
        self.benchmark = registry.benchmark(benchmark, official=official)
        if actor.chat is None:
            raise ValueError("the policy actor needs a token space (chat); text-level actors only serve as `external`")
        self.actor = actor
        self.external = external
        if (self.cfg.rubric_writer == "external" or self.cfg.scorer == "external") and external is None:
            raise ValueError("an external rubric writer or scorer needs the `external` actor")
        self.judge = judge or self.benchmark.make_judge()
        self.max_new_tokens = self.cfg.max_new_tokens or self.benchmark.max_new_tokens
        self.max_context = self.cfg.max_context_tokens or self.benchmark.max_context_tokens
        self._agents: dict[int, _Agent] = {}

    # -- public ------------------------------------------------------------------------
    async def rollout(self, record: dict, tree_id: str | None = None) -> Rollout:
        """Play one root task to the end; errors are recorded in ``tree.meta["error"]`` (a failure)."""
        a, cfg = self.benchmark, self.cfg
        t0 = time.perf_counter()
        env = a.root_env(record, max_steps=cfg.root_max_steps or cfg.max_steps_per_agent, max_depth=cfg.max_depth,
                         child_max_steps=cfg.max_steps_per_agent)
        a.install_hook(env, self._delegate)
        task_id = a.task_id(record)
        tree = Tree.new(tree_id or task_id, a.name, task_id, a.goal(env), seed=cfg.seed)
        for key in ("difficulty", "task_family"):
            value = record_value(record, key)
            if value is not None:
                tree.meta[key] = value
        shared = _Shared()
        try:
            await self._run_agent(env, tree.root, _Scope(tree, shared))
            passed, details = a.root_result(env)
            tree.root_reward = 1.0 if passed else 0.0
            tree.root.result["verdict"] = details
        except Exception as exc:  # noqa: BLE001 - one broken rollout must not kill the batch; it counts as a failure
            tree.meta["error"] = f"{type(exc).__name__}: {exc}"
            tree.root_reward = 0.0
        tree.meta.update(forks=shared.forks, groups=len(shared.points))
        return Rollout(tree, shared.points, round(time.perf_counter() - t0, 4))

    async def rollouts(self, records: Sequence[dict], *, trees: int = 1, progress: bool = False,
                       part: tuple[int, int] = (0, 1), on_done: Callable[[Rollout], None] | None = None,
                       gate: Gate | None = None, desc: str | None = None) -> list[Rollout]:
        """``trees`` rollouts of every record, all concurrently (batched through one actor).

        Tree ids are ``{task_id}/t{k}``; results come back in input order. ``part=(i, n)``
        plays only the trees ``i::n`` of that order (process ``i`` of ``n``): a tree's seed
        derives from its id, so the union of the parts equals one run of all trees.
        ``on_done`` is called with each rollout as it finishes (in finishing order), so a
        caller can keep it before the slowest tree of the run ends. With ``gate``
        (:class:`~sera_core.utils.aio.Gate`, shared by other runs in the same loop) a tree
        plays only while it holds a slot, ranked by its position in this run: runs that share
        a gate enter round robin. ``desc`` names the progress bar."""
        index, count = part
        if not 0 <= index < count:
            raise ValueError(f"part {part}: need 0 <= index < count")
        jobs = [(rec, f"{self.benchmark.task_id(rec)}/t{k}") for rec in records for k in range(trees)][index::count]
        bar = tqdm(total=len(jobs), desc=desc or f"rollouts {self.benchmark.name}", disable=not progress)

        async def one(rank: int, rec: dict, tid: str) -> Rollout:
            async with gate.hold(rank) if gate is not None else contextlib.nullcontext():
                out = await self.rollout(rec, tid)
            if on_done is not None:
                on_done(out)
            bar.update(1)
            bar.set_postfix(success=f"{out.tree.root_reward:.0f}")
            return out

        try:
            return list(await asyncio.gather(*(one(i, r, t) for i, (r, t) in enumerate(jobs))))
        finally:
            bar.close()

    def run(self, records: Sequence[dict], *, trees: int = 1, progress: bool = False,
            part: tuple[int, int] = (0, 1), on_done: Callable[[Rollout], None] | None = None) -> list[Rollout]:
        """Synchronous :meth:`rollouts`. Called while an event loop runs in this thread
        (a notebook cell, the trainer inside one), it runs the rollouts on a fresh loop in a
        worker thread and waits; ``await rollouts(...)`` avoids that thread."""
        return run_sync(lambda: self.rollouts(records, trees=trees, progress=progress, part=part, on_done=on_done))

    async def rescore(self, point: DelegationPoint, *, keep_turn: bool = False) -> DelegationPoint:
        """The same delegation point with this runtime's rubric writer and scorer.

        The branches stay as they were played (trajectories, final states, judge labels);
        the rubric is written again from the point's stored rubric prompt (at
        ``rubric_temperature``; seed ``derive_seed(seed, "rescore", tree_id, child_id)``),
        every branch is scored against it exactly as the runtime scores a child (a branch that
        did not finish, or finished with no report, gets a forced zero without a call), and
        the ranking loss is recomputed; with ``keep_turn`` the new rubric call's turn (its
        prompt and completion tokens: what a training step needs, kilobytes a point) is kept
        as ``rewritten`` (None for the external writer). A fixed set of points scored by two policies measures
        their rubric writing and scoring alone, on the same branches (the tiny experiment's
        held-out points). Points written before the calls were stored cannot be rescored."""
        if (self.cfg.rubric_writer != "global" and not point.rubric_call) \
                or any("final_state" not in b.score_inputs for b in point.branches):
            raise ValueError(f"delegation point {point.tree_id}/{point.child_id} holds no rubric call or score "
                             "inputs (written by an older version): it cannot be rescored")
        key = f"rescore/{point.tree_id}/{point.child_id}"
        rubric, rubric_error, rewritten = GLOBAL_RUBRIC, None, None
        if self.cfg.rubric_writer != "global":
            seed = derive_seed(self.cfg.seed, "rescore", point.tree_id, point.child_id)
            text, rewritten, _ = await self._ask_rubric(point.rubric_call, seed, key, point.child_id)
            parsed = parse_rubric(text)
            rubric, rubric_error = parsed.value, parsed.error  # value None exactly when error is set
        scored = await asyncio.gather(*(
            self._score(b.tree.root, rubric, {"finished": b.finished, "end": b.end, **b.score_inputs},
                        key=f"{key}/b{b.branch}", detached=True)
            for b in point.branches))
        branches = []
        for b, (result, turn) in zip(point.branches, scored, strict=True):
            score, error = branch_score(result)
            branches.append(replace(b, score=score, score_error=error, score_turn=turn))
        out = replace(point, rubric=rubric.to_json() if rubric is not None else None, rubric_error=rubric_error,
                      rubric_turn=None, branches=branches, rewritten=rewritten if keep_turn else None)
        out.ranking = ranking_loss(out.scores, out.labels)
        return out

    async def rescore_many(self, points: Sequence[DelegationPoint], *, keep_turns: bool = False,
                           bar: Any = None) -> list[DelegationPoint]:
        """:meth:`rescore` of every point (``keep_turn=keep_turns``), all concurrently (batched
        through one actor), in input order; ``bar`` (a tqdm bar) counts them as they end."""
        async def one(point: DelegationPoint) -> DelegationPoint:
            out = await self.rescore(point, keep_turn=keep_turns)
            if bar is not None:
                bar.update(1)
            return out

        return list(await asyncio.gather(*(one(p) for p in points)))

    def rescore_all(self, points: Sequence[DelegationPoint], *, progress: bool = False,
                    keep_turns: bool = False) -> list[DelegationPoint]:
        """Synchronous :meth:`rescore_many`, with a progress bar."""
        bar = tqdm(total=len(points), desc="rescore points", disable=not progress)
        try:
            return run_sync(lambda: self.rescore_many(points, keep_turns=keep_turns, bar=bar))
        finally:
            bar.close()

    # -- agents ------------------------------------------------------------------------
    async def _run_agent(self, env: Any, node: Node, scope: _Scope) -> dict:
        """Run one agent to its end; record its turns on ``node``; return its outcome."""
        a, cfg = self.benchmark, self.cfg
        key = f"{scope.tree.tree_id}/{node.node_id}"
        agent = _Agent(env, node, scope, key, derive_seed(cfg.seed, key))
        self._agents[id(env)] = agent
        start = a.start_facts(env)
        observation = a.first_observation(env)
        prompt = self.actor.chat.prompt(agent_messages(
            a.name, a.goal(env), observation, depth=env.state.depth, max_depth=env.max_depth,
            max_steps=env.state.max_steps))
        texts: list[str] = []
        try:
            while not env.done:
                budget = self.max_new_tokens
                if self.actor.enforce_context:
                    budget = min(budget, self.max_context - len(prompt))
                    if budget <= 0:
                        env.stop("context")
                        break
                temperature = cfg.temperature if scope.temperature is None else scope.temperature
                params = SamplingParams(temperature=temperature, max_new_tokens=budget, stop=a.stop,
                                        seed=derive_seed(agent.seed, "act", len(node.turns)))
                info = {"env": a.name, "can_delegate": env.can_delegate, "seed": agent.seed, **a.expert_info(env)}
                gen = await self.actor.complete(Call("act", prompt, params, key, observation, info))
                turn = build_turn("act", prompt, gen.token_ids, gen.logprobs, self.actor.chat.decode, a.name,
                                  meta={"finish_reason": gen.finish_reason, **gen.meta})
                agent.act_index = len(node.turns)
                node.turns.append(turn)
                result = await env.astep(turn.text)
                turn.observation = observation = result.observation
                texts.append(turn.text)
                if env.done:
                    break
                if a.loop_repeats and looping(texts, a.loop_repeats):
                    env.stop("loop")
                    break
                prompt = prompt + gen.token_ids + self.actor.chat.glue(observation, gen.token_ids)
        finally:
            self._agents.pop(id(env), None)
            self.actor.release(key)
        end = "finish" if env.state.finished else (env.state.stopped or "steps")
        node.finished = bool(env.state.finished)
        node.result.update(steps=env.state.steps, max_steps=env.state.max_steps, end=end,
                           finish_message=env.state.finish_message)
        observations = [t.observation for t in node.turns if t.kind == "act"]
        return {"env": env, "end": end, "finished": node.finished, "outcome": a.outcome(env, start, observations),
                "final_state": a.final_state(env), "result_text": env.result_text()}

    # -- delegation --------------------------------------------------------------------
    async def _delegate(self, parent_env: Any, spec: Any) -> str:
        """The hook every launch calls: rubric, child (or branch group), score; the child's report."""
        parent = self._agents[id(parent_env)]
        guard = parent.lock if self.cfg.sequential else contextlib.nullcontext()
        async with guard:
            return await self._child(parent, spec)

    async def _child(self, parent: _Agent, spec: Any) -> str:
        a, cfg, scope = self.benchmark, self.cfg, parent.scope
        goal = a.spec_goal(parent.env, spec)
        node = scope.tree.add_child(parent.node.node_id, goal, parent.act_index, meta={"spec": a.spec_json(spec)})
        rubric, rubric_call = await self._write_rubric(parent, node, spec, goal)
        group = cfg.counterfactual and not scope.in_branch
        if group and scope.shared.forks + cfg.counterfactual <= cfg.fork_cap:
            scope.shared.forks += cfg.counterfactual
            child = await self._branch_group(parent, node, spec, goal, rubric, rubric_call)
        elif cfg.select > 1 and scope.shared.forks + cfg.select <= cfg.select_fork_cap:
            scope.shared.forks += cfg.select
            child = await self._select(parent, node, spec, goal, rubric)
        else:
            if group:
                node.meta["counterfactual"] = "fork cap reached: ordinary child"
            elif cfg.select > 1:
                node.meta["selection"] = {"candidates": 1, "note": "fork cap reached: ordinary child"}
            env = a.spawn(parent.env, spec)
            child = await self._run_agent(env, node, scope)
            if cfg.labels_children:
                node.label, node.result["label_reason"] = await self._label(env)
            score, turn = await self._score(node, rubric, child, key=f"{scope.tree.tree_id}/{node.node_id}")
            if turn is not None:
                parent.node.turns.append(turn)
            self._record_score(node, score, scope.tree)
        return child["result_text"]

    def _rubric_inputs(self, parent: _Agent, spec: Any, goal: str) -> RubricInputs:
        a, env = self.benchmark, parent.env
        turn = parent.node.turns[parent.act_index]
        spans = a.launch_spans(turn.text)
        decision = "\n".join(turn.text[s:e] for s, e in spans) or turn.text
        depth = env.state.depth
        return RubricInputs(
            parent_task=parent.node.task,
            parent_metadata=f"parent depth {depth}; child depth {depth + 1} (max {env.max_depth}); "
                            f"delegation at parent step {parent.act_index}",
            parent_trajectory=render_trajectory(parent.node, parent.act_index),
            delegation=decision, environment=a.observable(env), subtask=goal,
            child_tools=tools_text(a.name, depth + 1 < env.max_depth), child_budget=a.child_budget(env, spec),
        )

    async def _write_rubric(self, parent: _Agent, node: Node, spec: Any, goal: str) -> tuple[Rubric | None, dict]:
        """Write, parse and freeze the child's rubric (before the child exists); also the call
        (``prompt`` and ``info``) that wrote it, for the delegation point (empty: global rubric)."""
        cfg = self.cfg
        if cfg.rubric_writer == "global":
            node.rubric, node.meta["rubric_source"] = GLOBAL_RUBRIC.to_json(), "global"
            return GLOBAL_RUBRIC, {}
        inputs = self._rubric_inputs(parent, spec, goal)
        call = {"prompt": build_rubric_prompt(inputs, max_section_chars=cfg.max_section_chars),
                "info": {"env": self.benchmark.name, "subtask": goal, "inputs": asdict(inputs),
                         **self.benchmark.spec_json(spec)}}
        text, turn, meta = await self._ask_rubric(call, derive_seed(parent.seed, "rubric", node.node_id),
                                                  f"{parent.key}>{node.node_id}", node.node_id)
        if turn is not None:
            parent.node.turns.append(turn)
            node.meta["rubric_turn"] = len(parent.node.turns) - 1
        else:
            node.meta.update(rubric_source="external", rubric_raw=text, rubric_call=meta)
        parsed = parse_rubric(text)
        if parsed.ok:
            node.rubric = parsed.value.to_json()
            return parsed.value, call
        node.rubric_error = parsed.error
        return None, call

    async def _ask_rubric(self, call: dict, seed: int, key: str, child_id: str) -> tuple[str, Any, dict]:
        """One rubric-writing call (``call``: its ``prompt`` text and ``info``) by the policy or
        the external writer: ``(text, turn, meta)``; ``turn`` is None for the external writer."""
        actor = self.external if self.cfg.rubric_writer == "external" else self.actor
        params = SamplingParams(temperature=self.cfg.rubric_temperature, max_new_tokens=self.cfg.call_max_new_tokens,
                                seed=seed, stop_json=True)
        messages = rubric_messages(call["prompt"])
        ids = actor.chat.prompt(messages) if actor.chat is not None else []
        gen = await actor.complete(Call("rubric", ids, params, key, info=call["info"], messages=messages))
        if actor is not self.actor:
            return gen.text, None, gen.meta
        turn = build_turn("rubric", ids, gen.token_ids, gen.logprobs, actor.chat.decode, self.benchmark.name,
                          meta={"child": child_id})
        return turn.text, turn, gen.meta

    async def _score(self, node: Node, rubric: Rubric | None, child: dict, *, key: str, detached: bool = False):
        """The child's score against the frozen rubric: ``(Score | Parsed | None, turn | None)``.

        None without a valid rubric; a forced zero (no call) when the child did not finish,
        or finished with no usable output (an empty finish message: nothing for the parent)."""
        if rubric is None:
            return None, None
        if not child["finished"]:
            return forced_zero(f"the child did not finish ({child['end']})"), None
        if not (node.result.get("finish_message") or "").strip():
            return forced_zero("the child finished with no output"), None
        cfg = self.cfg
        prompt_text = build_score_prompt(rubric, node.task, render_trajectory(node), child["final_state"],
                                         max_section_chars=cfg.max_section_chars)
        actor = self.external if cfg.scorer == "external" else self.actor
        params = SamplingParams(temperature=cfg.score_temperature, max_new_tokens=cfg.call_max_new_tokens,
                                seed=derive_seed(cfg.seed, key, "score"), stop_json=True)
        messages = score_messages(prompt_text)
        ids = actor.chat.prompt(messages) if actor.chat is not None else []
        info = {"env": self.benchmark.name, "rubric": rubric, "outcome": child["outcome"]}
        gen = await actor.complete(Call("score", ids, params, key, info=info, messages=messages))
        turn = None
        if actor is self.actor:
            turn = build_turn("score", ids, gen.token_ids, gen.logprobs, actor.chat.decode, self.benchmark.name,
                              meta={"child": node.node_id, "detached": detached})
            text = turn.text
        else:
            text = gen.text
            node.meta.update(score_raw=text, score_call=gen.meta)
        parsed = parse_score(text, rubric)
        return (parsed.value if parsed.ok else parsed), turn

    def _record_score(self, node: Node, score: Score | Parsed | None, tree: Tree) -> None:
        """Store the score (or why there is none) and the child's resolved reward."""
        if score is None:
            score = Parsed(None, "no valid rubric to score against", "")
        if isinstance(score, Score):
            node.score = score_json(score)
        else:
            node.score_error = score.error
        reward = resolve_child_reward(score, MalformedPolicy(self.cfg.malformed_policy), node.label)
        node.result.update(reward=reward.reward, reward_source=reward.source)
        if reward.drop_rollout:
            tree.meta["drop_rollout"] = True

    async def _label(self, env: Any) -> tuple[bool | None, str]:
        """The judge's binary label of a finished child (None: no label)."""
        if getattr(self.judge, "remote", False):  # may wait on an endpoint: off the event loop
            verdict = await asyncio.to_thread(self.judge.judge, env)
        else:
            verdict = self.judge.judge(env)
        return verdict.success, verdict.reason

    # -- test-time selection ------------------------------------------------------------
    async def _select(self, parent: _Agent, node: Node, spec: Any, goal: str, rubric: Rubric | None) -> dict:
        """N candidates of one sub-goal on cloned worlds, scored bottom-up; the best is kept.

        Every candidate runs in a tree of its own (sampled at ``select_temperature``; its
        delegations select too), then the frozen rubric scores each finished candidate.
        :func:`pick_candidate` chooses; the chosen world is committed to the parent and its
        subtree is grafted at ``node`` (:func:`~sera_core.agents.tree.graft`); the others
        are dropped, their scores kept in ``node.meta["selection"]``."""
        a, n, scope = self.benchmark, self.cfg.select, parent.scope
        envs = [a.fork_child(parent.env, spec) for _ in range(n)]
        trees = [Tree.new(f"{scope.tree.tree_id}/{node.node_id}/c{b}", a.name, scope.tree.task_id, goal, candidate=b)
                 for b in range(n)]
        scopes = [_Scope(t, scope.shared, temperature=self.cfg.select_temperature) for t in trees]
        children = await asyncio.gather(*(self._run_agent(envs[b], trees[b].root, scopes[b]) for b in range(n)))
        scored = await asyncio.gather(*(self._score(trees[b].root, rubric, children[b], key=f"{trees[b].tree_id}/0")
                                        for b in range(n)))
        values = [s.final_score if isinstance(s, Score) else None for s, _ in scored]
        best = pick_candidate(values)
        a.commit(parent.env, envs[best])
        parent.env.children.append(envs[best])
        graft(scope.tree, node.node_id, trees[best])
        if self.cfg.labels_children:
            node.label, node.result["label_reason"] = await self._label(envs[best])
        score, turn = scored[best]
        if turn is not None:
            turn.meta["child"] = node.node_id
            parent.node.turns.append(turn)
        self._record_score(node, score, scope.tree)
        node.meta["selection"] = {"candidates": n, "scores": values, "chosen": best,
                                  "finished": [c["finished"] for c in children]}
        return children[best]

    # -- counterfactual groups -----------------------------------------------------------
    async def _branch_group(self, parent: _Agent, node: Node, spec: Any, goal: str, rubric: Rubric | None,
                            rubric_call: dict):
        """B branches of one sub-goal on forked worlds; branch 0 is the real child."""
        a, b_count, scope = self.benchmark, self.cfg.counterfactual, parent.scope
        state_before = a.world_json(parent.env)
        envs = [a.fork_child(parent.env, spec) for _ in range(b_count)]
        nodes, scopes = [node], [scope]
        for b in range(1, b_count):
            tree = Tree.new(f"{scope.tree.tree_id}/{node.node_id}/b{b}", a.name, scope.tree.task_id, goal,
                            branch=b, parent_tree=scope.tree.tree_id, parent_node=node.node_id, depth_offset=node.depth)
            nodes.append(tree.root)
            scopes.append(_Scope(tree, scope.shared, in_branch=True))
        children = await asyncio.gather(*(self._run_agent(envs[b], nodes[b], scopes[b]) for b in range(b_count)))
        labels = [await self._label(env) for env in envs]
        scored = await asyncio.gather(*(
            self._score(nodes[b], rubric, children[b], key=f"{scopes[b].tree.tree_id}/{nodes[b].node_id}", detached=b > 0)
            for b in range(b_count)))
        a.commit(parent.env, envs[0])
        parent.env.children.append(envs[0])
        node.label, node.result["label_reason"] = labels[0]
        if scored[0][1] is not None:
            parent.node.turns.append(scored[0][1])
        self._record_score(node, scored[0][0], scope.tree)
        node.meta["counterfactual"] = f"group of {b_count}, branch 0 committed"
        branches = []
        for b in range(b_count):
            score, turn = scored[b]
            branch_tree = subtree(scope.tree, node.node_id, f"{scope.tree.tree_id}/{node.node_id}/b0") if b == 0 \
                else scopes[b].tree
            branches.append(Branch(
                b, branch_tree, children[b]["finished"], children[b]["outcome"]["steps"], children[b]["end"],
                a.world_json(envs[b]), labels[b][0], labels[b][1], *branch_score(score), turn,
                {"final_state": children[b]["final_state"], "outcome": children[b]["outcome"]}))
        act = parent.node.turns[parent.act_index]
        point = DelegationPoint(
            scope.tree.tree_id, a.name, scope.tree.task_id, parent.node.node_id, node.node_id, node.event_id,
            node.launch_step, {"prompt_ids": list(act.prompt_ids), "completion_ids": list(act.completion_ids),
                               "text": render_trajectory(parent.node, parent.act_index)},
            goal, node.rubric, node.rubric_error, node.meta.get("rubric_turn"), state_before, branches,
            rubric_call=rubric_call)
        point.ranking = ranking_loss(point.scores, point.labels)
        scope.shared.points.append(point)
        return children[0]
