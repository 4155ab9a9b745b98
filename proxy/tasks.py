"""Background tasks of the proxy: the one set type that holds them, and ending them for good.

Invariant: a task the proxy starts in the background is held in a `TaskSet` until it is
done (the event loop keeps only weak references: one nobody holds may be collected
mid-run), so whoever owns the set can wait for it, or cancel what is left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Iterator
from typing import Any

#: how long a cancelled task may take to end before it is cancelled again (see `cancel_and_wait`)
RECANCEL_SECONDS = 0.5


class TaskSet:
    """Tasks running in the background, each held until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` as a task held here until it is done."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def wait(self, timeout: float | None = None) -> set[asyncio.Task[Any]]:
        """Wait until every task held now is done, at most `timeout` seconds; returns those still running."""
        if not self._tasks:
            return set()
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        return pending

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(set(self._tasks))  # a snapshot: tasks leave the set as they end

    def __len__(self) -> int:
        return len(self._tasks)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until every one is done.

    One cancel is not always enough on Python 3.11: `asyncio.wait_for` drops a cancel that
    lands as the awaited future completes (fixed in 3.12). So a task still running after
    `RECANCEL_SECONDS` is cancelled again (its next wait takes it)."""
    every = list(tasks)
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    for task in every:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
