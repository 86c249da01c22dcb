"""The commands of a whole run (train, export, evaluate, tables) and running them with live output.

Notebook 11 (driven headless by papermill: ``make train-full``, ``make reproduce-tiny``)
builds its commands here, so the notebook holds no logic of its own:

* :func:`train_command`: ``accelerate launch`` with the config's shipped Accelerate file
  (FSDP on 1 x H200 or 2 x 8 H200) when the config names one, else plain
  ``python -m sera_core train`` (the tiny CPU configs);
* :func:`tasks_command`, :func:`export_command`, :func:`eval_command`: the evaluation
  tasks, the trained checkpoint as a Hugging Face folder, and its evaluation under the
  paper's contract (vLLM when the config's backend is vLLM);
* :func:`run_command`: run one of them, echoing its output line by line (progress bars
  included) into the notebook and a log file; a failure raises with the log's tail;
* :func:`update_budget`: what one update of each stage plays and trains, from the config
  (the counterfactual work of a rubric update, the token ceilings; notebooks 08 and 11).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sera_core.train.config import TrainConfig


def train_command(cfg: TrainConfig, config_file: str | os.PathLike, *, num_processes: int | None = None,
                  num_machines: int | None = None, machine_rank: int = 0, main_process_ip: str | None = None,
                  out: str | os.PathLike | None = None, resume: bool = False, total_updates: int | None = None) -> list[str]:
    """The command that trains ``cfg`` (read from ``config_file``) on this machine.

    With ``cfg.accelerate_config``: ``accelerate launch --config_file F --num_processes N
    --machine_rank R [--num_machines M [--main_process_ip IP]] -m sera_core train ...``
    (``num_processes`` defaults to ``cfg.gpus``, the processes of all machines; without
    ``num_machines`` the Accelerate file's setting applies); run it on every machine with
    its own ``machine_rank``. Without: ``python -m sera_core train ...``."""
    tail = ["train", "--config", str(config_file)] + (["--out", str(out)] if out else []) + (["--resume"] if resume else [])
    tail += ["--total-updates", str(total_updates)] if total_updates else []
    accel = cfg.accelerate_file
    if accel is None:
        return [sys.executable, "-m", "sera_core", *tail]
    cmd = ["accelerate", "launch", "--config_file", str(accel), "--num_processes", str(num_processes or cfg.gpus),
           "--machine_rank", str(machine_rank)]
    if num_machines is not None:  # else the Accelerate file's machine count applies
        cmd += ["--num_machines", str(num_machines)]
        if num_machines > 1:
            if not main_process_ip:
                raise ValueError("a run on several machines needs main_process_ip (the rank-0 machine's address)")
            cmd += ["--main_process_ip", main_process_ip]
    return [*cmd, "-m", "sera_core", *tail]


def tasks_command(benchmark: str, out: str | os.PathLike) -> list[str]:
    """``sera tasks``: the evaluation split of ``benchmark`` (TextCraft val, TextWorld test)."""
    from sera_core.envs.registry import BENCHMARKS

    split = BENCHMARKS[benchmark].eval_split
    return [sys.executable, "-m", "sera_core", "tasks", "--env", benchmark, "--split", split, "--out", str(out)]


def export_command(run: str | os.PathLike, out: str | os.PathLike) -> list[str]:
    """``sera export``: the run's checkpoint as a Hugging Face folder (for vLLM and ``hf:``)."""
    return [sys.executable, "-m", "sera_core", "export", "--run", str(run), "--out", str(out)]


def eval_command(cfg: TrainConfig, model: str | os.PathLike, tasks: str | os.PathLike, out: str | os.PathLike, *,
                 label: str, seeds: int = 1, limit: int | None = None) -> list[str]:
    """``sera eval`` of an exported model under the contract (``vllm:`` when the config's
    backend is vLLM, else ``hf:``), labelled for the report; ``limit``: the first tasks only."""
    policy = f"{'vllm' if cfg.backend == 'vllm' else 'hf'}:{model}"
    return [sys.executable, "-m", "sera_core", "eval", "--env", cfg.env, "--tasks", str(tasks), "--policy", policy,
            "--seeds", str(seeds), "--label", label, "--method", cfg.method, "--out", str(out),
            *(["--limit", str(limit)] if limit else [])]


def run_command(cmd: Sequence[str], log: str | os.PathLike, *, echo=print) -> None:
    """Run ``cmd``, echoing each output line (stdout and stderr together; carriage-return
    progress updates become lines) and appending it to ``log``. Raises ``RuntimeError``
    with the last lines when the command fails."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    tail: list[str] = []
    env = {**os.environ, "TQDM_MININTERVAL": "10"}  # a progress line every 10 s, not a flood
    with open(log, "a") as fh, subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                 bufsize=1, env=env) as proc:
        fh.write(f"$ {shlex.join(cmd)}\n")
        for line in proc.stdout:  # text mode: "\r" progress updates arrive as lines too
            line = line.rstrip("\n")
            if line:
                echo(line)
                fh.write(line + "\n")
                tail = (tail + [line])[-20:]
    if proc.returncode:
        raise RuntimeError(f"{shlex.join(cmd)} failed (exit {proc.returncode}); last lines:\n" + "\n".join(tail))


def update_budget(cfg: TrainConfig, *, agents_per_tree: float = 1.0) -> list[dict[str, Any]]:
    """What one update of each stage of ``cfg.schedule`` plays and trains, from the config
    (SPEC 3-4, 8), one row per stage in schedule order. With T trees, B branches per group:

    * ``updates_per_cycle``, ``updates_in_run`` (of ``total_updates``), and ``trains``: the
      token role the stage trains (execution, launch, rubric);
    * ``trees`` T = tasks_per_update x trees_per_task, and ``agent_runs`` = T x
      ``agents_per_tree`` (rounded): the agents of the ordinary trees (the config does not bound a
      tree's size: 1 counts the roots only; pass a measured mean to count the children);
    * ``groups`` = T x (fork_cap // B) on a stage that branches (rubric generation), else 0:
      the most branch groups (delegation points) the fork cap lets each root rollout open;
    * ``forked_runs`` = groups x (B - 1): children played again on forked worlds (branch 0 is
      the real child; each forked run is a whole child subtree, counted here as one agent),
      ``branch_labels`` = groups x B external labels (checker or judge), and
      ``detached_scores`` = groups x (B - 1) scoring calls that never enter the optimizer;
    * ``episode_tokens`` = min(max_steps_per_agent x max_new_tokens, context): the most one
      agent generates, and ``generated_tokens_max`` = (agent_runs + forked_runs) x
      episode_tokens;
    * ``trained_tokens_max``: the ceiling of the trained role's tokens: execution agent_runs
      x episode_tokens, rubric groups x the rubric call's cap; None for launch (a launch
      statement, a few dozen tokens per delegation, has no bound in the config)."""
    from sera_core.envs.registry import benchmark
    from sera_core.train.stages import STAGE_ROLE, StageController

    stages, bench, calls = StageController(cfg.schedule), benchmark(cfg.env), cfg.rollout_settings()
    in_run = stages.counts(cfg.total_updates)
    context = cfg.max_context_tokens or bench.max_context_tokens
    episode = min(cfg.max_steps_per_agent * (cfg.max_new_tokens or bench.max_new_tokens), context)
    trees = cfg.tasks_per_update * cfg.trees_per_task
    rows = []
    for name, count in stages.parts:
        groups = trees * (cfg.fork_cap // cfg.counterfactual) if name == "rubric_generation" else 0
        forked, agents = groups * (cfg.counterfactual - 1), round(trees * agents_per_tree)
        trained = {"execution": agents * episode, "launch": None, "rubric": groups * calls.call_max_new_tokens}
        rows.append({"stage": name, "trains": STAGE_ROLE[name], "updates_per_cycle": count,
                     "updates_in_run": in_run[name], "trees": trees, "agent_runs": agents, "groups": groups,
                     "forked_runs": forked, "branch_labels": groups * cfg.counterfactual, "detached_scores": forked,
                     "episode_tokens": episode, "generated_tokens_max": (agents + forked) * episode,
                     "trained_tokens_max": trained[STAGE_ROLE[name]]})
    return rows
