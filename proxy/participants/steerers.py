"""Guest steerers of a live session: participants besides the owner whose messages steer it
(docs/protocol.md §9.3).

A session that asked for it (`"steerable": true`) gets a `steer_token` in `video.start`.
`WebSocket /v1/realtime/video/steer?steer_token=...` (rtvideo.proxy.edge.guest_doors) then
attaches a `GuestSteerer`: it is fed what a watcher is fed (video.start marked
`"steerer": true`, an init pair, every chunk pair the owner is handed, the owner's
`session.done`), and its frames go to the session's steering (rtvideo.proxy.session.steering) with
its own rate bucket and its own share of the requests in flight. What answers its own
messages (acks, pongs, errors) is written to it alone (`answer`); the session's dispatch
routes the model's answers to it by request tag.

Fan-out never waits: every frame is queued on the steerer's own bounded `Outbox`
(`--watcher-buffer-bytes`); a steerer whose queue is full is dropped with `slow_consumer`, so
it delays neither the owner nor anyone else. The owner's `session.revoke_steering` drops every
steerer at once with close `REVOKED_CLOSE_CODE`, and the session's steer token is retired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Frame, Guest, Link, Outbox
from rtvideo.proxy.session.limits import TokenBucket
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.tasks import TaskSet

log = logging.getLogger(__name__)

#: seconds a steerer's last frames (session.done, or the slow_consumer error) may take before the close
STEER_FLUSH_SECONDS = 5.0
#: the close code of a steer link the owner revoked (`session.revoke_steering`), with REVOKED_REASON
REVOKED_CLOSE_CODE = 4001
REVOKED_REASON = "steering revoked by the owner"
#: a steerer's share of the session's --max-requests-in-flight: one steerer can never hold them all
IN_FLIGHT_SHARE = 4


def in_flight_share(settings: ProxySettings) -> int:
    """How many requests one steerer may have in flight (the session's bound holds for all together)."""
    return max(1, settings.max_requests_in_flight // IN_FLIGHT_SHARE)


@dataclass
class SteerCensus:
    """The steerers on this proxy now, across its sessions (bounded by --max-steerers)."""

    count: int = 0


class GuestSteerer:
    """A steering participant besides the owner: one link, its bounded outbox, its rate bucket,
    and the tags of its requests in flight. Satisfies `Steerer` and `Guest` (rtvideo.proxy.participants.links)."""

    def __init__(self, hub: SteerHub, conn: Link, peer: str, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        self._hub = hub
        self.conn = conn
        self._peer = peer
        self._metrics = metrics
        self.outbox = Outbox(conn, settings.watcher_buffer_bytes, metrics, lambda frame: frame)
        self._bucket = TokenBucket(settings.max_messages_per_second, settings.message_burst, time.monotonic())
        self._tags: set[str] = set()
        self.over = False  # dropped, revoked, ended or gone: nothing more is queued

    @property
    def peer(self) -> str:
        return self._peer

    @property
    def guest(self) -> Guest:
        return self

    def within_rate(self, now: float) -> bool:
        return self._bucket.take(now)

    def forwarded(self, tag: str) -> None:
        self._tags.add(tag)

    def in_flight(self, pending: Callable[[str], bool]) -> int:
        self._tags = {tag for tag in self._tags if pending(tag)}
        return len(self._tags)

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        return self.over or self.outbox.put(frame, urgent=urgent, force=force)

    def answer(self, message: Mapping[str, Any], text: str | None = None) -> None:
        """An answer to one of its own messages: ahead of queued video, bounded like it."""
        if self.over:
            return
        if message.get("type") == protocol.ERROR:
            self._metrics.errors.labels(str(message.get("code"))).inc()
        frame = Frame(text if text is not None else server_messages.encode(message), message)
        if not self.outbox.put(frame, urgent=True):
            self._hub.drop(self)

    def leave(self) -> None:
        """Its link closed."""
        self._hub.leave(self)


class SteerHub:
    """The guest steerers of one session."""

    def __init__(self, settings: ProxySettings, census: SteerCensus, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._census = census
        self._metrics = metrics
        self._steerers: list[GuestSteerer] = []
        self._closing = TaskSet()  # steerers flushing their last bytes before their close
        self._closed = False  # the session ended, or its steering was revoked: nobody joins any more

    def __len__(self) -> int:
        return len(self._steerers)

    def room(self) -> str | None:
        """Why no steerer may join now (None: one may)."""
        if self._closed:
            return "the session has ended or its steering was revoked"
        if len(self._steerers) >= self._settings.max_steerers_per_session:
            return f"the session has {self._settings.max_steerers_per_session} steerers (--max-steerers-per-session)"
        if self._census.count >= self._settings.max_steerers:
            return f"this server has {self._settings.max_steerers} steerers (--max-steerers)"
        return None

    def join(self, conn: Link, peer: str, start: dict[str, Any], init: Frame | None) -> GuestSteerer:
        """A steerer attaches: it gets `start` (the owner's video.start, marked) and the init pair
        first, then every pair from now on, and the answers to its own messages."""
        steerer = GuestSteerer(self, conn, peer, self._settings, self._metrics)
        # Urgent, as its answers are: an answer to a message sent right after the upgrade must
        # not overtake them (urgent frames keep their order, and go before queued video).
        steerer.put(Frame(server_messages.encode(start), start), urgent=True, force=True)
        if init is not None:
            steerer.put(init, urgent=True, force=True)
        self._steerers.append(steerer)
        self._census.count += 1
        self._metrics.steerers.inc()
        log.info("peer=%s steerer joined (%d on the session)", peer, len(self._steerers))
        return steerer

    def leave(self, steerer: GuestSteerer) -> None:
        self._remove(steerer)
        steerer.outbox.close()

    def publish(self, frame: Frame) -> None:
        """A frame handed to the owner: chunk pairs go to every steerer; `session.done` too, and
        ends the steering."""
        kind = frame.message.get("type")
        if kind == protocol.DONE:
            for steerer in list(self._steerers):
                steerer.put(frame, force=True)
                self._end(steerer, 1000)
            self._closed = True
            return
        if frame.data is None or kind != protocol.CHUNK_METADATA:
            return
        for steerer in list(self._steerers):
            if not steerer.put(frame):
                self.drop(steerer)

    def share(self, frame: Frame, sender: object = None) -> None:
        """An interaction acked to `sender` (`session.interaction.shared`, docs/protocol.md §9.4),
        to every other steerer, ahead of its queued video."""
        for steerer in list(self._steerers):
            if steerer is not sender and not steerer.put(frame, urgent=True):
                self.drop(steerer)

    def drop(self, steerer: GuestSteerer) -> None:
        """A steerer that reads too slowly: its queue goes, the error is written at once, close."""
        if steerer.over:
            return
        self._metrics.steerers_dropped.labels("slow_consumer").inc()
        steerer.outbox.discard()
        limit = self._settings.watcher_buffer_bytes
        message = server_messages.error(
            ErrorCode.SLOW_CONSUMER, f"the steerer reads too slowly: more than {limit} bytes are waiting"
        )
        steerer.outbox.write_now(Frame(server_messages.encode(message), message))
        log.info("peer=%s a steerer was dropped: slow consumer", steerer.peer)
        self._end(steerer, 1000)

    def revoke(self) -> int:
        """The owner revoked steering: every steerer is closed with REVOKED_CLOSE_CODE (what was
        queued for it is dropped), and nobody joins any more. Returns how many were closed."""
        self._closed = True
        revoked = list(self._steerers)
        for steerer in revoked:
            self._metrics.steerers_dropped.labels("revoked").inc()
            self._remove(steerer)
            steerer.outbox.close()
            steerer.conn.close(REVOKED_CLOSE_CODE, REVOKED_REASON)
        if revoked:
            log.info("%d steerer(s) revoked by the owner", len(revoked))
        return len(revoked)

    def _remove(self, steerer: GuestSteerer) -> None:
        steerer.over = True
        if steerer in self._steerers:
            self._steerers.remove(steerer)
            self._census.count -= 1
            self._metrics.steerers.dec()

    def _end(self, steerer: GuestSteerer, code: int) -> None:
        self._remove(steerer)
        conn, outbox = steerer.conn, steerer.outbox

        async def close() -> None:
            await outbox.flush(STEER_FLUSH_SECONDS)
            conn.close(code)

        self._closing.spawn(close())

    def close(self, code: int = 1000) -> None:
        """The session is over without a session.done handed out: the steerers close (1012: it
        goes on at another replica, where they rejoin)."""
        self._closed = True
        for steerer in list(self._steerers):
            self._end(steerer, code)
