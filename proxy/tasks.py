"""Ending asyncio tasks for good."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_SECONDS = 0.5


async def cancel_and_wait(tasks: Iterable[asyncio.Future[object]]) -> None:
    """Cancel `tasks` and wait until every one is done.

    One cancel is not always enough: Python 3.11's `asyncio.wait_for` returns the result, and drops
    the cancel, when the cancel lands as the awaited future completes (fixed in 3.12). A probe loop
    hit that way ran on, and the proxy's stop waited for it for good; so a task still running
    after `RECANCEL_SECONDS` is cancelled again (its next wait takes it)."""
    every = list(tasks)
    pending = {task for task in every if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_SECONDS)
    for task in every:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit
