"""Success rates, benchmark averages and their spread over seeds (SPEC 5, 7).

All rates are success percentages in [0, 100], like the paper's tables. A per-task
result row is ``{"task_id", "difficulty", "family"?, "success": bool, "error": str | None}``;
a row with an error is a failure whatever its ``success`` says (SPEC 5: evaluation
errors count as failures).

The benchmark average differs by benchmark (SPEC 5; the registry's ``eval_counts`` and
``pool_weighted`` say which):

* TextCraft-Synth weights each difficulty by its task count in the 632-task pool
  (147 / 213 / 136 / 136)::

      avg = sum_d r_d n_d / sum_d n_d

* TextWorld-Sync has 350 test tasks per difficulty, so its task-weighted average is the
  macro average ``avg = mean_d r_d``.

A run over a subset of the tasks keeps these weights (the pool's counts, not the
subset's), so its average estimates the same quantity as the paper's; difficulties
absent from a run are left out of both sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sera_core.envs import DIFFICULTIES
from sera_core.envs.registry import BENCHMARKS

SUMMARY_FORMAT = "sera.eval/1"
"""The ``format`` tag of an evaluation ``summary.json`` (:func:`summarize_runs`)."""
STD_DDOF = 0
"""Delta degrees of freedom of the spread over seeds: 0, the population std (the paper
says "mean +- std over 3 runs" without naming the estimator)."""


def weighted_average(rates: Mapping[str, float], counts: Mapping[str, int]) -> float:
    """``sum_d r_d n_d / sum_d n_d`` over the difficulties ``d`` in ``rates``.

    Raises ``ValueError`` when ``rates`` is empty, names a difficulty ``counts`` lacks, or
    the weights sum to zero.
    """
    if not rates:
        raise ValueError("no rates to average")
    missing = sorted(set(rates) - set(counts))
    if missing:
        raise ValueError(f"no task count for {missing}")
    total = sum(counts[d] for d in rates)
    if total <= 0:
        raise ValueError("the task counts sum to zero")
    return sum(rates[d] * counts[d] for d in rates) / total


def macro_average(rates: Mapping[str, float]) -> float:
    """``mean_d r_d``: every difficulty in ``rates`` weighs the same."""
    if not rates:
        raise ValueError("no rates to average")
    return sum(rates.values()) / len(rates)


def benchmark_average(benchmark: str, rates: Mapping[str, float], counts: Mapping[str, int] | None = None) -> float:
    """The paper's average for ``benchmark``: :func:`weighted_average` with ``counts`` (default
    the benchmark's ``eval_counts``, TextCraft's 632-task pool) for a ``pool_weighted``
    benchmark (TextCraft), else :func:`macro_average` (TextWorld: equal counts make the two
    the same)."""
    unknown = sorted(set(rates) - set(DIFFICULTIES))
    if unknown:
        raise ValueError(f"unknown difficulties {unknown}; expected some of {DIFFICULTIES}")
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {tuple(BENCHMARKS)}, got {benchmark!r}")
    if BENCHMARKS[benchmark].pool_weighted:
        return weighted_average(rates, BENCHMARKS[benchmark].eval_counts if counts is None else counts)
    return macro_average(rates)


def succeeded(row: Mapping[str, Any]) -> bool:
    """A row's verdict: ``success`` is true and there was no ``error``."""
    return bool(row.get("success")) and not row.get("error")


def success_rates(rows: Iterable[Mapping[str, Any]], key: str = "difficulty") -> dict[str, float]:
    """``100 * successes / tasks`` per value of ``row[key]`` (difficulties in
    :data:`DIFFICULTIES` order, anything else sorted). Errored rows count as failures.

    Raises ``ValueError`` on a row without ``key`` or a ``task_id`` seen twice.
    """
    tasks: dict[str, int] = {}
    wins: dict[str, int] = {}
    seen: set[Any] = set()
    for row in rows:
        if row.get(key) is None:
            raise ValueError(f"row {row.get('task_id')!r} has no {key!r}")
        task_id = row.get("task_id")
        if task_id in seen:
            raise ValueError(f"task {task_id!r} appears twice")
        seen.add(task_id)
        group = str(row[key])
        tasks[group] = tasks.get(group, 0) + 1
        wins[group] = wins.get(group, 0) + succeeded(row)
    return {g: 100.0 * wins[g] / tasks[g] for g in _ordered(tasks)}


def over_seeds(values: Iterable[float]) -> dict[str, float | int]:
    """``{"mean", "std", "n"}`` of one number over seeds: ``mean = sum_s v_s / n`` and the
    population std ``sqrt(sum_s (v_s - mean)^2 / n)`` (ddof 0, :data:`STD_DDOF`; 0 for one
    seed)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values to summarise")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - STD_DDOF))
    return {"mean": mean, "std": std, "n": n}


def summarize_runs(per_seed_rows: Mapping[int, list[dict[str, Any]]], benchmark: str, *,
                   label: str | None = None, method: str | None = None) -> dict[str, Any]:
    """The ``summary.json`` of an evaluation (format :data:`SUMMARY_FORMAT`).

    ``per_seed_rows`` maps each seed to its per-task rows; every seed must cover the same
    tasks. Returns::

        format, benchmark, label, method     what was evaluated (label: model and scale, free text)
        seeds                          the seeds, ascending
        per_seed   {seed: {average, by_difficulty, by_family, tasks, successes, errors}}
        average        {mean, std, n}  the benchmark average over seeds (n: seeds)
        by_difficulty  {d: {mean, std, n}}
        by_family      {f: {mean, std, n}}   (TextWorld rows carry a family; else {})
        tasks          {d: count}      tasks per difficulty in each seed
        errors         errored rows over all seeds
        std_ddof       0 (population std over seeds)

    Rates are percentages; averages follow :func:`benchmark_average`.
    """
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {tuple(BENCHMARKS)}, got {benchmark!r}")
    if not per_seed_rows:
        raise ValueError("no seeds to summarise")
    seeds = sorted(per_seed_rows)
    first = {row.get("task_id") for row in per_seed_rows[seeds[0]]}
    per_seed: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        rows = per_seed_rows[seed]
        if not rows:
            raise ValueError(f"seed {seed} has no rows")
        ids = {row.get("task_id") for row in rows}
        if ids != first:
            raise ValueError(f"seed {seed} covers {len(ids)} tasks that differ from seed {seeds[0]}'s "
                             f"{len(first)}: every seed must evaluate the same tasks")
        by_difficulty = success_rates(rows, "difficulty")
        with_family = [row for row in rows if row.get("family") is not None]
        per_seed[str(seed)] = {
            "average": benchmark_average(benchmark, by_difficulty),
            "by_difficulty": by_difficulty,
            "by_family": success_rates(with_family, "family") if with_family else {},
            "tasks": _counts(rows),
            "successes": sum(succeeded(row) for row in rows),
            "errors": sum(bool(row.get("error")) for row in rows),
        }
    runs = list(per_seed.values())
    return {
        "format": SUMMARY_FORMAT,
        "env": benchmark,
        "label": label,
        "method": method,
        "seeds": seeds,
        "per_seed": per_seed,
        "average": over_seeds(run["average"] for run in runs),
        "by_difficulty": _spread(runs, "by_difficulty"),
        "by_family": _spread(runs, "by_family"),
        "tasks": runs[0]["tasks"],
        "errors": sum(run["errors"] for run in runs),
        "std_ddof": STD_DDOF,
    }


def _ordered(groups: Iterable[str]) -> list[str]:
    """Difficulties in :data:`DIFFICULTIES` order first, then other groups sorted."""
    groups = set(groups)
    return [d for d in DIFFICULTIES if d in groups] + sorted(groups - set(DIFFICULTIES))


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Tasks per difficulty."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["difficulty"])] = counts.get(str(row["difficulty"]), 0) + 1
    return {d: counts[d] for d in _ordered(counts)}


def _spread(runs: list[dict[str, Any]], field: str) -> dict[str, dict[str, float | int]]:
    """:func:`over_seeds` of each group of ``run[field]`` (all seeds hold the same groups,
    since they cover the same tasks)."""
    return {g: over_seeds(run[field][g] for run in runs) for g in runs[0][field]}


def paired_change(before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Root success of two models on the same tasks (per-task rows of one seed each), with
    95% intervals: each rate ``p = mean_i y_i`` (``y_i`` in {0, 1}) with the normal
    approximation ``1.96 * sqrt(p (1 - p) / n)``, and the paired difference
    ``d = mean_i (y_i^after - y_i^before)`` with ``1.96 * std_i(d_i) / sqrt(n)`` (sample std),
    which is narrower than two separate intervals when the models fail the same tasks.
    Also how many tasks each model alone solved (``gained``, ``lost``) and which
    (``gained_tasks``, ``lost_tasks``: sorted ids). Rates in [0, 1].

    Raises ``ValueError`` when the two sets of tasks differ."""
    b = {row["task_id"]: float(succeeded(row)) for row in before}
    a = {row["task_id"]: float(succeeded(row)) for row in after}
    if set(a) != set(b) or not a:
        raise ValueError(f"paired_change needs the same tasks on both sides ({len(b)} before, {len(a)} after, "
                         f"{len(set(a) ^ set(b))} not shared)")
    n = len(a)
    diffs = [a[t] - b[t] for t in sorted(a)]
    d = sum(diffs) / n
    sd = math.sqrt(sum((x - d) ** 2 for x in diffs) / (n - 1)) if n > 1 else 0.0

    def rate(values: Iterable[float]) -> dict[str, float]:
        p = sum(values) / n
        return {"rate": p, "ci": 1.96 * math.sqrt(p * (1 - p) / n)}

    return {"tasks": n, "before": rate(b.values()), "after": rate(a.values()),
            "difference": {"rate": d, "ci": 1.96 * sd / math.sqrt(n)},
            "gained": sum(x > 0 for x in diffs), "lost": sum(x < 0 for x in diffs),
            "gained_tasks": [t for t in sorted(a) if a[t] > b[t]], "lost_tasks": [t for t in sorted(a) if a[t] < b[t]]}


def task_moves(changes: Mapping[Any, Mapping[str, Any]]) -> dict[str, dict[Any, str]]:
    """Which tasks each run's :func:`paired_change` flipped, read across runs:
    ``{task: {run: "gained" | "lost"}}`` for every task flipped in at least one run (runs in
    the order of ``changes``), the most often flipped first, ties by task id. The same few
    tasks in most runs is training moving the policy one way on them; a different handful in
    each run is noise."""
    out: dict[str, dict[Any, str]] = {}
    for run, change in changes.items():
        for word in ("gained", "lost"):
            for task in change[f"{word}_tasks"]:
                out.setdefault(task, {})[run] = word
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (Lentz's continued fraction,
    accurate to about 1e-12 for the arguments :func:`t_quantile` gives it)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the continued fraction converges fast below this point
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0.5 < p < 1``), by
    bisection on its distribution function ``F(t) = 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2``
    (``t >= 0``). ``t_quantile(0.975, 2) = 4.3027``; it tends to the normal 1.9600 as ``df`` grows."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + hi * hi)) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + mid * mid)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def t_interval(values: Iterable[float], level: float = 0.95) -> dict[str, float | int | None]:
    """The mean of ``n`` values (seeds) and its Student's t interval: ``half = t_{(1 + level) / 2,
    n - 1} * s / sqrt(n)`` with ``s`` the sample standard deviation (``n - 1``); ``low`` and
    ``high`` its ends. One value: no interval (``half`` None). Over 3 seeds ``t`` is 4.30, not
    the normal 1.96: a normal interval over a few seeds is about half as wide as it should be."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("t_interval needs at least one value")
    n, mean = len(xs), sum(xs) / len(xs)
    if n == 1:
        return {"n": 1, "mean": mean, "half": None, "low": None, "high": None, "level": level}
    s = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * s / math.sqrt(n)
    return {"n": n, "mean": mean, "half": half, "low": mean - half, "high": mean + half, "level": level}


def mcnemar_exact(gained: int, lost: int) -> float:
    """The two-sided exact McNemar p-value of a paired success comparison: under "no change",
    each of the ``gained + lost`` discordant tasks goes either way with probability 1/2, so
    ``p = min(1, 2 * sum_{k <= min(gained, lost)} C(n, k) / 2^n)``. 5 gained and 0 lost:
    p = 0.0625 (not significant at 5%); nothing discordant: 1."""
    n = gained + lost
    if min(gained, lost) < 0:
        raise ValueError("gained and lost are counts >= 0")
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(gained, lost) + 1)) / 2 ** n)


def bootstrap_interval(values: Iterable[float], *, reps: int = 10000, level: float = 0.95, seed: int = 0) -> dict[str, float]:
    """The mean of ``values`` (tasks or points of one run) and its percentile bootstrap
    interval: ``reps`` resamples of the values with replacement (``random.Random(seed)``: the
    same interval every time), the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
    their means."""
    import random

    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("bootstrap_interval needs at least one value")
    rng = random.Random(seed)
    n = len(xs)
    means = sorted(sum(rng.choices(xs, k=n)) / n for _ in range(reps))
    cut = (1 - level) / 2
    return {"mean": sum(xs) / n, "low": means[int(cut * (reps - 1))], "high": means[int(math.ceil((1 - cut) * (reps - 1)))],
            "level": level, "reps": reps}
