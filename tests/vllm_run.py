"""Training with ``backend: vllm`` on CPU, one engine per process (tests/test_vllm_backend.py).

Run alone (``python tests/vllm_run.py OUT``) or as several gloo processes
(``python -m torch.distributed.run --standalone --nproc_per_node 2 tests/vllm_run.py OUT``):
each process's trainer starts its own vLLM CPU engine (``external_launcher`` when there are
several) on the embedded policy (``model: tiny``: a LoRA adapter, served merged). Then:

1. one update on trees the noisy expert played (mixed rewards: a real gradient; lr 1e-2 so the
   weights move visibly), then the push;
2. one update through ``Trainer.run`` on the engine's own rollouts (continuous batching
   inside the trainer), which writes a checkpoint;
3. alone: a fresh trainer (a second engine) resumes from that checkpoint.

After each, every process compares its engine's greedy logprobs on a fixed prompt with its
trainer model's logprobs of the same tokens (``Trainer.engine_agreement``), and writes
``OUT/result.<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


from sera_core.agents.actors import noisy_expert
from sera_core.envs.textcraft.tasks import generate_split
from sera_core.train.config import load_config
from sera_core.train.trainer import Trainer
from sera_core.utils.jsonio import write_jsonl


def main(out: Path) -> None:
    rank = int(os.environ.get("RANK", 0))  # torchrun's; the trainer starts the process group
    out.mkdir(parents=True, exist_ok=True)
    tasks = out / f"tasks.{rank}.jsonl"
    write_jsonl(tasks, [t for t in generate_split("train") if t["misc"]["difficulty"] == "easy"][:4])
    cfg = load_config("textcraft/sera_tiny.yaml", backend="vllm", tasks=str(tasks), difficulties=None, tasks_per_update=2,
                      trees_per_task=2, schedule="execution:1", counterfactual=0, max_new_tokens=48,
                      max_steps_per_agent=3, micro_batch_tokens=2048, total_updates=2, checkpoint_every=1, lr=1e-2,
                      filter_zero_variance=False, engine_kv_cache_gib=0.5, engine_max_model_len=4096,
                      engine_dtype="float32", mixed_precision="no",  # engine logprobs = the trainer's within 1e-3
                      out=str(out / "run"))
    trainer = Trainer(cfg, progress=False)
    result = {"rank": rank, "processes": trainer.part[1], "start": trainer.engine_agreement()}
    stage = trainer.stages.stage(0)
    rollouts = trainer.play(stage, 0, noisy_expert(tokenizer=trainer.tokenizer))
    adv, *_ = trainer.train_on(stage, rollouts)
    trainer.updates_done += 1
    result["expert_update"] = trainer.engine_agreement() | {"datums": len(adv)}
    rows = trainer.run()
    result["own_update"] = trainer.engine_agreement() | {"tokens_trained": rows[-1]["tokens_trained"],
                                                 "requests": trainer.policy.requests,
                                                 "logprob_gap": rows[-1]["logprob_gap"]}
    trainer.close()  # as ``sera train`` does: a two-process launch ends its group before it exits
    if trainer.part[1] == 1:
        del trainer
        resumed = Trainer(cfg.replace(total_updates=3), progress=False)
        result["fresh"] = resumed.engine_agreement()
        resumed.load(out / "run" / "checkpoint")
        result["resumed"] = resumed.engine_agreement()
    (out / f"result.{rank}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
