"""How one proxy session ends from the proxy's side (docs/protocol.md §2, §8).

Each end is claimed on the session's `Lifecycle` first (`claim_end`, by the session), so
exactly one runs, then reported by a task of the session: the error, a complete
`session.done` from the ledger (what the owner was actually handed), then the Triton sequence
is ended before the owner's socket is flushed and closed, so the model's slot is freed
whatever the client does. A connection refused before it had a session is answered by
`refuse_connection`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from rtvideo.core import server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.phase import SessionPhase
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.tasks import TaskSet, cancel_and_wait

log = logging.getLogger(__name__)

#: how long the last messages of a session may take to reach a client before the close
FLUSH_SECONDS = 10.0


class SequenceEnd(Protocol):
    """What an end needs of the session's `Upstream`: ending the Triton sequence."""

    async def end(self) -> None: ...


class Ending:
    """How an end the session claimed is reported: the error, a complete `session.done`, the
    sequence ended, the owner's socket flushed and closed. It never claims an end itself: the
    session claims it on its `Lifecycle` (one writer) and then calls one of these."""

    def __init__(
        self, life: SessionPhase, tasks: TaskSet, seat: OwnerSeat, ledger: Ledger, upstream: SequenceEnd
    ) -> None:
        self._life = life
        self._tasks = tasks
        self._seat = seat
        self._ledger = ledger
        self._upstream = upstream

    def report(self, code: ErrorCode, message: str, close_code: int = 1000) -> asyncio.Task[None]:
        """A claimed end from the proxy's side, reported by a task; returns it."""
        return self._tasks.spawn(self._report_failure(code, message, close_code))

    def finish_soon(self) -> asyncio.Task[None]:
        """The end is claimed and the owner has its last message queued: finish in a task."""
        return self._tasks.spawn(self._finish(FLUSH_SECONDS))

    async def closed_within(self, timeout: float) -> None:
        """After a claimed shutdown: the session closed within `timeout`, or its owner's socket is
        closed (1001) now; then its tasks get `timeout` more, and what is left is cancelled.
        Returns within about twice `timeout` whatever Triton and the client do."""
        try:
            await asyncio.wait_for(self._life.closed.wait(), timeout)
        except asyncio.TimeoutError:
            self._seat.owner.close(1001, "server shutting down")
        # The session's tasks end by themselves (every wait in them is bounded), but a stream
        # Triton never ends must not hold the server's stop: what is left after `timeout` goes.
        pending = await self._tasks.wait(timeout)
        for task in pending:
            log.warning("request_id=%s a task did not end at shutdown: %s", self._life.request_id, task.get_coro())
        await cancel_and_wait(pending)

    async def _report_failure(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """Error, `session.done` (from the ledger: what the client was actually handed), close."""
        owner = self._seat.owner
        stuck = code is ErrorCode.SLOW_CONSUMER or not await owner.flush(1.0)
        if stuck:
            owner.discard()  # the client cannot take more; the end must still fit
        # Nothing is queued now but the error: the ledger has seen every frame before the done.
        # A stuck writer would never reach them: they go to the socket directly, before the close.
        request_id = self._life.request_id
        self._seat.emit(server_messages.error(code, message, request_id=request_id), force=True, now=stuck)
        self._seat.emit(self._ledger.done(), force=True, now=stuck)
        await self._finish(1.0 if code is ErrorCode.SLOW_CONSUMER else FLUSH_SECONDS, close_code)

    async def _finish(self, flush_seconds: float, close_code: int = 1000) -> None:
        """After the session's last message: end the sequence, flush, close (normally, by default)."""
        await self._upstream.end()
        await self._seat.close_after_flush(flush_seconds, close_code)


def refuse_connection(
    owner: Owner,
    metrics: ProxyMetrics,
    tasks: TaskSet,
    answer: dict[str, Any],
    *,
    done: bool,
    close_code: int = 1000,
) -> None:
    """A connection that did not become (or join) a session: `answer` (an error), with `done` an
    empty `session.done` as for any refused start (docs/protocol.md §2), then flush and close."""
    metrics.errors.labels(str(answer.get("code"))).inc()
    owner.put(Frame(server_messages.encode(answer), answer), force=True)
    if done:
        empty = Ledger().done()
        owner.put(Frame(server_messages.encode(empty), empty), force=True)
    tasks.spawn(_close_after_flush(owner, close_code))


async def _close_after_flush(owner: Owner, close_code: int) -> None:
    await owner.flush(FLUSH_SECONDS)
    owner.close(close_code)
