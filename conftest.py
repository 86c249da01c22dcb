"""How ``make test`` shares the suite between its xdist workers (``-n 2 --dist loadfile``).

Each test file is one unit, as ``--dist loadfile`` makes it (its module fixtures are built
once, and a notebook's cells stay in order in one kernel), except that the notebooks are one
unit together, run in their numbered order by one worker: notebook 09 evaluates notebook 08's
run and notebook 10 reads notebook 09's, so two workers running them at once raced. Seen
2026-12-07: 09 loaded 08's checkpoint while 08 was still rewriting it, and waited past pytest's
600 s. (xdist's own ``--dist loadgroup`` cannot do this under pytest 9: it renames node ids
through ``Item._nodeid``, which pytest 9 no longer reads.)
"""

from __future__ import annotations


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: xdist's file scheduling with every notebook in one scope."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksInOrder(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "notebooks" if path.endswith(".ipynb") else path

    return NotebooksInOrder(config, log)
