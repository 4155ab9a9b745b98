"""Clients for the resume and watch tests: one connection ("leg") of a resumable session that
records what the application consumed, drops its TCP connection without a close frame, and
the assembly of several legs into one continuous stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from rtvideo.core.fmp4 import init_segment, strip_init

NO_KEEPALIVE: dict[str, Any] = {"ping_interval": None}
T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout: float) -> T:
    """`awaitable`'s result within `timeout` seconds (asyncio.TimeoutError beyond), where a cancel
    always cancels. `asyncio.wait_for` of CPython 3.10 and 3.11 returns the inner result instead
    when the cancel comes in the loop turn that result arrived (CPython gh-86296, fixed in 3.12):
    a task that reads a busy stream in a loop then survives its `cancel()` and reads on, and a
    test waiting for it to end waits until its own timeout while the connection it meant to drop
    stays open (issue 39 item 8). An unfinished `awaitable` is cancelled and its cancel is through
    before this returns (websockets allows one `recv` at a time; cancelling one loses nothing)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if not done:
        raise asyncio.TimeoutError(f"nothing within {timeout:g} s")
    return task.result()


@dataclass
class Leg:
    """One connection: every message read, and the pairs whose payload was read whole."""

    conn: ClientConnection
    messages: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[tuple[dict[str, Any], bytes]] = field(default_factory=list)
    #: every message this connection sent, in order
    sent: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    async def open(cls, url: str) -> Leg:
        return cls(await connect(url, max_size=None, **NO_KEEPALIVE))

    @classmethod
    async def resumed(cls, url: str, token: str, last: int, attempts: int = 100) -> tuple[Leg, dict[str, Any]]:
        """A new connection's resume right after a drop, retried as the clients retry it: the
        proxy takes the session for attached until it has seen the old connection go (a dropped
        TCP connection is seen a moment later), and refuses a resume until then."""
        for _ in range(attempts):
            leg = await cls.open(url)
            answer = await leg.resume(token, last)
            if answer.get("code") != "invalid_resume" or "attached" not in answer.get("message", ""):
                return leg, answer
            await leg.conn.close()
            await asyncio.sleep(0.05)
        return leg, answer

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        await self.conn.send(json.dumps(message))

    async def start(self, prompt: str, **fields: Any) -> dict[str, Any]:
        await self.send({"type": "session.start", "prompt": prompt, **fields})
        return await self.read()

    async def resume(self, token: str, last: int) -> dict[str, Any]:
        await self.send({"type": "session.resume", "resume_token": token, "last_transport_chunk_index": last})
        return await self.read()

    async def interact(self, prompt: str, event_id: str, transition_chunks: int | None = None) -> None:
        interaction: dict[str, Any] = {"event_id": event_id, "event": {"prompt": prompt}}
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        await self.send({"type": "session.interaction", "interaction": interaction})

    async def read(self, timeout: float = 30.0, *, payload: bool = True) -> dict[str, Any]:
        """The next message; a metadata message's payload is read too, unless `payload` is False
        (the drop "between a metadata message and its payload"). A reading task stops at its
        `cancel()`, whenever it comes (`within`)."""
        try:
            frame = await within(self.conn.recv(), timeout)
        except ConnectionClosed as exc:  # a failure says what the server said last
            exc.add_note(f"the last messages on this connection: {self.messages[-3:]}")
            raise
        assert isinstance(frame, str), "a binary frame without its metadata"
        message = json.loads(frame)
        self.messages.append(message)
        if message["type"] == "video.chunk_metadata" and payload:
            data = await within(self.conn.recv(), timeout)
            assert isinstance(data, bytes) and len(data) == message["byte_length"]
            self.pairs.append((message, data))
        return message

    async def until(self, kind: str, timeout: float = 60.0, **match: Any) -> dict[str, Any]:
        while True:
            message = await self.read(timeout)
            if message["type"] == kind and all(message.get(k) == v for k, v in match.items()):
                return message

    async def media(self, count: int, timeout: float = 30.0) -> None:
        """Read on until `count` more media pairs were read whole (init pairs and messages between
        them are read and kept too)."""
        for _ in range(count):
            while (await self.read(timeout))["type"] != "video.chunk_metadata" or self.messages[-1]["kind"] != "media":
                pass

    async def read_to_close(self, timeout: float = 10.0) -> None:
        """Read, keeping what comes, until the connection closes (its code is `conn.close_code`)
        or nothing comes within `timeout` seconds (the code is then None)."""
        with contextlib.suppress(ConnectionClosed, asyncio.TimeoutError):
            while True:
                await self.read(timeout)

    @property
    def last_index(self) -> int:
        """The transport index of the last payload read whole (-1: none)."""
        indices = [m["transport_chunk_index"] for m, _ in self.pairs if m["transport_chunk_index"] is not None]
        return indices[-1] if indices else -1

    def drop(self) -> None:
        """Gone without a close frame: the TCP connection is aborted (RST)."""
        self.conn.transport.abort()


def media_pairs(legs: list[Leg]) -> list[tuple[dict[str, Any], bytes]]:
    """The pairs with a transport index, across legs, in order (init pairs left out)."""
    return [(m, d) for leg in legs for m, d in leg.pairs if m["kind"] != "init"]


def continuous_stream(legs: list[Leg]) -> bytes:
    """What a recorder writes: every payload once, one init segment (a replayed first payload's
    own init is dropped when an init was already written)."""
    out = bytearray()
    for _meta, data in media_pairs(legs):
        out += strip_init(data) if out and init_segment(data) else data
    return bytes(out)


def leg_stream(leg: Leg) -> bytes:
    """One resumed leg alone, as a fresh decoder sees it: its init pair, then its payloads."""
    out = bytearray()
    for meta, data in leg.pairs:
        out += strip_init(data) if out and meta["kind"] != "init" and init_segment(data) else data
    return bytes(out)
