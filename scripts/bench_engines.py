"""Which engine rolls out on CPU: the ``hf`` backend against vLLM's CPU build, side by side
(numbers go to docs/benchmarks.md; not a test).

For each backend, in its own process (``--backend``), on the embedded policy:

1. start: seconds to a ready policy (vLLM: the engine, its first call included);
2. decode: completion tokens per second at batch 1, 8 and 32 from the first prompts of
   TextCraft val tasks (temperature 1, seeded, up to ``--new`` tokens, EOS allowed);
3. tasks: the first ``--tasks`` easy TextCraft val tasks through the runtime at temperature 0
   (the evaluation's settings): seconds a task, tasks solved, and the batching tail, the share
   of generation time spent at <= 2 sequences generating (``step_log`` of each backend);
4. update: one SERA update of ``textcraft/sera_tiny.yaml`` on easy train tasks (2 tasks x 4
   trees at temperature 1, execution stage): seconds, of which generation and the update.

Run: ``.venv/bin/python scripts/bench_engines.py`` (both backends, about 15 minutes on 2 cores)
or ``--backend vllm --out runs/bench/vllm.json`` for one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tail_share(log: list[tuple[int, float]]) -> float:
    """Share of the logged generation seconds spent at <= 2 sequences generating."""
    total = sum(s for _, s in log)
    return sum(s for n, s in log if n <= 2) / total if total else 0.0


def measure(backend: str, new: int, n_tasks: int) -> dict:
    import torch

    from sera_core.agents.actors import make_actor
    from sera_core.agents.prompts import agent_messages
    from sera_core.agents.runtime import Runtime
    from sera_core.envs.textcraft.tasks import generate_split
    from sera_core.policy.base import SamplingParams
    from sera_core.train.config import load_config
    from sera_core.train.trainer import Trainer

    row: dict = {"backend": backend, "threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    actor = make_actor("tiny" if backend == "hf" else "vllm:tiny")
    policy = actor.policy
    val = generate_split("val")
    prompts = [policy.chat_prompt(agent_messages("textcraft", t["goal"], None, depth=0, max_depth=3, max_steps=20))
               for t in val[:32]]
    policy.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=4))  # first call (vLLM warms up)
    row["start_s"] = round(time.perf_counter() - t0, 1)
    for batch in (1, 8, 32):
        params = [SamplingParams(temperature=1.0, max_new_tokens=new, seed=i) for i in range(batch)]
        t0 = time.perf_counter()
        gens = policy.generate(prompts[:batch], params)
        row[f"decode_b{batch}_tok_s"] = round(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0), 1)
    print(row, flush=True)
    cfg = load_config("textcraft/sera_tiny.yaml", backend=backend)
    easy = [t for t in val if t["misc"]["difficulty"] == "easy"][:n_tasks]
    policy.step_log = []
    t0 = time.perf_counter()
    rollouts = Runtime("textcraft", actor, cfg.rollout_settings(branches=False, temperature=0.0, rubric_temperature=0.0)).run(easy)
    row["tasks"] = len(easy)
    row["task_s"] = round((time.perf_counter() - t0) / len(easy), 1)
    row["tasks_solved"] = sum((r.tree.root_reward or 0.0) >= 1.0 for r in rollouts)
    row["tasks_tail_share"] = round(tail_share(policy.step_log), 3)
    print(row, flush=True)
    del actor, policy
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config("textcraft/sera_tiny.yaml", backend=backend, difficulties=["easy"], out=out, total_updates=1)
        t0 = time.perf_counter()
        trainer = Trainer(cfg, progress=False)
        row["update_start_s"] = round(time.perf_counter() - t0, 1)
        trainer.policy.step_log = []
        metrics = trainer.step()
        row["update_s"] = metrics["seconds"]
        row["update_generation_s"] = metrics["seconds_generation"]
        row["update_training_s"] = metrics["seconds_update"]
        row["update_tokens_trained"] = metrics["tokens_trained"]
        row["update_tail_share"] = round(tail_share(trainer.policy.step_log), 3)
    return row


def table(rows: list[dict]) -> str:
    keys = [k for k in rows[0] if k != "backend"]
    lines = ["| measure | " + " | ".join(r["backend"] for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    lines += [f"| {k} | " + " | ".join(str(r.get(k, "")) for r in rows) + " |" for k in keys]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("hf", "vllm"))
    parser.add_argument("--new", type=int, default=128, help="tokens per sequence in the decode test")
    parser.add_argument("--tasks", type=int, default=8, help="easy val tasks through the runtime")
    parser.add_argument("--out", default="runs/bench/engines")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.backend:
        row = measure(args.backend, args.new, args.tasks)
        (out / f"{args.backend}.json").write_text(json.dumps(row, indent=1))
        print(json.dumps(row))
        return
    for backend in ("hf", "vllm"):  # one process each: threads, memory and engines do not mix
        subprocess.run([sys.executable, __file__, "--backend", backend, "--new", str(args.new), "--tasks",
                        str(args.tasks), "--out", str(out)], check=True, env=os.environ)
    print(table([json.loads((out / f"{b}.json").read_text()) for b in ("hf", "vllm")]))


if __name__ == "__main__":
    main()
