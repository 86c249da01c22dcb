"""What each agent and each rubric/scoring call is shown (the runtime's prompts).

An agent's first prompt is a system message (the benchmark's interface: tools or
blocks, the reply format, its depth and whether it may delegate, its step budget) and a
user message (its goal and, in TextWorld, what it sees). Agents at the depth cap are
told they cannot delegate (SPEC 1). Rubric and scoring calls are fresh single-message
contexts built here (:func:`build_rubric_prompt` from :class:`RubricInputs`, and
:func:`build_score_prompt`), under their own system messages; long sections are cut in the
middle (:func:`sera_core.utils.text.truncate_middle`, shared with the LLM judge). Every
prompt text of the runtime lives in this module but each benchmark's agent interface (its
introduction, tools or reply blocks, and delegation tool: ``agent_intro``, ``agent_tools``,
``delegate_tool`` of its class in :mod:`sera_core.envs.registry`);
:mod:`sera_core.rubrics` parses what comes back.

The wording is ours; the structure (CodeAct tools, one block per TextWorld reply, the
rubric writer's eight sections) is the official one (SPEC 8).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sera_core.envs.registry import BENCHMARKS
from sera_core.rubrics import MAX_ITEMS, MIN_ITEMS, Rubric
from sera_core.utils.text import truncate_middle

RUBRIC_SYSTEM = ("You write grading rubrics for delegated subtasks. You never see the sub-agent's future work. "
                 "Reply with one JSON object only.")
SCORE_SYSTEM = ("You grade a sub-agent's work strictly against a frozen rubric, using only the trajectory and the "
                "final environment state. Reply with one JSON object only.")


def tools_text(benchmark: str, can_delegate: bool) -> str:
    """The tools (TextCraft) or blocks (TextWorld) an agent has: the benchmark's
    ``agent_tools``, and its ``delegate_tool`` when the agent may delegate."""
    bench = BENCHMARKS[benchmark]
    return bench.agent_tools + ("\n" + bench.delegate_tool if can_delegate else "")


def system_prompt(benchmark: str, *, depth: int, max_depth: int, max_steps: int) -> str:
    """The system message of an agent at ``depth`` with ``max_steps`` steps."""
    can = depth < max_depth
    who = "the root agent" if depth == 0 else f"a sub-agent at depth {depth}"
    rule = (f"You may delegate sub-goals to child agents (depth {depth + 1} of at most {max_depth})."
            if can else f"You are at the maximum depth ({max_depth}): you cannot delegate; do the work yourself.")
    body = BENCHMARKS[benchmark].agent_intro + tools_text(benchmark, can)
    return f"You are {who}. {rule} You have {max_steps} steps.\n{body}"


def agent_messages(benchmark: str, goal: str, first_observation: str | None, *, depth: int, max_depth: int,
                   max_steps: int) -> list[dict[str, str]]:
    """The first prompt of an agent: system message, then its goal (and first observation)."""
    user = goal if first_observation is None else first_observation
    return [{"role": "system", "content": system_prompt(benchmark, depth=depth, max_depth=max_depth, max_steps=max_steps)},
            {"role": "user", "content": user}]


def rubric_messages(prompt: str) -> list[dict[str, str]]:
    """A rubric-writing call's messages."""
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": prompt}]


def score_messages(prompt: str) -> list[dict[str, str]]:
    """A scoring call's messages."""
    return [{"role": "system", "content": SCORE_SYSTEM}, {"role": "user", "content": prompt}]


RUBRIC_SECTIONS = (
    "Parent task", "Parent metadata", "Parent trajectory before delegation", "Delegation decision",
    "Observable environment before the call", "Delegated subtask", "Child tools", "Child budget",
)
"""The rubric writer's inputs, in the official order (SPEC 8)."""


@dataclass(frozen=True)
class RubricInputs:
    """Exactly what the rubric writer may see (SPEC 2, 8): nothing of the child's future."""

    parent_task: str
    parent_metadata: str
    """Depths and the fork step, e.g. ``parent depth 0; child depth 1; delegation at step 3``."""
    parent_trajectory: str
    """The parent's turns before the delegation."""
    delegation: str
    """The delegation decision itself (the launch statement or delegate block)."""
    environment: str
    """The observable environment before the call."""
    subtask: str
    child_tools: str
    child_budget: str


def build_rubric_prompt(inputs: RubricInputs, *, min_items: int = MIN_ITEMS, max_items: int = MAX_ITEMS,
                        max_section_chars: int = 6000) -> str:
    """The rubric writer's prompt: the eight sections in order, then the output format."""
    values = (inputs.parent_task, inputs.parent_metadata, inputs.parent_trajectory, inputs.delegation,
              inputs.environment, inputs.subtask, inputs.child_tools, inputs.child_budget)
    parts = ["Write a rubric to judge whether a sub-agent completes the delegated subtask. "
             "It is frozen before the sub-agent runs."]
    for title, value in zip(RUBRIC_SECTIONS, values, strict=True):
        parts.append(f"## {title}\n{truncate_middle(value.strip(), max_section_chars)}")
    parts.append(
        f"## Output\nReply with one JSON object: {{\"rubric_items\": [{{\"name\", \"weight\", \"description\", "
        f"\"score_0\", \"score_full\"}}, ...] ({max(min_items, MIN_ITEMS)} to {max_items} items), "
        "\"success_gate\", \"failure_conditions\": [...], \"scoring_procedure\"}."
    )
    return "\n\n".join(parts)


def build_score_prompt(rubric: Rubric, subtask: str, trajectory: str, final_state: str,
                       *, max_section_chars: int = 8000) -> str:
    """The scoring call's prompt: frozen rubric, delegated task, child trajectory, final state."""
    return "\n\n".join([
        "Score the sub-agent's work against the frozen rubric.",
        f"## Rubric\n{json.dumps(rubric.to_json(), indent=1)}",
        f"## Delegated task\n{subtask.strip()}",
        f"## Sub-agent trajectory\n{truncate_middle(trajectory.strip(), max_section_chars)}",
        f"## Final environment state\n{truncate_middle(final_state.strip(), max_section_chars)}",
        "## Output\nReply with one JSON object: {\"success\": true|false, \"criterion_scores\": "
        "[{\"name\", \"score\" (0 to 1), \"reason\"}, ...] (every rubric item once), \"final_score\", \"reason\"}. "
        "If the success gate fails, success is false and the final score is 0.",
    ])
