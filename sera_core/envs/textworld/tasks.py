"""TextWorld-Sync tasks: seeded multi-dish CookingWorld records in the official format.

A record has the official top-level keys (FORMAT.md 2): ``base_game``, ``difficulty``,
``dishes``, ``game``, ``game_params``, ``generation``, ``parallelism``,
``schema_version``, ``seed``, ``source_fold``, ``split``, ``task_description``,
``task_descriptions``, ``task_family``, ``task_id``, ``task_view``; the nested objects
``dishes[].recipe[]``, ``game_params``, ``parallelism`` and ``generation`` carry the
official keys too. Records are plain JSON (lists, never tuples), so
``json.loads(json.dumps(r)) == r``.

How a task is drawn (every draw comes from ``rng_for("textworld.task", seed)`` over
sorted lists, so a record depends on its seed alone and is identical in every process):

1. Parameters from the difficulty's :class:`Band` (FORMAT.md 2.2-2.3): dishes,
   ingredients per dish, locations, distractors, doors, inventory limit and capacity,
   min/max prepared ingredients per dish, preparation complexity; runtime: the shared
   environment-action budget and the tool cooldown.
2. A *slot profile* per dish from the family (below): for each ingredient slot, what
   its preparation must be (raw/uncut, one step, cook-and-cut, any preparation, fried,
   cut, ...). Prepared slots per dish always stay within the sampled min/max.
3. Foods are matched to slots by a randomised bipartite matching over the 22 task
   foods (``data.task_foods()``), so ingredients are disjoint across dishes and every
   slot gets a food with a fitting preparation in the split's fold (train -> train,
   dev -> valid, test -> test); the preparation is drawn among the food's fitting
   ones, and each dish's recipe order is shuffled. If a profile cannot be filled in
   that fold, the family's next candidate profile is tried.
4. ``parallelism`` and the texts follow from the dishes (FORMAT.md 2.4-2.5):
   critical_path_estimate = max dish work + 2K, estimated_sequential_actions =
   total work + 2K + includeDoors, ideal_parallel_speedup = round(total / cpe, 4).

How the families differ (K dishes, n ingredients per dish, p prepared per dish):

* ``multi_dish_fork_join`` (fork_join): p = sampled minimum in every dish and the same
  number of cook-and-cut ingredients, so dish works are equal (at most 1 apart when a
  fold cannot supply that).
* ``critical_path``: one dish (at a drawn position) has the band's maximum number of
  prepared ingredients, all cook-and-cut (branch_work 3); every other dish has the
  minimum, all one-step (branch_work 2): the long dish leads every other by >= 3.
* ``load_balanced``: dish works form a ladder from the lightest possible (minimum
  prepared, one-step) to the heaviest (maximum prepared, cook-and-cut), evenly spaced
  and assigned to dishes in drawn order.
* ``resource_constrained``: ``limitInventorySize`` 1 at every difficulty with the
  sampled capacity, ``resource_capacity {"inventory": c}``, bottlenecks knife, stove,
  kitchen.
* ``dependency_gate``: ``includeDoors`` 1 at every difficulty (also easy, like the
  official records) and edges ``gate_1 -> dish_2..dish_K`` (dish_1 is not gated).
* ``conflict``: every dish needs the stove (a fried ingredient) and the knife (a cut
  one); ``resource_capacity {"knife": 1, "stove": 1}``, ``resource_conflict`` true; the
  cooldown is drawn from the band's non-zero choices where there are any.
* ``hierarchical``: every dish has the band's maximum number of prepared ingredients;
  ``hierarchy_depth`` 2 with ``root -> dish_k`` and ``dish_k -> dish_k::<ingredient>``
  decompose edges.

Decisions where the official generator is not public (and departures from it):

* Seeds: test ``820000 + 1000*d + 100*f + i`` (official). Train and dev use the
  config's strides: ``start + 100000*d + 200*f + i`` with train start 850000 and dev
  start 860000, ``d`` the index in easy/medium/hard/extreme and ``i`` the index within
  the (family, difficulty) cell; :class:`TaskConfig` checks that no seed repeats.
* Train (medium 900 / hard 150 / extreme 450) and dev (50 per difficulty) spread each
  difficulty over the 7 families as evenly as possible, the remainder going to the
  first families in official order (medium 129,129,129,129,128,128,128; hard
  22,22,22,21,21,21,21; extreme 65,65,64,64,64,64,64; dev 8,7,7,7,7,7,7). Every split
  is ordered difficulty, family, index, like the test file; dev records say
  ``"dev"`` in ``split``/``source_fold`` and ``"valid"`` in
  ``generation.source_db_fold``.
* The official records always use exactly the sampled *minimum* of prepared
  ingredients per dish; fork_join, resource_constrained, dependency_gate and conflict
  do the same. critical_path, load_balanced and hierarchical record the band's top
  value as their sampled maximum (within the band) and use it as described above, so
  their structure is visible even on easy tasks. The official sample's families are
  not structurally distinguishable by work; ours are by design.
* ``limitInventorySize`` is 1 for easy ``resource_constrained`` tasks (official easy
  records have 0 but state the capacity); ``v7_sampled_parameters`` keeps the band's
  draw, as the official easy ``dependency_gate`` records do for doors.
* Easy bands only allow tool cooldown 0, so easy ``conflict`` tasks have cooldown 0
  (as the official easy conflict records do); medium conflict tasks always get 1.
* ``preparation_complexity`` is drawn and recorded; its effect in the official
  generator is not visible in the data, so it steers nothing here.
* Distractors are only a count (``numDistractorItems``), as in the official records;
  the world picks them.

The renderers (:func:`render_structured`, :func:`render_coarse`) work from a record's
``dishes``, ``task_family`` and ``parallelism`` and reproduce the official texts of
every record of the official sample exactly.

The task generator reproduces the official V9 draws (families, bands, seeds, rendering,
validation), one specification kept in one module.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from random import Random

from tqdm import tqdm

from sera_core.envs import DIFFICULTIES as LEVELS
from sera_core.envs.textworld.data import (
    COOKING,
    CUTTING,
    FOLDS,
    branch_work,
    load_foods,
    task_foods,
)
from sera_core.utils.errors import UserInputError
from sera_core.utils.seeding import rng_for

FAMILIES: dict[str, str] = {
    "multi_dish_fork_join": "fork_join",
    "critical_path": "critical_path",
    "load_balanced": "load_balanced",
    "resource_constrained": "resource_constrained",
    "dependency_gate": "dependency_gate",
    "conflict": "conflict",
    "hierarchical": "hierarchical",
}
"""Task family -> ``parallelism.pattern``, in the official order (seed and file order)."""

DIFFICULTIES: tuple[str, ...] = LEVELS
"""Difficulties in the official order (seed and file order): the shared levels."""

SPLITS: tuple[str, ...] = ("test", "train", "dev")
"""Task splits; each uses the preparation fold ``data.FOLDS[split]``."""

SOURCE_DB_FOLDS: dict[str, str] = {"test": "test", "train": "train", "dev": "valid"}
"""``generation.source_db_fold`` of each split."""

DEFAULT_BOTTLENECKS: list[str] = ["kitchen", "meal_preparation", "meal_eating"]
FAMILY_BOTTLENECKS: dict[str, list[str]] = {
    "resource_constrained": ["knife", "stove", "kitchen"],
    "conflict": ["knife", "stove"],
}
"""``parallelism.shared_bottlenecks`` where a family departs from the default."""

TOP_PREPARED_FAMILIES: frozenset[str] = frozenset({"critical_path", "load_balanced", "hierarchical"})
"""Families whose sampled max prepared-per-dish is the band's top value."""

STRUCTURED_HEADER = (
    "Prepare and eat {k} independent dishes. Complete every dish.\n"
    "The dishes are separate objectives and may be prepared independently before the final meal actions."
)
STRUCTURED_FOOTER = "After all required ingredients for a dish are ready, prepare and eat that dish."
COARSE_HEADER = "Prepare and eat {k} dishes. Check the cookbook and complete every dish."
FAMILY_SENTENCES: dict[str, tuple[str, ...]] = {
    "multi_dish_fork_join": (),
    "critical_path": ("The dishes do not require equal amounts of preparation work.",),
    "load_balanced": ("The preparation workloads of the dishes are intentionally different.",),
    "resource_constrained": (
        "The shared inventory can hold at most {capacity} ingredients at once.",
        "The kitchen and preparation tools are shared across all dishes.",
    ),
    "dependency_gate": ("Some ingredient locations are behind an access gate that must be opened first.",),
    "conflict": ("Several dishes require shared kitchen tools; coordinate their use.",),
    "hierarchical": ("Each dish contains multiple ingredient-level objectives that can be handled as a group.",),
}
"""Sentences appended to both views (FORMAT.md 2.5); ``{capacity}`` is the inventory capacity."""


@dataclass(frozen=True)
class Band:
    """The parameter and runtime ranges of one difficulty (FORMAT.md 2.2-2.3).

    Integer ranges are inclusive ``(min, max)``; choice fields list the allowed values.
    """

    dishes: tuple[int, int]
    """Number of dishes K."""
    ingredients_per_dish: tuple[int, int]
    """Ingredients per dish n (all dishes of a task have the same n)."""
    locations: tuple[int, int]
    """``numLocations``."""
    distractors: tuple[int, int]
    """``numDistractorItems``."""
    include_doors: tuple[bool, ...]
    """Choices for doors (``includeDoors``)."""
    limit_inventory: tuple[bool, ...]
    """Choices for the inventory limit (``limitInventorySize``)."""
    inventory_capacity: tuple[int, int]
    """Capacity of the shared inventory when limited."""
    min_prepared: tuple[int, int]
    """Range of the sampled minimum of prepared ingredients per dish."""
    max_prepared: tuple[int, int]
    """Range of the sampled maximum of prepared ingredients per dish."""
    complexity: tuple[str, ...]
    """Choices for ``preparation_complexity``."""
    max_steps: tuple[int, int]
    """Shared environment-action budget (``shared_environment_max_steps``)."""
    tool_cooldown: tuple[int, ...]
    """Choices for ``tool_cooldown_steps``."""
    view: str
    """Task view given to the agent: ``structured`` or ``coarse``."""

    def __post_init__(self) -> None:
        for name in ("dishes", "ingredients_per_dish", "locations", "distractors", "inventory_capacity",
                     "min_prepared", "max_prepared", "max_steps"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"band {name} must be (min, max) with 0 <= min <= max, got {(low, high)}")
        if self.dishes[0] < 1 or self.max_steps[0] < 1 or self.inventory_capacity[0] < 1:
            raise ValueError("band dishes, max_steps and inventory_capacity must be positive")
        if self.min_prepared[1] > self.max_prepared[0]:
            raise ValueError("band min_prepared may exceed max_prepared")
        if self.max_prepared[1] > self.ingredients_per_dish[0]:
            raise ValueError("band max_prepared may exceed ingredients_per_dish")
        if not (self.include_doors and self.limit_inventory and self.complexity and self.tool_cooldown):
            raise ValueError("band choice fields must not be empty")
        if any(c < 0 for c in self.tool_cooldown):
            raise ValueError("band tool_cooldown choices must be >= 0")
        if self.view not in ("structured", "coarse"):
            raise ValueError(f"band view must be 'structured' or 'coarse', got {self.view!r}")

    def parameter_band(self) -> dict:
        """``generation.v7_parameter_band`` (official layout)."""
        def span(r: tuple[int, int]) -> dict:
            return {"max": r[1], "min": r[0]}

        return {
            "dish_count": span(self.dishes),
            "include_doors": {"choices": list(self.include_doors)},
            "ingredients_per_dish": span(self.ingredients_per_dish),
            "inventory_capacity": span(self.inventory_capacity),
            "limit_inventory_size": {"choices": list(self.limit_inventory)},
            "max_prepared_ingredients_per_dish": span(self.max_prepared),
            "min_prepared_ingredients_per_dish": span(self.min_prepared),
            "num_distractor_items": span(self.distractors),
            "num_locations": span(self.locations),
            "preparation_complexity": {"choices": list(self.complexity)},
        }

    def runtime_band(self) -> dict:
        """``generation.v7_runtime_band`` (official layout)."""
        return {
            "shared_environment_max_steps": {"max": self.max_steps[1], "min": self.max_steps[0]},
            "tool_cooldown_steps": {"choices": list(self.tool_cooldown)},
        }


BANDS: dict[str, Band] = {
    "easy": Band(dishes=(2, 2), ingredients_per_dish=(3, 3), locations=(5, 6), distractors=(3, 5),
                 include_doors=(False,), limit_inventory=(False,), inventory_capacity=(2, 2),
                 min_prepared=(1, 1), max_prepared=(1, 2), complexity=("low", "medium"),
                 max_steps=(115, 125), tool_cooldown=(0,), view="structured"),
    "medium": Band(dishes=(2, 4), ingredients_per_dish=(3, 4), locations=(7, 10), distractors=(6, 12),
                   include_doors=(True,), limit_inventory=(True,), inventory_capacity=(1, 2),
                   min_prepared=(2, 3), max_prepared=(3, 3), complexity=("medium", "high"),
                   max_steps=(95, 100), tool_cooldown=(0, 1), view="structured"),
    "hard": Band(dishes=(4, 5), ingredients_per_dish=(4, 4), locations=(10, 11), distractors=(12, 18),
                 include_doors=(True,), limit_inventory=(True,), inventory_capacity=(1, 1),
                 min_prepared=(3, 3), max_prepared=(3, 3), complexity=("high",),
                 max_steps=(75, 90), tool_cooldown=(1,), view="structured"),
    "extreme": Band(dishes=(5, 5), ingredients_per_dish=(4, 4), locations=(10, 11), distractors=(16, 20),
                    include_doors=(True,), limit_inventory=(True,), inventory_capacity=(1, 1),
                    min_prepared=(3, 3), max_prepared=(3, 3), complexity=("high",),
                    max_steps=(65, 80), tool_cooldown=(1,), view="coarse"),
}
"""The difficulty bands of the official V9 config (FORMAT.md 2.3 table)."""


def _spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts, the remainder to the first parts."""
    return [total // parts + (i < total % parts) for i in range(parts)]


@dataclass(frozen=True)
class TaskConfig:
    """How the TextWorld-Sync splits are drawn (defaults: the official V9 config)."""

    bands: dict[str, Band] = field(default_factory=lambda: dict(BANDS))
    """Difficulty -> parameter/runtime band."""
    tasks_per_cell: int = 50
    """Test tasks per (family, difficulty) cell (official: 50, 1,400 in all)."""
    test_seed_start: int = 820000
    """Seed of the test task (easy, fork_join, 0)."""
    test_difficulty_stride: int = 1000
    """Test seed step between difficulties."""
    test_family_stride: int = 100
    """Test seed step between families."""
    train_seed_start: int = 850000
    """Seed of the first train task."""
    dev_seed_start: int = 860000
    """Seed of the first dev task."""
    train_dev_difficulty_stride: int = 100000
    """Train/dev seed step between difficulties (indexed in the full difficulty order)."""
    train_dev_family_stride: int = 200
    """Train/dev seed step between families."""
    train_counts: dict[str, int] = field(default_factory=lambda: {"medium": 900, "hard": 150, "extreme": 450})
    """Train tasks per difficulty, spread over the families (official: 1,500)."""
    dev_counts: dict[str, int] = field(default_factory=lambda: {d: 50 for d in DIFFICULTIES})
    """Dev tasks per difficulty, spread over the families (official: 200)."""

    def __post_init__(self) -> None:
        if set(self.bands) != set(DIFFICULTIES):
            raise ValueError(f"bands must cover exactly {list(DIFFICULTIES)}")
        for name, counts in (("train_counts", self.train_counts), ("dev_counts", self.dev_counts)):
            unknown = set(counts) - set(DIFFICULTIES)
            if unknown:
                raise ValueError(f"{name}: unknown difficulties {sorted(unknown)}")
            if any(not isinstance(n, int) or n < 0 for n in counts.values()):
                raise ValueError(f"{name}: counts must be non-negative integers")
        if self.tasks_per_cell < 0:
            raise ValueError("tasks_per_cell must be >= 0")
        if min(self.test_difficulty_stride, self.test_family_stride,
               self.train_dev_difficulty_stride, self.train_dev_family_stride) < 1:
            raise ValueError("seed strides must be positive")
        if self.tasks_per_cell > self.test_family_stride or \
                len(FAMILIES) * self.test_family_stride > self.test_difficulty_stride:
            raise ValueError("test cells overlap: need tasks_per_cell <= family stride and "
                             "7 * family stride <= difficulty stride")
        largest = max([n for c in (self.train_counts, self.dev_counts) for n in _spread_cells(c).values()] or [0])
        if largest > self.train_dev_family_stride or \
                len(FAMILIES) * self.train_dev_family_stride > self.train_dev_difficulty_stride:
            raise ValueError("train/dev cells overlap: need cell size <= family stride and "
                             "7 * family stride <= difficulty stride")
        seen: set[int] = set()
        for split in SPLITS:
            seeds = {seed_for(split, f, d, i, self) for (d, f), n in cell_counts(split, self).items() for i in range(n)}
            if seeds & seen:
                raise ValueError(f"seeds of split {split!r} collide with another split's")
            seen |= seeds


def _spread_cells(counts: dict[str, int]) -> dict[tuple[str, str], int]:
    """Per-difficulty counts spread over the families, in file order."""
    return {(d, f): n for d in DIFFICULTIES if d in counts
            for f, n in zip(FAMILIES, _spread(counts[d], len(FAMILIES)), strict=True)}


def cell_counts(split: str, cfg: TaskConfig) -> dict[tuple[str, str], int]:
    """``{(difficulty, family): tasks}`` of a split, in file order."""
    if split == "test":
        return {(d, f): cfg.tasks_per_cell for d in DIFFICULTIES for f in FAMILIES}
    if split == "train":
        return _spread_cells(cfg.train_counts)
    if split == "dev":
        return _spread_cells(cfg.dev_counts)
    raise ValueError(f"unknown split {split!r}; known: {list(SPLITS)}")


def seed_for(split: str, family: str, difficulty: str, index: int, cfg: TaskConfig) -> int:
    """Seed of task ``index`` of a (family, difficulty) cell (see the module docstring)."""
    d, f = DIFFICULTIES.index(difficulty), list(FAMILIES).index(family)
    if split == "test":
        return cfg.test_seed_start + cfg.test_difficulty_stride * d + cfg.test_family_stride * f + index
    if split in ("train", "dev"):
        start = cfg.train_seed_start if split == "train" else cfg.dev_seed_start
        return start + cfg.train_dev_difficulty_stride * d + cfg.train_dev_family_stride * f + index
    raise ValueError(f"unknown split {split!r}; known: {list(SPLITS)}")


def task_id(split: str, family: str, difficulty: str, index: int) -> str:
    """``cookingworld_multidish_<split>_<family>_<difficulty>_<NNNN>``."""
    return f"cookingworld_multidish_{split}_{family}_{difficulty}_{index:04d}"


# --------------------------------------------------------------------------- slots

SLOT_KINDS: dict[str, Callable[[tuple[str, str]], bool]] = {
    "raw": lambda p: p == ("raw", "uncut"),
    "one_step": lambda p: branch_work(p) == 2,
    "full": lambda p: branch_work(p) == 3,
    "prepared": lambda p: branch_work(p) >= 2,
    "fried": lambda p: p[0] == "fried",
    "cut": lambda p: p[1] != "uncut",
    "fried_cut": lambda p: p[0] == "fried" and p[1] != "uncut",
}
"""What a slot's preparation must satisfy; every kind but ``raw`` needs preparation."""

Profile = list[list[str]]
"""Slot kinds per dish."""


def _dish_slots(n: int, full: int, one_step: int) -> list[str]:
    return ["full"] * full + ["one_step"] * one_step + ["raw"] * (n - full - one_step)


def _profiles(family: str, k: int, n: int, lo: int, hi: int, rng: Random) -> list[Profile]:
    """Candidate slot profiles of a family, in order of preference.

    ``lo``/``hi`` are the sampled min/max prepared ingredients per dish. Later
    candidates prepare more ingredients (up to ``hi``) for folds with too few foods
    that may stay raw (the valid fold has six).
    """
    candidates: list[Profile] = []
    if family == "multi_dish_fork_join":
        for p in range(lo, hi + 1):
            fulls = list(range(p + 1))
            rng.shuffle(fulls)
            candidates += [[_dish_slots(n, f, p - f) for _ in range(k)] for f in fulls]
            # fallback: works one apart (half of the dishes with one more cook-and-cut ingredient)
            for f in fulls:
                if f < p:
                    heavier = set(rng.sample(range(k), (k + 1) // 2))
                    candidates.append([_dish_slots(n, f + (i in heavier), p - f - (i in heavier)) for i in range(k)])
    elif family == "critical_path":
        long = rng.randrange(k)
        for p in range(lo, hi + 1):
            candidates.append([_dish_slots(n, hi, 0) if i == long else _dish_slots(n, 0, p) for i in range(k)])
    elif family == "load_balanced":
        gaps = max(k - 1, 1)
        order = list(range(k))
        rng.shuffle(order)
        for p in range(lo, hi + 1):
            # extra work e = prepared + cook-and-cut, evenly spaced from p (light) to 2*hi (heavy)
            extras = [p + (2 * order[i] * (2 * hi - p) + gaps) // (2 * gaps) for i in range(k)]
            most_full = [max(p, (e + 1) // 2) for e in extras]
            most_prepared = [min(hi, e) for e in extras]
            for prepared in (most_full, most_prepared):
                candidates.append([_dish_slots(n, e - q, 2 * q - e) for e, q in zip(extras, prepared, strict=True)])
    elif family == "conflict":
        for p in range(lo, hi + 1):
            need = ["fried", "cut"] + ["prepared"] * (p - 2) if p >= 2 else ["fried_cut"]
            candidates.append([need + ["raw"] * (n - len(need)) for _ in range(k)])
    else:
        for p in range(hi if family == "hierarchical" else lo, hi + 1):
            candidates.append([["prepared"] * p + ["raw"] * (n - p) for _ in range(k)])
    return candidates


@cache
def _options(fold: str) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``{(food, slot kind): sorted preparations of the fold that fit}`` for the task foods."""
    foods = load_foods()
    return {
        (name, kind): [p for p in sorted(foods[name].preparations[fold]) if test(p)]
        for name in task_foods() for kind, test in SLOT_KINDS.items()
    }


def _fill(profile: Profile, fold: str, rng: Random) -> list[list[tuple[str, tuple[str, str]]]] | None:
    """Match foods to the profile's slots (disjoint) and draw their preparations; None if impossible."""
    options = _options(fold)
    slots = [(d, kind) for d, kinds in enumerate(profile) for kind in kinds]
    candidates = []
    for _, kind in slots:
        names = [name for name in task_foods() if options[(name, kind)]]
        rng.shuffle(names)
        candidates.append(names)
    owner: dict[str, int] = {}

    def assign(s: int, seen: set[str]) -> bool:
        for name in candidates[s]:
            if name not in seen:
                seen.add(name)
                if name not in owner or assign(owner[name], seen):
                    owner[name] = s
                    return True
        return False

    if not all(assign(s, set()) for s in range(len(slots))):
        return None
    food_of = {s: name for name, s in owner.items()}
    dishes: list[list[tuple[str, tuple[str, str]]]] = [[] for _ in profile]
    for s, (d, kind) in enumerate(slots):
        name = food_of[s]
        dishes[d].append((name, rng.choice(options[(name, kind)])))
    for recipe in dishes:
        rng.shuffle(recipe)
    return dishes


# --------------------------------------------------------------------------- records

def _parallelism(family: str, dishes: list[dict], params: dict, runtime: dict, include_doors: int) -> dict:
    k = len(dishes)
    works = [d["estimated_branch_work"] for d in dishes]
    total = sum(works)
    cpe = max(works) + 2 * k
    dependencies: list[dict] = []
    if family == "dependency_gate":
        dependencies = [{"from": "gate_1", "to": d["dish_id"], "type": "door"} for d in dishes[1:]]
    elif family == "hierarchical":
        for d in dishes:
            dependencies.append({"from": "root", "to": d["dish_id"], "type": "decompose"})
            dependencies += [{"from": d["dish_id"], "to": f"{d['dish_id']}::{name}", "type": "decompose"}
                             for name in d["ingredient_names"]]
    capacity = None
    if family == "resource_constrained":
        capacity = {"inventory": params["inventory_capacity"]}
    elif family == "conflict":
        capacity = {"knife": 1, "stove": 1}
    return {
        "branches": k,
        "critical_path_estimate": cpe,
        "dependencies": dependencies,
        "estimated_sequential_actions": total + 2 * k + include_doors,
        "hierarchy_depth": 2 if family == "hierarchical" else 1,
        "ideal_parallel_speedup": round(total / cpe, 4),
        "ingredient_disjoint": True,
        "mechanisms": {"tool_cooldown_steps": runtime["tool_cooldown_steps"]},
        "pattern": FAMILIES[family],
        "resource_capacity": capacity,
        "resource_conflict": family == "conflict",
        "shared_bottlenecks": list(FAMILY_BOTTLENECKS.get(family, DEFAULT_BOTTLENECKS)),
        "shared_environment_max_steps": runtime["shared_environment_max_steps"],
        "total_branch_work": total,
    }


def _dish(index: int, recipe: list[tuple[str, tuple[str, str]]]) -> dict:
    foods = load_foods()
    entries = [{
        "branch_work": branch_work(prep),
        "candidate_source_locations": list(foods[name].locations),
        "name": name,
        "preparation": list(prep),
        "requires_preparation": prep != ("raw", "uncut"),
    } for name, prep in recipe]
    return {
        "dish_id": f"dish_{index + 1}",
        "estimated_branch_work": sum(e["branch_work"] for e in entries),
        "ingredient_names": [e["name"] for e in entries],
        "recipe": entries,
    }


def make_task(split: str, family: str, difficulty: str, index: int, seed: int, cfg: TaskConfig | None = None) -> dict:
    """One task record (cell ``index`` of family x difficulty); every draw comes from ``seed``.

    ``cfg`` supplies the difficulty bands (default :class:`TaskConfig`).
    """
    cfg = cfg or TaskConfig()
    if split not in SPLITS or family not in FAMILIES or difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown split/family/difficulty {split!r}/{family!r}/{difficulty!r}")
    band = cfg.bands[difficulty]
    rng = rng_for("textworld.task", seed)
    params = {
        "dish_count": rng.randint(*band.dishes),
        "include_doors": rng.choice(band.include_doors),
        "ingredients_per_dish": rng.randint(*band.ingredients_per_dish),
        "inventory_capacity": rng.randint(*band.inventory_capacity),
        "limit_inventory_size": rng.choice(band.limit_inventory),
        "max_prepared_ingredients_per_dish": rng.randint(*band.max_prepared),
        "min_prepared_ingredients_per_dish": rng.randint(*band.min_prepared),
        "num_distractor_items": rng.randint(*band.distractors),
        "num_locations": rng.randint(*band.locations),
        "preparation_complexity": rng.choice(band.complexity),
    }
    if family in TOP_PREPARED_FAMILIES:
        params["max_prepared_ingredients_per_dish"] = band.max_prepared[1]
    cooldowns = sorted(band.tool_cooldown)
    if family == "conflict" and any(cooldowns):
        cooldowns = [c for c in cooldowns if c > 0]
    runtime = {"shared_environment_max_steps": rng.randint(*band.max_steps), "tool_cooldown_steps": rng.choice(cooldowns)}

    k, n = params["dish_count"], params["ingredients_per_dish"]
    lo, hi = params["min_prepared_ingredients_per_dish"], params["max_prepared_ingredients_per_dish"]
    fold = FOLDS[split]
    for profile in _profiles(family, k, n, lo, hi, rng):
        recipes = _fill(profile, fold, rng)
        if recipes is not None:
            break
    else:
        raise RuntimeError(f"cannot fill a {family} {difficulty} task from the {fold} fold (seed {seed})")
    dishes = [_dish(i, r) for i, r in enumerate(recipes)]

    include_doors = int(params["include_doors"] or family == "dependency_gate")
    game_params = {
        "includeDoors": include_doors,
        "limitInventorySize": int(params["limit_inventory_size"] or family == "resource_constrained"),
        "numDishes": k,
        "numDistractorItems": params["num_distractor_items"],
        "numIngredientsPerDish": n,
        "numIngredientsTotal": k * n,
        "numLocations": params["num_locations"],
    }
    record = {
        "base_game": "cookingworld",
        "difficulty": difficulty,
        "dishes": dishes,
        "game": "cookingworld_multidish",
        "game_params": game_params,
        "generation": {
            "require_disjoint_ingredients": True,
            "requires_composite_environment": True,
            "requires_composite_scorer": True,
            "source_db_fold": SOURCE_DB_FOLDS[split],
            "source_db_seed": seed,
            "task_family": family,
            "v7_parameter_band": band.parameter_band(),
            "v7_runtime_band": band.runtime_band(),
            "v7_sampled_parameters": params,
            "v7_sampled_runtime": runtime,
            "v7_seed": seed,
        },
        "parallelism": _parallelism(family, dishes, params, runtime, include_doors),
        "schema_version": 1,
        "seed": seed,
        "source_fold": split,
        "split": split,
        "task_family": family,
        "task_id": task_id(split, family, difficulty, index),
        "task_view": band.view,
    }
    record["task_descriptions"] = {"coarse": render_coarse(record), "structured": render_structured(record)}
    record["task_description"] = record["task_descriptions"][band.view]
    return record


def generate_split(split: str, cfg: TaskConfig | None = None, *, progress: bool = False) -> list[dict]:
    """All records of ``split`` (``test``, ``train`` or ``dev``) in file order.

    Order: difficulty (easy..extreme), then family (official order), then index.
    ``progress`` shows a progress bar on stderr.
    """
    cfg = cfg or TaskConfig()
    cells = [(d, f, i) for (d, f), n in cell_counts(split, cfg).items() for i in range(n)]
    return [
        make_task(split, f, d, i, seed_for(split, f, d, i, cfg), cfg)
        for d, f, i in tqdm(cells, desc=f"textworld tasks ({split})", unit="task", disable=not progress,
                            file=sys.stderr, mininterval=1.0)
    ]


def train_fold_tasks(difficulty: str, n: int, cfg: TaskConfig | None = None) -> list[dict]:
    """``n`` tasks of ``difficulty`` drawn as the train split's cells are: train-fold foods, the
    train seed ``seed_for("train", family, difficulty, i)``, spread over the families in order
    (``_spread``), family by family.

    For a difficulty the train split holds, these are the first records of its cells. For easy,
    which it does not hold (official: medium 900, hard 150, extreme 450), they are new 2-dish
    tasks whose seeds (``train_seed_start + 200 f + i``) no split uses: the warm start's easy
    TextWorld demonstrations (:class:`~sera_core.tiny.demos.DemoConfig` ``textworld_easy``),
    never evaluated on (the test fold's foods are apart)."""
    cfg = cfg or TaskConfig()
    if difficulty not in DIFFICULTIES or n < 0:
        raise ValueError(f"difficulty must be one of {list(DIFFICULTIES)} and n >= 0, not {difficulty!r}, {n}")
    counts = _spread(n, len(FAMILIES))
    if max(counts) > cfg.train_dev_family_stride:
        raise ValueError(f"at most {cfg.train_dev_family_stride} tasks per family: their seeds would reach the next family's")
    return [make_task("train", f, difficulty, i, seed_for("train", f, difficulty, i, cfg), cfg)
            for f, k in zip(FAMILIES, counts, strict=True) for i in range(k)]


def split_stats(records: list[dict]) -> dict:
    """``{"tasks": n, "by_difficulty": {...}, "by_family": {...}}`` in the official orders."""
    by_difficulty = Counter(r["difficulty"] for r in records)
    by_family = Counter(r["task_family"] for r in records)
    return {
        "tasks": len(records),
        "by_difficulty": {d: by_difficulty[d] for d in DIFFICULTIES if by_difficulty[d]},
        "by_family": {f: by_family[f] for f in FAMILIES if by_family[f]},
    }


# --------------------------------------------------------------------------- texts

def _family_sentences(record: dict) -> list[str]:
    family = record["task_family"]
    if family != "resource_constrained":
        return list(FAMILY_SENTENCES[family])
    capacity = (record["parallelism"].get("resource_capacity") or {}).get("inventory")
    if capacity is None:
        capacity = record["generation"]["v7_sampled_parameters"]["inventory_capacity"]
    return [s.format(capacity=capacity) for s in FAMILY_SENTENCES[family]]


def render_structured(record: dict) -> str:
    """The ``structured`` view: every dish's ingredients with their (cook, cut) states."""
    lines = [STRUCTURED_HEADER.format(k=len(record["dishes"]))]
    for dish in record["dishes"]:
        lines.append(f"Dish {dish['dish_id']}: prepare the following ingredients:")
        lines += [f"- {e['name']} ({e['preparation'][0]}, {e['preparation'][1]})" for e in dish["recipe"]]
    lines.append(STRUCTURED_FOOTER)
    return "\n".join(lines + _family_sentences(record))


def render_coarse(record: dict) -> str:
    """The ``coarse`` view: ingredient names only (preparations come from the cookbook)."""
    lines = [COARSE_HEADER.format(k=len(record["dishes"]))]
    lines += [f"Dish {d['dish_id']} uses: {', '.join(e['name'] for e in d['recipe'])}." for d in record["dishes"]]
    return "\n".join(lines + _family_sentences(record))


# --------------------------------------------------------------------------- validation

TOP_LEVEL_KEYS: tuple[str, ...] = (
    "base_game", "difficulty", "dishes", "game", "game_params", "generation", "parallelism", "schema_version",
    "seed", "source_fold", "split", "task_description", "task_descriptions", "task_family", "task_id", "task_view",
)
RECIPE_KEYS: tuple[str, ...] = ("branch_work", "candidate_source_locations", "name", "preparation",
                                "requires_preparation")
DISH_KEYS: tuple[str, ...] = ("dish_id", "estimated_branch_work", "ingredient_names", "recipe")
GAME_PARAM_KEYS: tuple[str, ...] = ("includeDoors", "limitInventorySize", "numDishes", "numDistractorItems",
                                    "numIngredientsPerDish", "numIngredientsTotal", "numLocations")
PARALLELISM_KEYS: tuple[str, ...] = (
    "branches", "critical_path_estimate", "dependencies", "estimated_sequential_actions", "hierarchy_depth",
    "ideal_parallel_speedup", "ingredient_disjoint", "mechanisms", "pattern", "resource_capacity",
    "resource_conflict", "shared_bottlenecks", "shared_environment_max_steps", "total_branch_work",
)
_TASK_ID = re.compile(r"cookingworld_multidish_(test|train|dev)_([a-z_]+)_(easy|medium|hard|extreme)_\d{4}")


def _missing(obj: object, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(obj, dict):
        raise UserInputError(f"{where}: expected an object, got {type(obj).__name__}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise UserInputError(f"{where}: missing fields {', '.join(missing)}")


def _in_range(value: object, low: int, high: int, what: str, where: str) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise UserInputError(f"{where}: {what} {value!r} is outside the band {low}-{high}")


def validate_record(record: dict, where: str = "record") -> None:
    """Raise :class:`~sera_core.utils.errors.UserInputError` naming the first problem if
    ``record`` is not a well-formed task (:func:`_check_record`); a field of an unexpected
    type is such a problem too, never a crash of the check itself."""
    try:
        _check_record(record, where)
    except (TypeError, KeyError, AttributeError, IndexError) as exc:
        raise UserInputError(f"{where}: not a well-formed TextWorld-Sync task ({type(exc).__name__}: {exc})") from None


def _check_record(record: dict, where: str) -> None:
    """The checks of :func:`validate_record`.

    Checks fields, family/difficulty/split names, the task id, the seed fields, dishes
    (ids, disjoint ingredients, valid and fold-allowed preparations, branch work),
    ``game_params`` and ``parallelism`` consistency (formulas of FORMAT.md 2.4), the
    default difficulty band of :data:`BANDS` (dishes, ingredients per dish, locations,
    distractors, budget, view) and
    that both texts are exactly the renderings and the description is the chosen view.
    """
    _missing(record, TOP_LEVEL_KEYS, where)
    family, difficulty, split = record["task_family"], record["difficulty"], record["split"]
    if family not in FAMILIES:
        raise UserInputError(f"{where}: unknown task_family {family!r}")
    if difficulty not in DIFFICULTIES:
        raise UserInputError(f"{where}: unknown difficulty {difficulty!r}")
    if split not in SPLITS or record["source_fold"] != split:
        raise UserInputError(f"{where}: split/source_fold must be one of {list(SPLITS)} and agree")
    if record["base_game"] != "cookingworld" or record["game"] != "cookingworld_multidish" \
            or record["schema_version"] != 1:
        raise UserInputError(f"{where}: not a cookingworld_multidish schema-1 record")
    match = _TASK_ID.fullmatch(str(record["task_id"]))
    if not match or match.groups() != (split, family, difficulty):
        raise UserInputError(f"{where}: task_id {record['task_id']!r} does not name split {split}, "
                             f"family {family}, difficulty {difficulty}")
    gen, params, par = record["generation"], record["game_params"], record["parallelism"]
    _missing(gen, ("source_db_fold", "source_db_seed", "task_family", "v7_seed", "v7_sampled_parameters",
                   "v7_sampled_runtime"), f"{where}.generation")
    _missing(params, GAME_PARAM_KEYS, f"{where}.game_params")
    _missing(par, PARALLELISM_KEYS, f"{where}.parallelism")
    if not isinstance(record["seed"], int) or not record["seed"] == gen["v7_seed"] == gen["source_db_seed"]:
        raise UserInputError(f"{where}: seed must be an int equal to generation.v7_seed and source_db_seed")
    if gen["task_family"] != family or par["pattern"] != FAMILIES[family]:
        raise UserInputError(f"{where}: generation.task_family / parallelism.pattern disagree with {family}")
    fold = gen["source_db_fold"]
    if fold not in ("train", "valid", "test"):
        raise UserInputError(f"{where}: unknown generation.source_db_fold {fold!r}")

    dishes = record["dishes"]
    if not isinstance(dishes, list) or not dishes:
        raise UserInputError(f"{where}: dishes must be a non-empty list")
    foods = load_foods()
    seen: set[str] = set()
    for i, dish in enumerate(dishes):
        dw = f"{where}.dishes[{i}]"
        _missing(dish, DISH_KEYS, dw)
        if dish["dish_id"] != f"dish_{i + 1}":
            raise UserInputError(f"{dw}: dish_id {dish['dish_id']!r} should be dish_{i + 1}")
        if not isinstance(dish["recipe"], list) or not dish["recipe"]:
            raise UserInputError(f"{dw}: recipe must be a non-empty list")
        for j, entry in enumerate(dish["recipe"]):
            ew = f"{dw}.recipe[{j}]"
            _missing(entry, RECIPE_KEYS, ew)
            name, prep = entry["name"], entry["preparation"]
            if not (isinstance(prep, list) and len(prep) == 2 and prep[0] in COOKING and prep[1] in CUTTING):
                raise UserInputError(f"{ew}: preparation {prep!r} is not a (cook, cut) pair of {COOKING} x {CUTTING}")
            if name in seen:
                raise UserInputError(f"{ew}: ingredient {name!r} repeats across or within dishes")
            seen.add(name)
            pair = (prep[0], prep[1])
            if name not in task_foods():
                raise UserInputError(f"{ew}: {name!r} is not one of the CookingWorld ingredient foods")
            if pair not in foods[name].preparations[fold]:
                raise UserInputError(f"{ew}: preparation {prep} of {name!r} is not allowed in the {fold} fold")
            if entry["requires_preparation"] != (pair != ("raw", "uncut")) or entry["branch_work"] != branch_work(pair):
                raise UserInputError(f"{ew}: requires_preparation/branch_work disagree with preparation {prep}")
        if dish["ingredient_names"] != [e["name"] for e in dish["recipe"]]:
            raise UserInputError(f"{dw}: ingredient_names differ from the recipe's names")
        if dish["estimated_branch_work"] != sum(e["branch_work"] for e in dish["recipe"]):
            raise UserInputError(f"{dw}: estimated_branch_work is not the sum of the recipe's branch_work")

    k = len(dishes)
    sizes = {len(d["recipe"]) for d in dishes}
    if params["numDishes"] != k or sizes != {params["numIngredientsPerDish"]} \
            or params["numIngredientsTotal"] != k * params["numIngredientsPerDish"]:
        raise UserInputError(f"{where}: game_params numDishes/numIngredients* disagree with the dishes")
    works = [d["estimated_branch_work"] for d in dishes]
    total, cpe = sum(works), max(works) + 2 * k
    expected = {
        "branches": k, "total_branch_work": total, "critical_path_estimate": cpe,
        "estimated_sequential_actions": total + 2 * k + params["includeDoors"],
        "ideal_parallel_speedup": round(total / cpe, 4), "ingredient_disjoint": True,
    }
    wrong = [key for key, value in expected.items() if par[key] != value]
    if wrong:
        raise UserInputError(f"{where}: parallelism {', '.join(wrong)} disagree with the dishes")
    budget = par["shared_environment_max_steps"]
    if not isinstance(budget, int) or budget <= 0:
        raise UserInputError(f"{where}: shared_environment_max_steps must be a positive int, got {budget!r}")
    if gen["v7_sampled_runtime"].get("shared_environment_max_steps") != budget:
        raise UserInputError(f"{where}: parallelism and v7_sampled_runtime budgets differ")

    band = BANDS[difficulty]
    _in_range(k, *band.dishes, "dish count", where)
    _in_range(params["numIngredientsPerDish"], *band.ingredients_per_dish, "ingredients per dish", where)
    _in_range(params["numLocations"], *band.locations, "numLocations", where)
    _in_range(params["numDistractorItems"], *band.distractors, "numDistractorItems", where)
    _in_range(budget, *band.max_steps, "shared_environment_max_steps", where)

    texts, view = record["task_descriptions"], record["task_view"]
    if not isinstance(texts, dict) or set(texts) != {"coarse", "structured"}:
        raise UserInputError(f"{where}: task_descriptions must hold exactly 'coarse' and 'structured'")
    if view != band.view:
        raise UserInputError(f"{where}: task_view {view!r} should be {band.view!r} for {difficulty}")
    if texts["structured"] != render_structured(record) or texts["coarse"] != render_coarse(record):
        raise UserInputError(f"{where}: task_descriptions do not match the dishes and family")
    if record["task_description"] != texts[view]:
        raise UserInputError(f"{where}: task_description is not task_descriptions[{view!r}]")
