"""Running coroutines from synchronous code, in scripts and inside notebooks alike."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
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
