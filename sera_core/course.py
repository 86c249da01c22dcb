"""What the notebooks share, so each opens with a short setup cell and then its lesson.

* :func:`pick_tasks` (from :mod:`sera_core.envs.registry`): task records of a benchmark's
  split by difficulty, family and count;
* :func:`noisy_expert` (from :mod:`sera_core.agents.actors`): the scripted expert with seeded
  mistakes (failed branches to rank, rewards that differ between trees);
* :func:`eval_row`: one row of an evaluation summary for a results table;
* :func:`rollout_policy`: a run config's rollout policy on its starting model.
"""

from __future__ import annotations

from typing import Any

from sera_core.agents.actors import noisy_expert
from sera_core.envs.registry import pick_tasks

__all__ = ["eval_row", "noisy_expert", "pick_tasks", "rollout_policy"]


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

    from sera_core.policy.checkpoints import model_path

    if cfg.backend == "vllm":
        from sera_core.policy.vllm_backend import VLLMPolicy

        engine = cfg.engine_settings()
        return VLLMPolicy(model_path(cfg), replace(engine, dtype=dtype) if dtype else engine)
    from sera_core.policy.hf import HFPolicy

    return HFPolicy(model_path(cfg))
