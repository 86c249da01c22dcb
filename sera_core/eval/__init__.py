"""Evaluation: running checkpoints on the benchmarks' evaluation tasks and aggregating their results (SPEC 5)."""
