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

The owner's seat (rtvideo.proxy.participants.seat) and the outbox in front of each socket
(rtvideo.proxy.participants.outbox) are their own modules.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from rtvideo.proxy.frames import Frame, Sink
from rtvideo.proxy.limits import TokenBucket
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.outbox import Outbox
from rtvideo.proxy.settings import ProxySettings


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
        """Queue a frame; False when the reader is too far behind (rtvideo.proxy.participants.outbox)."""
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
