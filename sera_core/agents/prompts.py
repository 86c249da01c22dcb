"""What each agent and each rubric/scoring call is shown (the runtime's prompts).

An agent's first prompt is a system message (the benchmark's interface: tools or
blocks, the reply format, its depth and whether it may delegate, its step budget) and a
user message (its goal and, in TextWorld, what it sees). Agents at the depth cap are
told they cannot delegate (SPEC 1). Rubric and scoring calls are fresh single-message
contexts built by :func:`sera_core.rubrics.build_rubric_prompt` and
:func:`sera_core.rubrics.build_score_prompt`, under their own system messages.

The wording is ours; the structure (CodeAct tools, one block per TextWorld reply, the
rubric writer's eight sections) is the official one (SPEC 8).
"""

from __future__ import annotations

TEXTCRAFT_TOOLS = (
    "get_info(items: list) -> list[dict]  # item, can_craft, is_base, in_inventory, crafting_depth, recipes\n"
    "view_inventory() -> dict\n"
    "craft(ingredients: dict, target: tuple[str, int]) -> str  # exact total ingredients for `count` units; "
    "count a multiple of the recipe's result count\n"
    "finish(message: str) -> str  # end your episode with a report"
)
TEXTCRAFT_LAUNCH = (
    "await launch_subagent(targets: dict, context: str = '') -> str  # a child agent crafts `targets` "
    "on the shared inventory; several at once with asyncio.gather"
)
TEXTWORLD_BLOCKS = (
    "<action>command</action>  # go to <room>, take <item>, read cookbook, chop|slice|dice <item>, "
    "cook <item> in stove|oven, cook <item> on grill, open door, prepare <dish>, eat <dish>, inventory\n"
    "<finish>message</finish>  # end your episode with a report"
)
TEXTWORLD_DELEGATE = (
    '<delegate>{"goal": "..."}</delegate> or <delegate>{"delegations": [{"goal": "...", "max_steps": n}, ...]}'
    "</delegate>  # child agents work on the shared world; their reports come back as [SubAgent Results]"
)
RUBRIC_SYSTEM = ("You write grading rubrics for delegated subtasks. You never see the sub-agent's future work. "
                 "Reply with one JSON object only.")
SCORE_SYSTEM = ("You grade a sub-agent's work strictly against a frozen rubric, using only the trajectory and the "
                "final environment state. Reply with one JSON object only.")


def tools_text(env: str, can_delegate: bool) -> str:
    """The tools (TextCraft) or blocks (TextWorld) an agent has."""
    if env == "textcraft":
        return TEXTCRAFT_TOOLS + ("\n" + TEXTCRAFT_LAUNCH if can_delegate else "")
    return TEXTWORLD_BLOCKS + ("\n" + TEXTWORLD_DELEGATE if can_delegate else "")


def system_prompt(env: str, *, depth: int, max_depth: int, max_steps: int) -> str:
    """The system message of an agent at ``depth`` with ``max_steps`` steps."""
    can = depth < max_depth
    who = "the root agent" if depth == 0 else f"a sub-agent at depth {depth}"
    rule = (f"You may delegate sub-goals to child agents (depth {depth + 1} of at most {max_depth})."
            if can else f"You are at the maximum depth ({max_depth}): you cannot delegate; do the work yourself.")
    if env == "textcraft":
        body = ("You craft items in TextCraft. Each turn, reply with <thought>...</thought> then "
                "<python>...</python>; the code runs in a persistent Python session (top-level await allowed) and "
                "its printed output is your next observation. Tools:\n" + tools_text(env, can))
    else:
        body = ("You cook in a shared TextWorld kitchen with other agents. Each turn, think briefly, then reply "
                "with exactly one block:\n" + tools_text(env, can))
    return f"You are {who}. {rule} You have {max_steps} steps.\n{body}"


def agent_messages(env: str, goal: str, first_observation: str | None, *, depth: int, max_depth: int,
                   max_steps: int) -> list[dict[str, str]]:
    """The first prompt of an agent: system message, then its goal (and first observation)."""
    user = goal if first_observation is None else first_observation
    return [{"role": "system", "content": system_prompt(env, depth=depth, max_depth=max_depth, max_steps=max_steps)},
            {"role": "user", "content": user}]


def rubric_messages(prompt: str) -> list[dict[str, str]]:
    """A rubric-writing call's messages."""
    return [{"role": "system", "content": RUBRIC_SYSTEM}, {"role": "user", "content": prompt}]


def score_messages(prompt: str) -> list[dict[str, str]]:
    """A scoring call's messages."""
    return [{"role": "system", "content": SCORE_SYSTEM}, {"role": "user", "content": prompt}]
