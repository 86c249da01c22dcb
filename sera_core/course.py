"""What the notebooks share, so each opens with a short setup cell and then its lesson.

* :func:`setup`: a notebook's set-up in one call: the smoke switch resolved (``SERA_SMOKE=1``
  in CI), the run config loaded and checked before any work (a bad one fails here), pandas'
  display settings; it returns a :class:`Lesson`;
* :func:`pick_tasks` (from :mod:`sera_core.envs.registry`): task records of a benchmark's
  split by difficulty, family and count;
* :func:`noisy_expert` (from :mod:`sera_core.agents.actors`): the scripted expert with seeded
  mistakes (failed branches to rank, rewards that differ between trees);
* :func:`eval_row`: one row of an evaluation summary for a results table;
* :func:`rollout_policy`: a run config's rollout policy on its starting model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sera_core.agents.actors import noisy_expert
from sera_core.envs.registry import pick_tasks
from sera_core.utils.errors import UserInputError

__all__ = ["Lesson", "eval_row", "noisy_expert", "pick_tasks", "rollout_policy", "setup"]


@dataclass(frozen=True)
class Lesson:
    """What a notebook's set-up cell gets from :func:`setup`."""

    config: Any
    """The run config (:class:`~sera_core.train.config.TrainConfig`), loaded and checked; None
    for a notebook without one (10 reads only published numbers)."""
    smoke: bool
    """The smoke switch: the notebook's ``SMOKE`` parameter or ``SERA_SMOKE=1`` (CI)."""

    def scale(self, full: Any, smoke: Any) -> Any:
        """``smoke`` in the smoke setting, else ``full`` (a task count, a step count, ...)."""
        return smoke if self.smoke else full

    def settings(self, *, branches: bool = True, **changes: Any) -> Any:
        """The config's rollout settings (``branches=False``: no counterfactual branches)."""
        return self.config.rollout_settings(branches=branches, **changes)

    def tasks(self, split: str | None = None, **selection: Any) -> list[dict]:
        """Task records of the config's benchmark (:func:`pick_tasks`: ``split`` default its
        evaluation split; ``difficulty``, ``family``, ``per_level``, ``spread``, ``count``)."""
        return pick_tasks(self.config.env, split, **selection)

    def runtime(self, policy: Any, *, branches: bool = True, **changes: Any) -> Any:
        """A :class:`~sera_core.agents.runtime.Runtime` on the config's benchmark playing
        ``policy`` (an actor, or a generating policy wrapped as one) with :meth:`settings`."""
        from sera_core.agents.actors import PolicyActor
        from sera_core.agents.runtime import Runtime

        actor = policy if hasattr(policy, "complete") else PolicyActor(policy)
        return Runtime(self.config.env, actor, self.settings(branches=branches, **changes))


def setup(config: str | None, smoke: bool, *, benchmark: str | None = None, loss: str | None = None,
          native: bool = False, **overrides: Any) -> Lesson:
    """A notebook's set-up: the smoke switch (``smoke`` or ``SERA_SMOKE=1``), the run config
    ``config`` loaded with ``overrides`` (a shipped name or a YAML path; unknown or bad keys fail
    here, naming the key) and checked against what the notebook teaches (``benchmark``, ``loss``,
    ``native``: generated task records, not the official format), and pandas' display width."""
    import pandas as pd

    pd.set_option("display.max_colwidth", 120)
    smoke = bool(smoke) or os.environ.get("SERA_SMOKE") == "1"
    if config is None:
        return Lesson(None, smoke)
    from sera_core.train.config import load_config

    cfg = load_config(config, **overrides)
    wanted = {"env": benchmark, "loss": loss, "task_format": "native" if native else None}
    for key, value in wanted.items():
        if value is not None and getattr(cfg, key) != value:
            raise UserInputError(f"{config}: this notebook needs {key}: {value} (the config has {getattr(cfg, key)!r})")
    return Lesson(cfg, smoke)


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
