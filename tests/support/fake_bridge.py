"""A `ProxySession` driven by hand: a fake WebSocket (`FakeConnection`, which can stop reading)
and a fake Triton (`FakeBridge` of `FakeStream`s, which confirm a stop like the model does),
the replies they carry, and a session wired to them. No Triton, no sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

from rtvideo.core.start_request import check_first_message
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.session import session as proxy_session
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.base import SessionStore
from rtvideo.proxy.store.keeper import StoreKeeper
from rtvideo.triton.wire import START_TAG, Reply

T = TypeVar("T")
START = json.dumps({"type": "session.start", "prompt": "a harbour"})


def run(coro: Awaitable[T], timeout: float = 20.0) -> T:
    """Run one test body on a fresh loop, bounded (nothing here waits on Triton or a socket)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))  # type: ignore[arg-type]


# --- a fake WebSocket and a fake Triton stream ---------------------------------------------------
class FakeConnection:
    """Records what the session hands to the socket (text frames as dicts); while `paused`,
    writes stay in progress (a client that does not read)."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.paused = False
        self.closed: int | None = None
        self.on_close: Callable[[], None] = lambda: None
        self._writes: list[asyncio.Future[None]] = []

    def write_message(self, message: str | bytes, binary: bool = False) -> asyncio.Future[None]:
        self.frames.append(message if binary else json.loads(message))
        future = asyncio.get_running_loop().create_future()
        self._writes.append(future)
        if not self.paused:
            self.resume()
        return future

    def resume(self) -> None:
        self.paused = False
        for future in self._writes:
            if not future.done():
                future.set_result(None)
        self._writes.clear()

    def close(self, code: int | None = None, reason: str | None = None) -> None:
        if self.closed is None:
            self.closed = code
            self.on_close()  # as Tornado calls on_close

    def texts(self) -> list[dict[str, Any]]:
        return [f for f in self.frames if isinstance(f, dict)]


class FakeStream:
    """`TritonStream` without Triton: records requests; a `sequence_end` is confirmed like the
    model does (a stopped `session.done` on the start stream) unless `auto_done` is off."""

    sequence_id = 1

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bool, bool]] = []
        self.auto_done = True
        self._replies: asyncio.Queue[Reply | None] = asyncio.Queue()

    def send(self, raw: bytes, *, start: bool = False, end: bool = False) -> str:
        self.sent.append((raw, start, end))
        if end and self.auto_done:
            self._replies.put_nowait(
                reply(START_TAG, {"type": "session.done", "request_id": "r", "chunks": 0, "stopped": True})
            )
        return START_TAG if start else f"m{len(self.sent)}"

    async def replies(self) -> AsyncIterator[Reply]:
        while (item := await self._replies.get()) is not None:
            yield item

    def close_requests(self) -> None:
        """Half-close: like Triton, the call ends once every request has completed (here: at
        once, unless the model is made not to answer the stop)."""
        if self.auto_done:
            self._replies.put_nowait(None)

    def cancel(self) -> None:
        self._replies.put_nowait(None)


class FakeBridge:
    def __init__(self) -> None:
        self.streams: list[FakeStream] = []

    def open_stream(self, patience: float = 0.0) -> FakeStream:
        self.streams.append(FakeStream())
        return self.streams[-1]


def reply(tag: str, message: dict[str, Any], data: bytes = b"") -> Reply:
    return Reply(tag, json.dumps(message), message, data)


def chunk(index: int, size: int, kind: str = "media") -> Reply:
    meta = {
        "type": "video.chunk_metadata",
        "request_id": "r",
        "kind": kind,
        "transport_chunk_index": index,
        "started_event_ids": [],
        "byte_length": size,
    }
    return reply(START_TAG, meta, b"x" * size)


VIDEO_START = reply(START_TAG, {"type": "video.start", "request_id": "r"})


class Built(NamedTuple):
    """A session built by hand (`build`), and what it is wired to."""

    session: proxy_session.ProxySession
    conn: FakeConnection  # its owner's link
    bridge: FakeBridge
    features: Features | None  # its resume, watch and steer tokens (None: a proxy without them)
    keeper: StoreKeeper | None  # its writes to a shared session store (None: one proxy alone)


def build(
    peer: str = "test",
    *,
    guests: bool = False,
    store: SessionStore | None = None,
    sid: str = "s-test",
    holder: str = "a",
    bridge: Any = None,
    **settings: Any,
) -> Built:
    """The one builder of a `ProxySession` in tests: its owner on a `FakeConnection` at `peer`, a
    `FakeBridge` for its Triton (or `bridge`), `ProxySettings(**settings)`. `guests`: with the
    proxy's `Features` (resume, watch and steer tokens), as the app gives every session. `store`:
    held by replica `holder` as `sid` in that shared store (its tokens the store's cluster's;
    guests implied). Closing the owner's link ends the session, as the socket handler does."""
    conn, bridge = FakeConnection(), FakeBridge() if bridge is None else bridge
    config, metrics = ProxySettings(**settings), ProxyMetrics()
    features = Features(config, shared=True) if store is not None else Features(config) if guests else None
    keeper = None
    if store is not None:
        assert features is not None
        for book in (features.resume_tokens, features.watch_tokens, features.steer_tokens):
            book.instance = store.cluster
        keeper = StoreKeeper(store, sid, holder, metrics.store_call, payload_bytes=config.replay_buffer_bytes)
    owner = Owner(conn, peer, config, metrics)  # type: ignore[arg-type]
    s = proxy_session.ProxySession(owner, bridge, config, metrics, lambda _: None, features, keeper)
    conn.on_close = s.on_disconnect
    return Built(s, conn, bridge, features, keeper)


def session(**settings: Any) -> tuple[proxy_session.ProxySession, FakeConnection, FakeBridge]:
    """`build` without guests: the session, its owner's link and its Triton."""
    s, conn, bridge, _, _ = build(**settings)
    return s, conn, bridge


def begin(s: proxy_session.ProxySession, raw: str = START) -> Awaitable[None] | None:
    """The session's start, as its connection hands it over (parsed by the product's rules)."""
    return s.begin(check_first_message(raw), raw.encode())


async def ended(s: proxy_session.ProxySession, conn: FakeConnection) -> None:
    """Wait for the session's own close, then for every task it started."""
    await asyncio.wait_for(s.closed.wait(), 5)
    await asyncio.wait_for(asyncio.gather(*list(s.tasks)), 5)


def kinds(frames: list[Any]) -> list[Any]:
    return [
        f"<{len(f)} bytes>"
        if isinstance(f, bytes)
        else (f["type"], f.get("transport_chunk_index", f.get("code", f.get("event_id"))))
        for f in frames
    ]


async def settle(rounds: int = 50) -> None:
    """Let everything the session has scheduled run: `rounds` turns of the event loop, counted,
    not timed (a timed sleep ends after fewer turns on a loaded machine). The fakes do no I/O,
    so a few turns take each write to the connection."""
    for _ in range(rounds):
        await asyncio.sleep(0)
