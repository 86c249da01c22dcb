"""A small hand-made TextWorld-Sync task record shared by several test modules."""

from __future__ import annotations


def make_record(*, doors=0, gated=(), capacity=None, cooldown=0, budget=60, distractors=2, seed=7):
    """A small hand-made task: dish_1 = carrot (grilled, diced) + salt (raw, uncut);
    dish_2 = red apple (roasted, sliced) + parsley (raw, chopped)."""
    def entry(name, prep, places):
        return {"name": name, "preparation": list(prep), "candidate_source_locations": places}
    return {
        "seed": seed,
        "task_description": "Prepare and eat 2 dishes.",
        "game_params": {"numLocations": 6, "includeDoors": doors, "limitInventorySize": int(capacity is not None),
                        "numDistractorItems": distractors},
        "parallelism": {"dependencies": [{"from": "gate_1", "to": d, "type": "door"} for d in gated],
                        "resource_capacity": {"inventory": capacity} if capacity else None,
                        "mechanisms": {"tool_cooldown_steps": cooldown}, "shared_environment_max_steps": budget},
        "dishes": [
            {"dish_id": "dish_1", "recipe": [entry("carrot", ("grilled", "diced"), ["kitchen.fridge"]),
                                             entry("salt", ("raw", "uncut"), ["pantry.shelf"])]},
            {"dish_id": "dish_2", "recipe": [entry("red apple", ("roasted", "sliced"), ["kitchen.counter"]),
                                             entry("parsley", ("raw", "chopped"), ["garden"])]},
        ],
    }
