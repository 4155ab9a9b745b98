"""The guests of one session, of one kind: what the watchers' hub (rtvideo.proxy.participants.watchers)
and the steerers' hub (rtvideo.proxy.participants.steerers) share (docs/protocol.md §9.2, §9.3).

A guest is a participant besides the owner that is handed what the owner is handed: one link
(`HubGuest.conn`) and its own bounded `Outbox`. A `GuestHub` holds the guests of one session;
it lives as long as the session's invitation of that kind and dies with it.

Invariants:
- Joining is bounded twice: by the kind's per-session limit and by its per-proxy limit, which the
  `GuestCensus` shared by every hub of that kind on the proxy counts (`room` says why not).
  Once the hub is closed (`session.done` handed out, the session closed, or steering revoked),
  nobody joins again.
- A guest is counted (census, gauge) from its join until it is removed, exactly once:
  `_remove` is the only place that uncounts, and it marks the guest `over` first.
- Fan-out never waits: `publish` and `share` queue the very frame objects (nothing is copied)
  on each guest's outbox; a guest whose outbox is full is dropped with `slow_consumer`, so it
  delays neither the owner nor another guest. A guest that is `over` takes (and ignores) every
  frame: `put` says True.
- Each guest's last frames (`session.done`, the `slow_consumer` error) get `FLUSH_SECONDS` to
  leave before its link is closed; those closes are held in the hub's `TaskSet`.

What differs between kinds (names in messages, limits, metrics, log lines, what a guest is) is
the subclass's: `GuestRules`, `_slow` and the subclass's `join`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from prometheus_client import Gauge

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Link
from rtvideo.proxy.participants.outbox import Outbox
from rtvideo.proxy.tasks import TaskSet

#: seconds a guest's last frames (session.done, or the slow_consumer error) may take before the close
FLUSH_SECONDS = 5.0


@dataclass
class GuestCensus:
    """The guests of one kind on this proxy now, across its sessions (bounded by the kind's
    per-proxy limit, --max-watchers or --max-steerers). Its writers are that kind's hubs, on a
    join and on a removal."""

    count: int = 0


@dataclass(frozen=True)
class GuestRules:
    """What one kind of guest is called and bounded by."""

    noun: str  # "watcher", "steerer": in refusals and errors, and in the flags' names
    per_session: int  # --max-{noun}s-per-session
    per_proxy: int  # --max-{noun}s
    closed: str  # why nobody joins a closed hub
    gauge: Gauge  # the guests of this kind connected now, on this proxy
    buffer_bytes: int  # each guest's outbox bound (--watcher-buffer-bytes)


class HubGuest:
    """One guest of a hub: its link, its bounded outbox, and whether it is over (dropped,
    revoked, ended or gone: nothing more is queued for it)."""

    def __init__(self, hub: GuestHub[Any], conn: Link, limit: int, metrics: ProxyMetrics) -> None:
        self._hub = hub
        self.conn = conn
        self.outbox = Outbox(conn, limit, metrics, lambda frame: frame)
        self.over = False

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        """Queue `frame` (False: the outbox is full); a guest that is over takes it and drops it."""
        return self.over or self.outbox.put(frame, urgent=urgent, force=force)

    def leave(self) -> None:
        """Its link closed."""
        self._hub.leave(self)


G = TypeVar("G", bound=HubGuest)


class GuestHub(ABC, Generic[G]):
    """The guests of one kind of one session (see the module's invariants)."""

    def __init__(self, rules: GuestRules, census: GuestCensus, metrics: ProxyMetrics) -> None:
        self._rules = rules
        self._census = census
        self._metrics = metrics
        self._guests: list[G] = []
        self._closing = TaskSet()  # guests flushing their last bytes before their close
        self._closed = False  # nobody joins any more

    def __len__(self) -> int:
        return len(self._guests)

    def room(self) -> str | None:
        """Why no guest may join now (None: one may)."""
        rules = self._rules
        if self._closed:
            return rules.closed
        if len(self._guests) >= rules.per_session:
            return f"the session has {rules.per_session} {rules.noun}s (--max-{rules.noun}s-per-session)"
        if self._census.count >= rules.per_proxy:
            return f"this server has {rules.per_proxy} {rules.noun}s (--max-{rules.noun}s)"
        return None

    def _admit(self, guest: G, start: dict[str, Any], init: Frame | None) -> G:
        """`guest` joins (the caller checked `room`): it gets `start` (the owner's video.start,
        marked) and the init pair first, then every pair from now on."""
        # urgent: a share (or a steerer's answer) queued right after the join is urgent too, and
        # must not overtake the guest's first frames (video.start is every client's first message)
        guest.put(Frame(server_messages.encode(start), start), urgent=True, force=True)
        if init is not None:
            guest.put(init, urgent=True, force=True)
        self._guests.append(guest)
        self._census.count += 1
        self._rules.gauge.inc()
        return guest

    def leave(self, guest: G) -> None:
        """`guest`'s link closed: it goes, and so does what was queued for it."""
        self._remove(guest)
        guest.outbox.close()

    def publish(self, frame: Frame) -> None:
        """A frame handed to the owner: chunk pairs go to every guest; `session.done` too, and
        closes the hub (each guest's link closes once it is flushed)."""
        kind = frame.message.get("type")
        if kind == protocol.DONE:
            for guest in list(self._guests):
                guest.put(frame, force=True)
                self._end(guest, 1000)
            self._closed = True
            return
        if frame.data is None or kind != protocol.CHUNK_METADATA:
            return
        for guest in list(self._guests):
            if not guest.put(frame):
                self.drop(guest)

    def share(self, frame: Frame, sender: object = None) -> None:
        """An interaction acked to `sender` (`session.interaction.shared`, docs/protocol.md §9.4),
        to every other guest, ahead of its queued video, so that it precedes every chunk that
        names its event."""
        for guest in list(self._guests):
            if guest is not sender and not guest.put(frame, urgent=True):
                self.drop(guest)

    def drop(self, guest: G) -> None:
        """A guest that reads too slowly: its queue goes, the error is written at once, close."""
        if guest.over:
            return
        self._slow(guest)
        guest.outbox.discard()
        noun, limit = self._rules.noun, self._rules.buffer_bytes
        message = server_messages.error(
            ErrorCode.SLOW_CONSUMER, f"the {noun} reads too slowly: more than {limit} bytes are waiting"
        )
        guest.outbox.write_now(Frame(server_messages.encode(message), message))
        self._end(guest, 1000)

    @abstractmethod
    def _slow(self, guest: G) -> None:
        """Count (and log) `guest`'s drop for slow_consumer: the kind's metric and log line."""

    def close(self, code: int = 1000) -> None:
        """The session is over without a session.done handed out: the guests close (1012: it
        goes on at another replica, where they rejoin), and nobody joins any more."""
        self._closed = True
        for guest in list(self._guests):
            self._end(guest, code)

    def _remove(self, guest: G) -> None:
        """The one place a guest is uncounted: it is over, and out of the hub, the census and the gauge."""
        guest.over = True
        if guest in self._guests:
            self._guests.remove(guest)
            self._census.count -= 1
            self._rules.gauge.dec()

    def _end(self, guest: G, code: int) -> None:
        """`guest` goes; its link closes with `code` once its last frames are written (or after
        FLUSH_SECONDS)."""
        self._remove(guest)
        conn, outbox = guest.conn, guest.outbox

        async def close() -> None:
            await outbox.flush(FLUSH_SECONDS)
            conn.close(code)

        self._closing.spawn(close())
