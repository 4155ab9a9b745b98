"""A small async client for `WebSocket /v1/realtime/video` (docs/protocol.md), on `websockets`.

async with RealtimeVideoClient("ws://127.0.0.1:8080/v1/realtime/video") as c:
    start = await c.start("A quiet harbour at dawn", num_frames=144)
    ack = await c.interact("A snowy street", transition_chunks=3)
    async for chunk in c.chunks():
        ...  # chunk.metadata, chunk.data
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtvideo.core import protocol
from rtvideo.core.errors import SESSION_ENDING_CODES, ErrorCode

_ENDING = {code.value for code in SESSION_ENDING_CODES}
_INTERACTION_REJECTED = {ErrorCode.INVALID_INTERACTION.value, ErrorCode.EVENT_ID_CONFLICT.value}


@dataclass(frozen=True)
class Chunk:
    """One `video.chunk_metadata` and the binary payload that followed it."""

    metadata: dict[str, Any]
    data: bytes


class RealtimeVideoError(Exception):
    """An `error` message: `code` is the stable code, `event_id` set when it concerns one event."""

    def __init__(self, code: str, message: str, event_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.event_id = code, message, event_id

    @classmethod
    def from_message(cls, m: dict[str, Any]) -> RealtimeVideoError:
        return cls(str(m.get("code")), str(m.get("message", "")), m.get("event_id"))


_END = object()  # end-of-stream marker in the chunk queue


@dataclass
class _AckWait:
    """The future every `interact()` for one event id waits on, and how many do."""

    future: asyncio.Future[dict[str, Any]]
    waiters: int = 0


class RealtimeVideoClient:
    """One session. Errors that do not end the session go to `on_error` (default: the
    `errors` queue); a session-ending error is raised by `chunks()` (and `start()`)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        on_error: Callable[[RealtimeVideoError], None] | None = None,
        open_timeout: float = 10.0,
    ) -> None:
        self.url = url
        self._token = token
        self._open_timeout = open_timeout
        self.errors: asyncio.Queue[RealtimeVideoError] = asyncio.Queue()
        self._on_error = on_error or self.errors.put_nowait
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task | None = None
        self._started: asyncio.Future[dict[str, Any]] | None = None
        self._acks: dict[str, _AckWait] = {}
        self._chunks: asyncio.Queue[Any] = asyncio.Queue()
        self.video_start: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.failure: RealtimeVideoError | None = None

    async def __aenter__(self) -> RealtimeVideoClient:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        self._ws = await connect(self.url, additional_headers=headers, max_size=2**26, open_timeout=self._open_timeout)
        self._started = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    # --- requests ------------------------------------------------------------------------
    async def start(self, prompt: str, **fields: Any) -> dict[str, Any]:
        """Send `session.start`; returns `video.start` (raises RealtimeVideoError if refused)."""
        assert self._started is not None, "use `async with`"
        await self._send({"type": protocol.START, "prompt": prompt, **fields})
        return await self._started

    async def interact(
        self,
        prompt: str,
        transition_chunks: int | None = None,
        event_id: str | None = None,
        *,
        timeout: float = 5.0,
        attempts: int = 3,
    ) -> dict[str, Any]:
        """Send a prompt update and return its `session.interaction.queued`. Without an ack in
        `timeout`, the same event id and payload are sent again (a retry is never applied twice)."""
        interaction: dict[str, Any] = {"event_id": event_id or str(uuid.uuid4()), "event": {"prompt": prompt}}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        eid = interaction["event_id"]
        if self.done is not None or self.failure is not None:  # over: no ack can come any more
            raise self._end_error()
        wait = self._acks.get(eid)
        if wait is None or wait.future.done():  # concurrent calls for one id share a pending future
            wait = self._acks[eid] = _AckWait(asyncio.get_running_loop().create_future())
        wait.waiters += 1
        sent = 0
        try:
            while True:
                await self._send({"type": protocol.INTERACTION, "interaction": interaction})
                sent += 1
                try:
                    return await asyncio.wait_for(asyncio.shield(wait.future), timeout)
                except asyncio.TimeoutError:
                    if sent >= attempts:
                        raise
        finally:
            wait.waiters -= 1
            if not wait.waiters and self._acks.get(eid) is wait:
                del self._acks[eid]

    async def stop(self) -> None:
        """Ask for the end: the stream then ends with the trailer and `session.done`."""
        await self._send({"type": protocol.STOP})

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Chunks as they arrive, until `session.done`; raises a session-ending error."""
        while (item := await self._chunks.get()) is not _END:
            yield item
        self._chunks.put_nowait(_END)  # a second iteration ends at once
        if self.failure is not None:
            raise self.failure

    async def save_mp4(self, path: str | Path) -> dict[str, Any] | None:
        """Write every chunk to `path` (a playable fragmented MP4); returns `session.done`."""
        with open(path, "wb") as f:
            async for chunk in self.chunks():
                f.write(chunk.data)
        return self.done

    async def _send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None, "use `async with`"
        await self._ws.send(json.dumps(message))

    # --- receiving -----------------------------------------------------------------------
    async def _read(self) -> None:
        assert self._ws is not None
        metadata: dict[str, Any] | None = None
        try:
            async for frame in self._ws:
                if isinstance(frame, bytes):
                    if metadata is not None:
                        self._chunks.put_nowait(Chunk(metadata, frame))
                    metadata = None
                    continue
                message = json.loads(frame)
                if message.get("type") == protocol.CHUNK_METADATA:
                    metadata = message
                else:
                    self._dispatch(message)
        except ConnectionClosed:
            pass
        finally:
            if self.done is None and self.failure is None:
                self.failure = RealtimeVideoError("connection_closed", "the connection closed before session.done")
            self._settle()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self.video_start = message
            self._resolve(self._started, message)
        elif kind == protocol.QUEUED:
            wait = self._acks.get(message["event_id"])
            self._resolve(wait.future if wait is not None else None, message)
        elif kind == protocol.DONE:
            self.done = message
            self._settle()
        elif kind == protocol.ERROR:
            error = RealtimeVideoError.from_message(message)
            waiting = self._acks.get(error.event_id or "")
            if error.code in _ENDING:
                self.failure = error
                self._wake(error)  # no video.start or ack comes after it; done may be late or never
            elif waiting is not None and error.code in _INTERACTION_REJECTED:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            else:
                self._on_error(error)

    def _settle(self) -> None:
        """The session is over: wake everything that waits on it."""
        self._wake(self._end_error())
        self._chunks.put_nowait(_END)

    def _end_error(self) -> RealtimeVideoError:
        return self.failure or RealtimeVideoError("session_done", "the session ended")

    def _wake(self, end: RealtimeVideoError) -> None:
        """Fail `start()` and every `interact()` still waiting."""
        for future in [self._started, *(wait.future for wait in self._acks.values())]:
            if future is not None and not future.done():
                future.set_exception(end)

    @staticmethod
    def _resolve(future: asyncio.Future | None, value: dict[str, Any]) -> None:
        if future is not None and not future.done():
            future.set_result(value)
