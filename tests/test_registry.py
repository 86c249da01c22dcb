"""The benchmark registry's protocol is the whole interface: every benchmark implements every
member it declares, and declares every public member a benchmark has (sera_core/envs/registry.py)."""

from __future__ import annotations

from sera_core.envs.registry import BENCHMARKS, Benchmark


def declared() -> set[str]:
    """The protocol's members: its annotated attributes and its methods."""
    return set(Benchmark.__annotations__) | {n for n, v in vars(Benchmark).items() if callable(v) and not n.startswith("_")}


def test_every_benchmark_implements_the_whole_protocol_and_nothing_outside_it():
    members = declared()
    assert {"spawn", "fork_child", "commit", "outcome", "agent_intro", "measured_levels", "expert_config",
            "noisy_expert_config", "demo_tasks", "vocabulary", "export_world", "eval_counts"} <= members
    for name, cls in BENCHMARKS.items():
        bench = cls()
        public = {n for n in dir(bench) if not n.startswith("_")}
        assert members - public == set(), f"{name} lacks {sorted(members - public)}"
        assert public - members == set(), f"{name} has {sorted(public - members)} that the protocol does not declare"
        assert bench.name == name
