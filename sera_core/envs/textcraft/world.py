"""TextCraft-Synth recipe worlds: a seeded, hash-stable generator and the recipe book.

The official TextCraft-Synth world is program-generated; we generate our own world of
the same *shape* (SPEC 5, FORMAT.md 1):

* five domains: metal ``m``, crystal ``c``, organic ``o``, arcane ``a``, tech ``t``;
  ten prefixes per domain (``m0`` .. ``m9``);
* base items at tier 0, named per domain: ``m3_ore``, ``c1_ore``, ``raw_o2``,
  ``raw_a0``, ``raw_t7``;
* crafted items ``{prefix}_i{tier}`` for tiers 1..12. From tier 6 on the tier is
  repeated (``a1_i6_6``), as in the official data. When a prefix is drawn again at the
  same tier the name gets a collision suffix ``_{10*j + k}`` (``k`` the prefix digit,
  ``j`` = 1, 2): ``m3_i5``, ``m3_i5_13``, ``m3_i5_23``. A prefix is drawn at most three
  times per tier (the official names never carry a third collision), so a cell holds
  ``min(items_per_tier, 30)`` items: 25 per cell give 1,500 crafted + 50 base = 1,550
  items (the issue estimated "about 1,450"; the official count is not published);
* one recipe per crafted item: at least one ingredient from the tier just below (so
  an item's crafting depth equals its tier), the others from the two tiers below; from
  tier 4 up, sometimes one extra ingredient from a lower tier (cross-tier); a few items
  also take a base item of another domain (cross-domain);
* result counts (units per craft) shrink with tier: 2-4 at tier 1, 2-3 at tier 2,
  1-2 at tiers 3-5, 1 from tier 6 on; ingredient amounts are 1 or 2 per craft.

Determinism: every random draw comes from ``random.Random(derive_seed(...))`` over
sorted lists, so the world is identical in every process and under any
``PYTHONHASHSEED``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

from sera_core.utils.errors import UserInputError
from sera_core.utils.seeding import rng_for

DOMAINS: tuple[str, ...] = ("m", "c", "o", "a", "t")
"""Domain letters: metal, crystal, organic, arcane, tech."""


def base_item_name(domain: str, k: int) -> str:
    """Name of base resource ``k`` of ``domain`` (``m3_ore``, ``raw_a0``, ...)."""
    return f"{domain}{k}_ore" if domain in ("m", "c") else f"raw_{domain}{k}"


def item_domain(item: str) -> str:
    """Domain letter of any item name (``raw_o2`` -> ``o``, ``a1_i5`` -> ``a``)."""
    return item[4] if item.startswith("raw_") else item[0]


@dataclass(frozen=True)
class WorldConfig:
    """How a synthetic recipe world is drawn."""

    seed: int = 0
    """Seed of the world; every draw is derived from it."""
    items_per_tier: int = 25
    """Crafted items per domain and tier (at most 3 x prefixes_per_domain)."""
    max_tier: int = 12
    """Highest crafted tier (= deepest crafting depth)."""
    prefixes_per_domain: int = 10
    """Prefix digits per domain (and base resources per domain)."""
    cross_tier_prob: float = 0.05
    """From tier 4 up: chance that a recipe gets one extra ingredient from tiers t-4..t-3."""
    cross_domain_prob: float = 0.01
    """Chance that a recipe (tier >= 2) also takes one base item of another domain."""

    def __post_init__(self) -> None:
        if self.items_per_tier < 1:
            raise UserInputError("items_per_tier must be >= 1")
        if not 2 <= self.max_tier <= 30:
            raise UserInputError("max_tier must be between 2 and 30")
        if not 1 <= self.prefixes_per_domain <= 10:
            raise UserInputError("prefixes_per_domain must be between 1 and 10 (one digit)")
        for name in ("cross_tier_prob", "cross_domain_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserInputError(f"{name} must be in [0, 1]")


@dataclass(frozen=True)
class Recipe:
    """One recipe: per craft, consume ``ingredients`` and produce ``result_count`` units."""

    item: str
    ingredients: tuple[tuple[str, int], ...]
    result_count: int

    def ingredient_dict(self, crafts: int = 1) -> dict[str, int]:
        """Ingredients consumed by ``crafts`` executions of the recipe."""
        return {name: amount * crafts for name, amount in self.ingredients}


@dataclass
class RecipeBook:
    """All recipes of a world, with its base items; immutable after construction.

    ``depth(item)`` is the true crafting depth: 0 for base items, else
    1 + max depth of the ingredients.
    """

    recipes: dict[str, Recipe]
    base_items: tuple[str, ...]
    config: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        base = set(self.base_items)
        for item, recipe in self.recipes.items():
            if item in base:
                raise ValueError(f"{item} is both a base item and has a recipe")
            if recipe.result_count < 1:
                raise ValueError(f"{item}: result_count must be >= 1")
            for name, amount in recipe.ingredients:
                if amount < 1:
                    raise ValueError(f"{item}: ingredient {name} has amount {amount}")
                if name not in base and name not in self.recipes:
                    raise ValueError(f"{item}: ingredient {name} is neither base nor craftable")
        self.depths  # noqa: B018 - computes depths and rejects cycles now

    def is_base(self, item: str) -> bool:
        return item in self._base_set

    def knows(self, item: str) -> bool:
        return item in self._base_set or item in self.recipes

    def depth(self, item: str) -> int:
        return self.depths[item]

    @cached_property
    def _base_set(self) -> frozenset[str]:
        return frozenset(self.base_items)

    @cached_property
    def depths(self) -> dict[str, int]:
        """Crafting depth of every known item (iterative DFS; raises on a cycle)."""
        depth: dict[str, int] = {b: 0 for b in self.base_items}
        for root in sorted(self.recipes):
            if root in depth:
                continue
            stack: list[tuple[str, bool]] = [(root, False)]
            on_path: set[str] = set()
            while stack:
                item, expanded = stack.pop()
                if item in depth:
                    continue
                recipe = self.recipes[item]
                if expanded:
                    on_path.discard(item)
                    depth[item] = 1 + max(depth[n] for n, _ in recipe.ingredients)
                    continue
                if item in on_path:
                    raise ValueError(f"recipe cycle through {item}")
                on_path.add(item)
                stack.append((item, True))
                stack.extend((n, False) for n, _ in recipe.ingredients if n not in depth)
        return depth

    def items_by_depth(self) -> dict[int, list[str]]:
        """Crafted items grouped by depth, each group sorted by name."""
        groups: dict[int, list[str]] = {}
        for item in sorted(self.recipes):
            groups.setdefault(self.depths[item], []).append(item)
        return groups

    # -- JSON -----------------------------------------------------------------
    def to_json(self) -> dict:
        """Plain-data form: ``{"config", "base_items", "recipes": {item: {...}}}``."""
        return {
            "config": self.config,
            "base_items": list(self.base_items),
            "recipes": {
                item: {"ingredients": dict(r.ingredients), "result_count": r.result_count}
                for item, r in self.recipes.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict) -> RecipeBook:
        try:
            recipes = {
                item: Recipe(item, tuple((str(k), int(v)) for k, v in r["ingredients"].items()), int(r["result_count"]))
                for item, r in data["recipes"].items()
            }
            return cls(recipes=recipes, base_items=tuple(data["base_items"]), config=dict(data.get("config", {})))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a TextCraft recipe book: missing or malformed field ({exc})") from None

    def save(self, path: str | os.PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> RecipeBook:
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    # -- official records -----------------------------------------------------
    @classmethod
    def from_gold_trajectory(cls, steps: list[dict], initial_inventory: dict[str, int]) -> RecipeBook:
        """Recipe book implied by an official record's gold plan.

        A gold step ``{"target": [item, n_crafts], "ingredients": totals, "result_count":
        total}`` holds ``n_crafts`` executions, so the per-craft recipe is
        ``ingredients / n_crafts`` and ``result_count / n_crafts``. Items that are never
        crafted are base items (the initial inventory's keys and the plan's leaves).
        """
        recipes: dict[str, Recipe] = {}
        for i, step in enumerate(steps):
            item, crafts = step["target"][0], int(step["target"][1])
            total_out = int(step["result_count"])
            if crafts < 1 or total_out % crafts or any(v % crafts for v in step["ingredients"].values()):
                raise ValueError(f"gold step {i} ({item}): totals are not divisible by its {crafts} crafts")
            recipe = Recipe(item, tuple((k, v // crafts) for k, v in step["ingredients"].items()), total_out // crafts)
            if item in recipes and recipes[item] != recipe:
                raise ValueError(f"gold plan crafts {item} with two different recipes")
            recipes[item] = recipe
        leaves = {n for r in recipes.values() for n, _ in r.ingredients} | set(initial_inventory)
        base = tuple(sorted(leaves - set(recipes)))
        return cls(recipes=recipes, base_items=base, config={"source": "gold_trajectory"})


def _crafted_name(prefix: str, tier: int, collision: int) -> str:
    name = f"{prefix}_i{tier}" + (f"_{tier}" if tier >= 6 else "")
    return name + (f"_{10 * collision + int(prefix[1:])}" if collision else "")


def _draw_names(cfg: WorldConfig, domain: str, tier: int) -> list[str]:
    """Names of the crafted items of one domain and tier, in draw order."""
    rng = rng_for(cfg.seed, "textcraft.names", domain, tier)
    uses: dict[str, int] = {}
    names: list[str] = []
    for _ in range(min(cfg.items_per_tier, 3 * cfg.prefixes_per_domain)):
        free = [k for k in range(cfg.prefixes_per_domain) if uses.get(k, 0) < 3]
        k = rng.choice(free)
        names.append(_crafted_name(f"{domain}{k}", tier, uses.get(k, 0)))
        uses[k] = uses.get(k, 0) + 1
    return names


def _ingredient_types(tier: int, rng) -> int:
    if tier == 1:
        return 1
    if tier == 2:
        return 2
    return rng.randint(2, 3) if tier <= 5 else rng.randint(2, 4)


def _result_count(tier: int, rng) -> int:
    low, high = {1: (2, 4), 2: (2, 3)}.get(tier, (1, 2) if tier <= 5 else (1, 1))
    return rng.randint(low, high)


def generate_world(cfg: WorldConfig | None = None) -> RecipeBook:
    """Draw a recipe world from ``cfg`` (see the module docstring for its shape)."""
    cfg = cfg or WorldConfig()
    pools: dict[tuple[str, int], list[str]] = {}
    for domain in DOMAINS:
        pools[(domain, 0)] = [base_item_name(domain, k) for k in range(cfg.prefixes_per_domain)]
        for tier in range(1, cfg.max_tier + 1):
            pools[(domain, tier)] = _draw_names(cfg, domain, tier)

    recipes: dict[str, Recipe] = {}
    for tier in range(1, cfg.max_tier + 1):
        for domain in DOMAINS:
            below = sorted(pools[(domain, tier - 1)])
            two_below = sorted(set(below) | set(pools[(domain, tier - 2)] if tier >= 2 else []))
            for item in pools[(domain, tier)]:
                rng = rng_for(cfg.seed, "textcraft.recipe", item)
                chosen = [rng.choice(below)]
                rest = [n for n in two_below if n != chosen[0]]
                chosen += rng.sample(rest, min(len(rest), _ingredient_types(tier, rng) - 1))
                if tier >= 4 and rng.random() < cfg.cross_tier_prob:
                    lower = sorted({n for t in range(max(0, tier - 4), tier - 2) for n in pools[(domain, t)]} - set(chosen))
                    chosen.append(rng.choice(lower))
                if tier >= 2 and rng.random() < cfg.cross_domain_prob:
                    other = rng.choice([d for d in DOMAINS if d != domain])
                    chosen.append(rng.choice(pools[(other, 0)]))
                ingredients = tuple((n, 2 if rng.random() < 0.2 else 1) for n in chosen)
                recipes[item] = Recipe(item, ingredients, _result_count(tier, rng))
    base = tuple(b for d in DOMAINS for b in pools[(d, 0)])
    return RecipeBook(recipes=recipes, base_items=base, config={"generator": "textcraft_synth", **asdict(cfg)})
