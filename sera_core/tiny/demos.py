"""Expert demonstrations for the imitation warm start, as token-exact samples.

A small transformer that imitates transcripts of *one* recipe world memorises plans
instead of reading observations. So every TextCraft demonstration task comes from a
freshly generated world (new item names and recipes: world seeds ``world_seed`` ...),
and TextWorld tasks come from the train split (train-fold foods); evaluation uses the
standard val world (seed 0) and the test fold, which training never sees. Each
benchmark draws its own (:meth:`~sera_core.envs.registry.Benchmark.demo_tasks`, reading
its fields of :class:`DemoConfig`).

The expert plays the tasks through the real runtime (:class:`~sera_core.agents.runtime.Runtime`
with :class:`~sera_core.policy.expert.ExpertPolicy`), so the samples are exactly what the
model will see and must write: every turn's prompt and completion ids in the model's
token space. All three roles are covered: act turns (execution and launch tokens), rubric
calls and scoring calls. A share of the rollouts is played by a *noisy* expert with
counterfactual groups, so failed children are scored too (the scorer sees both outcomes);
the detached scoring calls of the branches are samples as well.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from sera_core.agents.actors import noisy_expert
from sera_core.agents.runtime import Rollout, Runtime, RuntimeConfig
from sera_core.agents.tree import Turn
from sera_core.envs.registry import BENCHMARKS
from sera_core.envs.textcraft.world import WorldConfig, generate_world
from sera_core.policy.chat import ChatFormat
from sera_core.policy.expert import ExpertPolicy
from sera_core.tiny.sft import Sample
from sera_core.utils.errors import UserInputError
from sera_core.utils.seeding import derive_seed


@dataclass(frozen=True)
class DemoConfig:
    """Which demonstrations to draw (the ``textcraft_*`` fields and ``world_seed`` are read by
    TextCraft's ``demo_tasks``, ``textworld_tasks`` by TextWorld's)."""

    textcraft_worlds: int = 150
    """Fresh TextCraft worlds (one generated recipe world each)."""
    textcraft_mix: dict[str, int] = field(default_factory=lambda: {"easy": 3, "medium": 1})
    """Tasks per world, by difficulty."""
    world_seed: int = 1000
    """Seed of the first training world (the val world is seed 0: never trained on)."""
    textworld_tasks: int = 150
    """TextWorld tasks from the train split (train-fold foods), spread over its order."""
    textworld_easy: int = field(default=0, metadata={"hashed_when_set": True})
    """Easy 2-dish TextWorld tasks from train-fold foods, spread over the 7 families
    (:func:`~sera_core.envs.textworld.tasks.train_fold_tasks`). The train split holds only medium,
    hard and extreme tasks, so without them the warm start never sees the expert's root delegate
    one sub-agent per dish on the 2-dish tasks that easy evaluation asks for. 0: none (the shipped recipe)."""
    noisy_every: int = 3
    """Every n-th task is played by the noisy expert with counterfactual groups of 4."""
    seed: int = 0
    """Seed of the runtime (and so of the noisy expert's choices)."""
    copy_drills: int = 0
    """Synthetic copy drills mixed into the samples (0: none): a user message lists item
    names and counts of the training worlds, the reply repeats it exactly. Short, so the
    curriculum serves them first: they teach copying from the context (induction heads)
    before the transcripts need it."""
    perturb: float = field(default=0.0, metadata={"hashed_when_set": True})
    """Chance that an expert act turn (not an agent's first) is replaced by a plausible
    mistake that changes nothing (:class:`~sera_core.policy.expert.ExpertPolicy`'s
    ``perturb``): the transcripts then show errors followed by good moves, and the model
    learns to recover from its own mistakes; the mistakes themselves are never learnt
    (:func:`turn_samples`). 0: none (and the recipe hash is what it was before this field)."""
    explain: bool = field(default=False, metadata={"hashed_when_set": True})
    """The expert spells out its decisions (:class:`~sera_core.policy.expert.ExpertPolicy`'s
    ``explain``): TextCraft's delegation decision (direct ingredients' depths against the
    threshold) and crafting arithmetic, and the scorer's gate check before its verdict, so
    that each decision is written after the facts it rests on instead of in its first token."""
    oversample: int = field(default=1, metadata={"hashed_when_set": True})
    """Each sample holding a rare decision is repeated this many times (:func:`rollout_samples`):
    an agent's conversation that delegates, and a scoring call on a child that failed (most
    scored children succeed, and a scorer that imitates the common case reports success for
    all). 1: none."""

    child_act_keep: int = field(default=1, metadata={"hashed_when_set": True})
    """Keep one in this many of the children's act conversations that launch nothing (a seeded
    choice per agent, :func:`rollout_samples`); roots, delegating agents, rubric and scoring
    calls are all kept. Why: an epoch on 2 cores costs about 10 hours per 8 M positions
    (docs/embedded.md), and these conversations are the most numerous and the most alike (a
    child crafting one item, or preparing one ingredient: 1.75 M positions of the one-epoch
    recipe's 9.3 M, of which TextWorld's learn 7% of their tokens). 1: all kept."""

    def __post_init__(self) -> None:
        if self.child_act_keep < 1:
            raise UserInputError("child_act_keep is 1 (keep every child's conversation) or more (keep one in that many)")
        if min(self.textcraft_worlds, self.textworld_tasks, self.textworld_easy, self.copy_drills) < 0 or self.noisy_every < 1:
            raise UserInputError("textcraft_worlds, textworld_tasks, textworld_easy, copy_drills >= 0 and noisy_every >= 1 "
                                 "are required")
        if self.oversample < 1:
            raise UserInputError("oversample is a repeat count >= 1")
        if not 0.0 <= self.perturb < 1.0:
            raise UserInputError("perturb is a probability in [0, 1)")
        if any(n < 0 for n in self.textcraft_mix.values()):
            raise UserInputError("textcraft_mix counts must be >= 0")


HEAD_ENDS = {"rubric": "## Parent trajectory before delegation", "score": "## Sub-agent trajectory"}
"""Where the head of a rubric or scoring call's prompt ends (:attr:`~sera_core.tiny.sft.Sample.head`):
the section that holds the transcript, which is what a cut may shorten; before it come the
system prompt and the task (and, for scoring, the frozen rubric)."""


def call_head(prompt_ids: tuple[int, ...], role: str, decode: Callable[[list[int]], str] | None) -> int:
    """The number of leading tokens of a rubric or scoring call's prompt before its transcript
    section (:data:`HEAD_ENDS`): the longest prefix whose text ends before the section's title.
    0 without ``decode`` or when the title is missing."""
    if decode is None or role not in HEAD_ENDS:
        return 0
    end = decode(list(prompt_ids)).find(HEAD_ENDS[role])
    if end < 0:
        return 0
    lo, hi = 0, len(prompt_ids)  # the largest k with len(decode(ids[:k])) <= end (lengths grow with k)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(decode(list(prompt_ids[:mid]))) <= end:
            lo = mid
        else:
            hi = mid - 1
    return lo


def turn_samples(turns: list[Turn], decode: Callable[[list[int]], str] | None = None) -> Iterator[Sample]:
    """The turns' exact prompt and completion ids, packed: an act turn whose context
    extends the previous act turn's context and completion joins that turn's sample (the
    earlier completion becomes a :attr:`~sera_core.tiny.sft.Sample.learn` span), so one
    sequence carries a whole conversation; rubric and scoring calls (their own
    conversations) are samples of their own. Learnt tokens and their contexts are
    exactly those of one sample per turn, except that a *perturbation* (an act turn whose
    meta says ``perturbation``: a mistake put in on purpose) is context only, never learnt:
    a conversation that ends on one is cut after its last learnt turn.

    Each sample carries its role (the turn kind) and its head: an act conversation's first
    prompt (the system prompt and the task), a call's prompt up to its transcript
    (:func:`call_head`, which needs ``decode``)."""
    for sample, _ in _packed(turns, decode):
        yield sample


def _packed(turns: list[Turn], decode: Callable[[list[int]], str] | None = None) -> Iterator[tuple[Sample, list[Turn]]]:
    """:func:`turn_samples`, each sample with the turns it holds."""
    run: Sample | None = None
    run_turns: list[Turn] = []
    run_mistake = False  # whether run's completion is a perturbation

    def finished(run: Sample, mistake: bool, held: list[Turn]) -> Iterator[tuple[Sample, list[Turn]]]:
        if not mistake:
            yield run, held
        elif run.learn:  # the last learnt completion becomes the sample's completion
            a, b = run.learn[-1]
            yield Sample(run.prompt_ids[:a], run.prompt_ids[a:b], learn=run.learn[:-1], role="act",
                         head=min(run.head, a)), held[:-1]

    for turn in turns:
        if not turn.completion_ids:
            continue
        prompt, completion = tuple(turn.prompt_ids), tuple(turn.completion_ids)
        mistake = bool(turn.meta.get("perturbation"))
        if turn.kind != "act":
            yield Sample(prompt, completion, role=turn.kind, head=call_head(prompt, turn.kind, decode)), [turn]
            continue
        if run is not None and prompt[:len(run.prompt_ids) + len(run.completion_ids)] == run.prompt_ids + run.completion_ids:
            learnt = () if run_mistake else ((len(run.prompt_ids), len(run.prompt_ids) + len(run.completion_ids)),)
            run, run_mistake = Sample(prompt, completion, learn=run.learn + learnt, role="act", head=run.head), mistake
            run_turns = run_turns + [turn]
            continue
        if run is not None:
            yield from finished(run, run_mistake, run_turns)
        run, run_mistake, run_turns = Sample(prompt, completion, role="act", head=len(prompt)), mistake, [turn]
    if run is not None:
        yield from finished(run, run_mistake, run_turns)


def rollout_samples(rollout: Rollout, oversample: int = 1, decode: Callable[[list[int]], str] | None = None, *,
                    child_act_keep: int = 1, seed: int = 0) -> Iterator[Sample]:
    """Every turn of the tree (packed per agent, :func:`turn_samples`; ``decode`` finds the
    calls' heads), and the detached scoring calls of its branch groups; a sample that holds a
    delegation (a launch token) or scores a child that failed (its judge label is False) comes
    ``oversample`` times. A child's act conversation without a launch is kept when
    ``derive_seed(seed, "child_act", tree id, node id) % child_act_keep == 0``
    (:attr:`DemoConfig.child_act_keep`)."""
    tree = rollout.tree
    for node in tree.nodes.values():
        for sample, held in _packed(node.turns, decode):
            launches = any("launch" in t.roles for t in held)
            if (sample.role == "act" and node.depth > 0 and not launches and child_act_keep > 1
                    and derive_seed(seed, "child_act", tree.tree_id, node.node_id) % child_act_keep):
                continue
            rare = launches or any(t.kind == "score" and tree.nodes[t.meta["child"]].label is False for t in held)
            yield from [sample] * (oversample if rare else 1)
    for point in rollout.points:
        for branch in point.branches[1:]:
            if branch.score_turn is not None:
                yield from list(turn_samples([branch.score_turn], decode)) * (oversample if branch.label is False else 1)


def copy_drills(tokenizer: Any, cfg: DemoConfig) -> list[Sample]:
    """``cfg.copy_drills`` copy drills (see :attr:`DemoConfig.copy_drills`): 1-6 items
    ``"{n}x {name}"`` with names of the first (up to 20) training worlds, seeded by ``cfg.seed``."""
    if cfg.copy_drills == 0:
        return []
    names = sorted({name for k in range(min(20, max(1, cfg.textcraft_worlds)))
                    for name in generate_world(WorldConfig(seed=cfg.world_seed + k)).depths})
    rng = random.Random(derive_seed(cfg.seed, "copy_drills"))
    chat = ChatFormat(tokenizer)
    out = []
    for _ in range(cfg.copy_drills):
        text = ", ".join(f"{rng.randint(1, 9)}x {rng.choice(names)}" for _ in range(rng.randint(1, 6)))
        out.append(Sample(chat.prompt([{"role": "user", "content": f"Repeat exactly: {text}"}]),
                          chat.encode(text) + [chat.eos_id]))
    return out


def play(benchmark: str, tasks: list[dict], tokenizer: Any, cfg: DemoConfig, *, progress: bool = False) -> list[Rollout]:
    """The expert's rollouts of ``tasks`` (every ``noisy_every``-th one noisy, with groups)."""
    clean = Runtime(benchmark, ExpertPolicy(tokenizer, perturb=cfg.perturb, explain=cfg.explain), RuntimeConfig(seed=cfg.seed))
    noisy = Runtime(benchmark, noisy_expert(tokenizer=tokenizer, perturb=cfg.perturb, explain=cfg.explain),
                    RuntimeConfig(seed=cfg.seed, counterfactual=4, fork_cap=8))

    async def main() -> list[Rollout]:
        out = []
        for start in tqdm(range(0, len(tasks), 32), desc=f"demos {benchmark}", disable=not progress):
            chunk = tasks[start:start + 32]
            out += await asyncio.gather(*(
                (noisy if (start + i) % cfg.noisy_every == cfg.noisy_every - 1 else clean).rollout(t, f"{benchmark}/{start + i}")
                for i, t in enumerate(chunk)))
        return out

    return asyncio.run(main())


def demonstrations(tokenizer: Any, cfg: DemoConfig, *, progress: bool = False) -> tuple[list[Sample], dict]:
    """All samples, and counts per benchmark and role (turn kind)."""
    samples: list[Sample] = []
    stats: dict[str, Any] = {}
    for benchmark, bench in BENCHMARKS.items():
        tasks = bench.demo_tasks(cfg)
        rollouts = play(benchmark, tasks, tokenizer, cfg, progress=progress)
        kinds = {"act": 0, "rubric": 0, "score": 0}
        for r in rollouts:
            for node in r.tree.nodes.values():
                for t in node.turns:
                    kinds[t.kind] += 1
        benchmark_samples = [s for r in rollouts for s in rollout_samples(r, cfg.oversample, tokenizer.decode,
                                                                          child_act_keep=cfg.child_act_keep, seed=cfg.seed)]
        stats[benchmark] = {"tasks": len(tasks), "samples": len(benchmark_samples), "turns": kinds,
                      "root_success": sum(r.tree.root_reward or 0 for r in rollouts) / max(1, len(rollouts)),
                      "completion_tokens": sum(len(s.completion_ids) + sum(b - a for a, b in s.learn) for s in benchmark_samples)}
        samples += benchmark_samples
    drills = copy_drills(tokenizer, cfg)
    stats["copy_drills"] = {"samples": len(drills), "completion_tokens": sum(len(d.completion_ids) for d in drills)}
    return samples + drills, stats


def corpus_texts(tokenizer: Any, cfg: DemoConfig) -> list[str]:
    """The text of a set of demonstrations, for training a tokenizer: each agent's first
    prompt, every completion and observation, every rubric and scoring prompt."""
    texts = []
    for benchmark, bench in BENCHMARKS.items():
        for r in play(benchmark, bench.demo_tasks(cfg), tokenizer, cfg):
            for node in r.tree.nodes.values():
                for i, t in enumerate(node.turns):
                    if i == 0 or t.kind != "act":
                        texts.append(tokenizer.decode(t.prompt_ids))
                    texts += [t.text, t.observation or ""]
    return texts
