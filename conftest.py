"""How ``make test`` shares the suite between its xdist workers (``-n 2 --dist loadfile``).

Each test file is one unit, as ``--dist loadfile`` makes it (its module fixtures are built
once, and a notebook's cells stay in order in one kernel), except that the notebooks are one
unit together, run in their numbered order by one worker: notebook 09 evaluates notebook 08's
run and notebook 10 reads notebook 09's, so two workers running them at once raced. Seen
2026-12-07: 09 loaded 08's checkpoint while 08 was still rewriting it, and waited past pytest's
600 s. (xdist's own ``--dist loadgroup`` cannot do this under pytest 9: it renames node ids
through ``Item._nodeid``, which pytest 9 no longer reads.)

The longest units go out first (:data:`FIRST`), the rest in xdist's order (most tests first).
xdist's order alone handed out ``tests/test_rubric_stage.py`` (a few tests, one of 450-600 s)
near the end: with AVX2 kernels forced (2026-12-07) it ran alone on one worker for its last
ten minutes while the other sat idle.
"""

from __future__ import annotations


FIRST = ("notebooks", "tests/test_rubric_stage.py", "tests/test_vllm_backend.py", "tests/test_distributed.py",
         "tests/test_faults.py", "tests/test_textcraft_expert.py", "tests/test_embedded.py")
"""The units that took longest in ``make test`` (its ``--durations``, 2026-12-07: the notebooks
about 10 min together, the rubric stage's resume test 450-600 s, the vLLM engine's files
70-130 s a test), handed out first and in this order."""


def handout_order(scopes: list[str]) -> list[str]:
    """``scopes`` (test files, and ``notebooks``) in the order they go to the workers: those of
    :data:`FIRST` first, in its order, then the others as given."""
    rank = {scope: i for i, scope in enumerate(FIRST)}
    return sorted(scopes, key=lambda scope: rank.get(scope, len(FIRST)))  # stable: the others keep their order


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: xdist's file scheduling with every notebook in one scope."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class NotebooksInOrder(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "notebooks" if path.endswith(".ipynb") else path

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "_ordered", False):  # the queue is whole at the first hand-out
                self._ordered = True
                queue = dict(self.workqueue)
                self.workqueue.clear()
                self.workqueue.update((scope, queue[scope]) for scope in handout_order(list(queue)))
            super()._assign_work_unit(node)

    return NotebooksInOrder(config, log)
