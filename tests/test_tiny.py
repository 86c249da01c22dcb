"""The tiny model's recipe: tokenizer, demonstrations, a small build (deterministic,
resumable, atomic), and the shipped model against its manifest."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sera_core.agents.corpus import corpus
from sera_core.agents.tree import ROLES
from sera_core.envs.registry import BENCHMARKS
from sera_core.envs.textcraft.world import WorldConfig, generate_world
from sera_core.policy.chat import ChatFormat
from sera_core.policy.tiny import train_tokenizer
from sera_core.tiny.demos import (
    DemoConfig,
    copy_drills,
    demonstrations,
    play,
    rollout_samples,
)
from sera_core.tiny.recipe import ASSETS, SMALL, TinyRecipe, build, read_manifest, weights_sha256


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus(), 1500)


def test_tokenizer_round_trips_any_text(tokenizer):
    rng = random.Random(0)
    alphabet = "ab_19 \n\t{}'\"é☃\u2063<|>" + "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(200))
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        assert tokenizer.decode(tokenizer.encode(text), clean_up_tokenization_spaces=False) == text


def test_identifiers_are_never_split_across_neighbours(tokenizer):
    pre = tokenizer.backend_tokenizer.pre_tokenizer
    pieces = [p for p, _ in pre.pre_tokenize_str("craft({'m3_i5_13': 2}, ('a1_i5', 4)) get_info x1_i10_7b")]
    assert "m3_i5_13" in "".join(pieces).replace("Ġ", " ").split("'")
    assert {"Ġget_info", "Ġx1_i10_7b"} <= set(pieces)
    # a token never holds part of an identifier and part of what follows it
    ids = tokenizer.encode("a1_i5_13: 3")
    text = [tokenizer.decode([i]) for i in ids]
    assert any(t.endswith("13") for t in text) and not any("13:" in t for t in text)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert ChatFormat(tokenizer).glue("obs", [tokenizer.eos_token_id]) == tokenizer.encode(
        "\n<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n")


def test_demonstrations_come_from_fresh_worlds_and_cover_every_role(tokenizer):
    cfg = DemoConfig(textcraft_worlds=2, textcraft_mix={"easy": 1, "medium": 1}, textworld_tasks=3, noisy_every=2)
    worlds = {t["misc"]["world"]["seed"] for t in BENCHMARKS["textcraft"].demo_tasks(cfg)}
    assert worlds == {1000, 1001}  # never the val world (seed 0)
    samples, stats = demonstrations(tokenizer, cfg)
    assert stats["textcraft"]["tasks"] == 4 and stats["textworld"]["tasks"] == 3
    assert all(stats[e]["turns"]["rubric"] > 0 and stats[e]["turns"]["score"] > 0 for e in ("textcraft", "textworld"))
    assert stats["copy_drills"] == {"samples": 0, "completion_tokens": 0}
    rollouts = play("textcraft", BENCHMARKS["textcraft"].demo_tasks(cfg), tokenizer, cfg)
    packed = 0
    for r in rollouts:  # packed samples learn exactly every turn's completion in its exact context
        turns = [t for n in r.tree.nodes.values() for t in n.turns]
        detached = [b.score_turn for p in r.points for b in p.branches[1:] if b.score_turn is not None]
        got = list(rollout_samples(r))
        learnt = [(s.prompt_ids[:a], s.prompt_ids[a:b]) for s in got for a, b in s.learn]
        learnt += [(s.prompt_ids, s.completion_ids) for s in got]
        expected = [(tuple(t.prompt_ids), tuple(t.completion_ids)) for t in turns]
        expected += [(tuple(t.prompt_ids), tuple(t.completion_ids)) for t in detached]
        assert sorted(learnt) == sorted(expected)
        assert len(got) < len(expected)  # an agent's act turns share one sequence
        packed += sum(len(s.learn) for s in got)
        for t in turns:
            assert sum(sum(t.mask(role)) for role in ROLES) == len(t.completion_ids)
    assert packed > 0
    noisy = [r for r in rollouts if r.points]
    assert noisy and any(b.score and not b.score.gate for r in noisy for p in r.points for b in p.branches)


def test_copy_drills_repeat_names_of_the_training_worlds(tokenizer):
    cfg = DemoConfig(textcraft_worlds=2, copy_drills=20)
    drills = copy_drills(tokenizer, cfg)
    assert len(drills) == 20 and drills == copy_drills(tokenizer, cfg)  # seeded
    world = set(generate_world(WorldConfig(seed=1000)).depths) | set(generate_world(WorldConfig(seed=1001)).depths)
    for d in drills:
        prompt, reply = tokenizer.decode(list(d.prompt_ids)), tokenizer.decode(list(d.completion_ids))
        assert reply.endswith(tokenizer.eos_token) and reply[: -len(tokenizer.eos_token)] in prompt
        assert {item.split("x ", 1)[1] for item in reply[: -len(tokenizer.eos_token)].split(", ")} <= world
    assert copy_drills(tokenizer, DemoConfig(copy_drills=0)) == []


def test_small_build_is_deterministic_resumable_and_atomic(tmp_path):
    first = build(SMALL, tmp_path / "a", progress=False)
    assert (tmp_path / "a" / "model.safetensors").is_file() and not (tmp_path / "a.work").exists()
    assert first["training"]["final_loss"] < first["training"]["first_loss"]
    assert first["recipe_hash"] == SMALL.config_hash() and first["weights_sha256"] == weights_sha256(tmp_path / "a")
    assert build(SMALL, tmp_path / "b", progress=False)["weights_sha256"] == first["weights_sha256"]
    assert first["warmup"]["steps"] == SMALL.warmup.steps and first["warmup"]["final_loss"] < first["warmup"]["first_loss"]
    assert build(SMALL, tmp_path / "c", progress=False, stop_after=SMALL.warmup.steps + 4) is None
    assert not (tmp_path / "c").exists() and (tmp_path / "c.work").exists()  # no half-written model
    resumed = build(SMALL, tmp_path / "c", progress=False)
    assert resumed["training"]["resumed_from"] == 4 and resumed["weights_sha256"] == first["weights_sha256"]
    assert build(SMALL, tmp_path / "d", progress=False, stop_after=2) is None  # interrupted inside the warm-up
    resumed = build(SMALL, tmp_path / "d", progress=False)
    assert resumed["warmup"]["resumed_from"] == 2 and resumed["weights_sha256"] == first["weights_sha256"]
    card = (tmp_path / "a" / "MODEL_CARD.md").read_text()
    assert "not* Qwen3-4B" in card and first["recipe_hash"] in card


def test_perturbed_demonstrations_show_mistakes_then_recovery_and_never_learn_the_mistakes(tokenizer):
    """``DemoConfig.perturb``: some expert act turns become harmless mistakes (a failing cell,
    an invalid action); the expert goes on from the same state, so every task is still
    solved; the samples keep the mistakes as context only: every other turn's completion
    is learnt in its exact context, no mistake is, and a conversation ending on one is cut."""
    cfg = DemoConfig(textcraft_worlds=3, textcraft_mix={"easy": 1, "medium": 1}, textworld_tasks=4, perturb=0.15)
    for env, bench in BENCHMARKS.items():
        tasks = bench.demo_tasks(cfg)
        rollouts = play(env, tasks, tokenizer, cfg)
        turns = [t for r in rollouts for n in r.tree.nodes.values() for t in n.turns]
        mistakes = [t for t in turns if t.meta.get("perturbation")]
        assert mistakes and all(t.kind == "act" for t in mistakes)
        refused = ("Error", "Invalid action", "No shared steps remain")  # the world refuses it: nothing changes
        assert all(t.observation.startswith(refused) for t in mistakes)
        unperturbed = play(env, tasks, tokenizer, DemoConfig(**{**cfg.__dict__, "perturb": 0.0}))
        # the expert recovers: every task it solves without mistakes, it solves with them
        assert [r.tree.root_reward for r in rollouts] == [r.tree.root_reward for r in unperturbed]
        got = [s for r in rollouts for s in rollout_samples(r)]
        learnt = sorted([(s.prompt_ids[:a], s.prompt_ids[a:b]) for s in got for a, b in s.learn]
                        + [(s.prompt_ids, s.completion_ids) for s in got])
        detached = [(tuple(b.score_turn.prompt_ids), tuple(b.score_turn.completion_ids))
                    for r in rollouts for p in r.points for b in p.branches[1:] if b.score_turn is not None]
        expected = sorted([(tuple(t.prompt_ids), tuple(t.completion_ids)) for t in turns
                           if not t.meta.get("perturbation") and t.completion_ids] + detached)
        assert learnt == expected
        # a mistake sits in the context of the turn after it
        assert any(tuple(m.completion_ids) == s.prompt_ids[i:i + len(m.completion_ids)]
                   for m in mistakes[:3] for s in got for i in range(len(s.prompt_ids) - len(m.completion_ids) + 1))


def test_explained_demonstrations_write_each_decision_after_its_facts_and_oversample_the_rare_ones(tokenizer):
    """``DemoConfig.explain``: the same moves (every code cell, rubric and score value) as
    without it, only longer thoughts: a delegating agent lists its direct ingredients' depths
    and compares them with the threshold before it launches, crafts show their products, and
    the scorer's ``reason`` (first) checks the gate on the counts before ``success``.
    ``oversample``: exactly the samples that delegate or score a failed child come n times."""
    from sera_core.rubrics import parse_rubric, parse_score

    cfg = DemoConfig(textcraft_worlds=3, textcraft_mix={"easy": 1, "medium": 1}, textworld_tasks=0, noisy_every=2)
    tasks = BENCHMARKS["textcraft"].demo_tasks(cfg)
    plain = play("textcraft", tasks, tokenizer, cfg)
    told = play("textcraft", tasks, tokenizer, DemoConfig(**{**cfg.__dict__, "explain": True}))
    assert [r.tree.root_reward for r in told] == [r.tree.root_reward for r in plain]
    acts = {True: [], False: []}
    for flag, rollouts in ((False, plain), (True, told)):
        for r in rollouts:
            for n in r.tree.nodes.values():
                acts[flag] += [t.text.split("</thought>")[1] if t.kind == "act" else t.text for t in n.turns
                               if t.kind != "score"]
    assert acts[True] == acts[False]  # the same cells and rubrics, in the same order
    launches = [t.text for r in told for n in r.tree.nodes.values() for t in n.turns if "launch" in t.roles]
    assert launches and all("Direct ingredients: " in t and ">= 2, so I delegate" in t for t in launches)
    thoughts = [t.text for r in told for n in r.tree.nodes.values() for t in n.turns if t.kind == "act"]
    assert any("< 2, so I make everything myself" in t for t in thoughts)  # easy roots decide too
    assert any(" per craft = " in t and "ingredients " in t for t in thoughts)
    scored = [(b.score_turn, b.label, p) for r in told for p in r.points for b in p.branches
              if b.score_turn is not None]
    assert {label for _, label, _ in scored} == {True, False}
    for turn, label, point in scored:
        data = json.loads(turn.text)
        assert list(data)[:2] == ["reason", "success"] and data["success"] is label
        assert ("(short)" in data["reason"]) is (not label) and "at the start" in data["reason"]
        assert parse_score(turn.text, parse_rubric(json.dumps(point.rubric)).value).value is not None
    world = DemoConfig(textcraft_worlds=0, textworld_tasks=2, noisy_every=1, explain=True)
    world_tasks = BENCHMARKS["textworld"].demo_tasks(world)
    world_scores = [json.loads(t.text) for r in play("textworld", world_tasks, tokenizer, world)
                    for n in r.tree.nodes.values() for t in n.turns if t.kind == "score"]
    assert world_scores and all(list(d)[0] == "reason" and d["reason"].startswith("the goal's state: ") for d in world_scores)
    # oversampling: the same samples, the rare ones three times
    for r in told:
        once, thrice = list(rollout_samples(r)), list(rollout_samples(r, 3))
        rare = [s for s in once if thrice.count(s) == 3 * once.count(s) and once.count(s)]
        assert len(thrice) == len(once) + 2 * len(rare) and set(thrice) == set(once)
        fails = sum(1 for n in r.tree.nodes.values() for t in n.turns
                    if t.kind == "score" and r.tree.nodes[t.meta["child"]].label is False)
        fails += sum(1 for p in r.points for b in p.branches[1:] if b.score_turn is not None and b.label is False)
        delegating = sum(1 for n in r.tree.nodes.values() if any("launch" in t.roles for t in n.turns))
        assert len(rare) == fails + delegating


def test_recipe_hash_tracks_every_setting():
    assert TinyRecipe().config_hash() == TinyRecipe().config_hash() != SMALL.config_hash()
    assert TinyRecipe(seed=1).config_hash() != TinyRecipe().config_hash()
    from sera_core.tiny.warmstart import WarmStartRecipe

    base = WarmStartRecipe()
    assert "perturb" not in base.to_json()["demos"]  # added later: left out at its default, old names hold
    perturbed = WarmStartRecipe(demos=DemoConfig(**{**base.to_json()["demos"], "perturb": 0.1}))
    assert perturbed.to_json()["demos"]["perturb"] == 0.1 and perturbed.config_hash() != base.config_hash()
    assert not {"explain", "oversample"} & set(base.to_json()["demos"])
    hashes = {WarmStartRecipe(demos=DemoConfig(**{**base.to_json()["demos"], **extra})).config_hash()
              for extra in ({"explain": True}, {"oversample": 3}, {"explain": True, "oversample": 3})}
    assert len(hashes) == 3 and base.config_hash() not in hashes
    with pytest.raises(ValueError, match="oversample"):
        DemoConfig(oversample=0)


@pytest.mark.skipif(not (ASSETS / "manifest.json").is_file(), reason="no shipped tiny model yet")
def test_shipped_model_matches_its_recipe_and_loads():
    from sera_core.policy.base import SamplingParams
    from sera_core.policy.hf import HFPolicy

    manifest = read_manifest()
    assert manifest["recipe_hash"] == TinyRecipe().config_hash(), "the recipe changed: rebuild and ship (sera tiny build)"
    assert manifest["recipe"] == json.loads(json.dumps(TinyRecipe().to_json()))
    assert manifest["weights_sha256"] == weights_sha256(Path(ASSETS))
    policy = HFPolicy(ASSETS)
    prompt = policy.chat_prompt([{"role": "user", "content": "Craft the following items: 1x a1_i2"}])
    out = policy.generate([prompt], SamplingParams(temperature=0, max_new_tokens=8))[0]
    assert len(out.token_ids) >= 1 and all(lp <= 0 for lp in out.logprobs)


def test_easy_textworld_demonstrations_come_from_train_fold_foods_and_show_one_child_per_dish(tokenizer):
    from sera_core.envs.textworld import tasks as world_tasks
    from sera_core.envs.textworld.data import load_foods

    cfg = world_tasks.TaskConfig()
    easy = world_tasks.train_fold_tasks("easy", 9)
    assert [t["task_family"] for t in easy] == [f for f, k in zip(world_tasks.FAMILIES, (2, 2, 1, 1, 1, 1, 1)) for _ in range(k)]
    assert {t["difficulty"] for t in easy} == {"easy"} and {len(t["dishes"]) for t in easy} == {2}
    foods = load_foods()
    entries = [e for t in easy for d in t["dishes"] for e in d["recipe"]]
    assert entries and all(tuple(e["preparation"]) in foods[e["name"]].preparations["train"] for e in entries)
    # new tasks: no split holds their seeds; for a level the train split holds, its own first records
    used = {world_tasks.seed_for(s, f, d, i, cfg) for s in ("train", "dev", "test")
            for (d, f), n in world_tasks.cell_counts(s, cfg).items() for i in range(n)}
    assert not {t["seed"] for t in easy} & used and len({t["task_id"] for t in easy}) == 9
    split = world_tasks.generate_split("train")
    firsts = [next(r for r in split if r["task_family"] == f and r["difficulty"] == "medium") for f in world_tasks.FAMILIES]
    assert world_tasks.train_fold_tasks("medium", 7) == firsts
    with pytest.raises(ValueError, match="at most 200 tasks per family"):
        world_tasks.train_fold_tasks("easy", 7 * 200 + 1)
    # in the warm start: after the train split's records, one per family first; off by default (the shipped hash holds)
    demo = DemoConfig(textcraft_worlds=0, textworld_tasks=2, textworld_easy=3, noisy_every=99)
    got = BENCHMARKS["textworld"].demo_tasks(demo)
    assert got[2:] == [easy[0], easy[2], easy[4]] and [t["difficulty"] for t in got[:2]] != ["easy", "easy"]
    assert len(BENCHMARKS["textworld"].demo_tasks(DemoConfig(textworld_tasks=2))) == 2
    from sera_core.tiny.warmstart import WarmStartRecipe

    assert "textworld_easy" not in WarmStartRecipe().to_json()["demos"]
    # the expert's root delegates one sub-agent per dish, and the tree is solved
    for rollout in play("textworld", got[2:], tokenizer, demo):
        root = rollout.tree.root
        assert len(root.children) == 2 and rollout.tree.root_reward == 1.0
        assert any("launch" in t.roles for t in root.turns)
