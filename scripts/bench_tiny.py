"""Speed of the tiny model on this machine (numbers go to docs/tiny.md; not a test).

1. Inference: batched generation through the ``hf`` backend from real first prompts of
   TextCraft val tasks, sampled at temperature 1 for ``--new`` tokens (no stop string),
   completion tokens per second by batch size.
2. Training: seconds per imitation step of the recipe's model (AdamW, batch of the
   recipe's size) on random token sequences of a fixed length, by length.

Evaluation throughput is measured by ``sera eval`` itself (tasks per minute in its
summary; docs/evaluation.md).

Run: ``.venv/bin/python scripts/bench_tiny.py [--model DIR]`` (default: the shipped model).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from sera_core.agents.prompts import agent_messages
from sera_core.envs.registry import pick_tasks
from sera_core.policy.base import SamplingParams
from sera_core.policy.hf import HFPolicy
from sera_core.tiny.recipe import ASSETS, TinyRecipe
from sera_core.tiny.sft import Sample, build_batch, sft_loss


def inference(policy: HFPolicy, tasks: list[dict], new: int) -> list[tuple[int, float]]:
    """(batch size, completion tokens per second) for batch sizes 1, 8, 32, 64."""
    prompts = [policy.chat_prompt(agent_messages("textcraft", t["goal"], None, depth=0, max_depth=3, max_steps=20))
               for t in tasks]
    rows = []
    for batch in (1, 8, 32, 64):
        params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(batch)]
        t0 = time.perf_counter()
        gens = policy.generate([prompts[i % len(prompts)] for i in range(batch)], params)
        rows.append((batch, sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)))
    return rows


def training(model, batch: int, lengths: tuple[int, ...] = (512, 1024, 2048), steps: int = 3) -> list[tuple[int, float]]:
    """(sequence length, seconds per AdamW step of ``batch`` sequences)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in lengths:
        samples = [Sample(tuple(torch.randint(10, 1000, (n // 2,), generator=g).tolist()),
                          tuple(torch.randint(10, 1000, (n - n // 2,), generator=g).tolist())) for _ in range(batch)]
        b = build_batch(samples, pad_id=0, max_len=n)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = sft_loss(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"], b["weights"])
            loss.backward()
            opt.step()
            opt.zero_grad()
        rows.append((n, (time.perf_counter() - t0) / steps))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(ASSETS))
    parser.add_argument("--new", type=int, default=128, help="tokens generated per sequence in the inference test")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    policy = HFPolicy(args.model)
    easy = pick_tasks("textcraft", "val", difficulty="easy", count=8)
    print("\n| batch | completion tokens / s |\n|---|---|")
    for batch, rate in inference(policy, easy, args.new):
        print(f"| {batch} | {rate:,.0f} |")
    recipe = TinyRecipe()
    print(f"\n| sequence length | seconds / step (batch {recipe.sft.batch_size}) |\n|---|---|")
    for n, sec in training(policy.model.train(), recipe.sft.batch_size):
        print(f"| {n} | {sec:.2f} |")


if __name__ == "__main__":
    main()
