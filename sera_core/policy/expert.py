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
  (:func:`textcraft_rubric`, :func:`textworld_rubric`), as the official JSON.
* ``score``: an honest score against the frozen rubric (:func:`expert_score`) from the
  child's outcome: the runtime passes the same facts the scoring prompt shows as text
  (net gains from the start and end inventories, the goal's state in the final world,
  error observations, irreversible mistakes, steps), already parsed.

Text becomes token ids with the actor's tokenizer (``logprobs`` are 0: the expert is
deterministic given its seed); decoding the ids gives the text back exactly.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from sera_core.envs.textcraft.expert import ExpertConfig as CraftExpertConfig
from sera_core.envs.textcraft.expert import TextCraftExpert
from sera_core.envs.textworld.expert import ExpertConfig as WorldExpertConfig
from sera_core.envs.textworld.expert import TextWorldExpert
from sera_core.envs.textworld.goals import FAILURE, SUCCESS
from sera_core.policy.base import Generation
from sera_core.policy.chat import ChatFormat
from sera_core.rubrics import Rubric

ITEM_KEYS = ("name", "weight", "description", "score_0", "score_full")


def _item(name: str, weight: float, description: str, score_0: str, score_full: str) -> dict[str, Any]:
    return dict(zip(ITEM_KEYS, (name, weight, description, score_0, score_full), strict=True))


def textcraft_rubric(targets: dict[str, int]) -> dict[str, Any]:
    """A rubric for a TextCraft sub-goal: one item per target (the first four; the rest
    share one item), a finished report, error-free crafting and the step budget."""
    named = list(targets.items())[:4]
    rest = list(targets.items())[4:]
    share = 0.6 / (len(named) + (1 if rest else 0))
    items = [_item(f"{item} crafted", share,
                   f"The sub-agent's net gain of {item} (final count minus its count at the sub-agent's start) reaches {n}.",
                   f"No {item} gained.", f"At least {n} {item} gained.")
             for item, n in named]
    if rest:
        listing = ", ".join(f"{n}x {item}" for item, n in rest)
        items.append(_item("other targets crafted", share, f"Net gains reach the counts of: {listing}.",
                           "None of them gained.", "All of them gained in full."))
    items += [
        _item("finished with a report", 0.15, "The sub-agent called finish() with a message matching what it made.",
              "finish() was not called.", "finish() called with an accurate report."),
        _item("error-free crafting", 0.15, "Craft and tool calls succeed (no error observations).",
              "Three or more errors.", "No errors."),
        _item("within budget", 0.1, "The work ends before the step budget runs out.",
              "The budget ran out.", "Finished with steps to spare."),
    ]
    goal = ", ".join(f"{n}x {item}" for item, n in targets.items())
    return {"rubric_items": items,
            "success_gate": f"finish() was called and the net gain of every target reaches its count ({goal}).",
            "failure_conditions": ["finish() was not called", "a target's net gain is short of its count"],
            "scoring_procedure": "Check the gate on the start and end inventories; if it fails the score is 0. "
                                 "Otherwise score each item in [0, 1]: targets by net gain / count, errors as "
                                 "1 - errors / 3, budget 1 if steps remain else 0.5."}


def textworld_rubric(goal: str) -> dict[str, Any]:
    """A rubric for a TextWorld sub-goal: the goal's state, a report, valid actions, no
    irreversible mistakes, and economy with the shared steps."""
    items = [
        _item("goal state reached", 0.5, f"In the final world state: {goal}.",
              "The goal's state is not reached.", "The goal's state is reached exactly."),
        _item("finished with a report", 0.15, "The sub-agent ended with <finish> and a truthful message.",
              "No <finish>.", "<finish> with a message that matches the state."),
        _item("valid actions", 0.15, "Actions and blocks are valid (no 'Invalid' observations).",
              "Three or more invalid steps.", "No invalid steps."),
        _item("no irreversible mistakes", 0.1, "No ingredient is burned, wrongly cut or destroyed.",
              "A mistake was recorded.", "No mistake recorded."),
        _item("economy of shared steps", 0.1, "The sub-agent ends before its turns run out.",
              "Its turns ran out.", "It finished with turns to spare."),
    ]
    return {"rubric_items": items,
            "success_gate": f"The final world state satisfies the goal: {goal}.",
            "failure_conditions": ["the goal's state is not reached", "an ingredient the goal needs was ruined"],
            "scoring_procedure": "Check the gate on the final state; if it fails the score is 0. Otherwise score "
                                 "each item in [0, 1]."}


def _item_scores(rubric: Rubric, outcome: dict) -> tuple[bool, dict[str, float], str]:
    """Gate, per-item scores and a reason from a child's outcome facts (see the runtime)."""
    errors = 1.0 - min(1.0, outcome.get("errors", 0) / 3)
    spare = 1.0 if outcome["steps"] < outcome["max_steps"] else 0.5
    finished = 1.0 if outcome["finished"] else 0.0
    if outcome["env"] == "textcraft":
        verdict = outcome["verdict"]
        gains, targets = verdict["gains"], outcome["targets"]
        per = {f"{t} crafted": min(1.0, max(0.0, gains.get(t, 0) / n)) for t, n in targets.items()}
        rest = [t for t in targets if f"{t} crafted" not in {i.name for i in rubric.items}]
        other = sum(per[f"{t} crafted"] for t in rest) / len(rest) if rest else 1.0
        table = {**per, "other targets crafted": other, "finished with a report": finished,
                 "error-free crafting": errors, "within budget": spare}
        gate = bool(verdict["passed"])
        reason = "all targets met" if gate else f"gate failed: {verdict.get('missing') or 'finish() not called'}"
    else:
        state = outcome["goal_verdict"]
        reached = 1.0 if state == SUCCESS else 0.0
        table = {"goal state reached": reached, "finished with a report": finished, "valid actions": errors,
                 "no irreversible mistakes": 0.0 if outcome.get("mistakes") else 1.0, "economy of shared steps": spare}
        gate = state == SUCCESS if state in (SUCCESS, FAILURE) else bool(outcome["finished"] and not outcome.get("mistakes"))
        reason = "goal met" if gate else "gate failed: the goal's state is not reached"
    # items the expert did not write itself (e.g. the global rubric) get the gate's value
    scores = {item.name: table.get(item.name, 1.0 if gate else 0.0) for item in rubric.items}
    return gate, scores, reason


def expert_score(rubric: Rubric, outcome: dict) -> dict[str, Any]:
    """The scorer's JSON: gate, one score per item, final_score = g * sum_j w_j c_j."""
    gate, scores, reason = _item_scores(rubric, outcome)
    final = (1.0 if gate else 0.0) * sum(item.weight * scores[item.name] for item in rubric.items)
    if gate and final <= 0:
        gate, final, reason = False, 0.0, "every item scored 0"
    return {"success": gate,
            "criterion_scores": [{"name": item.name, "score": round(scores[item.name], 4), "reason": ""}
                                 for item in rubric.items],
            "final_score": round(final, 4) if gate else 0.0, "reason": reason}


class ExpertPolicy:
    """The expert as an actor (see the module docstring)."""

    enforce_context = False

    def __init__(self, tokenizer: Any, *, textcraft: CraftExpertConfig | None = None,
                 textworld: WorldExpertConfig | None = None):
        self.chat = ChatFormat(tokenizer)
        self.textcraft = textcraft or CraftExpertConfig(mode="delegate")
        self.textworld = textworld or WorldExpertConfig(mode="delegate")
        self._agents: dict[str, Any] = {}

    async def complete(self, call) -> Generation:
        if call.kind == "act":
            text = self._act(call)
        elif call.kind == "rubric":
            info = call.info
            rubric = textcraft_rubric(info["targets"]) if info["env"] == "textcraft" else textworld_rubric(info["subtask"])
            text = json.dumps(rubric, indent=1)
        else:
            text = json.dumps(expert_score(call.info["rubric"], call.info["outcome"]), indent=1)
        ids = self.chat.encode(text)
        return Generation(ids, [0.0] * len(ids), self.chat.decode(ids), "stop")

    def _act(self, call) -> str:
        agent = self._agents.get(call.agent)
        info = call.info
        if agent is None:
            if info["env"] == "textcraft":
                cfg = replace(self.textcraft, noise_seed=info["seed"])
                agent = TextCraftExpert(cfg, info["targets"], can_delegate=info["can_delegate"])
            else:
                agent = TextWorldExpert(replace(self.textworld, noise_seed=info["seed"]), can_delegate=info["can_delegate"])
            self._agents[call.agent] = agent
        return agent.act(call.observation)

    def release(self, agent: str) -> None:
        self._agents.pop(agent, None)
