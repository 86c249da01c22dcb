"""CookingWorld food and preparation data, read from the ``textworld`` package.

The official TextWorld-Sync generator draws from CookingWorld's database; the
``textworld`` package ships one in ``textworld.challenges.tw_cooking.cooking``. We read
it from there (a dependency, not a hand-typed copy):

* ``FOODS``: 38 foods, each with its source locations (``kitchen.fridge``,
  ``kitchen.counter``, ``pantry.shelf``, ``supermarket.showcase``, ``garden``) and
  properties (``cookable``, ``cuttable``, ``edible``, ...).
* ``FOODS_SPLITS``: train 22 / valid 8 / test 8 foods. The official task files use the
  22 *train* foods in every split (their ingredient names are exactly these), so tasks
  always draw ingredients from them; the other 16 foods appear only as distractors.
* ``FOOD_PREPARATIONS_SPLITS``: for each of the 22 foods, the (cooking, cutting)
  preparations allowed in the train, valid and test folds (disjoint within a food).
  Our train split uses the train fold, dev the valid fold, test the test fold (the
  official records name their fold in ``generation.source_db_fold``).
* Cooking states ``raw fried roasted grilled``; cutting states ``uncut chopped sliced
  diced``.

``docs/textworld.md`` lists the foods and preparations (``sera`` reads them here).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

COOKING: tuple[str, ...] = ("raw", "fried", "roasted", "grilled")
"""Cooking states; ``raw`` means not cooked."""
CUTTING: tuple[str, ...] = ("uncut", "chopped", "sliced", "diced")
"""Cutting states; ``uncut`` means not cut."""
COOK_APPLIANCE: dict[str, str] = {"fried": "stove", "roasted": "oven", "grilled": "grill"}
"""Which appliance gives which cooking state (SPEC 8)."""
CUT_VERB: dict[str, str] = {"chopped": "chop", "sliced": "slice", "diced": "dice"}
"""The command verb of each cutting state."""
ROOMS: tuple[str, ...] = (
    "kitchen", "pantry", "garden", "supermarket", "hallway", "dining room",
    "garage", "study", "basement", "attic", "courtyard",
)
"""Room names, in order; a task uses the first clamp(numLocations, 4, 11) (SPEC 8)."""
FOLDS: dict[str, str] = {"train": "train", "dev": "valid", "test": "test"}
"""Preparation fold used by each task split."""


@dataclass(frozen=True)
class Food:
    """One CookingWorld food."""

    name: str
    locations: tuple[str, ...]
    """Where it can be found: ``room.container`` or a bare room."""
    properties: tuple[str, ...]
    preparations: dict[str, tuple[tuple[str, str], ...]]
    """Allowed (cooking, cutting) pairs per fold (``train``/``valid``/``test``);
    empty for foods outside the 22 task foods."""


def rooms_for(num_locations: int) -> tuple[str, ...]:
    """The rooms of a task with ``numLocations`` = n: the first clamp(n, 4, 11)."""
    return ROOMS[: max(4, min(11, int(num_locations)))]


@lru_cache(maxsize=1)
def load_foods() -> dict[str, Food]:
    """All 38 foods by name (sorted), read from ``textworld``'s tw_cooking module."""
    from textworld.challenges.tw_cooking import cooking

    preps = cooking.FOOD_PREPARATIONS_SPLITS
    foods = {}
    for name in sorted(cooking.FOODS):
        entry = cooking.FOODS[name]
        foods[name] = Food(
            name=name,
            locations=tuple(entry["locations"]),
            properties=tuple(entry["properties"]),
            preparations={fold: tuple(tuple(p) for p in preps[fold].get(name, ())) for fold in sorted(preps)},
        )
    return foods


@lru_cache(maxsize=1)
def task_foods() -> tuple[str, ...]:
    """The 22 foods tasks draw ingredients from (``FOODS_SPLITS["train"]``), sorted."""
    from textworld.challenges.tw_cooking import cooking

    return tuple(sorted(cooking.FOODS_SPLITS["train"]))


def distractor_foods() -> tuple[str, ...]:
    """Foods that never appear as ingredients (the valid and test food splits)."""
    tasks = set(task_foods())
    return tuple(name for name in load_foods() if name not in tasks)


def branch_work(preparation: tuple[str, str]) -> int:
    """Actions to make one ingredient ready: take (1) + cook (1 if not raw) + cut (1 if not uncut)."""
    cook, cut = preparation
    return 1 + (cook != "raw") + (cut != "uncut")
