"""The embedded policy: SmolLM2-135M-Instruct plus a LoRA warm start, built on a CPU.

The policy every laptop path uses (``--policy tiny``, ``model: tiny``) is the embedded
base model (:mod:`sera_core.policy.base_model`: SmolLM2-135M-Instruct, Q4_1 weights
de-quantized to fp32) with a LoRA adapter trained by imitation of the scripted expert.
Only the adapter (``adapter_model.safetensors``, ``adapter_config.json``) and its
``manifest.json`` ship in the package (:data:`sera_core.policy.models.EMBEDDED`); loading means base + adapter,
merged into plain linear layers for inference (:func:`sera_core.policy.models.load_model`).

:class:`WarmStartRecipe` holds every setting; :func:`build_adapter` runs it:

1. the base model and its tokenizer (the caller may name another base folder: tests use
   a small stand-in of the same architecture);
2. expert demonstrations of all three roles (acting, rubric writing, scoring) on both
   benchmarks, in the base tokenizer's ids (:func:`sera_core.tiny.demos.demonstrations`):
   fresh TextCraft worlds (the val world, seed 0, is never trained on), TextWorld's
   train fold, and every ``noisy_every``-th task played by the noisy expert with
   counterfactual groups, so failed children are scored too;
3. a LoRA adapter (peft) on every attention and MLP projection, trained with
   :func:`sera_core.tiny.sft.train_sft` (the completion-only loss computed without
   full-vocabulary logits, gradient checkpointing through the frozen base): peak memory
   stays near 10 GB on 2 CPU cores at batch 2 x 1,536 tokens;
4. the adapter, stored in bfloat16, and the manifest (base sha256, recipe and its hash,
   data counts, training summary; measured results are added by ``sera tiny measure
   --record``) are written to a temporary folder and swapped in whole.

An interrupted build resumes from its last checkpoint (``{out}.work``); the same recipe
gives bit-identical adapter weights on the same machine.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sera_core import __version__
from sera_core.envs.registry import BENCHMARKS
from sera_core.policy.base_model import BASE_NAME, GGUF_SHA256, base_model_folder, load_tokenizer, weights_digest
from sera_core.policy.models import EMBEDDED, checkpoint_activations
from sera_core.tiny.demos import DemoConfig, demonstrations
from sera_core.tiny.recipe import Hashed, _machine
from sera_core.tiny.sft import SFTConfig, Sample, fit, packed_steps, samples_sha256, train_sft
from sera_core.utils.errors import UserInputError
from sera_core.utils.folders import sha256_file, swap_in

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama/Qwen block that get LoRA matrices."""


@dataclass(frozen=True)
class LoraSettings:
    """The adapter's shape (peft ``LoraConfig``)."""

    r: int = 16
    """Rank of each update ``B A`` (``A``: r x in, ``B``: out x r)."""
    alpha: int = 32
    """Scale: the update is ``(alpha / r) B A``."""
    dropout: float = 0.0
    """Dropout on the adapter's input (0 keeps training deterministic)."""
    targets: tuple[str, ...] = PROJECTIONS
    """Module names that get an adapter."""


@dataclass(frozen=True)
class WarmStartRecipe(Hashed):
    """Everything that determines the shipped adapter (its hash names the build)."""

    demos: DemoConfig = field(default_factory=lambda: DemoConfig(textcraft_worlds=60, textworld_tasks=40, noisy_every=3))
    """Demonstrations imitated (fresh TextCraft worlds from seed 1000; TextWorld train fold).
    ``sera tiny build --perturb 0.15`` adds recovery demonstrations (:attr:`DemoConfig.perturb`)."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """The adapter."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(
        steps=220, batch_size=2, lr=1e-3, warmup_steps=10, weight_decay=0.0, max_len=1536, log_every=5,
        checkpoint_every=10))
    """The imitation loop (float32 on CPU: bf16 autocast measured slower there)."""
    seed: int = 0
    """Seed of the adapter's initial weights."""


EPOCH_WARMSTART = WarmStartRecipe(
    demos=DemoConfig(textcraft_worlds=60, textworld_tasks=40, noisy_every=3, explain=True, textworld_easy=28,
                     child_act_keep=3),
    sft=SFTConfig(max_len=8192, tokens_per_step=8192, epochs=1, lr=1e-3, warmup_steps=25, weight_decay=0.0,
                  mixed_precision="auto", log_every=5, checkpoint_every=10),
)
"""The one-epoch recipe (``sera tiny build --epoch``): every demonstration imitated once,
whole (``max_len`` 8,192 holds the longest sample, 7,070 tokens), in shuffled packed steps of
at most 8,192 positions, at the machine's precision (float32 on 2 cores without AVX512_BF16:
about 10 hours, docs/embedded.md). Its demonstrations: the explained
expert (its decisions written after the facts they rest on), the noisy expert's groups
(failed children scored ``false``; its lenient rate is 0), and 28 easy 2-dish TextWorld
tasks whose root delegates one sub-agent per dish; the 240 TextCraft tasks hold 76 easy
ones of 5-10 crafts, whose roots delegate (docs/embedded.md has the table by benchmark,
role and length). One in three of the children's act conversations that launch nothing is
kept (:attr:`~sera_core.tiny.demos.DemoConfig.child_act_keep`), so that the epoch fits about
10 hours on 2 cores."""

RECIPES = {"first": WarmStartRecipe(), "epoch": EPOCH_WARMSTART}
"""The recipes an adapter of the workbook may be shipped from, by name: ``first`` (220 steps of
2 samples, the adapter shipped until the epoch build is measured) and ``epoch``
(:data:`EPOCH_WARMSTART`). The shipped manifest names one of them by its hash
(:func:`shipped_recipe`), so shipping another adapter is a folder swap (``sera tiny ship``), not an
edit of the code."""


def shipped_recipe(path: str | os.PathLike = EMBEDDED) -> WarmStartRecipe:
    """The recipe of the adapter in ``path`` (default: the shipped one, ``model: tiny``): the one
    of :data:`RECIPES` whose hash its manifest's ``recipe_hash`` is; what ``sera tiny build``
    rebuilds by default. A manifest naming no known recipe (a recipe edited since the adapter
    was built changes its hash) is refused, naming both."""
    digest = read_manifest(path)["recipe_hash"]
    known = {recipe.config_hash(): name for name, recipe in RECIPES.items()}
    if digest not in known:
        raise UserInputError(f"{Path(path) / 'manifest.json'} names recipe {digest}, and tiny.warmstart.RECIPES hashes "
                             f"to {', '.join(f'{n} {h}' for h, n in known.items())}: rebuild the adapter (sera tiny build) "
                             "or restore the recipe it was built from")
    return RECIPES[known[digest]]


CUT_MARKER = "\n... [tokens omitted] ...\n"
"""What stands for the middle of a sample cut to ``max_len`` (:func:`sera_core.tiny.sft.fit`):
the words of the runtime's own cut (:func:`sera_core.utils.text.truncate_middle`)."""

ROLES = ("act", "rubric", "score")
"""What a demonstration teaches: acting (with launches), writing a rubric, scoring a child."""

SMALL_WARMSTART = WarmStartRecipe(
    demos=DemoConfig(textcraft_worlds=2, textcraft_mix={"easy": 1}, textworld_tasks=1),
    lora=LoraSettings(r=4, alpha=8),
    sft=SFTConfig(steps=6, batch_size=2, lr=1e-2, warmup_steps=1, max_len=8192, log_every=2, checkpoint_every=2),
)
"""A recipe for tests and CI (seconds, on a small stand-in base): same code, tiny sizes."""


def demonstration_table(samples: list[Sample], max_len: int, marker: tuple[int, ...] = ()) -> dict[str, dict]:
    """Per role (:data:`ROLES`): samples, positions (their tokens), learnt tokens, the longest,
    and the share of samples that lose anything to ``max_len`` (:func:`~sera_core.tiny.sft.fit`:
    a position, or a learnt token) against the cut before packing (the tail of 1,536 tokens)."""
    table = {}
    for role in ROLES:
        mine = [s for s in samples if s.role == role]
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in mine]
        learnt = [len(s.completion_ids) + sum(b - a for a, b in s.learn) for s in mine]
        kept = [sum(b - a for a, b in fit(s, max_len, marker)[1]) for s in mine]
        table[role] = {"samples": len(mine), "positions": sum(lengths), "learnt_tokens": sum(learnt),
                       "longest": max(lengths, default=0),
                       "cut_share": round(sum(n > max_len for n in lengths) / max(1, len(mine)), 4),
                       "learnt_lost": sum(learnt) - sum(kept),
                       "cut_share_at_1536": round(sum(n > 1536 for n in lengths) / max(1, len(mine)), 4)}
    return table


def check_demonstrations(samples: list[Sample], recipe: WarmStartRecipe) -> None:
    """Refuse, before any training, a recipe that would teach a role nothing: a role of
    :data:`ROLES` with no demonstration (the expert delegates, writes rubrics and scores on the
    recipe's tasks, so an empty role means the tasks asked for are missing), or one whose every
    sample is longer than ``sft.max_len`` (each would be cut). The message names the role and
    the setting."""
    for role in ROLES:
        lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples if s.role == role]
        if not lengths:
            raise UserInputError(f"the recipe's demonstrations hold no {role} sample: its tasks (demos: "
                                 f"textcraft_worlds={recipe.demos.textcraft_worlds}, textworld_tasks="
                                 f"{recipe.demos.textworld_tasks}, textworld_easy={recipe.demos.textworld_easy}) give none")
        if min(lengths) > recipe.sft.max_len:
            raise UserInputError(f"every {role} sample is longer than sft.max_len={recipe.sft.max_len} (the shortest has "
                                 f"{min(lengths)} tokens), so each would be cut: raise sft.max_len")


def prepared_demonstrations(recipe: WarmStartRecipe, tokenizer, *, progress: bool = False) -> tuple[list[Sample], dict, tuple[int, ...]]:
    """The recipe's demonstrations (:func:`~sera_core.tiny.demos.demonstrations`), checked
    (:func:`check_demonstrations`), with their table by benchmark and role
    (:func:`demonstration_table`) in the statistics, and the cut marker's tokens."""
    samples, stats = demonstrations(tokenizer, recipe.demos, progress=progress)
    check_demonstrations(samples, recipe)
    marker = tuple(tokenizer.encode(CUT_MARKER, add_special_tokens=False))
    start = 0
    for benchmark in BENCHMARKS:  # demonstrations() lists each benchmark's samples in turn
        n = stats[benchmark]["samples"]
        stats[benchmark]["by_role"] = demonstration_table(samples[start:start + n], recipe.sft.max_len, marker)
        start += n
    return samples, stats, marker


def plan_build(recipe: WarmStartRecipe, *, base: str | os.PathLike | None = None, progress: bool = False) -> dict:
    """What a build of ``recipe`` would train, without training (``sera tiny build --plan``):
    the demonstrations' table, their positions and learnt tokens after the cut, and for a
    packed recipe its optimizer steps."""
    base = Path(base) if base is not None else base_model_folder()
    samples, stats, marker = prepared_demonstrations(recipe, load_tokenizer(base), progress=progress)
    lengths = [len(fit(s, recipe.sft.max_len, marker)[0]) for s in samples]
    steps = len(packed_steps(lengths, recipe.sft)) if recipe.sft.tokens_per_step else recipe.sft.steps
    return {"recipe_hash": recipe.config_hash(), "demonstrations": stats, "samples": len(samples),
            "positions": sum(lengths), "steps": steps}


def lora_model(model, lora: LoraSettings, seed: int, *, recompute: bool = True):
    """``model`` wrapped with a fresh LoRA adapter (initialised from ``seed``), with
    gradient checkpointing through the frozen base (``recompute``: the same gradient, about
    a third more compute, far less memory: docs/embedded.md measures both)."""
    from peft import LoraConfig, get_peft_model

    if recompute:
        checkpoint_activations(model)
    torch.manual_seed(seed)
    return get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=list(lora.targets), task_type="CAUSAL_LM"))


def build_adapter(recipe: WarmStartRecipe, out: str | os.PathLike, *, base: str | os.PathLike | None = None,
                  progress: bool = True, stop_after: int | None = None, recompute: bool = True,
                  carry: str | os.PathLike | None = None) -> dict | None:
    """Run ``recipe`` on ``base`` (default: the embedded base model) into ``out``; return
    the manifest (None when ``stop_after`` stopped the training early; a rerun resumes).
    ``recompute``: activation checkpointing (an operational choice: the same adapter).
    An ``out`` that already holds this recipe's adapter on the same base is returned as it is,
    without any work: a pipeline that runs the build, then what uses it (``make background``),
    can be rerun from the top after an interruption.

    ``carry``: a folder that carries the build from machine to machine (the repository's
    ``builds/``, committed at each session's end: a new machine starts with an empty home
    folder). While it trains, ``carry/<recipe hash>/sft`` mirrors each checkpoint and
    ``loss.csv`` and is resumed from where it is further on than the work folder's
    (:func:`sera_core.tiny.sft.train_sft`); once it has ended, ``carry/<recipe hash>/adapter``
    holds the finished folder and its ``loss.csv`` (the checkpoint is dropped), which a later
    call copies into ``out`` instead of building again."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    name = BASE_NAME if base is None else str(base)
    carried = Path(carry) / recipe.config_hash() if carry is not None else None
    work, tmp = out.with_name(out.name + ".work"), out.with_name(out.name + ".tmp")

    def finished(folder: Path) -> dict | None:
        built = read_manifest(folder) if (folder / "manifest.json").is_file() else {}
        return built if built.get("recipe_hash") == recipe.config_hash() and built.get("base", {}).get("name") == name else None

    if (built := finished(out)) is not None:
        return built
    if carried is not None and finished(carried / "adapter") is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(carried / "adapter", tmp, ignore=shutil.ignore_patterns("loss.csv"))
        swap_in(tmp, out)
        return read_manifest(out)
    t0 = time.perf_counter()
    base = Path(base) if base is not None else base_model_folder()
    tokenizer = load_tokenizer(base)
    samples, demo_stats, marker = prepared_demonstrations(recipe, tokenizer, progress=progress)
    model = lora_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), recipe.lora, recipe.seed,
                       recompute=recompute)
    t_train = time.perf_counter()
    summary = train_sft(model, samples, recipe.sft, work / "sft", progress=progress, pad_id=tokenizer.pad_token_id,
                        stop_after=stop_after, marker=marker, carry=carried / "sft" if carried is not None else None)
    t_train = time.perf_counter() - t_train
    if summary["steps"] < summary["total_steps"]:
        return None
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "README.md").unlink(missing_ok=True)  # peft's empty model-card template
    _store_bf16(tmp / "adapter_model.safetensors")
    manifest = {
        "recipe_hash": recipe.config_hash(), "recipe": recipe.to_json(), "sera_version": __version__,
        "base": {"name": name,
                 "gguf_sha256": GGUF_SHA256, "weights_sha256": weights_digest(base)},
        "adapter_sha256": sha256_file(tmp / "adapter_model.safetensors"),
        "parameters": {"base": sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n),
                       "adapter": sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)},
        # every training second over the build's runs (a build of hours resumes many times), plus
        # the last run's demonstrations and saving: not only the last run's wall clock
        "build_seconds": round(time.perf_counter() - t0 - t_train + summary["seconds"], 1), "machine": _machine(),
        "demonstrations": demo_stats, "demonstrations_sha256": samples_sha256(samples), "training": summary, "results": None,
    }
    write_manifest(tmp, manifest)
    if carried is not None:  # the finished folder and its loss curve replace the carried checkpoint
        shutil.rmtree(carried / "adapter.tmp", ignore_errors=True)
        shutil.copytree(tmp, carried / "adapter.tmp")
        shutil.copyfile(work / "sft" / "loss.csv", carried / "adapter.tmp" / "loss.csv")
        swap_in(carried / "adapter.tmp", carried / "adapter")
        shutil.rmtree(carried / "sft", ignore_errors=True)
    swap_in(tmp, out)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def built_folder(recipe: WarmStartRecipe) -> Path:
    """Where ``sera tiny build`` writes ``recipe``'s adapter by default:
    ``~/.cache/sera/embedded/<recipe hash>`` (the work folder ``.work`` beside it while it runs)."""
    return Path.home() / ".cache" / "sera" / "embedded" / recipe.config_hash()


def read_manifest(path: str | os.PathLike = EMBEDDED) -> dict:
    return json.loads((Path(path) / "manifest.json").read_text())


def write_manifest(path: Path, manifest: dict) -> None:
    """``manifest.json`` beside the adapter (atomically)."""
    tmp = path / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path / "manifest.json")


def _store_bf16(path: Path) -> None:
    """Rewrite a safetensors file with its floating tensors in bfloat16 (halves the shipped size)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}, str(path),
              metadata={"format": "pt"})
