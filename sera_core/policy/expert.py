"""The ``expert`` policy: the environments' solvers playing every role of the runtime.

It answers the runtime's three calls (:class:`sera_core.agents.actors.Call`) in the
exact formats a model must produce, so its trees are supervised demonstrations:

* ``act``: one expert agent per runtime agent (TextCraft :class:`TextCraftExpert`,
  TextWorld :class:`TextWorldExpert`), created on the agent's first turn and fed the
  observation text each turn. The experts discover recipes and the world through the
  tools, act a few steps at a time and delegate large sub-goals. Noise (early finish,
  wasted crafts, wrong preparations) comes from the expert configs; each agent's noise
  seed is the runtime's per-agent sampling seed, so the B branches of one
  counterfactual group behave differently.
* ``rubric``: a task-specific rubric (4-8 weighted items) for the child's sub-goal
  (each benchmark's ``expert_rubric``, through the registry), as the official JSON.
* ``score``: an honest score against the frozen rubric (:func:`expert_score`) from the
  child's outcome: the runtime passes the same facts the scoring prompt shows as text
  (net gains from the start and end inventories, the goal's state in the final world,
  error observations, irreversible mistakes, steps), already parsed. With ``lenient`` p, a
  seeded share p of the scoring calls answers :func:`lenient_score` instead (full marks
  whatever the child did: the embedded policy's own scoring mistake), so that rubrics earn
  different ranking losses (notebook 07).

``explain=True`` (the embedded warm start's third recipe) spells out the decisions in the
text an imitator learns: the TextCraft agents' delegation decision and crafting arithmetic
(:attr:`~sera_core.envs.textcraft.expert.ExpertConfig.explain`) and the scorer's gate check,
written before its verdict.

Text becomes token ids with the actor's tokenizer (``logprobs`` are 0: the expert is
deterministic given its seed); decoding the ids gives the text back exactly.
"""

from __future__ import annotations

import json
import random
from typing import Any

from sera_core.envs.registry import BENCHMARKS
from sera_core.policy.base import Generation
from sera_core.policy.chat import ChatFormat
from sera_core.rubrics import Rubric
from sera_core.utils.seeding import derive_seed


def _item_scores(rubric: Rubric, outcome: dict) -> tuple[bool, dict[str, float], str]:
    """Gate, per-item scores and a reason from a child's outcome facts (see the runtime):
    the benchmark's expert table; items the expert did not write itself (e.g. the global
    rubric) get the gate's value."""
    gate, table, reason = BENCHMARKS[outcome["env"]].expert_item_scores(outcome, {i.name for i in rubric.items})
    scores = {item.name: table.get(item.name, 1.0 if gate else 0.0) for item in rubric.items}
    return gate, scores, reason


def expert_score(rubric: Rubric, outcome: dict, *, explain: bool = False) -> dict[str, Any]:
    """The scorer's JSON: gate, one score per item, final_score = g * sum_j w_j c_j.

    With ``explain``, ``reason`` comes first and opens with the gate checked in words (the
    benchmark's ``expert_check``: TextCraft's target counts at the start and the end against
    the goal), so an imitator writes the check before it writes ``success`` (the parser reads
    the keys in any order)."""
    gate, scores, reason = _item_scores(rubric, outcome)
    final = (1.0 if gate else 0.0) * sum(item.weight * scores[item.name] for item in rubric.items)
    if gate and final <= 0:
        gate, final, reason = False, 0.0, "every item scored 0"
    out = {"success": gate,
           "criterion_scores": [{"name": item.name, "score": round(scores[item.name], 4), "reason": ""}
                                for item in rubric.items],
           "final_score": round(final, 4) if gate else 0.0}
    if explain:
        return {"reason": f"{BENCHMARKS[outcome['env']].expert_check(outcome)}: {reason}", **out}
    return out | {"reason": reason}


def lenient_score(rubric: Rubric) -> dict[str, Any]:
    """A lenient scorer's JSON, whatever the child did: ``success`` true, 1.0 for every item,
    ``final_score`` 1.0. It is the shape of a success report, which the embedded policy's own
    scorer copies for every branch, the failed ones as well (docs/embedded.md: pairwise
    accuracy 0.50, every pair tied); a failure scored so ranks level with the successes, and
    its group's ``L_rank`` is above 0."""
    items = [{"name": item.name, "score": 1.0, "reason": ""} for item in rubric.items]
    return {"success": True, "criterion_scores": items, "final_score": 1.0, "reason": "all targets met"}


class ExpertPolicy:
    """The expert as an actor (see the module docstring)."""

    enforce_context = False

    def __init__(self, tokenizer: Any, *, perturb: float = 0.0, explain: bool = False, lenient: float = 0.0,
                 **configs: Any):
        """``configs``: an expert config per benchmark name (``textcraft=ExpertConfig(...)``),
        each benchmark's :meth:`~sera_core.envs.registry.Benchmark.expert_config` for the
        others; ``explain`` reaches the agents of the benchmarks that spell out decisions;
        ``lenient``: the chance that a scoring call answers :func:`lenient_score` (drawn from
        the call's sampling seed, which the runtime derives from its seed and the branch)."""
        if not 0.0 <= perturb < 1.0:
            raise ValueError(f"perturb is a probability in [0, 1), got {perturb!r}")
        if not 0.0 <= lenient <= 1.0:
            raise ValueError(f"lenient is a probability in [0, 1], got {lenient!r}")
        if unknown := sorted(set(configs) - set(BENCHMARKS)):
            raise ValueError(f"no benchmark named {', '.join(unknown)}; "
                             f"expert configs are given for {list(BENCHMARKS)}")
        self.chat = ChatFormat(tokenizer)
        self.configs = {name: bench.expert_config(configs.get(name), explain=explain)
                        for name, bench in BENCHMARKS.items()}
        """The expert config each benchmark's agents play by."""
        self.explain = explain
        self.perturb = perturb
        self.lenient = lenient
        self._agents: dict[str, list] = {}  # agent -> [expert, act calls so far, observation held back]

    async def complete(self, call) -> Generation:
        meta = {}
        if call.kind == "act":
            text, perturbed = self._act(call)
            meta = {"perturbation": True} if perturbed else {}
        elif call.kind == "rubric":
            text = json.dumps(BENCHMARKS[call.info["env"]].expert_rubric(call.info), indent=1)
        elif self.lenient and random.Random(derive_seed(call.params.seed, call.agent, "lenient")).random() < self.lenient:
            text = json.dumps(lenient_score(call.info["rubric"]), indent=1)  # full marks, whatever the child did
        else:
            text = json.dumps(expert_score(call.info["rubric"], call.info["outcome"], explain=self.explain), indent=1)
        ids = self.chat.encode(text)
        return Generation(ids, [0.0] * len(ids), self.chat.decode(ids), "stop", meta=meta)

    def _act(self, call) -> tuple[str, bool]:
        """The agent's next reply, and whether it is a perturbation.

        With ``perturb`` > 0, each act turn but the first is, with that chance (seeded by
        the agent's seed and the turn), replaced by the benchmark's plausible mistake
        (:meth:`~sera_core.envs.registry.Benchmark.perturbation`: a failing cell or an
        invalid action, which changes nothing in the world). The expert is not told: its
        next turn reads the result of its own last move (with the world as it is now,
        :meth:`~sera_core.envs.registry.Benchmark.after_mistake`), so it goes on from the
        same state, and the transcript shows an error followed by a good move. The warm start
        learns those moves, never the mistake (its turn's meta says ``perturbation``)."""
        info = call.info
        bench = BENCHMARKS[info["env"]]  # its hooks are static: no instance per call
        entry = self._agents.get(call.agent)
        if entry is None:
            entry = self._agents[call.agent] = [bench.expert_agent(self.configs[info["env"]], info), 0, None]
        expert, calls, held = entry
        entry[1] += 1
        observation = call.observation if held is None else bench.after_mistake(held, call.observation)
        if self.perturb and calls and random.Random(derive_seed(info["seed"], "perturb", calls)).random() < self.perturb:
            entry[2] = observation  # what the expert reads next, whatever the mistake printed
            return bench.perturbation(call.observation, info, random.Random(derive_seed(info["seed"], "mistake", calls))), True
        entry[2] = None
        return expert.act(observation), False

    def release(self, agent: str) -> None:
        self._agents.pop(agent, None)
