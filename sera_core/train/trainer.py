"""The SERA trainer: rollouts -> rewards -> advantages -> one CISPO update, on Accelerate.

One update (a training iteration, :meth:`Trainer.run_update`) at version ``v`` (the number of
updates already done, ``Trainer.updates_done``: the policy's version):

1. **Stage**: ``stage = StageController(cfg.schedule).stage(v)`` (16:2:2 by default); it
   fixes the objective (the token role trained) and whether rollouts branch
   counterfactually (rubric generation only).
2. **Tasks**: ``tasks_per_update`` root tasks drawn with ``random.Random(derive_seed(seed,
   "tasks", v))`` from the task list (the data cursor is the version itself).
3. **Rollouts**: ``trees_per_task`` trees per task through the recursive runtime
   (:class:`~sera_core.agents.runtime.Runtime`) at ``temperature``, seeded by
   ``derive_seed(seed, "rollouts", v)``; the policy generates with the model being
   trained (``hf``) or a vLLM engine whose weights are replaced after each update.
4. **Rewards and advantages** of the stage's objective (:mod:`sera_core.rewards`,
   :mod:`sera_core.train.advantages`): execution (children: rubric score or external
   label), leaf coverage, or rubric ranking; LOO baselines, zero-variance filtering,
   depth weighting.
5. **Update**: CISPO (or GRPO) loss over the datums' tokens
(:mod:`sera_core.train.update`),
   AdamW (``lr``, ``betas``, ``weight_decay``), gradient clipping, one optimizer step.

Per update a row goes to ``metrics.csv`` (columns: :data:`METRICS`, defined in
docs/training.md) and to the tracker ``log_with`` names (TensorBoard or wandb, none by
default). Every ``checkpoint_every`` updates
and at the end a checkpoint is written atomically (``checkpoint.tmp/`` then renamed to
``checkpoint/``): model weights, optimizer state, ``state.json`` (version, config,
cumulative counters, sha256 of every file). ``resume=True`` continues from it: the stage
position and the data cursor are functions of the version, every random draw is derived
from ``(seed, version)``, so an interrupted run and an uninterrupted one write the same
metrics at the same versions. A checkpoint whose files are missing or do not match their
hashes is refused with :class:`CheckpointError`. ``init_from`` starts a *new* run from another
run's trained weights (for example execution training from a rubric-stage checkpoint): weights
only, a fresh optimizer, version 0.

Distributed (``accelerate launch``, DDP or FSDP, ``P`` processes): process ``i`` plays the
trees ``i::P`` of the update (split by tree, not by task: 8 tasks x 4 trees keep 16
processes busy), then every process receives every tree (``gather_object``) and computes
the same rewards, advantages (LOO baselines, zero-variance filter, depth weights
``w_d = N / (D n_d)``) and token rows over the whole batch, so the CISPO normaliser
``N_tokens`` and the depth weights are global by construction. The rows' micro-batches are
dealt round-robin and padded with zero-weight micro-batches (``update.process_share``), so
every process runs the same number of forward/backward passes and collectives whatever
the task count, and the update equals the one-process update (tested with 3 CPU
processes: tests/test_distributed.py). :meth:`Trainer.close` ends the process group once the
run is over (``sera train`` calls it).

One update's life cycle (rollouts, advantages, the split update, metrics, checkpoints)
is the trainer's own state, so it stays one module; the maths lives in advantages, cispo
and update.
"""

from __future__ import annotations

import csv
import errno
import gc
import json
import os
import random
import shutil
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

import torch
from tqdm.auto import tqdm

from sera_core.agents.actors import as_actor
from sera_core.agents.runtime import Rollout, Runtime
from sera_core.agents.summary import summarize
from sera_core.agents.tree import write_trees
from sera_core.envs.registry import benchmark
from sera_core.policy.checkpoints import (CheckpointError, CheckpointWriteError, initial_weights, model_path,
                                          read_checkpoint)
from sera_core.rewards.execution import execution_datums
from sera_core.rewards.leaf_credit import leaf_datums
from sera_core.rewards.rubric_ranking import kept_points, rubric_datums
from sera_core.train.advantages import (
    Advantage,
    depth_weighted,
    execution_advantages,
    leaf_advantages,
    rubric_advantages,
)
from sera_core.train.cispo import CISPOConfig
from sera_core.train.config import RENAMED, TrainConfig
from sera_core.train.stages import Stage, StageController
from sera_core.train.update import advantage_token_mean, loss_and_backward, token_rows
from sera_core.utils.errors import UserInputError
from sera_core.utils.folders import sha256_file, swap_in
from sera_core.utils.seeding import derive_seed

METRICS = (
    "version", "stage", "cycle", "tasks", "trees", "errors", "root_success", "agents", "delegations",
    "rubric_validity", "score_validity", "groups", "groups_valid", "ranking_loss", "pairwise_accuracy",
    "datums", "datums_filtered", "reward_mean", "advantage_mean", "advantage_std", "advantage_token_mean",
    "loss", "grad_norm", "clip_fraction_low", "clip_fraction_high", "ratio_mean", "logprob_gap", "tokens_trained",
    "tokens_execution", "tokens_launch", "tokens_rubric", "tokens_score",
    "judge_calls", "judge_tokens", "external_calls", "external_tokens",
    "seconds_generation", "seconds_environment", "seconds_update", "seconds",
)
"""The columns of ``metrics.csv`` (one row per update)."""


OPERATIONAL = ("total_updates", "checkpoint_every", "save_rollouts", "log_with", "judge_cache", "judge_timeout_s",
               "judge_max_retries", "out")
"""Config keys a resumed run may change (they do not change what is trained): ``out`` too, so a
run folder moved or copied elsewhere resumes there."""


class TimedPolicy:
    """A policy wrapper that counts the seconds spent generating: in ``generate`` calls, or,
    for a continuously batching policy (``agenerate``: vLLM), in its engine steps since the
    wrapper was made (requests overlap there, so timing each call would count a step many times)."""

    def __init__(self, policy: Any):
        self.policy, self._seconds = policy, 0.0
        self.tokenizer = getattr(policy, "tokenizer", None)  # none on the scripted expert (an actor itself)
        self._engine_start = getattr(policy, "seconds", 0.0) if hasattr(policy, "agenerate") else 0.0

    @property
    def seconds(self) -> float:
        if hasattr(self.policy, "agenerate"):
            return self.policy.seconds - self._engine_start
        return self._seconds

    def generate(self, prompts, params):
        if hasattr(self.policy, "agenerate"):  # its engine steps are counted already
            return self.policy.generate(prompts, params)
        t0 = time.perf_counter()
        try:
            return self.policy.generate(prompts, params)
        finally:
            self._seconds += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)


@contextmanager
def leave_on_failure():
    """Run the block; in a process of a multi-process launch (``WORLD_SIZE`` > 1), an exception
    from it ends the process at once: its traceback is printed, then ``os._exit(1)``.

    Why: the other processes are waiting at a collective this one will never reach, and the
    launcher (torchrun, ``accelerate launch``) stops them only once this process has exited.
    An ordinary exit would first tear the process group down, which can wait for ever on a
    collective still in flight, or on the GIL (:meth:`Trainer.close`); so the process leaves
    without the interpreter's teardown, its output flushed. One process: the exception
    propagates as usual."""
    try:
        yield
    except BaseException:
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            raise
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


class Trainer:
    """Trains ``cfg``'s method (module docstring). ``run()`` does the updates."""

    def __init__(self, cfg: TrainConfig, *, progress: bool = True):
        from sera_core.policy.models import load_model
        from sera_core.utils.hardware import make_accelerator
        from sera_core.utils.weights import load_trained

        self.cfg, self.progress = cfg, progress
        self.out = Path(cfg.out)
        self.stages = StageController(cfg.schedule)
        self.accelerator = make_accelerator(cfg.precision(), cpu=not torch.cuda.is_available(),
                                       log_with=None if cfg.log_with == "none" else cfg.log_with, project_dir=cfg.out)
        path = model_path(cfg)
        start = initial_weights(cfg.init_from, cfg.model) if cfg.init_from else None  # checked before any work
        torch.manual_seed(derive_seed(cfg.seed, "init"))
        # a Hugging Face folder trains every parameter; an adapter folder (``tiny``) its LoRA matrices
        model, self.tokenizer = load_model(path, trainable=True, device="cpu", dtype=torch.float32)
        if start is not None:
            load_trained(model, start)
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.policy = self._policy(path)
        if start is not None and cfg.backend == "vllm":
            self._sync_policy()  # the engine was built from ``model``'s own weights
        self.tasks = cfg.task_pool()
        self.updates_done = 0
        """Updates applied so far: the policy's version (stored as ``version`` in ``state.json``
        and as the ``version`` column of ``metrics.csv``: the version each row's update started from)."""
        self.counters = {"tokens_trained": 0, "judge_calls": 0, "judge_tokens": 0, "external_calls": 0,
                         "external_tokens": 0}
        self.external = self._external()
        self.judge = benchmark(cfg.env).make_judge(cfg.judge, url=cfg.judge_url, model=cfg.judge_model, cache=cfg.judge_cache,
                                timeout_s=cfg.judge_timeout_s, max_retries=cfg.judge_max_retries)

    # -- setup -------------------------------------------------------------------------
    def _policy(self, path: Path):
        if self.cfg.backend == "vllm":
            from sera_core.policy.vllm_backend import VLLMPolicy

            # one engine per process, on its own device (module docstring of vllm_backend)
            return VLLMPolicy(path, self.cfg.engine_settings(), distributed=self.part[1] > 1)
        from accelerate.utils import DistributedType

        from sera_core.policy.hf import HFPolicy
        from sera_core.policy.models import merged

        if self.accelerator.distributed_type == DistributedType.FSDP:
            raise UserInputError("backend hf cannot generate under FSDP (each process would generate on its shards, "
                                 "a collective whose length differs by process: it hangs); use backend: vllm")
        # a plain model is shared (updates are what the next rollouts sample from); an adapter
        # is merged into a copy of its base (plain layers generate faster), re-made after each
        # update and owned by the policy (its weights laid out for decoding: hf.decode_layout)
        model = self.accelerator.unwrap_model(self.model)
        plain = merged(model)
        return HFPolicy.from_model(plain.eval(), self.tokenizer, own=plain is not model)

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What each process's engine loads: :func:`~sera_core.policy.models.engine_state` of
        the model (full tensors on every process, an adapter merged)."""
        from sera_core.policy.models import engine_state

        return engine_state(self.accelerator.unwrap_model(self.model))

    def _sync_policy(self) -> None:
        """Make the rollout policy sample from the model's current weights (after an update
        and after :meth:`load`): every process's vLLM engine gets :meth:`engine_weights`
        pushed; an adapter is merged again into a fresh copy of its base; a plain HF model is
        the policy's own model already."""
        model = self.accelerator.unwrap_model(self.model)
        if self.cfg.backend == "vllm":
            self.policy.push(self.engine_weights())  # gathered while the engine sleeps, then woken and pushed
        elif hasattr(model, "merge_and_unload"):
            self.policy = self._policy(model_path(self.cfg))

    def engine_agreement(self, content: str = "Craft 1 oak planks. Reply with your first action.",
                         max_new_tokens: int = 12) -> dict[str, Any]:
        """Whether the rollout policy samples from the trained weights: its greedy tokens on one
        user message ``content``, their log-probabilities as it recorded them (``engine``) and
        under the trained model, teacher-forced through the wrapped model (``model``; under FSDP a
        forward every process joins, so every process calls this), ``max_diff`` and ``mean_diff``
        between the two, and for a vLLM engine the ``device`` its weights sit on. What the tests
        and the GPU check compare after each push (float32 on both sides: within 1e-3; a
        bfloat16 engine: the update's ``logprob_gap``)."""
        from sera_core.policy.base import SamplingParams
        from sera_core.train.update import sequence_logprobs

        prompt = self.policy.chat_prompt([{"role": "user", "content": content}])
        [gen] = self.policy.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
        ids = torch.tensor([prompt + gen.token_ids], device=self.accelerator.device)
        with torch.no_grad():
            ours = sequence_logprobs(self.model, ids, torch.ones_like(ids))[0, len(prompt) - 1:].float().tolist()
        diffs = [abs(a - b) for a, b in zip(gen.logprobs, ours, strict=True)]
        out = {"tokens": gen.token_ids, "engine": gen.logprobs, "model": ours, "max_diff": max(diffs),
               "mean_diff": sum(diffs) / len(diffs)}
        if self.cfg.backend == "vllm":
            out["device"] = self.policy.device()
        return out

    def _external(self):
        from sera_core.agents.actors import external_actor

        return external_actor(self.cfg.rubric_writer, self.cfg.scorer, self.cfg.external_url, self.cfg.external_model)

    # -- one update --------------------------------------------------------------------
    def batch_tasks(self, version: int) -> list[dict]:
        """The update's root tasks (the same draw on every process)."""
        rng = random.Random(derive_seed(self.cfg.seed, "tasks", version))
        return rng.sample(self.tasks, min(self.cfg.tasks_per_update, len(self.tasks)))

    @property
    def part(self) -> tuple[int, int]:
        """``(process index, processes)``: this process's share of trees and micro-batches."""
        return self.accelerator.process_index, self.accelerator.num_processes

    def play(self, stage: Stage, version: int, policy: Any) -> list[Rollout]:
        """Every tree of the update, in one order on every process: this process plays
        trees ``i::P`` (module docstring), then the processes exchange them."""
        mine = self.runtime(stage, version, policy).run(self.batch_tasks(version), trees=self.cfg.trees_per_task,
                                                        progress=False, part=self.part)
        count = self.part[1]
        if count == 1:
            return mine
        from accelerate.utils import gather_object

        shares = gather_object([mine])  # one list per process; tree j was played by process j % P
        return [shares[j % count][j // count] for j in range(sum(map(len, shares)))]

    def runtime(self, stage: Stage, version: int, policy: Any) -> Runtime:
        cfg = self.cfg
        # only RAO's rewards need every child labelled; counterfactual branches are always labelled
        rc = cfg.rollout_settings(branches=stage.counterfactual, seed=derive_seed(cfg.seed, "rollouts", version),
                                  label_children=cfg.child_reward == "label")
        return Runtime(cfg.env, as_actor(policy), rc, judge=self.judge, external=self.external,
                       official=cfg.task_format == "official")

    def advantages(self, stage: Stage, rollouts: list[Rollout]) -> tuple[list[Advantage], int]:
        """The stage's advantages, depth-weighted when configured, and how many datums
        zero-variance filtering dropped."""
        cfg, trees = self.cfg, [r.tree for r in rollouts]
        if stage.name == "execution":
            datums = [d for t in trees for d in execution_datums(t, cfg.child_reward)]
            adv = execution_advantages(datums, trees, filter_zero_variance=cfg.filter_zero_variance)
            filtered = len(datums) - len(adv)
        elif stage.name == "delegation":
            datums = [d for t in trees for d in leaf_datums(t, cfg.leaf_gate_filter)]
            adv = leaf_advantages(datums, trees, filter_zero_variance=cfg.filter_zero_variance)
            filtered = len(datums) - len(adv)
        else:
            datums = rubric_datums(kept_points(rollouts), cfg.rubric_variant, cfg.spread_weight)
            adv = rubric_advantages(datums, filter_zero_variance=cfg.filter_zero_variance)
            filtered = len(datums) - len(adv)
        if cfg.depth_weighting:
            adv = depth_weighted(adv)
        return adv, filtered

    def run_update(self) -> dict[str, Any]:
        """One update (a whole training iteration: play, rewards, advantages, :meth:`train_on`)
        at version ``self.updates_done``; returns its metrics row."""
        cfg, v = self.cfg, self.updates_done
        stage = self.stages.stage(v)
        t0 = time.perf_counter()
        torch.manual_seed(derive_seed(cfg.seed, "torch", v))
        model = self.accelerator.unwrap_model(self.model)
        model.eval()
        timed = TimedPolicy(self.policy)
        spent = self._supervision()
        rollouts = self.play(stage, v, timed)
        self._count_supervision(spent)
        if cfg.save_rollouts and self.accelerator.is_main_process:
            write_trees(self.out / "rollouts" / f"v{v:05d}.jsonl.gz", [r.tree for r in rollouts])
        refuse_all_failed(rollouts, v)
        t_rollout = time.perf_counter() - t0
        adv, filtered, stats, grad_norm = self.train_on(stage, rollouts)
        t_update = time.perf_counter() - t0 - t_rollout
        self.updates_done += 1
        return self._metrics(v, stage, rollouts, adv, filtered, stats, grad_norm, timed.seconds,
                             t_rollout, t_update, time.perf_counter() - t0)

    def train_on(self, stage: Stage, rollouts: list[Rollout]) -> tuple[list[Advantage], int, dict[str, float], float]:
        """One optimizer step on the stage's objective over ``rollouts`` (every tree of the
        update, on every process); the rollout policy then follows the new weights. Returns
        the advantages, the datums zero-variance filtering dropped, the loss statistics of
        the whole update and the gradient norm before clipping."""
        adv, filtered = self.advantages(stage, rollouts)
        rows = token_rows({r.tree.tree_id: r.tree for r in rollouts}, adv, datum_balance=self.cfg.datum_balance)
        stats, grad_norm = self.train_rows(rows)
        return adv, filtered, stats | {"advantage_token_mean": advantage_token_mean(rows)}, grad_norm

    def train_rows(self, rows: list) -> tuple[dict[str, float], float]:
        """One optimizer step on ``rows`` (every process passes all of them): the CISPO (or
        GRPO) loss back-propagated, gradients clipped, AdamW stepped; then the rollout policy
        follows the new weights. Returns the loss statistics of the whole update and the
        gradient norm before clipping (0 without rows)."""
        cfg = self.cfg
        model = self.accelerator.unwrap_model(self.model)
        model.train()
        if cfg.backend == "vllm":
            self.policy.sleep()  # GPUs: the engine's memory is the update's until _sync_policy
        self.optimizer.zero_grad(set_to_none=True)
        stats = loss_and_backward(self.model, rows, pad_id=self.tokenizer.pad_token_id,
                                  total_tokens=sum(r.tokens for r in rows), micro_batch_tokens=cfg.micro_batch_tokens,
                                  loss=cfg.loss, cispo=CISPOConfig(cfg.clip_low, cfg.clip_high), grpo_eps=cfg.grpo_eps,
                                  backward=self.accelerator.backward, part=self.part, pi_old=cfg.pi_old,
                                  tis_cap=cfg.tis_cap)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), cfg.grad_clip) if rows else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        model.eval()
        self._sync_policy()
        return self._whole_batch(stats), float(grad_norm)

    def _supervision(self) -> list[int]:
        """This process's cumulative judge calls and input tokens, external writer/scorer
        calls and tokens (in the order of :meth:`_count_supervision`)."""
        judge = self.judge.stats_snapshot()
        ext = self.external.stats.as_dict() if self.external is not None else dict.fromkeys(judge, 0)
        return [judge["calls"], judge["input_tokens"], ext["calls"], ext["input_tokens"] + ext["output_tokens"]]

    def _count_supervision(self, before: list[int]) -> None:
        """Add what the judge and the external writer/scorer spent since ``before``, on all
        processes, to the counters: only the calls this method made (Table 2's cost)."""
        spent = torch.tensor([a - b for a, b in zip(self._supervision(), before, strict=True)], dtype=torch.int64,
                             device=self.accelerator.device)
        if self.part[1] > 1:
            spent = self.accelerator.reduce(spent, "sum")
        for key, n in zip(("judge_calls", "judge_tokens", "external_calls", "external_tokens"), spent.tolist(),
                          strict=True):
            self.counters[key] += int(n)

    def _whole_batch(self, stats: dict[str, float]) -> dict[str, float]:
        """The loss, tokens and clip statistics of the whole update from each process's
        share (sums over processes; means weighted by tokens)."""
        if self.part[1] == 1:
            return stats
        keys = ("loss", "tokens", "clip_fraction_low_sum", "clip_fraction_high_sum", "ratio_mean_sum", "logprob_gap_sum")
        total = self.accelerator.reduce(torch.tensor([stats[k] for k in keys], dtype=torch.float64,
                                                     device=self.accelerator.device), "sum").tolist()
        out = dict(zip(keys, total, strict=True))
        n = out["tokens"]
        return out | {k[:-4]: (out[k] / n if n else 0.0) for k in keys[2:]}

    def _metrics(self, v: int, stage: Stage, rollouts: list[Rollout], adv: list[Advantage], filtered: int,
                 stats: dict, grad_norm: float, t_gen: float, t_rollout: float, t_update: float, seconds: float) -> dict:
        summary = summarize(rollouts)
        values = [a.value for a in adv]
        calls = summary["scores"]["scored"] + summary["scores"]["malformed"]
        self.counters["tokens_trained"] += int(stats["tokens"])
        return {
            "version": v, "stage": stage.name, "cycle": stage.cycle, "tasks": len({r.tree.task_id for r in rollouts}),
            "trees": summary["trees"], "errors": summary["errors"], "root_success": summary["root_success_rate"], "agents": summary["agents"],
            "delegations": summary["delegations"], "rubric_validity": summary["rubrics"]["validity"],
            "score_validity": round(summary["scores"]["scored"] / calls, 4) if calls else None,
            "groups": summary["groups"]["total"], "groups_valid": summary["groups"]["valid"],
            "ranking_loss": summary["mean_ranking_loss"], "pairwise_accuracy": summary["mean_pairwise_accuracy"],
            "datums": len(adv), "datums_filtered": filtered,
            "reward_mean": round(fmean(a.datum.reward for a in adv), 6) if adv else None,
            "advantage_mean": round(fmean(values), 6) if values else None,
            "advantage_std": round(pstdev(values), 6) if values else None,
            "advantage_token_mean": None if stats.get("advantage_token_mean") is None
            else round(stats["advantage_token_mean"], 6),
            "loss": round(stats["loss"], 8), "grad_norm": round(grad_norm, 6),
            "clip_fraction_low": round(stats["clip_fraction_low"], 6), "clip_fraction_high": round(stats["clip_fraction_high"], 6),
            "ratio_mean": round(stats["ratio_mean"], 6), "logprob_gap": round(stats["logprob_gap"], 6),
            "tokens_trained": int(stats["tokens"]),
            **{f"tokens_{role}": n for role, n in summary["tokens"].items()},
            "judge_calls": self.counters["judge_calls"], "judge_tokens": self.counters["judge_tokens"],
            "external_calls": self.counters["external_calls"],
            "external_tokens": self.counters["external_tokens"],
            "seconds_generation": round(t_gen, 3), "seconds_environment": round(max(0.0, t_rollout - t_gen), 3),
            "seconds_update": round(t_update, 3), "seconds": round(seconds, 3),
        }

    # -- the loop ----------------------------------------------------------------------
    def run(self, *, total_updates: int | None = None, resume: bool = False, stop_after: int | None = None) -> list[dict]:
        """Updates from the current version to ``total_updates`` (default ``cfg.total_updates``);
        ``resume`` continues from ``out/checkpoint``; ``stop_after`` returns after that
        many updates of this call (to test interruption). Returns this call's rows."""
        target = self.cfg.total_updates if total_updates is None else total_updates
        if resume and (self.out / "checkpoint").exists():
            self.load(self.out / "checkpoint")
        elif not resume:
            shutil.rmtree(self.out / "checkpoint", ignore_errors=True)
            shutil.rmtree(self.out / "rollouts", ignore_errors=True)
            (self.out / "metrics.csv").unlink(missing_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self._trim_metrics()
        self._start_trackers()
        rows: list[dict] = []
        bar = tqdm(total=target, initial=self.updates_done, desc=f"train {self.cfg.method}", disable=not self.progress)
        while self.updates_done < target:
            row = self.run_update()
            rows.append(row)
            self._append_metrics(row)
            bar.update(1)
            bar.set_postfix(stage=row["stage"][:5], success=row["root_success"], loss=f"{row['loss']:.4f}")
            if self.updates_done % self.cfg.checkpoint_every == 0 or self.updates_done == target:
                self.save()
            if stop_after is not None and len(rows) >= stop_after:
                break
        bar.close()
        for tracker in self.accelerator.trackers:  # not end_training(): that also ends the process group
            tracker.finish()
        self.accelerator.trackers = []
        return rows

    def close(self) -> None:
        """End a multi-process run's process group in order, once no process needs it again,
        so that no communication thread is left for the interpreter's exit. One process:
        nothing to end.

        Every process waits for the others (Accelerate's barrier), then a second barrier
        drains the group; the DDP wrapper is dropped (its C++ ``Reducer`` holds the group);
        then the group is destroyed, which joins gloo's worker threads while Python is still
        whole. Why each step (found from a rank stuck at exit, ``py-spy dump``, 2026-12-07):

        * gloo's worker thread frees a finished collective's work after its waiter has
          returned, and that work can hold tensors that Python owns (those of
          ``broadcast_object_list``, kept as the barrier's prior work); freeing them needs the
          GIL. Whoever destroys the group joins that thread while holding the GIL: if the
          thread is still freeing such a work, neither moves (a rank that never exits). The
          second barrier holds no Python tensors, and while this process waits on it (the GIL
          released) gloo's worker frees the earlier works; the group is destroyed only after
          it. Measured with the same load beside it: 1 launch in 13 stuck before, 20 of 20
          ended after (the drain narrows the race to nothing seen; it is not a proof).
        * DDP's ``Reducer`` keeps the group alive after ``destroy_process_group``; left to
          the interpreter's exit, the group's threads are torn down with the process, where
          one aborted a rank (``terminate called without an active exception``, CI
          2026-12-06) and one deadlocked as above. Dropped here, the group's last reference
          goes with ``destroy_process_group`` and its threads end before this returns
          (tests/test_distributed.py counts them)."""
        if self.accelerator.num_processes > 1 and torch.distributed.is_initialized():
            self.accelerator.wait_for_everyone()
            torch.distributed.barrier()  # drains the first barrier's work (above)
            self.model = self.accelerator.unwrap_model(self.model)
            self.accelerator.free_memory()  # Accelerate's references to the wrapped model; collects
            self.accelerator.state.destroy_process_group()  # as Accelerator.end_training, without its trackers
            gc.collect()

    # -- metrics -----------------------------------------------------------------------
    def _append_metrics(self, row: dict) -> None:
        if not self.accelerator.is_main_process:
            return
        append_row(self.out / "metrics.csv", METRICS, row)
        if self.accelerator.trackers:
            self.accelerator.log({k: x for k, x in row.items() if isinstance(x, (int, float)) and k != "version"},
                                 step=row["version"])

    def _start_trackers(self) -> None:
        """Start the configured tracker (``log_with``) on the main process, with the config
        as its hyperparameters (lists and mappings as text): TensorBoard writes
        ``out/tensorboard``; wandb logs project ``sera``, run ``<method>-<out folder name>``."""
        if self.cfg.log_with == "none" or self.accelerator.trackers:
            return
        hparams = {k: v if v is None or isinstance(v, (bool, int, float, str)) else json.dumps(v)
                   for k, v in self.cfg.to_json().items()}
        if self.cfg.log_with == "tensorboard":
            self.accelerator.init_trackers("tensorboard", config=hparams)
        else:
            self.accelerator.init_trackers("sera", config=hparams, init_kwargs={
                "wandb": {"name": f"{self.cfg.method}-{self.out.name}", "dir": str(self.out)}})

    def _trim_metrics(self) -> None:
        """Keep only the rows of versions already done (a resumed run rewrites later ones)."""
        keep_rows(self.out / "metrics.csv", METRICS, before=self.updates_done)

    # -- checkpoints -------------------------------------------------------------------
    def save(self) -> Path:
        """Write ``out/checkpoint`` atomically (module docstring). The main process writes;
        when it cannot (a full disk, a read-only folder, a size limit), every process raises
        the same :class:`~sera_core.policy.checkpoints.CheckpointWriteError` (an ``OSError``)
        naming the checkpoint that is kept, so no process of a multi-process run waits at a
        collective the others never reach."""
        from accelerate.utils import broadcast_object_list
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        from sera_core.utils.weights import optimizer_state, trained_state

        self.accelerator.wait_for_everyone()
        final, tmp = self.out / "checkpoint", self.out / "checkpoint.tmp"
        model = self.accelerator.unwrap_model(self.model)
        weights, moments = trained_state(model), optimizer_state(model, self.optimizer)  # collectives under FSDP
        failure: list = [None]  # (errno, message) of the main process's failed write
        cause: BaseException | None = None
        if self.accelerator.is_main_process:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                save_file(weights, str(tmp / "model.safetensors"))
                torch.save(moments, tmp / "optimizer.pt")
                files = {name: sha256_file(tmp / name) for name in ("model.safetensors", "optimizer.pt")}
                state = {"version": self.updates_done, "config": self.cfg.to_json(), "counters": self.counters, "files": files}
                (tmp / "state.json").write_text(json.dumps(state, indent=1))
                swap_in(tmp, final)
            except (OSError, RuntimeError, SafetensorError) as exc:  # torch and safetensors report I/O failures as
                cause = exc                                           # their own errors
                shutil.rmtree(tmp, ignore_errors=True)
                old = final.with_name(final.name + ".old")  # where swap_in keeps it while it renames
                kept = (f"the previous one (update {read_checkpoint(final)['version']}) is intact" if final.exists()
                        else f"the previous one is in {old}" if old.exists() else "there is no earlier one")
                failure = [(getattr(exc, "errno", None) or errno.EIO,
                            f"{final}: could not write the checkpoint of update {self.updates_done} "
                            f"({getattr(exc, 'strerror', None) or exc}); {kept}")]
        if self.accelerator.num_processes > 1:
            failure = broadcast_object_list(failure, from_process=0)  # every process learns of it
        if failure[0] is not None:
            raise CheckpointWriteError(*failure[0]) from cause
        return final

    def load(self, path: Path) -> None:
        """Restore a checkpoint written by :meth:`save`, after checking it is whole and ours."""
        from sera_core.utils.weights import load_optimizer_state, load_trained

        state = read_checkpoint(path)
        # a checkpoint written before a key was renamed (:data:`RENAMED`) stores it by its former name
        mine, theirs = self.cfg.to_json(), {RENAMED.get(k, (k,))[0]: v for k, v in state["config"].items()}
        changed = sorted(k for k in mine if k not in OPERATIONAL and mine[k] != theirs.get(k))
        if changed:
            raise CheckpointError(f"{path}: written with another config (differs in {', '.join(changed)})")
        model = self.accelerator.unwrap_model(self.model)
        load_trained(model, path / "model.safetensors")
        load_optimizer_state(model, self.optimizer, path / "optimizer.pt")
        self.updates_done, self.counters = state["version"], self.counters | state["counters"]
        self._sync_policy()  # the next rollouts sample from the loaded weights, not the initial ones


class RolloutsFailed(RuntimeError):
    """Every tree of an update raised: the cause is the system (an engine, a sandbox), not
    the policy, and an update on nothing would be recorded as a run that learned nothing."""


def refuse_all_failed(rollouts: list[Rollout], version: int) -> None:
    """Raise :class:`RolloutsFailed` when every rollout of update ``version`` raised (an
    error recorded in ``tree.meta["error"]``), naming the first error; before the update, so
    the last checkpoint stays the run's and ``--resume`` continues once the cause is fixed.
    Some failed trees are outcomes (counted in the ``errors`` column); all of them is a fault."""
    errors = [r.tree.meta["error"] for r in rollouts if "error" in r.tree.meta]
    if rollouts and len(errors) == len(rollouts):
        raise RolloutsFailed(f"update {version}: all {len(rollouts)} rollouts raised, nothing to train on "
                             f"(first: {errors[0]}); the last checkpoint is kept, --resume continues after a fix")


def keep_rows(path: Path, columns: tuple[str, ...], *, before: int) -> list[dict]:
    """The rows of the CSV ``path`` whose ``version`` is below ``before``, the file rewritten
    with only those (a resumed run redoes the rest); none when there is no file."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["version"]) < before]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return rows


def append_row(path: Path, columns: tuple[str, ...], row: dict) -> dict:
    """Append ``row``'s ``columns`` to the CSV ``path`` (the header first; None as empty);
    returns the row as the CSV's text values."""
    new = not path.exists()
    text = {k: "" if row.get(k) is None else str(row[k]) for k in columns}
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        if new:
            w.writeheader()
        w.writerow(text)
    return text


def plan(cfg: TrainConfig) -> dict[str, Any]:
    """What ``sera train --dry-run`` prints: the run's plan, without loading a model."""
    stages = StageController(cfg.schedule)
    trees = cfg.tasks_per_update * cfg.trees_per_task
    bench = benchmark(cfg.env)
    context = cfg.max_context_tokens or bench.max_context_tokens
    out_cap = cfg.max_new_tokens or bench.max_new_tokens
    params = _parameter_count(cfg)
    accel = str(cfg.accelerate_file) if cfg.accelerate_file else None
    return {
        "method": cfg.method, "env": cfg.env, "model": str(model_path(cfg)), "backend": cfg.backend,
        # the checkpoint whose weights the run starts from, checked as the trainer checks it
        "init_from": str(initial_weights(cfg.init_from, cfg.model).parent) if cfg.init_from else None,
        "task_pool": {"tasks": cfg.tasks, "difficulties": list(cfg.difficulties or ()) or "all",
                      "size": len(cfg.task_pool())},
        "schedule": stages.schedule, "cycle_length": stages.cycle_length,
        "updates": cfg.total_updates, "updates_per_stage": stages.counts(cfg.total_updates),
        "batch": {"root_tasks": cfg.tasks_per_update, "trees_per_task": cfg.trees_per_task, "trees": trees,
                  "counterfactual_branches": cfg.counterfactual if stages.counts(stages.cycle_length)["rubric_generation"] else 0},
        "child_reward": cfg.child_reward, "loss": cfg.loss, "lr": cfg.lr, "betas": list(cfg.betas),
        "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip,
        "clip": [cfg.clip_low, cfg.clip_high] if cfg.loss == "cispo" else [1 - cfg.grpo_eps, 1 + cfg.grpo_eps],
        "context_tokens": context, "max_new_tokens": out_cap,
        "tokens_per_update_max": trees * context,
        "devices": {"gpus": cfg.gpus, "accelerate_config": accel, "mixed_precision": cfg.precision()},
        "memory": _memory(params, cfg),
        "out": cfg.out,
    }


def _parameter_count(cfg: TrainConfig) -> int | None:
    """Parameters of the model from its config.json (None if the folder is not there yet)."""
    from sera_core.policy.models import config_file

    folder = model_path(cfg)
    path = config_file(folder) if folder.is_dir() else folder / "config.json"
    if not path.is_file():
        return 4_022_468_096 if "Qwen3-4B" in cfg.model else None  # Qwen3-4B-Instruct-2507
    c = json.loads(path.read_text())
    h, n, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c.get("head_dim") or h // c["num_attention_heads"]
    layer = h * hd * (heads + 2 * kv) + heads * hd * h + 3 * h * inter + 2 * h + 2 * hd
    return n * layer + vocab * h * (1 if c.get("tie_word_embeddings") else 2) + h


def _memory(params: int | None, cfg: TrainConfig) -> dict[str, Any]:
    """Training-state memory: weights + gradients + two Adam moments in float32 (16 bytes a
    parameter; bf16 autocast keeps float32 master weights), sharded over the GPUs by FSDP."""
    if params is None:
        return {"parameters": None}
    total = params * 16
    return {"parameters": params, "training_state_gib": round(total / 2**30, 2),
            "per_gpu_gib": round(total / max(cfg.gpus, 1) / 2**30, 2)}
