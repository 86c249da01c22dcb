"""One process of the multi-process training check (tests/test_distributed.py).

Launched as ``accelerate launch --cpu --num_processes 3 tests/distributed_run.py OUT``, or
run alone (``python tests/distributed_run.py OUT``) for the one-process reference. With the
from-scratch fixture model as the trained model:

1. three updates (execution, delegation, rubric generation) through ``Trainer.play`` and
   ``Trainer.train_on`` on trees played by the noisy expert (mixed rewards, so every stage's
   execution advantages are non-zero; zero-variance filtering is off so that every stage's
   tokens go through the split update): 5 tasks x 2 trees, a count 3 does not divide;
2. two more updates through ``Trainer.run`` with the model's own rollouts, which writes
   a checkpoint from the main process between collectives.

Then ``Trainer.close`` ends the process group, as ``sera train`` does. The main process writes
``OUT/result.json`` (each update's loss statistics, the datums and the trained tokens, whether
the group was closed) and ``OUT/weights.pt`` (every parameter after the five updates).

``python tests/distributed_run.py OUT failing-save`` instead saves once where the main process
cannot write (a file stands where ``checkpoint.tmp`` goes), then closes: each process writes
the error it raised, whether its group was closed and the gloo threads it still has to
``OUT/save.<rank>.txt``.

``python tests/distributed_run.py OUT failing-rank``: the last process raises once its trainer
is built, the others train; all of it under :func:`~sera_core.train.trainer.leave_on_failure`,
as ``sera train`` runs. The launch must end, failed, with no process left.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from sera_core.agents.actors import noisy_expert
from sera_core.envs.textcraft.tasks import generate_split
from sera_core.tiny.recipe import ASSETS
from sera_core.train.config import CONFIGS, load_config
from sera_core.train.trainer import Trainer, leave_on_failure
from sera_core.utils.jsonio import write_jsonl


def config(out: Path, tasks: Path):
    return load_config(CONFIGS / "textcraft" / "sera_tiny.yaml", model=str(ASSETS), backend="hf", tasks=str(tasks),
                       tasks_per_update=5, trees_per_task=2, schedule="execution:1,delegation:1,rubric_generation:1",
                       counterfactual=4, fork_cap=8, max_new_tokens=256, max_steps_per_agent=6,
                       micro_batch_tokens=2048, total_updates=5, checkpoint_every=5, filter_zero_variance=False,
                       mixed_precision="no", out=str(out / "run"))  # float32: 3 processes = 1


def failing_save(out: Path, tasks: Path) -> None:
    trainer = Trainer(config(out, tasks), progress=False)
    rank = trainer.part[0]
    if trainer.accelerator.is_main_process:
        trainer.out.mkdir(parents=True, exist_ok=True)
        (trainer.out / "checkpoint.tmp").write_text("a file where the checkpoint's folder goes")
    try:
        trainer.save()
        said = "saved"
    except OSError as exc:
        said = str(exc)
    trainer.close()
    (out / f"save.{rank}.txt").write_text(f"{said}\nclosed: {not torch.distributed.is_initialized()}\n"
                                          f"gloo threads: {gloo_threads()}")


def failing_rank(out: Path, tasks: Path) -> None:
    with leave_on_failure():
        trainer = Trainer(config(out, tasks), progress=False)
        if trainer.part[0] == trainer.part[1] - 1:
            raise RuntimeError(f"process {trainer.part[0]} fails on purpose")
        trainer.run()  # waits at the first collective for the process that failed
        trainer.close()


def gloo_threads() -> list[str]:
    """The names of this process's threads that belong to gloo (``pt_gloo_runloop``, ``gloo_tcp_loop``)."""
    names = (Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
    return sorted(n for n in names if "gloo" in n)


def main(out: Path, mode: str = "train") -> None:
    tasks = out / f"tasks.{torch.distributed.get_rank() if torch.distributed.is_initialized() else 0}.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(tasks, [t for t in generate_split("train") if t["misc"]["difficulty"] == "medium"][:5])
    if mode == "failing-save":
        return failing_save(out, tasks)
    if mode == "failing-rank":
        return failing_rank(out, tasks)
    cfg = config(out, tasks)
    trainer = Trainer(cfg, progress=False)
    expert = noisy_expert(tokenizer=trainer.tokenizer)
    updates = []
    for v in range(3):
        stage = trainer.stages.stage(v)
        rollouts = trainer.play(stage, v, expert)
        adv, filtered, stats, grad_norm = trainer.train_on(stage, rollouts)
        trainer.updates_done += 1
        updates.append({"stage": stage.name, "trees": [r.tree.tree_id for r in rollouts], "datums": len(adv),
                        "filtered": filtered, "grad_norm": grad_norm, **stats})
    rows = trainer.run()
    trainer.close()
    if trainer.accelerator.is_main_process:  # the process's index, kept after the group is gone
        model = trainer.accelerator.unwrap_model(trainer.model)
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out / "weights.pt")
        (out / "result.json").write_text(json.dumps({"updates": updates, "run_versions": [r["version"] for r in rows],
                                                     "processes": trainer.part[1],
                                                     "closed": not torch.distributed.is_initialized(),
                                                     "gloo_threads": gloo_threads()}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:])
