"""How one proxy session ends from the proxy's side (docs/protocol.md §2, §8).

Each end is claimed on the session's `Lifecycle` first (`claim_end`), so exactly one runs,
then reported by a task of the session: the error, a complete `session.done` from the ledger
(what the owner was actually handed), then the Triton sequence is ended before the owner's
socket is flushed and closed, so the model's slot is freed whatever the client does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from rtvideo.core import server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.session.lifecycle import Lifecycle
from rtvideo.proxy.tasks import TaskSet, cancel_and_wait

__all__ = ["FLUSH_SECONDS", "Ending", "SequenceEnd"]

log = logging.getLogger(__name__)

#: how long the last messages of a session may take to reach a client before the close
FLUSH_SECONDS = 10.0


class SequenceEnd(Protocol):
    """What an end needs of the session's `Upstream`: ending the Triton sequence."""

    async def end(self) -> None: ...


class Ending:
    """The ends the proxy reports itself, and the close after the model's own `session.done`."""

    def __init__(
        self,
        life: Lifecycle,
        tasks: TaskSet,
        seat: OwnerSeat,
        ledger: Ledger,
        upstream: SequenceEnd,
        request_id: Callable[[], str | None],
        gone: Callable[[], None],
    ) -> None:
        self._life = life
        self._tasks = tasks
        self._seat = seat
        self._ledger = ledger
        self._upstream = upstream
        self._request_id = request_id
        #: the session's close when no connection will report one (it ended while detached)
        self._gone = gone

    def fail(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """End the session from the proxy's side: claimed at once, reported by a task."""
        if self._life.claim_end():
            self._tasks.spawn(self._report_failure(code, message, close_code))

    def finish_soon(self) -> None:
        """The end is claimed and the owner has its last message queued: finish in a task."""
        self._tasks.spawn(self._finish(FLUSH_SECONDS))

    def refuse_resume(self, message: str, oldest: int | None) -> None:
        """`invalid_resume`, then close (no `session.done`: no session of this connection ended)."""
        if not self._life.claim_end():
            return
        answer = server_messages.error(ErrorCode.INVALID_RESUME, message)
        if oldest is not None:
            answer["oldest_resumable_index"] = oldest
        self._seat.emit(answer, force=True)
        self._tasks.spawn(self._seat.close_after_flush(FLUSH_SECONDS))

    async def shutdown(self, timeout: float) -> None:
        """`server_shutdown`, a complete `session.done` and close 1001; an end already under way
        goes on. Returns within about twice `timeout` whatever Triton and the client do."""
        self.fail(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down; reconnect to go on", close_code=1001)
        try:
            await asyncio.wait_for(self._life.closed.wait(), timeout)
        except asyncio.TimeoutError:
            self._seat.owner.close(1001, "server shutting down")
        # The session's tasks end by themselves (every wait in them is bounded), but a stream
        # Triton never ends must not hold the server's stop: what is left after `timeout` goes.
        pending = await self._tasks.wait(timeout)
        for task in pending:
            log.warning("request_id=%s a task did not end at shutdown: %s", self._request_id(), task.get_coro())
        await cancel_and_wait(pending)

    async def _report_failure(self, code: ErrorCode, message: str, close_code: int = 1000) -> None:
        """Error, `session.done` (from the ledger: what the client was actually handed), close."""
        owner = self._seat.owner
        stuck = code is ErrorCode.SLOW_CONSUMER or not await owner.flush(1.0)
        if stuck:
            owner.discard()  # the client cannot take more; the end must still fit
        # Nothing is queued now but the error: the ledger has seen every frame before the done.
        # A stuck writer would never reach them: they go to the socket directly, before the close.
        self._seat.emit(server_messages.error(code, message, request_id=self._request_id()), force=True, now=stuck)
        self._seat.emit(self._ledger.done(), force=True, now=stuck)
        await self._finish(1.0 if code is ErrorCode.SLOW_CONSUMER else FLUSH_SECONDS, close_code)

    async def _finish(self, flush_seconds: float, close_code: int = 1000) -> None:
        """After the session's last message: end the sequence, flush, close (normally, by default)."""
        await self._upstream.end()
        await self._seat.close_after_flush(flush_seconds, close_code)
        if self._seat.gone:  # ended while detached: no connection will report its close
            self._gone()
