"""A session's participants: each is one link (a WebSocket) with its own outbox and bounds.

The session (rtvideo.proxy.session.session) outlives its participants: the owner's connection may
drop and a resume attaches a new `Owner`; watchers (rtvideo.proxy.participants.watchers) come and go.
What a participant holds dies with its link: the outbox in front of the socket, its rate
bucket, its peer address.

- `Owner`: the connection that started the session, or took it over with a resume. Its
  frames steer the session; every reply goes to it. While its link is gone (the session is
  detached) its outbox is `Parked`: frames wait there for the next owner.
- `Steerer`: what the session's steering (rtvideo.proxy.session.steering) needs of a participant whose
  messages it takes: the owner, and the guest steerers of a steerable session
  (rtvideo.proxy.participants.steerers), each with its own bucket and outbox. A guest's answers (acks,
  pongs, errors about its own messages) go to it alone (`Guest`); the owner's go through the
  session's ordering to the owner's seat.

## The owner's seat (OwnerSeat)

The owner's seat of a session: which `Owner` participant holds it, how it changes hands,
and what is written to it.

The seat outlives its holders. When the holder's link drops, the seat keeps it, parked:
frames wait for the next holder (rtvideo.proxy.participants.Parked). A resume seats a new
owner (`hand_over`): it is given the session's video.start again, the init pair, what the
old link may have lost (from the replay buffer) and what was parked, in that order, before
anything live. Every frame a holder's socket takes passes the session's hand-out hook.

## The outbox (Outbox, Frame)

One writer per connection: frames leave in order, a metadata text frame and its binary
frame back to back, and the bytes waiting for a slow reader are bounded.

Invariant: `on_taken` sees every frame the moment it is handed to the socket, in order, and
nothing else is written; what it returns is what is written (the session completes a
`session.done` there, rtvideo.proxy.session.ledger).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.session.lifecycle import Phase, SessionPhase
from rtvideo.proxy.session.limits import TokenBucket
from rtvideo.proxy.settings import ProxySettings


class Sink(Protocol):
    """What Tornado's `WebSocketHandler` offers for writing."""

    def write_message(self, message: str | bytes, binary: bool = False) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Frame:
    """A text frame (`message` is its parsed form), or a metadata text frame with the binary
    payload that follows it."""

    text: str
    message: Mapping[str, Any] = field(compare=False)
    data: bytes | None = None
    size: int = field(init=False)  # bytes on the wire (payloads), for the buffer bound and metrics
    #: a frame sent again on a resumed connection (or a watcher's own): the session's ledger and
    #: timing saw it the first time (or never concern it), so `on_taken` passes it through
    replay: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        size = len(self.text.encode("utf-8")) + (len(self.data) if self.data is not None else 0)
        object.__setattr__(self, "size", size)


class Outbox:
    """Queues + writer coroutine; awaits Tornado's write futures, so the socket sets the pace.

    `limit` bounds the bytes queued or being written: `put` refuses a frame that would
    exceed it (the caller ends the session with `slow_consumer`). Urgent frames (acks,
    pongs: small answers a client waits for) are written before queued video, so they
    never wait behind a backlog of chunks.
    """

    def __init__(
        self, sink: Sink, limit: int, metrics: ProxyMetrics, on_taken: Callable[[Frame], Frame | None]
    ) -> None:
        """`on_taken` sees each frame as the socket takes it and returns what is written; None:
        nothing is (the frame counts as taken: the client has it already, as after a takeover
        whose store lagged the chunks in flight, rtvideo.proxy.session.session `take_over`)."""
        self._sink = sink
        self._limit = limit
        self._metrics = metrics
        self._on_taken = on_taken
        self._queue: deque[Frame] = deque()
        self._urgent: deque[Frame] = deque()
        self._pending = 0  # bytes queued or in the write in progress
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._task = asyncio.ensure_future(self._run())

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        """Queue a frame; False (nothing queued) when the reader is too far behind,
        unless `force` (the few closing messages of a session)."""
        if self._closed:
            return True  # the connection is gone: nothing to bound any more
        if not force and self._pending and self._pending + frame.size > self._limit:
            return False
        (self._urgent if urgent else self._queue).append(frame)
        self._pending += frame.size
        self._idle.clear()
        self._wake.set()
        return True

    def discard(self) -> None:
        """Drop what is still queued (not the pair being written)."""
        for queue in (self._urgent, self._queue):
            self._pending -= sum(f.size for f in queue)
            queue.clear()

    def take_unsent(self) -> list[Frame]:
        """Remove and return what is queued and not handed to the socket yet, in the order it
        would have been written (urgent first): a detached session keeps it for its next
        connection (rtvideo.proxy.participants.resume)."""
        frames = [*self._urgent, *self._queue]
        self.discard()
        return frames

    def write_now(self, frame: Frame) -> None:
        """Hand `frame` to the socket at once, behind what was handed already; call `discard` first,
        so that nothing queued is overtaken. For a session's last messages to a client that does
        not read: Tornado buffers them behind the write in progress, so a client that reads again
        before the close times out still finds them, in order. Queued instead, they would wait
        behind a write that never completes, and the close would go out without them."""
        if self._closed:
            return
        taken = self._on_taken(frame)
        if taken is None:
            return
        frame = taken
        try:
            writes = [self._sink.write_message(frame.text)]
            if frame.data is not None:
                writes.append(self._sink.write_message(frame.data, binary=True))
        except (WebSocketClosedError, StreamClosedError):
            return
        for write in writes:  # awaited by no one: a connection closed meanwhile is no error
            asyncio.ensure_future(write).add_done_callback(_consume)
        self._metrics.sent(frame.size, frame.data is not None)

    async def flush(self, timeout: float) -> bool:
        """Wait until everything queued was written; False on timeout or a closed connection."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return not self._closed

    def close(self) -> None:
        """Stop writing (the connection is gone)."""
        self._closed = True
        self._urgent.clear()
        self._queue.clear()
        self._pending = 0
        self._idle.set()
        self._task.cancel()

    async def _run(self) -> None:
        try:
            while True:
                if not (self._urgent or self._queue):
                    self._idle.set()
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                queued = (self._urgent or self._queue).popleft()
                taken = self._on_taken(queued)
                if taken is None:  # taken, not written: the client has it already
                    self._pending -= queued.size
                    continue
                frame = taken
                # Both writes are issued before any await: nothing can come between them.
                writes = [self._sink.write_message(frame.text)]
                if frame.data is not None:
                    writes.append(self._sink.write_message(frame.data, binary=True))
                for write in writes:
                    await write
                self._pending -= queued.size
                self._metrics.sent(frame.size, frame.data is not None)
        except (WebSocketClosedError, StreamClosedError):
            log.debug("connection closed while writing")
        finally:
            self._closed = True
            self._idle.set()


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Link(Sink, Protocol):
    """A participant's WebSocket: writes and a close."""

    def close(self, code: int | None = None, reason: str | None = None) -> None: ...


class Connection(Link, Protocol):
    """The owner's WebSocket (Tornado's handler): a link that can also be probed and dropped."""

    async def responsive(self, timeout: float) -> bool:
        """Whether the peer answers a WebSocket ping within `timeout` seconds."""
        ...

    def abandon(self) -> None:
        """Close the TCP connection without a close frame (the peer is gone: nothing to say)."""
        ...


class Guest(Protocol):
    """A steering participant other than the owner: what answers its own messages is written
    to it alone, and it holds its own share of the session's requests in flight."""

    def answer(self, message: Mapping[str, Any], text: str | None = None) -> None:
        """An ack, a pong or an error about one of its messages (`text`: the wire form, if known)."""
        ...

    def forwarded(self, tag: str) -> None:
        """One of its messages went to the model as request `tag` (in flight until answered)."""
        ...

    def in_flight(self, pending: Callable[[str], bool]) -> int:
        """How many of its requests are still in flight (`pending`: whether a tag still is)."""
        ...


class Steerer(Protocol):
    """A participant whose messages steer the session: its rate is its own."""

    @property
    def peer(self) -> str: ...

    @property
    def guest(self) -> Guest | None:
        """Where answers to its messages go; None for the owner (the session's ordered replies)."""
        ...

    def within_rate(self, now: float) -> bool:
        """Whether one more message fits its rate (one token of its bucket, taken)."""
        ...


class Parked:
    """A detached owner's outbox: frames wait here, never written, until a new owner takes
    them over (bounded like an outbox: a refused frame ends the session with `slow_consumer`,
    as a reader that never reads would)."""

    def __init__(self, frames: list[Frame], limit: int) -> None:
        self.frames = list(frames)
        self._limit = limit
        self._bytes = sum(f.size for f in self.frames)

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        if not force and self.frames and self._bytes + frame.size > self._limit:
            return False
        self.frames.append(frame)
        self._bytes += frame.size
        return True

    def take_unsent(self) -> list[Frame]:
        frames, self.frames, self._bytes = self.frames, [], 0
        return frames

    def discard(self) -> None:
        self.take_unsent()

    def write_now(self, frame: Frame) -> None:
        self.put(frame, force=True)

    async def flush(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.discard()


def _as_is(frame: Frame) -> Frame:
    return frame


class Owner:
    """The participant that steers a session and is handed every reply: one connection, the
    outbox in front of it (or, once the link is gone, what is parked for the next owner), and
    the bucket of its message rate."""

    def __init__(self, conn: Connection, peer: str, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        self._conn = conn
        self._peer = peer
        self._limit = settings.outbound_buffer_bytes
        self._hand_out: Callable[[Frame], Frame | None] = _as_is
        self._outlet: Outbox | Parked = Outbox(conn, self._limit, metrics, self._taken)
        self._bucket = TokenBucket(settings.max_messages_per_second, settings.message_burst, time.monotonic())
        self.gone = False  # the link dropped: frames are parked, nothing reports a close any more

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def link(self) -> Connection:
        return self._conn

    @property
    def guest(self) -> Guest | None:
        return None  # the owner's answers go through the session's ordering, to its seat

    def bind(self, hand_out: Callable[[Frame], Frame | None]) -> None:
        """`hand_out` sees every frame as the socket takes it and returns what is written (the
        session it now owns: its ledger completes a session.done there)."""
        self._hand_out = hand_out

    def _taken(self, frame: Frame) -> Frame | None:
        return self._hand_out(frame)

    def within_rate(self, now: float) -> bool:
        return self._bucket.take(now)

    def inherit_rate(self, previous: Owner) -> None:
        """A resumed owner goes on with the rate its predecessor used: a reconnect refills nothing."""
        self._bucket = previous._bucket

    # --- the outbox ---------------------------------------------------------------------------
    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        """Queue a frame; False when the reader is too far behind (rtvideo.proxy.participants.links)."""
        return self._outlet.put(frame, urgent=urgent, force=force)

    def write_now(self, frame: Frame) -> None:
        self._outlet.write_now(frame)

    async def flush(self, timeout: float) -> bool:
        return await self._outlet.flush(timeout)

    def discard(self) -> None:
        self._outlet.discard()

    def take_unsent(self) -> list[Frame]:
        return self._outlet.take_unsent()

    def close_outbox(self) -> None:
        self._outlet.close()

    # --- the link -----------------------------------------------------------------------------
    def close(self, code: int | None = None, reason: str | None = None) -> None:
        self._conn.close(code, reason)

    def park(self) -> None:
        """The link dropped: what it had not taken, and whatever comes later, waits for the next owner."""
        unsent = self._outlet.take_unsent()
        self._outlet.close()
        self._outlet = Parked(unsent, self._limit)
        self.gone = True

    async def responsive(self, timeout: float) -> bool:
        return await self._conn.responsive(timeout)

    def abandon(self) -> None:
        self._conn.abandon()


log = logging.getLogger(__name__)


class OwnerSeat:
    """The participant that owns one session now, and the writing of messages to it."""

    def __init__(self, owner: Owner, metrics: ProxyMetrics, hand_out: Callable[[Frame], Frame | None]) -> None:
        self._owner = owner
        self._metrics = metrics
        self._hand_out = hand_out  # sees every frame a holder's socket takes; returns what is written
        owner.bind(hand_out)

    @property
    def owner(self) -> Owner:
        return self._owner

    @property
    def gone(self) -> bool:
        """The holder's link dropped: nothing will report its close."""
        return self._owner.gone

    def emit(
        self,
        message: Mapping[str, Any],
        *,
        text: str | None = None,
        data: bytes | None = None,
        urgent: bool = False,
        force: bool = False,
        now: bool = False,
    ) -> bool:
        """Queue one message (a pair with `data`) for the holder; False when it reads too slowly.
        `now`: handed to the socket at once (the last messages to a reader that does not read)."""
        if message.get("type") == protocol.ERROR:
            self._metrics.errors.labels(str(message.get("code"))).inc()
        frame = Frame(text if text is not None else server_messages.encode(message), message, data)
        if now:
            self._owner.write_now(frame)
            return True
        return self._owner.put(frame, urgent=urgent, force=force)

    def park(self) -> None:
        """The holder's link dropped: what it had not taken, and whatever comes, waits."""
        self._owner.park()

    def hand_over(self, owner: Owner, start: dict[str, Any], init: Frame | None, replayed: list[Frame]) -> int:
        """`owner` takes the seat: `start`, the init pair, `replayed` (sent again: the ledger saw
        them the first time), then what was parked. Returns how many frames were parked."""
        parked = self._owner.take_unsent()
        owner.inherit_rate(self._owner)
        owner.bind(self._hand_out)
        self._owner = owner
        owner.put(Frame(server_messages.encode(start), start, replay=True), force=True)
        if init is not None:
            owner.put(init, force=True)
        for frame in replayed:
            owner.put(Frame(frame.text, frame.message, frame.data, replay=True), force=True)
        for frame in parked:
            owner.put(frame, force=True)
        return len(parked)

    async def drop_if_silent(self, timeout: float, life: SessionPhase) -> None:
        """A holder whose connection does not answer a ping within `timeout` is taken for dropped:
        its TCP connection is closed, and this waits (briefly) until the close has reached the
        session (no longer attached)."""
        owner = self._owner
        if await owner.responsive(timeout) or owner is not self._owner or life.phase is Phase.DETACHED:
            return
        log.info(
            "request_id=%s peer=%s connection silent for %.1f s: taken for dropped",
            life.request_id,
            owner.peer,
            timeout,
        )
        owner.abandon()
        for _ in range(100):  # the close reaches the session's on_disconnect through the IOLoop
            if not life.attached:
                return
            await asyncio.sleep(0.01)

    async def close_after_flush(self, flush_seconds: float, code: int = 1000) -> None:
        await self._owner.flush(flush_seconds)
        self._owner.close(code)
