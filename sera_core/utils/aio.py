"""Running coroutines from synchronous code, in scripts and inside notebooks alike."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``make()`` to completion and return its result. Called while an
    event loop runs in this thread (a notebook cell, the trainer inside one), it runs on a
    fresh loop in a worker thread and waits, since ``asyncio.run`` cannot nest."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


async def settle(count: Callable[[], int], rounds: int, limit: int | None = None) -> None:
    """Yield to the event loop until ``count()`` has stayed the same for ``rounds``
    consecutive yields (or reached ``limit``): every coroutine that is ready to submit work
    (an agent whose turn just ended) has submitted it before a batch or engine step starts."""
    seen, quiet = -1, 0
    while quiet < rounds and (limit is None or count() < limit):
        await asyncio.sleep(0)
        quiet = quiet + 1 if count() == seen else 0
        seen = count()


def fail_waiting(futures, exc: BaseException) -> None:
    """Hand ``exc``, raised while serving a batch of requests, to every caller still waiting
    on one of ``futures``, then re-raise it if it stops the program (Ctrl-C, ``SystemExit``)
    or cancels the serving task (``asyncio.CancelledError``: the waiting futures are
    cancelled too, and the task ends cancelled as asyncio expects).

    Any ``BaseException`` is handed over, not only ``Exception``: an interruption raised in
    the middle of an engine step (pytest-timeout's ``Failed``, a notebook's interrupt) would
    otherwise end the serving task alone, and asyncio keeps such an exception on the task,
    so the callers' futures would never resolve and the run would hang instead of failing."""
    cancelled = isinstance(exc, asyncio.CancelledError)
    for future in futures:
        if future.done():
            continue
        if cancelled:
            future.cancel()
        else:
            future.set_exception(exc)
    if cancelled or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc


class Gate:
    """At most ``slots`` holders at a time (:meth:`hold`); waiters enter lowest ``rank`` first,
    equal ranks in arrival order.

    Slots are granted one loop step after a request, not at once, so coroutines started
    together all queue before any enters: several sets of trees started in one ``gather``
    through one gate, each tree ranked by its position in its own set, enter round robin (the
    k-th tree of every set before the (k+1)-th of any), not the first set's trees first. A
    holder cancelled while it waits leaves no trace; one cancelled after its slot was granted
    hands the slot on."""

    def __init__(self, slots: int):
        if slots < 1:
            raise ValueError(f"a gate needs at least 1 slot, not {slots}")
        self.slots = slots
        self._free = slots
        self._waiting: list[tuple[Any, int, asyncio.Future]] = []
        self._order = itertools.count()
        self._dispatching = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @asynccontextmanager
    async def hold(self, rank: Any = 0) -> AsyncIterator[None]:
        """Hold one slot for the body of an ``async with`` (in one event loop: a gate is not
        thread-safe, so a second loop is refused)."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            raise RuntimeError("a Gate serves one event loop; make one per loop")
        self._loop = loop
        granted = loop.create_future()
        heapq.heappush(self._waiting, (rank, next(self._order), granted))
        if self._free and not self._dispatching:  # after the coroutines ready now have queued too
            self._dispatching = True
            loop.call_soon(self._dispatch)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled before it ran
                self._release()
            raise
        try:
            yield
        finally:
            self._release()

    def _dispatch(self) -> None:
        """Grant the free slots to the first waiters still waiting."""
        self._dispatching = False
        while self._free and self._waiting:
            *_, granted = heapq.heappop(self._waiting)
            if not granted.done():
                granted.set_result(None)
                self._free -= 1

    def _release(self) -> None:
        self._free += 1
        self._dispatch()
