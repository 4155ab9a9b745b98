"""Resuming a dropped connection of a resumable session (docs/protocol.md §9.1).

A `Reconnect` keeps what a resume needs across connections: the transport index of the last
payload received whole (what the server replays from) and the attempt budget. Each resume opens
a new connection and sends `session.resume`; the server may not have seen the old connection
go yet, so that refusal and network errors are retried, waiting `backoff`, 2×, 4×… seconds.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from rtvideo.client.errors import RealtimeVideoError
from rtvideo.core import protocol
from rtvideo.core.resume import RESUME

__all__ = ["Reconnect"]


class Reconnect:
    """One client's resumes: attempts, the index to resume after, and the wake-up of senders
    that met the dropped connection."""

    def __init__(self, url: str, token: str | None, open_timeout: float, attempts: int, backoff: float) -> None:
        self._url, self._open_timeout = url, open_timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else None
        self._attempts, self._backoff = attempts, backoff
        self.closing = False  # the client's own close: nothing to resume
        self.last_index = -1  # transport index of the last payload received whole
        self._reattached = asyncio.Event()
        self.reconnecting = False  # True while a dropped connection is being resumed
        self.resumes = 0  # connections resumed so far

    def fresh(self, metadata: dict[str, Any]) -> bool:
        """A payload to hand out: not an init pair (a fresh decoder's start, not video) and not
        one received already; records its index for the next resume."""
        index = metadata.get("transport_chunk_index")
        if not isinstance(index, int) or index <= self.last_index:
            return False
        self.last_index = index
        return True

    def may_resume(self) -> bool:
        """Not closing, and resumes allowed at all (the start must also have asked for them)."""
        return not self.closing and self._attempts > 0

    async def resume(self, resume_token: str) -> tuple[ClientConnection, Any] | RealtimeVideoError:
        """The new connection and its next resume token, or the failure that ends the session
        (`resume_failed` once the attempts are spent, else the server's refusal)."""
        self.reconnecting = True
        try:
            for attempt in range(self._attempts):
                await asyncio.sleep(self._backoff * 2**attempt)
                try:
                    ws = await connect(
                        self._url, additional_headers=self._headers, max_size=2**26, open_timeout=self._open_timeout
                    )
                    first = await self._ask(ws, resume_token)
                except (OSError, ConnectionClosed, asyncio.TimeoutError, InvalidHandshake):
                    continue  # the network is still away, or the old connection is not seen gone yet
                if first.get("type") == protocol.VIDEO_START and first.get("resumed"):
                    self.resumes += 1
                    return ws, first.get("resume_token")
                await ws.close()
                if first.get("type") == protocol.ERROR and "attached" in str(first.get("message")):
                    continue  # the server has not seen the old connection drop yet
                return RealtimeVideoError.from_message(first)
            return RealtimeVideoError(
                "resume_failed", f"the connection dropped and {self._attempts} resume attempts failed"
            )
        finally:
            self.reconnecting = False

    async def _ask(self, ws: ClientConnection, resume_token: str) -> dict[str, Any]:
        """`ws`'s answer to the resume. A cancel (the client leaving) closes `ws`: a connection
        not handed to the client is not left open for the server to stream into."""
        resume = {"type": RESUME, "resume_token": resume_token, "last_transport_chunk_index": self.last_index}
        try:
            await ws.send(json.dumps(resume))
            return json.loads(await asyncio.wait_for(ws.recv(), self._open_timeout))
        except asyncio.CancelledError:
            await ws.close()
            raise

    def reattached(self) -> None:
        """A new connection is in place: wake every sender waiting in `wait`."""
        self._reattached.set()
        self._reattached = asyncio.Event()

    async def wait(self, dropped: Callable[[], bool]) -> None:
        """Until `dropped()` is false, polling every 0.5 s besides the wake-up of `reattached`."""
        while dropped():
            waiter = asyncio.ensure_future(self._reattached.wait())
            await asyncio.wait([waiter], timeout=0.5)
            waiter.cancel()
