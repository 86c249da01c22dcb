"""Imitation speed of the warm-start build on this machine (numbers go to docs/embedded.md; not a test).

Real demonstrations of the one-epoch recipe (``EPOCH_WARMSTART``'s demonstration settings, on
``--worlds`` TextCraft worlds and ``--textworld`` TextWorld tasks), through the embedded base
model with a fresh LoRA adapter, timed per optimizer step (AdamW, the recipe's loss) in each
setting:

* ``padded 2 x 1536``: the shipped recipe's step (2 samples drawn by the curriculum, cut to
  1,536 tokens, right-padded);
* ``packed 8192``: whole samples packed into steps of at most 8,192 positions, each run
  unpadded (:func:`sera_core.tiny.sft.packed_steps`), with and without activation
  recomputation, in float32 and in bf16 autocast (the frozen base's weights stored in bf16
  once, as the build does: :func:`sera_core.tiny.sft.cast_frozen_linears`).

Reported per setting: positions per second (padding not counted), and the useful GFLOP/s
against the matmul roofline of the step's precision (a 2,048 x 576 by 576 x 1,536 product,
as in scripts/bench_generation.py). Useful FLOPs per position, with ``P`` the decoder's linear
weights (q, k, v, o, gate, up, down of every block: 106.2M for SmolLM2-135M), ``H`` the hidden
size, ``L`` the layers and ``t`` the position's index in its sample:
``4 P`` (forward, and the backward to the inputs: the base is frozen) ``+ 12 L H t``
(attention scores and values, forward and backward), and per learnt token ``4 V H`` (the
output layer). Recomputation is not useful work: it is counted in the step's time only.

Run: ``.venv/bin/python scripts/bench_warmstart.py [--steps 3] [--worlds 2] [--textworld 2]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import roofline  # noqa: E402

from sera_core.policy.base_model import base_model_folder, load_tokenizer  # noqa: E402
from sera_core.tiny.demos import demonstrations  # noqa: E402
from sera_core.tiny.sft import (IGNORE, SFTConfig, batch_indices, build_batch, cast_frozen_linears, fit,  # noqa: E402
                                packed_steps, step_backward)
from sera_core.tiny.warmstart import CUT_MARKER, EPOCH_WARMSTART, lora_model  # noqa: E402
from sera_core.utils.hardware import describe, make_accelerator  # noqa: E402


def useful_flops(model, parts: list[dict]) -> float:
    """Useful FLOPs of one step over ``parts`` (the batches it runs; module docstring)."""
    cfg = model.config
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and "lora_" not in n and "lm_head" not in n)
    total = 0.0
    for b in parts:
        lengths = b["attention_mask"].sum(1).tolist()
        learnt = int((b["labels"][:, 1:] != IGNORE).sum())
        for n in lengths:
            total += 4 * linear * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * n * (n - 1) / 2
        total += 4 * cfg.vocab_size * cfg.hidden_size * learnt
    return total


def time_steps(model, steps: list[list[dict]], precision: str) -> tuple[float, int, float]:
    """Seconds per step (after one warm-up step), positions and useful FLOPs of the timed steps."""
    accelerator = make_accelerator(precision)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    seconds, positions, flops = [], 0, 0.0
    for k, parts in enumerate(steps):
        t0 = time.perf_counter()
        _, _, n_positions = step_backward(model, parts, accelerator)  # the build's own step
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if k:  # the first step warms the allocator and the kernels
            seconds.append(time.perf_counter() - t0)
            positions += n_positions
            flops += useful_flops(model, parts)
    return sum(seconds) / len(seconds), positions, flops / sum(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per setting (one more warms up)")
    ap.add_argument("--worlds", type=int, default=2, help="TextCraft worlds of demonstrations")
    ap.add_argument("--textworld", type=int, default=2, help="TextWorld tasks of demonstrations")
    ap.add_argument("--only", nargs="*", help="settings to run (names as printed)")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    base = base_model_folder()
    tok = load_tokenizer(base)
    demos = replace(EPOCH_WARMSTART.demos, textcraft_worlds=args.worlds, textworld_tasks=args.textworld, textworld_easy=2)
    samples, _ = demonstrations(tok, demos)
    marker = tuple(tok.encode(CUT_MARKER, add_special_tokens=False))
    machine = describe()
    rl = {"no": roofline(torch.float32), "bf16": roofline(torch.bfloat16)}
    print(json.dumps({"machine": machine, "samples": len(samples), "roofline_gflops": {k: round(v) for k, v in rl.items()}}))

    n = args.steps + 1
    old = SFTConfig(steps=220, batch_size=2, max_len=1536)
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i].prompt_ids) + len(samples[i].completion_ids), i))
    padded = [[build_batch([samples[i] for i in batch_indices(order, 200 + s, old)], 0, 1536)] for s in range(n)]
    packed_cfg = SFTConfig(max_len=8192, tokens_per_step=8192, epochs=1)
    plan = packed_steps([len(fit(s, 8192, marker)[0]) for s in samples], packed_cfg)
    packed = [[build_batch([samples[i]], 0, 8192, marker) for i in step] for step in plan[:n]]
    settings = [("padded 2x1536, fp32, recompute", padded, "no", True),
                ("packed 8192, fp32, recompute", packed, "no", True),
                ("packed 8192, fp32, no recompute", packed, "no", False),
                ("packed 8192, bf16, recompute", packed, "bf16", True),
                ("packed 8192, bf16, no recompute", packed, "bf16", False)]
    for name, steps, precision, recompute in settings:
        if args.only and name not in args.only:
            continue
        model = lora_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                           EPOCH_WARMSTART.lora, 0, recompute=recompute)
        if precision == "bf16":  # as train_sft does: the frozen base's weights cast once
            cast_frozen_linears(model, torch.bfloat16)
        model.train()
        step_s, positions, gflops = time_steps(model, steps, precision)
        print(json.dumps({"setting": name, "seconds_per_step": round(step_s, 2),
                          "positions_per_s": round(positions / (step_s * args.steps), 1),
                          "useful_gflops": round(gflops / 1e9, 1), "roofline_share": round(gflops / 1e9 / rl[precision], 3)}),
              flush=True)
        del model


if __name__ == "__main__":
    main()
