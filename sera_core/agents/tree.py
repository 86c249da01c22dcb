"""One rollout as a tree of agents, with the exact tokens every turn produced.

A rollout of a root task is a :class:`Tree`: the root agent (node ``"0"``) takes turns;
when it delegates, children start in fresh contexts (``"0.1"``, ``"0.2"``, their
children ``"0.1.1"``, ...; SPEC 1, max depth 3 is enforced by the runtime). Every turn
the policy generated is a :class:`Turn` that keeps, *token in, token out*:

* ``prompt_ids`` and ``completion_ids``: the exact ids given to and returned by the
  policy (never rebuilt by re-tokenising text);
* ``logprobs``: one per completion token, as recorded at generation (CISPO's "old"
  logprobs, SPEC 4);
* ``roles``: one per completion token, from :data:`ROLES`.

The three objectives (SPEC 3) train three disjoint masks over the same record::

    execution  ordinary acting tokens of "act" turns        (execution reward)
    launch     the delegation statement of an "act" turn    (leaf-coverage reward)
    rubric     every token of a rubric-writing call          (ranking reward)
    score      every token of a scoring call                 (never trained)

:meth:`Tree.masks` gives, per turn, the boolean mask of one role; the masks of the four
roles partition the completion tokens.

Which tokens are ``launch`` is decided by :mod:`sera_core.agents.roles` (with each
benchmark's rule from the registry); this module is plain data.

Trees are plain data (dataclasses of lists, dicts, str, int, float) and serialise to
one JSON object per line (:func:`write_trees` / :func:`read_trees`); reading back gives
an equal tree, floats bit for bit, and re-serialising gives the same bytes.

The record is one cohesive data type: nodes, turns, masks, events, serialisation and the
subtree/graft copies it needs; it is plain data and imports no other part of the
workbook.
"""

from __future__ import annotations

import json
import math
import operator
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sera_core.utils.jsonio import read_jsonl, write_jsonl

ROLES = ("execution", "launch", "rubric", "score")
"""Every completion token's role; the masks of the four roles partition the tokens."""
KINDS = ("act", "rubric", "score")
"""Turn kinds: an agent's step in the environment, a rubric-writing call, a scoring call."""
FORMAT = "sera.tree/1"
"""The ``format`` tag of a serialised tree."""

_KIND_ROLES = {"act": ("execution", "launch"), "rubric": ("rubric",), "score": ("score",)}
"""The roles a turn of each kind may hold."""



def _envs() -> tuple[str, ...]:
    """The benchmark names a tree may carry (the registry's; imported late: trees are plain data)."""
    from sera_core.envs.registry import BENCHMARKS

    return tuple(BENCHMARKS)


# ---------------------------------------------------------------------------------
# JSON safety
# ---------------------------------------------------------------------------------
def _check_json(obj: Any, where: str) -> None:
    """Raise ValueError unless ``obj`` is JSON-native and round-trips to an equal value.

    Allowed: None, bool, int, finite float, str, list, dict with str keys. Tuples are
    refused (they would come back as lists), as are NaN and infinities.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return
    if isinstance(obj, int):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise ValueError(f"{where}: non-finite float {obj!r} cannot be written as JSON")
        return
    if isinstance(obj, list):
        for i, item in enumerate(obj):
            _check_json(item, f"{where}[{i}]")
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: dict key {key!r} is not a str (JSON keys are strings)")  # noqa: TRY004
            _check_json(value, f"{where}[{key!r}]")
        return
    raise ValueError(
        f"{where}: {type(obj).__name__} is not JSON-native (use None, bool, int, float, str, list, dict)"
    )


def _int_list(ids: Iterable[Any]) -> list[int]:
    """``ids`` as a list of ints (a list of plain ints is copied without a Python loop)."""
    ids = list(ids)
    if set(map(type, ids)) <= {int}:
        return ids
    return [operator.index(i) for i in ids]


# ---------------------------------------------------------------------------------
# Turns
# ---------------------------------------------------------------------------------
@dataclass(eq=True)
class Turn:
    """One policy call: the exact tokens in and out, their logprobs and roles.

    Validated on construction (:meth:`validate`); call :meth:`validate` again after
    mutating. Violations are programming errors and raise ``ValueError``.
    """

    kind: str
    """``"act"`` (an agent's step), ``"rubric"`` (writing a child's rubric) or ``"score"``
    (scoring a child against its frozen rubric)."""
    prompt_ids: list[int]
    """The exact token ids the policy was given."""
    completion_ids: list[int]
    """The exact token ids the policy generated."""
    logprobs: list[float]
    """log pi_old(token) per completion token, recorded at generation (finite, <= 0)."""
    roles: list[str]
    """One role from :data:`ROLES` per completion token. ``act`` turns hold only
    ``execution``/``launch``; ``rubric`` and ``score`` turns only their own role."""
    text: str = ""
    """The decoded completion, ``decode(completion_ids)``."""
    observation: str | None = None
    """What the environment answered to this turn (act turns); None otherwise."""
    meta: dict = field(default_factory=dict)
    """Free JSON-native extras (e.g. ``{"child": "0.1"}`` on rubric/score turns,
    finish reason, sampling temperature)."""

    def __post_init__(self) -> None:
        try:
            self.prompt_ids = _int_list(self.prompt_ids)
            self.completion_ids = _int_list(self.completion_ids)
        except TypeError as exc:
            raise ValueError(f"Turn: token ids must be integers ({exc})") from None
        try:
            self.logprobs = [float(x) for x in self.logprobs]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Turn: logprobs must be numbers ({exc})") from None
        self.roles = list(self.roles)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` with a clear message if the turn is inconsistent."""
        if self.kind not in KINDS:
            raise ValueError(f"Turn: kind {self.kind!r} is not one of {KINDS}")
        n = len(self.completion_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"Turn: {n} completion tokens but {len(self.logprobs)} logprobs (need one per token)")
        if len(self.roles) != n:
            raise ValueError(f"Turn: {n} completion tokens but {len(self.roles)} roles (need one per token)")
        for name in ("prompt_ids", "completion_ids"):
            ids = getattr(self, name)
            if ids and (not set(map(type, ids)) <= {int} or min(ids) < 0):  # fast path in C; find the culprit below
                i, tok = next((i, t) for i, t in enumerate(ids) if type(t) is not int or t < 0)
                raise ValueError(f"Turn: {name}[{i}] = {tok!r} is not a non-negative int")
        for i, lp in enumerate(self.logprobs):
            if not math.isfinite(lp):
                raise ValueError(f"Turn: logprobs[{i}] = {lp!r} is not finite")
            if lp > 0.0:
                raise ValueError(f"Turn: logprobs[{i}] = {lp!r} is positive (a log-probability is <= 0)")
        allowed = _KIND_ROLES[self.kind]
        for i, role in enumerate(self.roles):
            if role not in ROLES:
                raise ValueError(f"Turn: roles[{i}] = {role!r} is not one of {ROLES}")
            if role not in allowed:
                raise ValueError(f"Turn: roles[{i}] = {role!r} in a {self.kind!r} turn (allowed: {allowed})")
        if not isinstance(self.text, str):
            raise ValueError(f"Turn: text must be a str, got {type(self.text).__name__}")  # noqa: TRY004
        if self.observation is not None and not isinstance(self.observation, str):
            raise ValueError(f"Turn: observation must be a str or None, got {type(self.observation).__name__}")
        if not isinstance(self.meta, dict):
            raise ValueError(f"Turn: meta must be a dict, got {type(self.meta).__name__}")  # noqa: TRY004

    def mask(self, role: str) -> list[bool]:
        """True for each completion token with ``role``."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        return [r == role for r in self.roles]

    def to_json(self) -> dict[str, Any]:
        """A JSON-native dict; ``roles`` are run-length encoded as ``[[role, count], ...]``."""
        self.validate()
        _check_json(self.meta, "Turn.meta")
        return {
            "kind": self.kind,
            "prompt_ids": list(self.prompt_ids),
            "completion_ids": list(self.completion_ids),
            "logprobs": list(self.logprobs),
            "roles": _rle(self.roles),
            "text": self.text,
            "observation": self.observation,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Turn:
        """Inverse of :meth:`to_json`."""
        return cls(
            kind=data["kind"], prompt_ids=data["prompt_ids"], completion_ids=data["completion_ids"],
            logprobs=data["logprobs"], roles=_unrle(data["roles"]), text=data["text"],
            observation=data["observation"], meta=data["meta"],
        )


def _rle(roles: Sequence[str]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for role in roles:
        if out and out[-1][0] == role:
            out[-1][1] += 1
        else:
            out.append([role, 1])
    return out


def _unrle(runs: Sequence[Sequence[Any]]) -> list[str]:
    out: list[str] = []
    for run in runs:
        if len(run) != 2 or not isinstance(run[1], int) or run[1] < 1:
            raise ValueError(f"bad run-length role entry {run!r} (expected [role, count >= 1])")
        out.extend([run[0]] * run[1])
    return out


# ---------------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------------
@dataclass(eq=True)
class Node:
    """One agent of the tree: its goal, its turns, its children and how it was judged."""

    node_id: str
    """Deterministic id: the root is ``"0"``, the k-th child (1-based) of ``p`` is ``f"{p}.{k}"``."""
    parent_id: str | None
    """The launching agent; None for the root."""
    depth: int
    """0 for the root, parent's depth + 1 otherwise."""
    task: str
    """The goal text this agent was given (root task or delegated subtask)."""
    turns: list[Turn] = field(default_factory=list)
    """Every policy call made for this agent, in order: its own ``act`` turns, and the
    ``rubric``/``score`` calls it made about its children (``meta["child"]`` names the child)."""
    children: list[str] = field(default_factory=list)
    """Child node ids in launch order."""
    launch_step: int | None = None
    """Index into the parent's ``turns`` of the ``act`` turn that launched this node; None for the root."""
    event_id: str | None = None
    """The delegation event: children launched in the same parent step share it; None for the root."""
    rubric: dict | None = None
    """The frozen rubric JSON, written before this child ran (None: root, or no rubric)."""
    rubric_error: str | None = None
    """Why the rubric could not be parsed, when it could not."""
    score: dict | None = None
    """The rubric score: gate ``g``, ``item_scores``, ``final_score``, ``forced`` (see :class:`sera_core.rubrics.Score`)."""
    score_error: str | None = None
    """Why the score could not be parsed, when it could not."""
    label: bool | None = None
    """External binary label (checker / judge); None when unknown - never set from an unknown verdict."""
    finished: bool = False
    """True when the agent ended by finishing (not by running out of steps or failing)."""
    result: dict = field(default_factory=dict)
    """Outcome details, e.g. checker verdict, finish message, steps used."""
    meta: dict = field(default_factory=dict)
    """Free JSON-native extras (e.g. targets, budget)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-native dict (turns included)."""
        for name in ("rubric", "score", "result", "meta"):
            _check_json(getattr(self, name), f"Node {self.node_id}.{name}")
        return {
            "node_id": self.node_id, "parent_id": self.parent_id, "depth": self.depth, "task": self.task,
            "turns": _compact_prompts([t.to_json() for t in self.turns], self.turns), "children": list(self.children),
            "launch_step": self.launch_step, "event_id": self.event_id,
            "rubric": self.rubric, "rubric_error": self.rubric_error,
            "score": self.score, "score_error": self.score_error,
            "label": self.label, "finished": self.finished, "result": self.result, "meta": self.meta,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        """Inverse of :meth:`to_json`."""
        fields = dict(data)
        turns: list[Turn] = []
        for t in data["turns"]:
            if "prompt_extends" in t:  # the context of an earlier act turn, then its completion, then a tail
                j = t["prompt_extends"]
                if not isinstance(j, int) or not 0 <= j < len(turns):
                    raise ValueError(f"Node {data.get('node_id')}: prompt_extends {j!r} is not an earlier turn")
                base = turns[j]
                t = {**t, "prompt_ids": base.prompt_ids + base.completion_ids + list(t["prompt_tail"])}
                del t["prompt_extends"], t["prompt_tail"]
            turns.append(Turn.from_json(t))
        fields["turns"] = turns
        return cls(**fields)


def _compact_prompts(dumped: list[dict[str, Any]], turns: list[Turn]) -> list[dict[str, Any]]:
    """Write an act turn's prompt as ``prompt_extends`` (the previous act turn) plus
    ``prompt_tail`` when it starts with that turn's prompt and completion: an agent's
    context grows by appending, so a tree's size stays linear in its tokens. Lossless:
    :meth:`Node.from_json` rebuilds the full ``prompt_ids``."""
    last = None
    for i, (turn, out) in enumerate(zip(turns, dumped, strict=True)):
        if turn.kind != "act":
            continue
        if last is not None:
            prev = turns[last]
            k = len(prev.prompt_ids) + len(prev.completion_ids)
            if turn.prompt_ids[:len(prev.prompt_ids)] == prev.prompt_ids and turn.prompt_ids[len(prev.prompt_ids):k] == prev.completion_ids:
                del out["prompt_ids"]
                out["prompt_extends"], out["prompt_tail"] = last, turn.prompt_ids[k:]
        last = i
    return dumped


class DelegationEvent(NamedTuple):
    """One delegation: a parent step that launched one or more children."""

    parent_id: str
    event_id: str
    child_ids: list[str]


# ---------------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------------
@dataclass(eq=False)
class Tree:
    """One rollout of one root task: agents as nodes, in creation order.

    Equality compares every field *and* the order of ``nodes``.
    """

    tree_id: str
    """Unique id of this rollout (e.g. ``"step3/task17/tree5"``)."""
    env: str
    """The benchmark's name (a key of :data:`~sera_core.envs.registry.BENCHMARKS`)."""
    task_id: str
    """The root task's id in its benchmark."""
    root_id: str = "0"
    """The root node's id."""
    nodes: dict[str, Node] = field(default_factory=dict)
    """Every node by id; insertion order is creation order."""
    root_reward: float | None = None
    """R_i in {0, 1}: the root checker's verdict; None until checked."""
    meta: dict = field(default_factory=dict)
    """Free JSON-native extras (seed, policy version, config name, ...)."""

    def __post_init__(self) -> None:
        if self.env not in _envs():
            raise ValueError(f"Tree: env {self.env!r} is not one of {_envs()}")

    def __repr__(self) -> str:  # short: a tree can hold millions of token ids
        return (f"Tree({self.tree_id!r}, env={self.env!r}, task_id={self.task_id!r}, nodes={len(self.nodes)}, "
                f"root_reward={self.root_reward!r})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tree):
            return NotImplemented
        return (
            (self.tree_id, self.env, self.task_id, self.root_id, self.root_reward, self.meta)
            == (other.tree_id, other.env, other.task_id, other.root_id, other.root_reward, other.meta)
            and list(self.nodes.items()) == list(other.nodes.items())
        )

    # -- construction --------------------------------------------------------------
    @classmethod
    def new(cls, tree_id: str, env: str, task_id: str, task: str, **meta: Any) -> Tree:
        """A tree holding just its root node (id ``"0"``) with goal ``task``."""
        tree = cls(tree_id=tree_id, env=env, task_id=task_id, meta=dict(meta))
        tree.add_node(task)
        return tree

    @property
    def dropped(self) -> bool:
        """Whether the ``drop_rollout`` policy dropped this rollout (a malformed rubric or score
        in it): it gives no datums and leaves every baseline."""
        return bool(self.meta.get("drop_rollout"))

    @property
    def root(self) -> Node:
        """The root node."""
        return self.nodes[self.root_id]

    def add_node(
        self, task: str, parent_id: str | None = None, launch_step: int | None = None,
        event_id: str | None = None, meta: dict | None = None,
    ) -> Node:
        """Create a node. Without ``parent_id`` it is the root (id ``root_id``; only one);
        otherwise see :meth:`add_child`."""
        if parent_id is None:
            if self.root_id in self.nodes:
                raise ValueError(f"Tree {self.tree_id}: the root {self.root_id!r} already exists")
            if launch_step is not None or event_id is not None:
                raise ValueError("the root has no launch_step or event_id")
            node = Node(node_id=self.root_id, parent_id=None, depth=0, task=task, meta=dict(meta or {}))
            self.nodes[node.node_id] = node
            return node
        return self.add_child(parent_id, task, launch_step, event_id, meta=meta)

    def add_child(
        self, parent_id: str, task: str, launch_step: int | None, event_id: str | None = None,
        meta: dict | None = None,
    ) -> Node:
        """Create the next child of ``parent_id``, launched by the parent's turn ``launch_step``.

        The id is ``f"{parent_id}.{k}"`` with k = 1 + the parent's number of children.
        ``event_id`` defaults to ``f"{parent_id}@{launch_step}"``, so children launched in
        the same parent step share one delegation event. An explicit ``event_id`` must
        not be reused by another parent or with another ``launch_step``.
        """
        if parent_id not in self.nodes:
            raise ValueError(f"Tree {self.tree_id}: unknown parent {parent_id!r}")
        if not isinstance(launch_step, int) or isinstance(launch_step, bool) or launch_step < 0:
            raise ValueError(f"launch_step must be a non-negative int (the parent's turn index), got {launch_step!r}")
        parent = self.nodes[parent_id]
        if event_id is None:
            event_id = f"{parent_id}@{launch_step}"
        for other in self.nodes.values():
            if other.event_id == event_id and (other.parent_id != parent_id or other.launch_step != launch_step):
                raise ValueError(
                    f"event_id {event_id!r} already belongs to parent {other.parent_id!r} step {other.launch_step}"
                )
        node_id = f"{parent_id}.{len(parent.children) + 1}"
        if node_id in self.nodes:
            raise ValueError(f"Tree {self.tree_id}: node {node_id!r} already exists")
        node = Node(
            node_id=node_id, parent_id=parent_id, depth=parent.depth + 1, task=task,
            launch_step=launch_step, event_id=event_id, meta=dict(meta or {}),
        )
        self.nodes[node_id] = node
        parent.children.append(node_id)
        return node

    # -- structure -------------------------------------------------------------------
    def walk(self, node_id: str | None = None) -> Iterator[Node]:
        """Nodes depth-first, pre-order (a node, then each child's subtree in launch order)."""
        start = self.root_id if node_id is None else node_id
        if start not in self.nodes:
            return
        stack = [start]
        while stack:
            node = self.nodes[stack.pop()]
            yield node
            stack.extend(reversed(node.children))

    def leaves(self) -> list[Node]:
        """Nodes without children, in :meth:`walk` order (a root that never delegates is a leaf)."""
        return [n for n in self.walk() if not n.children]

    def leaves_under(self, node_id: str) -> list[Node]:
        """The leaves of ``node_id``'s subtree (the node itself if it is a leaf)."""
        if node_id not in self.nodes:
            raise KeyError(node_id)
        return [n for n in self.walk(node_id) if not n.children]

    def depth_of(self, node_id: str) -> int:
        """The node's depth (root 0)."""
        return self.nodes[node_id].depth

    def delegation_events(self) -> list[DelegationEvent]:
        """Every delegation as ``(parent_id, event_id, [child ids])``, ordered by the
        creation of each event's first child."""
        events: dict[str, DelegationEvent] = {}
        for node in self.nodes.values():
            if node.parent_id is None:
                continue
            ev = events.get(node.event_id)  # type: ignore[arg-type]
            if ev is None:
                events[node.event_id] = DelegationEvent(node.parent_id, node.event_id, [node.node_id])  # type: ignore[index]
            else:
                ev.child_ids.append(node.node_id)
        return list(events.values())

    def event_leaves(self, event: DelegationEvent) -> list[Node]:
        """L_i(e): the leaves under all children of a delegation event (SPEC 3)."""
        return [leaf for child in event.child_ids for leaf in self.leaves_under(child)]

    # -- tokens ----------------------------------------------------------------------
    def masks(self, role: str) -> list[tuple[str, int, list[bool]]]:
        """``(node_id, turn_index, mask)`` for every turn (nodes in creation order) that
        holds at least one token of ``role``; ``mask[t]`` is True exactly for the
        completion tokens with that role. Turns without the role are omitted."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        out = []
        for node in self.nodes.values():
            for i, turn in enumerate(node.turns):
                mask = turn.mask(role)
                if any(mask):
                    out.append((node.node_id, i, mask))
        return out

    def token_count(self, role: str | None = None, depth: int | None = None) -> int:
        """How many completion tokens have ``role`` (all roles when None), optionally
        only at node depth ``depth`` (the N_d of depth weighting, SPEC 4)."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {ROLES}")
        total = 0
        for node in self.nodes.values():
            if depth is not None and node.depth != depth:
                continue
            for turn in node.turns:
                total += len(turn.roles) if role is None else turn.roles.count(role)
        return total

    # -- validation and (de)serialisation -----------------------------------------------
    def validate(self) -> None:
        """Raise ``ValueError`` if the structure is inconsistent (links, depths, events,
        launch steps, reward) or a turn is invalid."""
        where = f"Tree {self.tree_id}"
        if self.env not in _envs():
            raise ValueError(f"{where}: env {self.env!r} is not one of {_envs()}")
        if self.root_reward is not None and self.root_reward not in (0, 1):
            raise ValueError(f"{where}: root_reward must be 0, 1 or None, got {self.root_reward!r}")
        if not self.nodes:
            return
        if self.root_id not in self.nodes:
            raise ValueError(f"{where}: root {self.root_id!r} is missing")
        event_owner: dict[str, tuple[str | None, int | None]] = {}
        for key, node in self.nodes.items():
            nw = f"{where} node {key!r}"
            if node.node_id != key:
                raise ValueError(f"{nw}: stored under a different id ({node.node_id!r})")
            for turn in node.turns:
                turn.validate()
            if node.label is not None and not isinstance(node.label, bool):
                raise ValueError(f"{nw}: label must be True, False or None, got {node.label!r}")
            for child in node.children:
                if child not in self.nodes or self.nodes[child].parent_id != key:
                    raise ValueError(f"{nw}: child {child!r} is missing or names another parent")
            if len(set(node.children)) != len(node.children):
                raise ValueError(f"{nw}: duplicate children")
            if key == self.root_id:
                if node.parent_id is not None or node.depth != 0 or node.launch_step is not None or node.event_id is not None:
                    raise ValueError(f"{nw}: the root needs parent_id None, depth 0, no launch_step or event_id")
                continue
            parent = self.nodes.get(node.parent_id)  # type: ignore[arg-type]
            if parent is None or key not in parent.children:
                raise ValueError(f"{nw}: parent {node.parent_id!r} is missing or does not list it")
            if node.depth != parent.depth + 1:
                raise ValueError(f"{nw}: depth {node.depth} but parent depth {parent.depth}")
            step = node.launch_step
            if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < len(parent.turns):
                raise ValueError(f"{nw}: launch_step {step!r} is not an index of the parent's {len(parent.turns)} turns")
            if parent.turns[step].kind != "act":
                raise ValueError(f"{nw}: launch_step {step} points at a {parent.turns[step].kind!r} turn, not 'act'")
            if not isinstance(node.event_id, str) or not node.event_id:
                raise ValueError(f"{nw}: a child needs a non-empty event_id")
            owner = event_owner.setdefault(node.event_id, (node.parent_id, step))
            if owner != (node.parent_id, step):
                raise ValueError(f"{nw}: event {node.event_id!r} is shared with another parent or step")
        reached = sum(1 for _ in self.walk())
        if reached != len(self.nodes):
            raise ValueError(f"{where}: {len(self.nodes) - reached} nodes are not reachable from the root")

    def to_json(self) -> dict[str, Any]:
        """A JSON-native dict (validated; no NaN or infinities)."""
        self.validate()
        _check_json(self.meta, f"Tree {self.tree_id}.meta")
        return {
            "format": FORMAT,
            "tree_id": self.tree_id, "env": self.env, "task_id": self.task_id, "root_id": self.root_id,
            "root_reward": None if self.root_reward is None else float(self.root_reward),
            "meta": self.meta,
            "nodes": [node.to_json() for node in self.nodes.values()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tree:
        """Inverse of :meth:`to_json` (validated)."""
        if data.get("format") != FORMAT:
            raise ValueError(f"not a serialised tree (format {data.get('format')!r}, expected {FORMAT!r})")
        nodes = [Node.from_json(n) for n in data["nodes"]]
        tree = cls(
            tree_id=data["tree_id"], env=data["env"], task_id=data["task_id"], root_id=data["root_id"],
            nodes={n.node_id: n for n in nodes}, root_reward=data["root_reward"], meta=data["meta"],
        )
        if len(tree.nodes) != len(nodes):
            raise ValueError(f"Tree {tree.tree_id}: duplicate node ids")
        tree.validate()
        return tree


def subtree(tree: Tree, node_id: str, tree_id: str) -> Tree:
    """A copy of ``node_id``'s subtree as a tree of its own, re-rooted at ``"0"``.

    Ids keep their suffix (``"0.2.1"`` under ``"0.2"`` becomes ``"0.1"``), depths drop by
    the node's depth, and ``meta["depth_offset"]`` records it; turns are copied."""
    top = tree.nodes[node_id]
    prefix = len(node_id)

    def rename(old: str | None) -> str | None:
        return None if old is None else tree.root_id + old[prefix:]

    nodes = {}
    for node in tree.walk(node_id):
        data = node.to_json()
        data.update(node_id=rename(node.node_id), children=[rename(c) for c in node.children],
                    depth=node.depth - top.depth)
        if node is top:
            data.update(parent_id=None, launch_step=None, event_id=None)
        else:
            data.update(parent_id=rename(node.parent_id), event_id=tree.root_id + node.event_id[prefix:])
        nodes[data["node_id"]] = Node.from_json(data)
    out = Tree(tree_id=tree_id, env=tree.env, task_id=tree.task_id, root_id=tree.root_id, nodes=nodes,
               meta={"source_tree": tree.tree_id, "source_node": node_id, "depth_offset": top.depth})
    out.validate()
    return out


def graft(tree: Tree, node_id: str, source: Tree) -> None:
    """Put ``source``'s root agent (its turns, outcome and subtree) at ``node_id`` of
    ``tree``: the inverse of :func:`subtree`. ``node_id`` must not have run yet (no turns,
    no children); it keeps its place (parent, launch step, event), rubric and meta. Ids
    get ``node_id``'s prefix (``"0.1"`` of ``source`` becomes ``node_id + ".1"``), depths
    grow by its depth, and rubric/score turns' ``meta["child"]`` are renamed alike. The
    nodes of ``source`` are moved, not copied: ``source`` must not be used afterwards."""
    top = tree.nodes[node_id]
    if top.turns or top.children:
        raise ValueError(f"Tree {tree.tree_id}: node {node_id!r} already ran; only a fresh node can be grafted onto")
    cut = len(source.root_id)

    def rename(old: str) -> str:
        return node_id + old[cut:]

    for node in list(source.walk()):
        for turn in node.turns:
            if "child" in turn.meta:
                turn.meta["child"] = rename(turn.meta["child"])
        node.children = [rename(c) for c in node.children]
        if node is source.root:
            top.turns, top.children, top.finished = node.turns, node.children, node.finished
            top.result.update(node.result)
            continue
        node.node_id, node.parent_id, node.depth = rename(node.node_id), rename(node.parent_id), node.depth + top.depth
        node.event_id = rename(node.event_id)
        tree.nodes[node.node_id] = node


def write_trees(path: str | os.PathLike, trees: Iterable[Tree]) -> int:
    """Write trees as JSON lines (one tree per line, atomically); return how many."""
    return write_jsonl(path, (tree.to_json() for tree in trees))


def read_trees(path: str | os.PathLike) -> list[Tree]:
    """Read the trees written by :func:`write_trees`."""
    return [Tree.from_json(rec) for rec in read_jsonl(path)]


def dumps_tree(tree: Tree) -> str:
    """One tree as the exact line :func:`write_trees` writes (without the newline)."""
    return json.dumps(tree.to_json())


__all__ = [
    "FORMAT", "KINDS", "ROLES", "DelegationEvent", "Node", "Tree", "Turn", "dumps_tree", "graft", "read_trees",
    "subtree", "write_trees",
]
