"""Crafting plans: the aggregated gold plan and the base materials a plan needs.

A plan is a list of gold steps in the official format::

    {"action": "craft", "target": [item, n_crafts], "ingredients": {name: total},
     "result_count": total_units}

``target[1]`` is the number of recipe executions, not units: the step consumes
``n_crafts * amount`` of every ingredient and yields ``n_crafts * result_count``
units. Replaying a step through the tool is
``craft(step["ingredients"], (item, step["result_count"]))``.

Aggregation: demands are resolved from the deepest item down, so an intermediate
used by several parents is crafted once, in one step, with
``n = ceil(demand / units_per_craft)`` executions; the plan may over-produce.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping

from sera_core.envs.textcraft.world import RecipeBook


class InfeasiblePlan(ValueError):
    """The available items cannot produce the targets; ``shortfall`` says what is missing."""

    def __init__(self, shortfall: dict[str, int]):
        self.shortfall = shortfall
        super().__init__("not enough base materials: " + ", ".join(f"{k} short by {v}" for k, v in shortfall.items()))


def plan_crafts(
    book: RecipeBook,
    targets: Mapping[str, int],
    available: Mapping[str, int] | None = None,
    *,
    strict: bool = True,
) -> list[dict]:
    """Aggregated plan that makes ``targets`` (units) from ``available`` items.

    ``available`` holds items the plan may consume (base and crafted); targets are
    always produced anew (units of a target in ``available`` are not counted, so the
    plan achieves a net gain). With ``strict``, a base-item shortfall raises
    :class:`InfeasiblePlan`; otherwise missing base items are assumed present.
    Steps are ordered by depth (shallowest first), then by first demand.
    """
    available = Counter({k: v for k, v in (available or {}).items() if v > 0})
    for t in targets:
        if not book.knows(t):
            raise KeyError(f"unknown item {t!r}")
        available.pop(t, None)
    depths = book.depths
    demand: Counter[str] = Counter()
    order: dict[str, int] = {}
    heap: list[tuple[int, int, str]] = []  # (-depth, first-demand order, item)

    def add_demand(item: str, n: int) -> None:
        if item not in order:
            order[item] = len(order)
            heapq.heappush(heap, (-depths[item], order[item], item))
        demand[item] += n

    for t, n in targets.items():
        add_demand(t, int(n))
    shortfall: dict[str, int] = {}
    steps: list[tuple[int, int, dict]] = []
    while heap:  # deepest first: every demand on an item is known before it is expanded
        _, _, item = heapq.heappop(heap)
        use = min(available[item], demand[item])
        available[item] -= use
        deficit = demand[item] - use
        if deficit <= 0:
            continue
        if book.is_base(item):
            shortfall[item] = deficit
            continue
        recipe = book.recipes[item]
        crafts = -(-deficit // recipe.result_count)
        for name, amount in recipe.ingredients:
            add_demand(name, crafts * amount)
        steps.append((depths[item], order[item], {
            "action": "craft",
            "target": [item, crafts],
            "ingredients": recipe.ingredient_dict(crafts),
            "result_count": crafts * recipe.result_count,
        }))
    if shortfall and strict:
        raise InfeasiblePlan(dict(sorted(shortfall.items())))
    return [s for _, _, s in sorted(steps, key=lambda x: (x[0], x[1]))]


def base_requirements(book: RecipeBook, steps: list[dict]) -> Counter[str]:
    """Total base items consumed by a plan."""
    need: Counter[str] = Counter()
    for step in steps:
        for name, total in step["ingredients"].items():
            if book.is_base(name):
                need[name] += total
    return need


def split_requirements(book: RecipeBook, targets: Mapping[str, int], levels: int) -> Counter[str]:
    """Base items needed when the top ``levels`` levels are delegated piecewise.

    At each of the top ``levels`` levels, every crafted ingredient is made by its own
    independent plan (no sharing of intermediates or leftovers between siblings), the
    way delegated children plan; below that, plans are aggregated. Aggregation is
    sub-additive, so this is an upper bound on what any mix of delegating and
    crafting-yourself within that depth consumes, and it grows with ``levels``.
    """
    need: Counter[str] = Counter()
    for item, count in targets.items():
        if book.is_base(item):
            need[item] += count
        elif levels <= 0:
            need += base_requirements(book, plan_crafts(book, {item: count}, strict=False))
        else:
            recipe = book.recipes[item]
            crafts = -(-count // recipe.result_count)
            need += split_requirements(book, recipe.ingredient_dict(crafts), levels - 1)
    return need


def simulate(book: RecipeBook, inventory: Mapping[str, int], steps: list[dict]) -> Counter[str]:
    """Apply ``steps`` to a copy of ``inventory``; raise ``ValueError`` on a bad step.

    Checks each step against the recipe (per-craft amounts times ``n_crafts``) and
    that no count goes negative. Returns the final inventory.
    """
    inv: Counter[str] = Counter(inventory)
    for i, step in enumerate(steps):
        item, crafts = step["target"]
        recipe = book.recipes.get(item)
        if recipe is None or step["ingredients"] != recipe.ingredient_dict(crafts) or step["result_count"] != crafts * recipe.result_count:
            raise ValueError(f"step {i}: {item} does not match its recipe")
        for name, total in step["ingredients"].items():
            if inv[name] < total:
                raise ValueError(f"step {i}: needs {total} {name}, has {inv[name]}")
            inv[name] -= total
        inv[item] += step["result_count"]
    return inv
