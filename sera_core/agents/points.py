"""Delegation points: a child's sub-goal replayed as B counterfactual branches (SPEC 3).

At a delegation in a rubric-generation rollout the runtime freezes the child's rubric,
forks the parent's world B times and plays the child on each fork
(:meth:`sera_core.agents.runtime.Runtime._branch_group`). Branch 0 is the real child (its
world is committed); branches 1..B-1 are detached. Each branch is labelled by the judge
and scored against the frozen rubric; the ranking loss of the scores against the labels
is the rubric writer's reward (:mod:`sera_core.rewards.rubric_ranking`).

:class:`DelegationPoint` holds one such group, :class:`Branch` one branch. They are the
records of ``delegation_points.jsonl`` (one point per line, format ``sera.delegation/1``):
``to_json`` writes exactly that line's object and ``from_json`` reads it back (an equal
object; re-serialising gives the same bytes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sera_core.agents.tree import Tree, Turn
from sera_core.rubrics import RankingResult, Score

POINT_FORMAT = "sera.delegation/1"
"""The ``format`` tag of a serialised delegation point."""


@dataclass
class Branch:
    """One branch of a delegation point: the child's sub-goal played on its own fork."""

    branch: int
    """0: the real child (its world committed); 1..B-1: detached counterfactuals."""
    tree: Tree
    """The branch's agents (branch 0: the committed child's subtree of the rollout)."""
    finished: bool
    """Whether the branch's root agent called finish."""
    steps: int
    end: str
    """How its root agent ended: ``finish``, ``steps``, ``loop``, ``context``."""
    state_after: dict
    """The branch's world after it ended (JSON)."""
    label: bool | None
    """The judge's verdict (None: no label)."""
    label_reason: str | None
    score: Score | None
    """Its score against the frozen rubric (None: no valid rubric or a malformed score)."""
    score_error: str | None
    """Why there is no score (``no valid rubric`` or the parse error)."""
    score_turn: Turn | None
    """The scoring call's turn (None for a forced zero or an external scorer)."""
    score_inputs: dict = field(default_factory=dict)
    """What a scoring call reads besides the rubric and the branch's trajectory:
    ``final_state`` (the text the score prompt shows) and ``outcome`` (the expert scorer's
    facts), so the branch can be scored again against another rubric (:meth:`~sera_core.agents.runtime.Runtime.rescore`)."""

    @property
    def malformed(self) -> bool:
        """Whether the branch's scoring call was made and its output did not parse (no score)."""
        return self.score is None and self.score_turn is not None

    def to_json(self) -> dict[str, Any]:
        return {"branch": self.branch, "tree": self.tree.to_json(), "finished": self.finished, "steps": self.steps,
                "end": self.end, "state_after": self.state_after, "label": self.label,
                "label_reason": self.label_reason, "score": asdict(self.score) if self.score is not None else None,
                "score_error": self.score_error,
                "score_turn": self.score_turn.to_json() if self.score_turn is not None else None,
                "score_inputs": self.score_inputs}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Branch:
        return cls(data["branch"], Tree.from_json(data["tree"]), data["finished"], data["steps"], data["end"],
                   data["state_after"], data["label"], data["label_reason"],
                   Score(**data["score"]) if data["score"] is not None else None, data["score_error"],
                   Turn.from_json(data["score_turn"]) if data["score_turn"] is not None else None,
                   data.get("score_inputs", {}))


@dataclass
class DelegationPoint:
    """One counterfactual group: where the parent delegated, the frozen rubric, the branches."""

    tree_id: str
    env: str
    task_id: str
    parent_id: str
    """The delegating agent's node id."""
    child_id: str
    """The child's node id (branch 0 in the rollout)."""
    event_id: str | None
    launch_step: int | None
    """The parent's act turn that launched the child."""
    parent_prefix: dict
    """That act turn's ``prompt_ids`` and ``completion_ids``, and the parent's rendered trajectory ``text``."""
    subtask: str
    rubric: dict | None
    """The frozen rubric (JSON; None when it was malformed)."""
    rubric_error: str | None
    rubric_turn: int | None
    """Index of the rubric-writing turn among the parent's turns (None: not the policy's)."""
    state_before: dict
    """The parent's world when it delegated (JSON)."""
    branches: list[Branch] = field(default_factory=list)
    ranking: RankingResult | None = None
    """The ranking loss of :attr:`scores` against :attr:`labels` (its reward is -L_rank)."""
    rubric_call: dict = field(default_factory=dict)
    """The rubric-writing call: its ``prompt`` text and the ``info`` the expert writer reads,
    so the rubric can be written again by another policy (:meth:`~sera_core.agents.runtime.Runtime.rescore`)."""
    rewritten: Turn | None = None
    """After :meth:`~sera_core.agents.runtime.Runtime.rescore` with ``keep_turn``: the policy's call that wrote
    :attr:`rubric` again (its tokens and logprobs: what the rubric stage on fixed branches
    trains, :mod:`sera_core.tiny.rubric_stage`). None in a rollout's point, whose rubric
    call is the parent's turn :attr:`rubric_turn`; serialised only when set."""

    @property
    def labels(self) -> list[bool | None]:
        """The branches' judge labels, in branch order."""
        return [b.label for b in self.branches]

    @property
    def scores(self) -> list[float | None]:
        """The branches' scores s (None where there is none), in branch order."""
        return [b.score.final_score if b.score is not None else None for b in self.branches]

    def to_json(self) -> dict[str, Any]:
        ranking = None if self.ranking is None else {**asdict(self.ranking), "reward": self.ranking.reward}
        return {"format": POINT_FORMAT, "tree_id": self.tree_id, "env": self.env, "task_id": self.task_id,
                "parent_id": self.parent_id, "child_id": self.child_id, "event_id": self.event_id,
                "launch_step": self.launch_step, "parent_prefix": self.parent_prefix, "subtask": self.subtask,
                "rubric": self.rubric, "rubric_error": self.rubric_error, "rubric_turn": self.rubric_turn,
                "state_before": self.state_before, "branches": [b.to_json() for b in self.branches],
                "labels": self.labels, "scores": self.scores, "ranking": ranking, "rubric_call": self.rubric_call} \
            | ({"rewritten": self.rewritten.to_json()} if self.rewritten is not None else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DelegationPoint:
        if data.get("format") != POINT_FORMAT:
            raise ValueError(f"not a delegation point (format {data.get('format')!r}, expected {POINT_FORMAT!r})")
        ranking = data.get("ranking")
        return cls(data["tree_id"], data["env"], data["task_id"], data["parent_id"], data["child_id"],
                   data["event_id"], data["launch_step"], data["parent_prefix"], data["subtask"], data["rubric"],
                   data["rubric_error"], data["rubric_turn"], data["state_before"],
                   [Branch.from_json(b) for b in data["branches"]],
                   None if ranking is None else RankingResult(**{k: v for k, v in ranking.items() if k != "reward"}),
                   data.get("rubric_call", {}),
                   Turn.from_json(data["rewritten"]) if data.get("rewritten") is not None else None)
