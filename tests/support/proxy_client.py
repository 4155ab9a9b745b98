"""Clients of a proxy for the tests: a raw WebSocket session that checks framing and records a
Transcript, the answers to one first message, and the HTTP status of an upgrade or a GET."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.proxy_host import run
from tests.support.streams import Transcript


class Ws:
    """A client connection recording a Transcript; a metadata text frame must be followed
    immediately by its binary frame (read here as one step)."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.t = Transcript()

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        await self.conn.send(json.dumps(message) if isinstance(message, dict) else message)

    async def start(self, prompt: str = "a harbour", **fields: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", "prompt": prompt, **fields})
        start = await self.next()
        assert start["type"] == "video.start", start
        return start

    async def interact(self, prompt: str, event_id: str, transition_chunks: int | None = None) -> None:
        interaction: dict[str, Any] = {"event_id": event_id, "event": {"prompt": prompt}}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        await self.send({"type": "session.interaction", "interaction": interaction})

    async def next(self, timeout: float = 30.0) -> dict[str, Any]:
        frame = await asyncio.wait_for(self.conn.recv(), timeout)
        assert isinstance(frame, str), "a binary frame without its metadata"
        message = json.loads(frame)
        data = b""
        if message["type"] == "video.chunk_metadata":
            data = await asyncio.wait_for(self.conn.recv(), timeout)
            assert isinstance(data, bytes), f"metadata followed by {data!r} instead of its payload"
            assert len(data) == message["byte_length"]
        self.t.add(message, data)
        return message

    async def until(self, match: str | Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """Read until a message of type `match` (a type name) or one `match` accepts; that message."""
        accepts = (lambda m: m["type"] == match) if isinstance(match, str) else match
        deadline = time.monotonic() + timeout
        while True:
            message = await self.next(max(0.01, deadline - time.monotonic()))
            if accepts(message):
                return message

    async def next_media(self) -> dict[str, Any]:
        return await self.until(lambda m: m["type"] == "video.chunk_metadata" and m["kind"] == "media")

    async def finish(self, timeout: float = 60.0) -> Transcript:
        """Read to `session.done`, then expect a normal close (1000) and nothing in between."""
        await self.until(lambda m: m["type"] == "session.done", timeout)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(self.conn.recv(), 10)
        assert self.conn.close_code == 1000
        return self.t


#: The tests' clients read only when a test awaits a message, so their receive queue may fill and
#: pause the socket's reads, pongs included: websockets' own keep-alive would then close a healthy
#: connection (1011) on a slow machine. Nothing here tests the client's keep-alive.
NO_KEEPALIVE: dict[str, Any] = {"ping_interval": None}


def ws(url: str, **kwargs: Any) -> Any:
    return connect(url, max_size=None, proxy=None, open_timeout=10, **{**NO_KEEPALIVE, **kwargs})


async def first_message_answers(url: str, first: Any, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Send one first message; read the two answers (an error, then session.done) and the 1000 close."""
    async with ws(url) as conn:
        s = Ws(conn)
        await s.send(first)
        messages = [await s.next(timeout), await s.next(timeout)]
        with pytest.raises(ConnectionClosed):
            await conn.recv()
        assert conn.close_code == 1000
        return messages


def is_error(code: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["type"] == "error" and m["code"] == code


def status_of(url: str, **kwargs: Any) -> int:
    """The HTTP status of a WebSocket upgrade to `url` (101 when accepted, 0 when refused)."""

    async def body() -> int:
        try:
            async with ws(url, **kwargs):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code
        except OSError:
            return 0  # refused: nothing listens

    return run(body(), 30)


def http_status(port: int, path: str, host: str) -> int:
    """The status of a GET of `path` on 127.0.0.1:`port` naming `host` in its Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()
