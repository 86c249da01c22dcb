"""The rubric stage on fixed branches: curve 1 of the tiny experiment (docs/measurements.md).

SERA's rubric-generation stage trains the rubric writer by how well the rubric lets the
scorer rank the B counterfactual branches of a delegation point (SPEC 3). In a full run the
branches are the policy's own; a 135M policy's branches mostly fail together (a group of one
outcome carries no ranking signal), so this stage is isolated here: **the branches are played
by the noisy expert** (:func:`sera_core.eval.points.heldout_points`: seeded mistakes, only
the *mixed* groups kept) and only the rubric and the scores are the policy's. That is the
whole difference from the trainer's rubric stage; the reward, the baseline and the update are
the same functions.

Per update ``v`` (a :class:`~sera_core.train.trainer.Trainer` with schedule
``rubric_generation:1`` supplies model, optimizer, engine, checkpoints):

1. draw ``points_per_update`` points from the training pool (mixed groups of the noisy
   expert's rollouts of the first ``pool_tasks`` medium *train*-world tasks) with
   ``random.Random(derive_seed(seed, "points", v))``;
2. the policy writes each point's rubric again (temperature ``rubric_temperature``) and
   scores its 8 stored branches (temperature ``scoring_temperature``),
   :meth:`~sera_core.agents.runtime.Runtime.rescore` keeping the rubric calls' tokens, runtime seed
   ``derive_seed(seed, "rescore", v)``;
3. rubric datums, SERA's ranking reward (:mod:`sera_core.rewards.rubric_ranking`,
   :func:`~sera_core.train.advantages.rubric_advantages`)::

       r_g = -L_rank(g) = -mean_{(p, n)} max(0, 0.2 - s_p + s_n),   A_g = r_g - mean_{g' != g} r_g'

4. with ``train_scorer`` (the workbook's extension, off in SERA: SPEC 3 keeps scoring calls
   out of the optimizer) each scoring call is trained on its share of the same hinge terms::

       r_b = -mean_{pairs (p, n) holding b} max(0, 0.2 - s_p + s_n),   A_b = r_b - mean_{b' != b} r_b'

   over the branches of one point that were scored (a branch the runtime forced to 0 has no
   call; a malformed score leaves the ranking, as in :func:`~sera_core.rubrics.ranking_loss`,
   and its call gets no datum); a point whose ``r_b`` are all equal gives none. The
   ``rubric_scorer_order`` arm rewards each call by its share of the pairwise *order* instead
   (the held-out readout, :func:`~sera_core.rubrics.pair_order`)::

       r_b = mean_{o of the other label} [1 if (b, o) in the right order, 1/2 if tied, 0 if reversed]

   Why (measured, docs/measurements.md): on a scorer that answers 1 or 0, the hinge is
   lopsided. With every other branch at 1.0, a failure's call that says ``false`` gains 0.2
   (its terms fall from 0.2 to 0), a success's call that says ``false`` loses 1.0 (0.2 to 1.2):
   the update pushes ``P("success": true)`` up five times harder than down, and a long
   ``rubric_scorer`` run drove the gate's best threshold from 0.82 to 0.999 while its sampled
   calls disagreed less and less (11 scoring datums an update over its first 8 updates, 3
   over the last 9). Under the order credit, a call that answers ``false`` instead of
   ``true`` (0 instead of 1) raises its ``r_b`` by 1/2 if its branch failed and lowers it by 1/2
   if its branch succeeded, whatever the other calls answered: both outcomes weigh alike, and
   the reward counts what the held-out readout counts. A malformed call earns 0 under the order
   credit (the hinge leaves it without a datum, the committed ``rubric_scorer`` runs' rule): a
   first order-credit run that gave it no datum lost the JSON format, score validity 100% ->
   68% on the held-out points by update 10, its reasons breaking their strings
   (docs/measurements.md). The negative advantages fall on every token of a call, the format's
   too, and a malformed call escaped them. The ``rubric_scorer_label`` arm trains the gate token
   of a balanced draw of the scoring calls toward the judge's label instead, a cross-entropy
   (:func:`gate_rows`), and no other token of the calls. Why: a ranking reward is blind to
   the gate's bias, which is what the greedy readout turns on. With independent gates
   ``p = P(true | success)``, ``q = P(true | failure)``, a pair's expected order credit is
   ``1/2 + (p - q)/2``; its gradient on a logit shift ``b`` shared by every call is
   ``(p(1-p) - q(1-q))/2``, which at the shipped scorer's ``p, q`` of 0.75-0.9 is a few
   hundredths (it points down while ``p > q > 1/2``, but sampling noise swamps it: the order
   arm's threshold fell on one seed and rose on another). The cross-entropy's gradient on
   the same shift is ``(1 - p) - q``: ten to twenty times larger there, and zero only where
   the gate is right. It reads the same labels the ranking reads;
5. one CISPO step over those tokens (:func:`~sera_core.train.update.loss_and_backward`).

The ``rubric_belief`` arm (the workbook's second extension) trains the writer only, as
``rubric`` does, but its scoring calls run at temperature 0 (the official setting) and step 3
ranks each branch by the probability its greedy call put on ``"success": true`` instead of by
the score it wrote (:func:`~sera_core.eval.points.branch_beliefs`; a forced zero stays 0)::

    q_b = P_pi(g = 1 | rubric, branch b),   r_g = -mean_{(p, n)} max(0, 0.2 - q_p + q_n)

an expected gate in the manner of G-Eval's probability-weighted scores, read from the greedy
call's recorded log-probabilities (no extra call). Since the gate multiplies the final score
(SPEC 3: ``final_score = g * sum_j w_j c_j``), ``q_b`` is what the score's expectation hinges
on; it is where the shipped scorer's uncertainty lives (its greedy call is sure of every token
but the gate and the first score digit). docs/fidelity.md lists it as a departure.

Why the extension exists (our decision, measured): the shipped adapter's scorer answers 1.0
for every branch at temperature 0, so every rubric it could write earns the same ``-L_rank =
-0.2`` and the writer alone has no gradient (every group drops out as zero-variance). At
temperature 1 its scores vary, and ``r_b`` rewards the calls that put failures below
successes. The ``rubric`` arm trains the writer only, SERA as specified. ``rubric_belief``
gives the writer a signal with the scorer left as it is: a rubric is rewarded for making the
greedy scorer's belief in success rank the branches, so a writer that learns to write gates
the scorer can check pushes failures' ``q_b`` down, towards a greedy ``false``.

Before training and every ``eval_every`` updates the policy rescores the **held-out points**
(the 34 mixed groups of the last 24 medium *val* tasks, :func:`~sera_core.tiny.measure.points_tasks`)
with both calls at temperature 0: pairwise accuracy, ranking loss (95% intervals over points),
the belief accuracy (the same greedy calls ranked by the probability they put on ``success:
true``, :func:`~sera_core.eval.points.success_belief`: what the scorer's reward trains, visible
before its greedy answer flips), the gate ceiling (the most a shift of the gate's bias alone
could give the greedy readout, :func:`~sera_core.eval.points.gate_ceiling`) and validity
(:func:`~sera_core.eval.points.point_metrics`),
one row of ``heldout.csv`` per measurement. Each update writes a row of ``updates.csv``; a checkpoint follows every update,
so a killed run resumes at its last update and measurement with nothing repeated or lost.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Any

import torch
from tqdm.auto import tqdm

from sera_core.agents.actors import as_actor
from sera_core.agents.points import DelegationPoint
from sera_core.agents.runtime import Runtime
from sera_core.agents.summary import read_points
from sera_core.envs.registry import pick_tasks
from sera_core.eval.points import branch_beliefs, gate_token, heldout_points, point_metrics
from sera_core.policy.chat import ChatFormat
from sera_core.rewards import Datum
from sera_core.rubrics import RANKING_MARGIN, RankingResult, pair_order, ranking_loss
from sera_core.train.advantages import REWARD_TOLERANCE, Advantage, leave_one_out, rubric_advantages, uniform
from sera_core.train.config import load_config
from sera_core.train.trainer import Trainer, append_row, keep_rows
from sera_core.train.update import TokenRow, advantage_weighted_logprob, logprob_by_sign, rescored, turn_rows
from sera_core.utils.jsonio import write_atomic, write_jsonl
from sera_core.utils.seeding import derive_seed

ARMS = ("rubric", "rubric_scorer", "rubric_scorer_order", "rubric_scorer_label", "rubric_belief")
"""``rubric``: SERA's rubric stage (the writer trained); ``rubric_scorer``: the writer and the
scoring calls trained (module docstring, step 4); ``rubric_scorer_order``: the same, the scoring
calls rewarded by their share of the pairwise order (step 4); ``rubric_scorer_label``: the
writer as in ``rubric``, the scoring calls' success gate trained toward the judge's label
(step 4, :func:`gate_rows`); ``rubric_belief``: the writer
trained on the ranking of the greedy scorer's beliefs (module docstring, after step 5)."""
CREDITS = ("hinge", "order")
"""The credits a scoring call can earn (:func:`branch_rewards`)."""
SCORER_ARMS = {"rubric_scorer": "hinge", "rubric_scorer_order": "order", "rubric_scorer_label": "label"}
"""The arms that train the scoring calls, and how: a credit each call earns (:data:`CREDITS`,
:func:`branch_rewards`), or ``label``, the gate token alone toward the label (:func:`gate_rows`)."""

UPDATE_COLUMNS = ("version", "points", "mixed", "pairwise_accuracy", "belief_accuracy", "ranking_loss", "belief_loss", "rubric_validity",
                  "score_validity", "datums_rubric", "datums_score", "tokens_rubric", "tokens_score", "loss",
                  "grad_norm", "seconds_generation", "seconds_update", "seconds")
HELDOUT_COLUMNS = ("version", "points", "mixed", "pairwise_accuracy", "pairwise_accuracy_ci", "belief_accuracy",
                   "belief_accuracy_ci", "gate_ceiling", "gate_threshold", "ranking_loss", "ranking_loss_ci", "rubric_validity",
                   "score_validity", "seconds")


@dataclass(frozen=True)
class RubricStageConfig:
    """One run of the rubric stage on fixed branches."""

    arm: str = "rubric_scorer"
    """What is trained: one of :data:`ARMS`."""
    seed: int = 0
    """Seeds the point draws, the sampled calls and the LoRA dropout (every draw derives from it)."""
    updates: int = 10
    """Optimizer updates."""
    points_per_update: int = 8
    """Delegation points drawn per update (each: 1 rubric call and up to 8 scoring calls)."""
    pool_tasks: int = 48
    """Medium train-world tasks whose noisy-expert mixed groups are the training pool."""
    heldout_tasks: int = 24
    """Last medium val tasks whose mixed groups are the held-out points (24: 34 points)."""
    heldout_ids: tuple[str, ...] | None = None
    """The held-out points' medium val tasks by id instead (a protocol's set, ``scripts/rubric_curve.py
    --protocol``; :attr:`heldout_tasks` then unused)."""
    eval_every: int = 5
    """Measure the held-out points before training and after every this many updates (and at the end)."""
    heldout_limit: int | None = None
    """Measure only the first this many held-out points (None: all; 0: no measurement, the
    notebook's smoke setting, which reads the trained calls' log-probabilities instead)."""
    rubric_temperature: float = 1.0
    """Sampling temperature of the rubric calls in training (held-out: 0)."""
    score_temperature: float | None = None
    """Sampling temperature of the scoring calls in training (held-out: 0, the official
    setting). None: 0 for ``rubric_belief`` (its reward reads the greedy call), else 1."""
    score_calls: int = 4
    """Scoring calls trained per point (the :data:`SCORER_ARMS`): a seeded draw among those with a
    datum, their advantages computed over all of them. A call's row is its whole prompt (the
    rubric, the task and the child's trajectory: about 2,500 tokens), so this bounds the
    update's cost: about 300 trained-row tokens a second on 2 cores."""
    gate_weight: float = 1.0
    """``lambda`` of the ``rubric_scorer_label`` arm: the update's loss is the writer's CISPO
    token mean plus ``lambda`` times the mean cross-entropy of its gate rows (:func:`gate_rows`;
    each row's advantage is ``lambda * N / n``, ``N`` the update's trained tokens, ``n`` its gate
    rows), so the gate's share does not shrink with the length of the rubrics."""
    config: str = "textcraft/sera_tiny.yaml"
    """The training config that gives model, engine, precision, optimizer and the CISPO bounds."""
    lr: float | None = None
    """Learning rate (None: the config's)."""
    kv_cache_gib: float = 6.0
    """The CPU engine's KV cache (the config's ``engine_kv_cache_gib``, 2 by default there). A
    scoring prompt holds the child's whole trajectory (about 3,000 tokens, 23 KB a token in
    bfloat16), and a call continues after each inner brace of its JSON with its prompt again:
    the 64 calls the engine runs at once need about 5 GiB for those prompts to stay cached
    between rounds (:meth:`~sera_core.policy.vllm_backend.VLLMPolicy._admit`)."""
    measure_step: bool = False
    """Rescore each update's trained rows in eval mode just before and just after its optimizer
    step (two extra forward passes, no gradient) into :attr:`RubricStage.last_moved`: what one
    step did to ``log pi`` of those tokens, by advantage sign and advantage-weighted. For a
    notebook's smoke setting and tests; off in experiments."""
    points_dir: str | None = None
    """Where the pool and the held-out points are cached (None: the parent of ``out``)."""
    out: str = "runs/rubric_stage/rubric_scorer_seed0"
    """Run folder: ``updates.csv``, ``heldout.csv``, ``checkpoint/``."""

    @property
    def points_folder(self) -> Path:
        """Where the pool and the held-out points are cached (:attr:`points_dir` resolved)."""
        return Path(self.points_dir) if self.points_dir else Path(self.out).parent

    @property
    def scoring_temperature(self) -> float:
        """The training scoring calls' temperature (:attr:`score_temperature` resolved)."""
        if self.score_temperature is not None:
            return self.score_temperature
        return 0.0 if self.arm == "rubric_belief" else 1.0

    def __post_init__(self) -> None:
        if self.arm not in ARMS:
            raise ValueError(f"arm must be one of {ARMS}, got {self.arm!r}")
        for name in ("updates", "points_per_update", "pool_tasks", "heldout_tasks", "eval_every", "score_calls"):
            if getattr(self, name) < (0 if name == "updates" else 1):
                raise ValueError(f"{name} must be >= {0 if name == 'updates' else 1}, got {getattr(self, name)}")
        for name in ("rubric_temperature", "score_temperature"):
            if (getattr(self, name) or 0.0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.heldout_limit is not None and self.heldout_limit < 0:
            raise ValueError(f"heldout_limit must be >= 0 or None, got {self.heldout_limit}")
        if self.gate_weight <= 0:
            raise ValueError(f"gate_weight must be > 0, got {self.gate_weight}")
        if self.heldout_ids is not None:
            object.__setattr__(self, "heldout_ids", tuple(self.heldout_ids))
            if not self.heldout_ids:
                raise ValueError("heldout_ids, when given, names at least one task")

    @property
    def heldout_name(self) -> str:
        """The held-out set in file names: ``24`` (the last 24 tasks) or a digest of :attr:`heldout_ids`."""
        if self.heldout_ids is None:
            return str(self.heldout_tasks)
        import hashlib

        return "ids" + hashlib.sha256("\n".join(self.heldout_ids).encode()).hexdigest()[:12]


def branch_rewards(point: DelegationPoint, margin: float = RANKING_MARGIN, credit: str = "hinge") -> list[float | None]:
    """Each branch's mean credit over the pairs ``(p, n)`` that hold it, for the branches in
    the ranking (a label and a score), None for the others (module docstring, step 4):
    ``credit="hinge"``: ``-max(0, margin - s_p + s_n)``; ``"order"``: ``1[s_p > s_n] + 1[s_p = s_n] / 2``,
    and a labelled branch whose scoring call was malformed earns 0, the least a call can
    (it stays out of the other branches' pairs, as in :func:`~sera_core.rubrics.ranking_loss`)."""
    if credit not in CREDITS:
        raise ValueError(f"credit must be one of {CREDITS}, got {credit!r}")

    def term(p: float, n: float) -> float:
        return pair_order(p, n) if credit == "order" else -max(0.0, margin - p + n)

    scores, labels = point.scores, point.labels
    good = [i for i, (s, y) in enumerate(zip(scores, labels, strict=True)) if y is True and s is not None]
    bad = [i for i, (s, y) in enumerate(zip(scores, labels, strict=True)) if y is False and s is not None]
    out: list[float | None] = [None] * len(scores)
    if not good or not bad:
        return out
    for i in good:
        out[i] = fmean(term(scores[i], scores[n]) for n in bad)
    for i in bad:
        out[i] = fmean(term(scores[p], scores[i]) for p in good)
    if credit == "order":
        for i, b in enumerate(point.branches):
            if b.malformed and b.label is not None:
                out[i] = 0.0
    return out


def score_advantages(point: DelegationPoint, credit: str = "hinge") -> list[tuple[int, float]]:
    """``(branch, A_b)`` for the point's scoring calls in the ranking, ``A_b = r_b - mean_{b' != b} r_b'``
    over those calls (``r_b``: :func:`branch_rewards` with ``credit``); none when their rewards
    are all equal (zero variance, to :data:`~sera_core.train.advantages.REWARD_TOLERANCE`)."""
    rewards = branch_rewards(point, credit=credit)
    called = [(b.branch, r) for b, r in zip(point.branches, rewards, strict=True) if r is not None and b.score_turn is not None]
    if uniform([r for _, r in called]):
        return []
    return list(zip([i for i, _ in called], leave_one_out([r for _, r in called]), strict=True))


def gate_rows(points: Sequence[DelegationPoint], *, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]],
              calls: int, rng: random.Random, weight: float = 1.0) -> list[TokenRow]:
    """The ``rubric_scorer_label`` arm's scoring rows (module docstring, step 4): per point, up
    to ``calls // 2`` successes and as many failures (a draw with ``rng`` among the labelled
    branches whose scoring call wrote a gate, :func:`~sera_core.eval.points.gate_token`); for
    each, the call's prompt and its completion up to the gate's value, that value set to the
    branch's label (``true`` for a success, ``false`` for a failure), and only that token
    trained, with advantage ``weight``. With the old log-probabilities taken from the model
    itself (:func:`~sera_core.train.update.rescored`: ratio 1), CISPO's term is the
    cross-entropy of the gate against the label::

        loss_b = -weight * log pi(y_b | rubric, branch b, the call's text before its gate)

    The rows' ``old_logprobs`` are 0 here; the caller fills them. A written value that matches
    the label keeps its own token; the other spelling is the first token of the separator the
    call wrote before its value (a space, say) followed by the label's word; a branch whose
    other spelling does not begin with a token holding the word's first letter gets no row."""
    rows: list[TokenRow] = []
    for p in points:
        found = {True: [], False: []}
        for b in p.branches:
            gate = gate_token(b.score_turn.completion_ids, decode) if b.score_turn is not None and b.label is not None else None
            if gate is not None:
                found[b.label].append((b, gate))
        k = min(calls // 2, len(found[True]), len(found[False]))
        for b, (t, value) in sorted(rng.sample(found[True], k) + rng.sample(found[False], k), key=lambda x: x[0].branch):
            turn, want = b.score_turn, "true" if b.label else "false"
            head = list(turn.completion_ids[:t])
            if value == want:
                target = turn.completion_ids[t]
            else:
                text = decode(list(turn.completion_ids[:t + 1]))
                target = encode(text[len(decode(head)):text.rindex(value[0])] + want)[0]
                if want[0] not in decode([target]):
                    continue  # the tokenizer splits the separator from the word: no one token holds the choice
            ids = tuple(turn.prompt_ids) + tuple(head) + (target,)
            trained = (False,) * (len(ids) - 1) + (True,)
            rows.append(TokenRow(ids, trained, (0.0,) * len(ids), tuple(weight if m else 0.0 for m in trained)))
    return rows


def rubric_ranking(point: DelegationPoint, decode: Callable[[list[int]], str] | None = None) -> RankingResult:
    """The ranking the writer's reward ``r_g = -L_rank`` reads: the point's scores, or with
    ``decode`` the branches' beliefs (:func:`~sera_core.eval.points.branch_beliefs`, the
    ``rubric_belief`` arm)."""
    if decode is None:
        return point.ranking
    return ranking_loss(branch_beliefs(point, decode), point.labels)


def stage_rows(points: Sequence[DelegationPoint], *, train_scorer: bool, score_calls: int = 8,
               rng: random.Random | None = None, decode: Callable[[list[int]], str] | None = None,
               credit: str = "hinge") -> tuple[list[TokenRow], dict[str, int]]:
    """The update's token rows: each rewritten rubric call with its ``A_g`` (rubric role; with
    ``decode``, its reward read from the beliefs, :func:`rubric_ranking`) and,
    with ``train_scorer``, up to ``score_calls`` scoring calls per point (their ``A_b`` from
    ``credit``, :func:`score_advantages`; drawn with ``rng``
    when there are more) with their ``A_b`` (score role); and the datums and trained tokens
    of each role. The draw is among the calls with ``A_b != 0`` (beyond
    :data:`~sera_core.train.advantages.REWARD_TOLERANCE`): a call that earned its
    point's mean moves nothing and costs a row of its whole prompt (about 3,000 tokens)."""
    rankings = [(p, rubric_ranking(p, decode)) for p in points]
    datums = [Datum(f"{p.tree_id}/{p.child_id}", p.task_id, p.parent_id, 0, "rubric", p.parent_id.count("."),
                    -r.loss, group=f"{p.parent_id}>{p.child_id}")
              for p, r in rankings if not r.skipped and p.rewritten is not None]
    turns = {f"{p.tree_id}/{p.child_id}": p.rewritten for p in points}
    adv: list[Advantage] = rubric_advantages(datums)
    rows = [r for a in adv for r in turn_rows([turns[a.datum.tree_id]], "rubric", a.value)]
    count = {"datums_rubric": len(adv), "tokens_rubric": sum(r.tokens for r in rows), "datums_score": 0, "tokens_score": 0}
    if train_scorer:
        rng = rng or random.Random(0)
        for p in points:
            calls = [(branch, value) for branch, value in score_advantages(p, credit) if abs(value) > REWARD_TOLERANCE]
            for branch, value in sorted(rng.sample(calls, min(score_calls, len(calls)))):
                trained = turn_rows([p.branches[branch].score_turn], "score", value)
                rows += trained
                count["datums_score"] += 1
                count["tokens_score"] += sum(r.tokens for r in trained)
    return rows, count


def stage_points(benchmark: str, split: str, tasks: int | Sequence[str], path: Path, *, last: bool = False) -> list[DelegationPoint]:
    """The noisy expert's mixed groups on the first (``last``: the last) ``tasks`` medium
    tasks of ``split``, or on the medium tasks of ``split`` with the ids ``tasks`` (in that
    order; a missing id is an error naming it), built once into ``path`` (seconds; the same
    bytes every time)."""
    if not path.exists():
        records = pick_tasks(benchmark, split, difficulty="medium")
        if isinstance(tasks, int):
            chosen = records[-tasks:] if last else records[:tasks]
        else:
            by_id = {r["id"]: r for r in records}
            if missing := [i for i in tasks if i not in by_id]:
                raise ValueError(f"no medium {benchmark} {split} task(s) {missing[:5]}")
            chosen = [by_id[i] for i in tasks]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(path, [p.to_json() for p in heldout_points(benchmark, chosen)])
    return read_points(path)


def heldout_set(cfg: RubricStageConfig, env: str) -> list[DelegationPoint]:
    """``cfg``'s held-out points in ``env``: the mixed groups of the last ``heldout_tasks``
    medium val tasks (cached in :attr:`~RubricStageConfig.points_folder`), the first
    ``heldout_limit`` of them."""
    path = cfg.points_folder / f"heldout_{env}_{cfg.heldout_name}.jsonl"
    tasks = cfg.heldout_tasks if cfg.heldout_ids is None else cfg.heldout_ids
    return stage_points(env, "val", tasks, path, last=True)[:cfg.heldout_limit]


def subtask_overlap(heldout: Sequence[DelegationPoint], pool: Sequence[DelegationPoint]) -> dict[str, Any]:
    """How many held-out points delegate a subtask (its text) that some training point of
    ``pool`` delegates too: ``{"points", "shared", "subtasks_shared", "examples"}``. A shared
    subtask is a child the trained writer and scorer have seen verbatim (issue 60 reports it)."""
    trained = {p.subtask for p in pool}
    shared = [p for p in heldout if p.subtask in trained]
    subtasks = sorted({p.subtask for p in shared})
    return {"points": len(heldout), "shared": len(shared), "subtasks_shared": len(subtasks), "examples": subtasks[:5]}


class RubricStage(Trainer):
    """The rubric stage on fixed branches (module docstring); ``run()`` trains and measures."""

    def __init__(self, cfg: RubricStageConfig, *, progress: bool = True):
        overrides = {"schedule": "rubric_generation:1", "seed": cfg.seed, "out": cfg.out, "total_updates": cfg.updates,
                     "checkpoint_every": 1, "method": f"sera_{cfg.arm}_stage", "engine_kv_cache_gib": cfg.kv_cache_gib}
        if cfg.lr is not None:
            overrides["lr"] = cfg.lr
        super().__init__(load_config(cfg.config, **overrides), progress=progress)
        self.stage_cfg = cfg
        cache, env = cfg.points_folder, self.cfg.env
        self.pool = stage_points(env, "train", cfg.pool_tasks, cache / f"pool_{env}_{cfg.pool_tasks}.jsonl", last=False)
        self.heldout = heldout_set(cfg, env)
        self.last_rows: list[TokenRow] = []
        self.last_stats: dict[str, Any] = {}
        self.last_moved: dict[str, dict[str, float | None]] = {}
        """With ``measure_step``: the last update's :meth:`measure_rows` before and after its step."""
        name = "".join(c if c.isalnum() else "_" for c in self.cfg.model)
        self.start_file = cache / f"heldout_start_{env}_{name}_{cfg.heldout_name}_{len(self.heldout)}.json"
        if len(self.pool) < cfg.points_per_update:
            raise ValueError(f"the pool holds {len(self.pool)} mixed points, fewer than points_per_update="
                             f"{cfg.points_per_update}: raise pool_tasks")

    def rescored(self, points: Sequence[DelegationPoint], seed: int, rubric_temperature: float,
                 score_temperature: float, progress: bool = False, keep_turns: bool = False) -> list[DelegationPoint]:
        """``points`` rubric-written and scored again by the current policy (``keep_turns``:
        with the rubric calls' tokens, :meth:`~sera_core.agents.runtime.Runtime.rescore`)."""
        rc = self.cfg.rollout_settings(seed=seed, rubric_temperature=rubric_temperature,
                                       score_temperature=score_temperature)
        return Runtime(self.cfg.env, as_actor(self.policy), rc).rescore_all(points, progress=progress, keep_turns=keep_turns)

    def measure(self) -> dict[str, Any]:
        """The held-out metrics of the current weights (both calls at temperature 0, so the
        seed does not enter: the starting model's are measured once per cache folder and
        shared by every arm and seed, ``start_file``)."""
        if self.updates_done == 0 and self.start_file.exists():
            row = json.loads(self.start_file.read_text())
            if "gate_ceiling" in row:  # a file from before the belief readout or the gate ceiling is measured again
                return row
        t0 = time.perf_counter()
        out = self.rescored(self.heldout, derive_seed(0, "heldout"), 0.0, 0.0, progress=self.progress)
        row = {"version": self.updates_done, **point_metrics(out, self.policy.decode), "seconds": round(time.perf_counter() - t0, 1)}
        if self.updates_done == 0:
            write_atomic(self.start_file, json.dumps(row).encode())
        return row

    def measure_rows(self, rows: list[TokenRow]) -> dict[str, float | None]:
        """``log pi`` of ``rows``' trained tokens under the current model (eval mode, no
        gradient): the mean by advantage sign (``pos``, ``neg``) and ``sum A log pi / N``
        (``weighted``, :func:`~sera_core.train.update.advantage_weighted_logprob`)."""
        scored = self.teacher_forced(rows)
        return logprob_by_sign(scored) | {"weighted": advantage_weighted_logprob(scored)}

    def teacher_forced(self, rows: list[TokenRow]) -> list[TokenRow]:
        """``rows`` with their old log-probabilities those of the current model (eval mode, no
        gradient, :func:`~sera_core.train.update.rescored`)."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        scored = rescored(self.model, rows, pad_id=self.tokenizer.pad_token_id, micro_batch_tokens=self.cfg.micro_batch_tokens)
        model.train(was_training)
        return scored

    def run_update(self) -> dict[str, Any]:
        """One update at ``self.updates_done``; returns its ``updates.csv`` row."""
        cfg, sc, v = self.cfg, self.stage_cfg, self.updates_done
        t0 = time.perf_counter()
        torch.manual_seed(derive_seed(cfg.seed, "torch", v))
        batch = random.Random(derive_seed(cfg.seed, "points", v)).sample(self.pool, sc.points_per_update)
        points = self.rescored(batch, derive_seed(cfg.seed, "rescore", v), sc.rubric_temperature, sc.scoring_temperature,
                               keep_turns=True)
        t_gen = time.perf_counter() - t0
        scorer = SCORER_ARMS.get(sc.arm)
        draw = random.Random(derive_seed(cfg.seed, "score_calls", v))
        rows, counts = stage_rows(points, train_scorer=scorer in CREDITS, score_calls=sc.score_calls, rng=draw,
                                  decode=self.policy.decode if sc.arm == "rubric_belief" else None,
                                  credit=scorer if scorer in CREDITS else "hinge")
        if scorer == "label":
            gates = gate_rows(points, decode=self.policy.decode, encode=ChatFormat(self.tokenizer).encode, calls=sc.score_calls, rng=draw)
            weight = sc.gate_weight * (sum(r.tokens for r in rows) + len(gates)) / max(len(gates), 1)
            gates = self.teacher_forced([replace(r, advantage=tuple(a * weight for a in r.advantage)) for r in gates])
            rows += gates
            counts["datums_score"], counts["tokens_score"] = len(gates), sum(r.tokens for r in gates)
        before = self.measure_rows(rows) if sc.measure_step and rows else None
        stats, grad_norm = self.train_rows(rows)
        if before is not None:
            self.last_moved = {"before": before, "after": self.measure_rows(rows)}
        self.last_rows, self.last_stats = rows, stats  # what the update trained, and log pi before it by sign
        self.updates_done += 1
        self.counters["tokens_trained"] += int(stats["tokens"])
        m = point_metrics(points, self.policy.decode)
        return {"version": v, "points": m["points"], "mixed": m["mixed"], "pairwise_accuracy": m["pairwise_accuracy"],
                "belief_accuracy": m["belief_accuracy"],
                "ranking_loss": m["ranking_loss"], "belief_loss": m["belief_loss"], "rubric_validity": m["rubric_validity"],
                "score_validity": m["score_validity"], **counts, "loss": round(stats["loss"], 8), "grad_norm": round(grad_norm, 6),
                "seconds_generation": round(t_gen, 1), "seconds_update": round(time.perf_counter() - t0 - t_gen, 1),
                "seconds": round(time.perf_counter() - t0, 1)}

    def run(self, *, total_updates: int | None = None, resume: bool = True, stop_after: int | None = None) -> dict:
        """Measure, train ``updates`` updates, measure every ``eval_every`` and at the end;
        ``resume`` continues from ``out/checkpoint`` (rows of later versions are dropped and
        redone), else an earlier run's checkpoint and rows are removed first. Returns
        ``{"updates": rows, "heldout": rows}`` as read back from the files."""
        target = self.stage_cfg.updates if total_updates is None else total_updates
        if resume and (self.out / "checkpoint").exists():
            self.load(self.out / "checkpoint")
        elif not resume:
            shutil.rmtree(self.out / "checkpoint", ignore_errors=True)
            for name in ("updates.csv", "heldout.csv"):
                (self.out / name).unlink(missing_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        updates = keep_rows(self.out / "updates.csv", UPDATE_COLUMNS, before=self.updates_done)
        heldout = keep_rows(self.out / "heldout.csv", HELDOUT_COLUMNS, before=self.updates_done + 1)  # this version's measure stays
        done = 0
        bar = tqdm(total=target, initial=self.updates_done, desc=f"rubric stage ({self.stage_cfg.arm})", disable=not self.progress)
        while True:
            due = self.updates_done % self.stage_cfg.eval_every == 0 or self.updates_done == target
            if due and self.heldout and not any(int(r["version"]) == self.updates_done for r in heldout):
                heldout.append(append_row(self.out / "heldout.csv", HELDOUT_COLUMNS, self.measure()))
            if self.updates_done >= target or (stop_after is not None and done >= stop_after):
                break
            updates.append(append_row(self.out / "updates.csv", UPDATE_COLUMNS, self.run_update()))
            self.save()
            done += 1
            bar.update(1)
            bar.set_postfix(acc=updates[-1]["pairwise_accuracy"], tokens=updates[-1]["tokens_score"])
        bar.close()
        return {"config": asdict(self.stage_cfg), "updates": updates, "heldout": heldout}

