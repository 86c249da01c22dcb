"""TextCraft-Synth tasks: single-target crafting goals with difficulty by depth.

A task record uses the official field names (FORMAT.md 1)::

    {"goal": "Craft the following items: 3x a1_i5", "id": "textcraft_synth.val.0",
     "max_steps": 75,
     "misc": {"target_items": {...}, "initial_inventory": {...},
              "gold_trajectory": [...], "difficulty": "medium", "max_depth": 5,
              "num_craft_steps": 22, "world": {...}}}

``misc.world`` (our addition) is the :class:`WorldConfig` the task was drawn from, so
the recipe book can be rebuilt; official records lack it and their book is rebuilt from
the gold plan instead. A gold step's ``target[1]`` is the number of recipe executions
(see :mod:`sera_core.envs.textcraft.planner`).

Decisions where the official generator is not public:

* Hold-out: 20% of the crafted items of every (domain, depth) cell are reserved for
  validation targets, the rest for train targets, so train and val targets never
  overlap.
* Split sizes: val 632 = 147 easy / 213 medium / 136 hard / 136 extreme (official);
  train 2,522 with 852 medium (official) and 586 / 542 / 542 easy / hard / extreme
  (our split of the remainder, about 4x val). Difficulties are shuffled in the file.
* Initial inventory: every base item the plans below could consume, times a slack
  of 1.0-1.5, where "could consume" is :func:`split_requirements` with the top
  ``delegation_levels`` levels delegated piecewise (so a delegating solver has enough,
  not just the aggregated gold plan), plus 1-2 unused base items of the same domain and
  1-2 of other domains as distractors (1-5 units each).
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from tqdm import tqdm

from sera_core.envs import DIFFICULTIES as LEVELS
from sera_core.envs.textcraft.planner import plan_crafts, split_requirements
from sera_core.envs.textcraft.world import DOMAINS, RecipeBook, WorldConfig, generate_world, item_domain
from sera_core.utils.errors import UserInputError
from sera_core.utils.seeding import rng_for

DIFFICULTY_DEPTHS: dict[str, tuple[int, int]] = {
    "easy": (2, 3),
    "medium": (4, 6),
    "hard": (7, 9),
    "extreme": (10, 12),
}
"""Inclusive crafting-depth band of each difficulty (SPEC 5)."""

DIFFICULTIES: tuple[str, ...] = tuple(DIFFICULTY_DEPTHS)
assert DIFFICULTIES == LEVELS, "the depth bands name the shared difficulty levels"

DEFAULT_SPLITS: dict[str, dict[str, int]] = {
    "val": {"easy": 147, "medium": 213, "hard": 136, "extreme": 136},
    "train": {"easy": 586, "medium": 852, "hard": 542, "extreme": 542},
}


def difficulty_of_depth(depth: int) -> str:
    """Difficulty label of a crafting depth (depth 1 counts as easy, above 12 as extreme)."""
    for name, (_, high) in DIFFICULTY_DEPTHS.items():
        if depth <= high:
            return name
    return "extreme"


def render_goal(targets: dict[str, int]) -> str:
    """``Craft the following items: 3x a1_i5, 1x m2_i7_7`` (the official wording)."""
    return "Craft the following items: " + ", ".join(f"{n}x {item}" for item, n in targets.items())


@dataclass(frozen=True)
class TaskConfig:
    """How TextCraft-Synth task splits are drawn."""

    world: WorldConfig = field(default_factory=WorldConfig)
    """The recipe world all tasks share."""
    seed: int = 0
    """Seed of the task draws (hold-out, targets, inventories, file order)."""
    holdout_fraction: float = 0.2
    """Share of each (domain, depth) cell's items reserved for validation targets."""
    max_steps: int = 75
    """Step budget stored in every record (the official files use 75)."""
    target_count: tuple[int, int] = (1, 3)
    """Inclusive range of the number of units asked for."""
    inventory_slack: tuple[float, float] = (1.0, 1.5)
    """Range of the factor applied to the base materials a delegating plan needs."""
    delegation_levels: int = 3
    """Levels of piecewise delegation the initial inventory must support (max depth 3)."""
    splits: dict[str, dict[str, int]] = field(default_factory=lambda: {k: dict(v) for k, v in DEFAULT_SPLITS.items()})
    """Tasks per difficulty for each split."""

    def __post_init__(self) -> None:
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError("holdout_fraction must be in (0, 1)")
        low, high = self.target_count
        if not 1 <= low <= high:
            raise ValueError("target_count must be (low, high) with 1 <= low <= high")
        if not 1.0 <= self.inventory_slack[0] <= self.inventory_slack[1]:
            raise ValueError("inventory_slack must be (low, high) with 1 <= low <= high")
        for split, sizes in self.splits.items():
            unknown = set(sizes) - set(DIFFICULTIES)
            if unknown:
                raise ValueError(f"split {split}: unknown difficulties {sorted(unknown)}")
        if self.world.max_tier < max(DIFFICULTY_DEPTHS[d][0] for s in self.splits.values() for d, n in s.items() if n):
            raise ValueError("world.max_tier is too small for the requested difficulties")

    def world_dict(self) -> dict:
        return asdict(self.world)


@lru_cache(maxsize=8)
def world_for(cfg: WorldConfig) -> RecipeBook:
    """The (cached) recipe book of a world config."""
    return generate_world(cfg)


def holdout_items(book: RecipeBook, cfg: TaskConfig) -> dict[str, list[str]]:
    """``{"train": [...], "val": [...]}`` target pools; disjoint, each sorted."""
    pools: dict[str, list[str]] = {"train": [], "val": []}
    for depth, items in book.items_by_depth().items():
        for domain in DOMAINS:
            cell = [i for i in items if item_domain(i) == domain]
            rng = rng_for(cfg.seed, "textcraft.holdout", depth, domain)
            rng.shuffle(cell)
            k = round(len(cell) * cfg.holdout_fraction)
            pools["val"] += cell[:k]
            pools["train"] += cell[k:]
    return {k: sorted(v) for k, v in pools.items()}


def make_task(
    book: RecipeBook, targets: dict[str, int], rng: random.Random, cfg: TaskConfig, task_id: str
) -> dict:
    """Build one task record: initial inventory, gold plan and metadata."""
    need = split_requirements(book, targets, cfg.delegation_levels)
    inventory: dict[str, int] = {}
    for name in sorted(need):
        inventory[name] = max(need[name], round(need[name] * rng.uniform(*cfg.inventory_slack)))
    domains = sorted({item_domain(t) for t in targets})
    same = sorted(b for b in book.base_items if item_domain(b) in domains and b not in inventory)
    other = sorted(b for b in book.base_items if item_domain(b) not in domains and b not in inventory)
    for pool in (same, other):
        for name in rng.sample(pool, min(len(pool), rng.randint(1, 2))):
            inventory[name] = rng.randint(1, 5)
    keys = list(inventory)
    rng.shuffle(keys)
    inventory = {k: inventory[k] for k in keys}
    gold = plan_crafts(book, targets, inventory)
    max_depth = max(book.depth(t) for t in targets)
    return {
        "goal": render_goal(targets),
        "id": task_id,
        "max_steps": cfg.max_steps,
        "misc": {
            "target_items": dict(targets),
            "initial_inventory": inventory,
            "gold_trajectory": gold,
            "difficulty": difficulty_of_depth(max_depth),
            "max_depth": max_depth,
            "num_craft_steps": len(gold),
            "world": cfg.world_dict(),
        },
    }


def generate_split(split: str, cfg: TaskConfig | None = None, *, progress: bool = False) -> list[dict]:
    """All task records of ``split`` (``"train"`` or ``"val"``), in file order.

    Record ``k`` depends only on (seed, split, k) and the world, never on other
    records, so any prefix of a split is reproducible on its own. ``progress`` shows a
    progress bar on stderr.
    """
    cfg = cfg or TaskConfig()
    if split not in cfg.splits:
        raise ValueError(f"unknown split {split!r}; known: {sorted(cfg.splits)}")
    book = world_for(cfg.world)
    pool = holdout_items(book, cfg)["val" if split == "val" else "train"]
    by_depth: dict[int, list[str]] = {}
    for item in pool:
        by_depth.setdefault(book.depth(item), []).append(item)
    labels = [d for d in DIFFICULTIES for _ in range(cfg.splits[split].get(d, 0))]
    rng_for(cfg.seed, "textcraft.order", split).shuffle(labels)
    records = []
    for k, difficulty in enumerate(tqdm(labels, desc=f"tasks ({split})", unit="task", disable=not progress,
                                        file=sys.stderr, mininterval=1.0)):
        rng = rng_for(cfg.seed, "textcraft.task", split, k)
        low, high = DIFFICULTY_DEPTHS[difficulty]
        depths = [d for d in range(low, high + 1) if by_depth.get(d)]
        if not depths:
            raise ValueError(f"no {split} target of depth {low}-{high} in this world")
        target = rng.choice(by_depth[rng.choice(depths)])
        count = rng.randint(*cfg.target_count)
        records.append(make_task(book, {target: count}, rng, cfg, f"textcraft_synth.{split}.{k}"))
    return records


def split_stats(records: list[dict]) -> dict:
    """Counts per difficulty and plan-length range per difficulty."""
    by_diff: dict[str, Counter] = {}
    steps: dict[str, list[int]] = {}
    for r in records:
        d = r["misc"]["difficulty"]
        by_diff.setdefault(d, Counter())["tasks"] += 1
        steps.setdefault(d, []).append(r["misc"]["num_craft_steps"])
    return {
        d: {"tasks": by_diff[d]["tasks"], "craft_steps_min": min(steps[d]), "craft_steps_max": max(steps[d])}
        for d in DIFFICULTIES if d in by_diff
    }


REQUIRED_MISC = ("target_items", "initial_inventory", "gold_trajectory")
MAX_TARGET_COUNT = 1_000_000
"""Largest count a task may ask for (tasks ask 1-3; a huge count is damage, not a task)."""


def validate_record(record: dict, where: str = "record") -> None:
    """Raise :class:`~sera_core.utils.errors.UserInputError` naming the problem if ``record``
    is not a TextCraft task."""
    if not isinstance(record, dict) or not isinstance(record.get("misc"), dict):
        raise UserInputError(f"{where}: not a TextCraft-Synth task (no 'misc' object)")
    missing = [k for k in REQUIRED_MISC if k not in record["misc"]]
    if missing:
        raise UserInputError(f"{where}: misc lacks {', '.join(missing)}")
    targets = record["misc"]["target_items"]
    if not isinstance(targets, dict) or not targets or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_TARGET_COUNT for v in targets.values()):
        raise UserInputError(f"{where}: misc.target_items must map items to positive counts "
                             f"(at most {MAX_TARGET_COUNT:,})")


def book_for_record(record: dict, *, official: bool = False) -> RecipeBook:
    """The recipe book a record is played with.

    Generated records carry ``misc.world`` and get the whole generated world; official
    records (or ``official=True``) get the book implied by their gold plan.
    """
    world = record["misc"].get("world")
    if world and not official:
        return world_for(WorldConfig(**world))
    return RecipeBook.from_gold_trajectory(record["misc"]["gold_trajectory"], record["misc"]["initial_inventory"])
