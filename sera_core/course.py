"""What the notebooks share, so each opens with a short setup cell and then its lesson.

* :func:`pick_tasks`: task records of a benchmark's split by difficulty, family and count;
* :func:`noisy_expert`: the scripted expert with seeded mistakes (failed branches to rank,
  rewards that differ between trees);
* :func:`eval_row`: one row of an evaluation summary for a results table;
* :func:`rollout_policy`: a run config's rollout policy on its starting model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sera_core.envs.registry import benchmark, record_value


def pick_tasks(env: str, split: str | None = None, *, difficulty: str | Sequence[str] | None = None,
               family: str | None = None, per_level: int | None = None, count: int | None = None) -> list[dict]:
    """Generated task records of ``env``'s ``split`` (default: its evaluation split, TextCraft
    val / TextWorld test), in file order: those of ``difficulty`` (one level or several) and
    ``family`` (TextWorld), the first ``per_level`` of each level (levels in the order given),
    then the first ``count`` of all."""
    bench = benchmark(env)
    records = bench.generate_split(split or bench.eval_split)
    levels = (difficulty,) if isinstance(difficulty, str) else tuple(difficulty or bench.difficulties)
    if family is not None:
        records = [r for r in records if record_value(r, "task_family") == family]
    if per_level is None:  # the file order across levels
        picked = [r for r in records if record_value(r, "difficulty") in levels]
    else:
        picked = [r for level in levels for r in [r for r in records if record_value(r, "difficulty") == level][:per_level]]
    return picked[:count]


def noisy_expert(*, waste: float = 0.3, early_finish: float = 0.1, mistake: float = 0.15, tokenizer: Any = None):
    """The delegating expert with seeded mistakes, on both benchmarks: TextCraft wastes a
    craft with chance ``waste`` and gives up early with ``early_finish``; TextWorld uses a
    wrong preparation with ``mistake`` and gives up early with ``early_finish / 2``. Each
    agent's mistakes are seeded by the runtime, so the branches of a group differ. Ids in
    ``tokenizer`` (default: the scripted policies' tokenizer)."""
    from sera_core.envs.textcraft.expert import ExpertConfig as CraftConfig
    from sera_core.envs.textworld.expert import ExpertConfig as WorldConfig
    from sera_core.policy.expert import ExpertPolicy
    from sera_core.tiny.corpus import default_tokenizer

    return ExpertPolicy(tokenizer if tokenizer is not None else default_tokenizer(),
                        textcraft=CraftConfig(mode="delegate", waste=waste, early_finish=early_finish),
                        textworld=WorldConfig(mode="delegate", mistake=mistake, early_finish=early_finish / 2))


def eval_row(summary: dict[str, Any]) -> dict[str, Any]:
    """An evaluation summary (``sera.eval/1``) as one table row: success % per difficulty,
    the benchmark average and the errored rollouts."""
    row = {d: v["mean"] for d, v in summary["by_difficulty"].items()}
    return row | {"average": summary["average"]["mean"], "errors": summary["errors"]}


def rollout_policy(cfg: Any, *, dtype: str | None = None) -> Any:
    """The policy that plays ``cfg``'s rollouts, on the config's starting model: a vLLM engine
    with the config's engine settings (``dtype`` overrides ``engine_dtype``: ``float32`` for
    logprobs equal to a float32 trainer's within 1e-3) for ``backend: vllm``, else the ``hf``
    backend."""
    from dataclasses import replace

    from sera_core.train.trainer import model_path

    if cfg.backend == "vllm":
        from sera_core.policy.vllm_backend import VLLMPolicy

        engine = cfg.engine_settings()
        return VLLMPolicy(model_path(cfg), replace(engine, dtype=dtype) if dtype else engine)
    from sera_core.policy.hf import HFPolicy

    return HFPolicy(model_path(cfg))
