"""Recompute what can be recomputed among the published numbers (SPEC 7).

Each :class:`~sera_core.report.published.Relation` gives a number as a linear
combination of others (the task-weighted TextCraft average, a gain as a difference,
a cell printed in two tables). The paper prints 2 decimals, so a relation holds when
the recomputed value, rounded to 2 decimals, is within 0.01 of the published one::

    |round(sum_k coef_k * value_k, 2) - value_target| <= 0.01
"""

from __future__ import annotations

from collections.abc import Iterable

from sera_core.report.published import PUBLISHED, RELATIONS, Key, Number, Relation, index

TOLERANCE = 0.01
"""Largest accepted gap on the shown digits (one unit of the last printed decimal)."""


class ReportError(ValueError):
    """A published number that disagrees with its recomputation, or a relation that cannot
    check it (the message names the number): the workbook's own data is wrong."""


def recompute(relation: Relation, numbers: dict[Key, Number]) -> float:
    """``sum_k coef_k * value(key_k)`` (0 for no terms)."""
    missing = [k for _, k in relation.terms if k not in numbers]
    if missing:
        raise ReportError(f"relation {relation.formula!r} names missing numbers {['/'.join(k) for k in missing]}")
    return sum(coef * numbers[key].value for coef, key in relation.terms)


def check_published(numbers: Iterable[Number] = PUBLISHED, relations: Iterable[Relation] = RELATIONS) -> int:
    """Check every relation and return how many were checked.

    Raises :class:`ReportError` naming the number when a key is given twice, a relation
    names a missing number, a recomputation disagrees beyond :data:`TOLERANCE`, or a
    derived number has no relation that recomputes it.
    """
    try:
        table = index(numbers)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    checked: set[Key] = set()
    count = 0
    for relation in relations:
        if relation.target not in table:
            raise ReportError(f"relation {relation.formula!r} targets a missing number {'/'.join(relation.target)}")
        published = table[relation.target].value
        value = recompute(relation, table)
        if abs(round(value, 2) - published) > TOLERANCE + 1e-9:
            given = " + ".join(f"{coef:.6g} x {'/'.join(key)} ({table[key].value:g})" for coef, key in relation.terms)
            raise ReportError(f"published {'/'.join(relation.target)} = {published:.2f} but "
                              f"{relation.formula} gives {value:.4f} with the numbers as given: {given}")
        checked.add(relation.target)
        count += 1
    unchecked = [n for n in table.values() if n.derived and n.key not in checked]
    if unchecked:
        raise ReportError(f"derived number {'/'.join(unchecked[0].key)} has no relation that recomputes it")
    return count
