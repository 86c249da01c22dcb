"""Recursive agents: the runtime that plays them and the record it writes.

* :mod:`~sera_core.agents.runtime`: :class:`~sera_core.agents.runtime.Runtime` plays root
  tasks as trees of agents (delegation, frozen rubrics, the scorer, counterfactual
  branch groups), batching every agent's calls through one actor.
* :mod:`~sera_core.agents.actors`: who answers the runtime's calls (a token-level policy
  through a batcher; the expert lives in :mod:`sera_core.policy.expert`).
* :mod:`~sera_core.agents.roles`: which completion tokens are ``launch``, ``execution``,
  ``rubric`` or ``score`` (each benchmark's launch rule comes from :mod:`sera_core.envs.registry`).
* :mod:`~sera_core.agents.prompts`: what agents and rubric/score calls are shown.
* :mod:`~sera_core.agents.tree`: one :class:`~sera_core.agents.tree.Tree` per rollout:
  nodes with their turns' exact prompt/completion ids, logprobs and one role per
  completion token (``execution``, ``launch``, ``rubric``, ``score``): the three
  training objectives' disjoint token masks.
* :mod:`~sera_core.agents.summary`: run files and the batch summary.
* :mod:`~sera_core.agents.view`: text views of trees and branch groups; a notebook browser.
"""
