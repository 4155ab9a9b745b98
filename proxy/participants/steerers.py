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
it delays neither the owner nor anyone else (the hub's invariants:
rtvideo.proxy.participants.guest_hub). The owner's `session.revoke_steering` drops every
steerer at once with close `REVOKED_CLOSE_CODE`, and the session's steer token is retired.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.limits import TokenBucket
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.guest_hub import GuestCensus, GuestHub, GuestRules, HubGuest
from rtvideo.proxy.participants.links import Guest, Link
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)

#: the close code of a steer link the owner revoked (`session.revoke_steering`), with REVOKED_REASON
REVOKED_CLOSE_CODE = 4001
REVOKED_REASON = "steering revoked by the owner"
#: a steerer's share of the session's --max-requests-in-flight: one steerer can never hold them all
IN_FLIGHT_SHARE = 4


def in_flight_share(settings: ProxySettings) -> int:
    """How many requests one steerer may have in flight (the session's bound holds for all together)."""
    return max(1, settings.max_requests_in_flight // IN_FLIGHT_SHARE)


#: the steerers on this proxy now, across its sessions (bounded by --max-steerers)
SteerCensus = GuestCensus


class GuestSteerer(HubGuest):
    """A steering participant besides the owner: one link, its bounded outbox, its rate bucket,
    and the tags of its requests in flight. Satisfies `Steerer` and `Guest` (rtvideo.proxy.participants.links)."""

    def __init__(self, hub: SteerHub, conn: Link, peer: str, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        super().__init__(hub, conn, settings.watcher_buffer_bytes, metrics)
        self._peer = peer
        self._metrics = metrics
        self._bucket = TokenBucket(settings.max_messages_per_second, settings.message_burst, time.monotonic())
        self._tags: set[str] = set()

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

    def answer(self, message: Mapping[str, Any], text: str | None = None) -> None:
        """An answer to one of its own messages: ahead of queued video, bounded like it."""
        if self.over:
            return
        if message.get("type") == protocol.ERROR:
            self._metrics.errors.labels(str(message.get("code"))).inc()
        frame = Frame(text if text is not None else server_messages.encode(message), message)
        if not self.outbox.put(frame, urgent=True):
            self._hub.drop(self)


class SteerHub(GuestHub[GuestSteerer]):
    """The guest steerers of one session (bounded by --max-steerers-per-session and --max-steerers)."""

    def __init__(self, settings: ProxySettings, census: SteerCensus, metrics: ProxyMetrics) -> None:
        rules = GuestRules(
            noun="steerer",
            per_session=settings.max_steerers_per_session,
            per_proxy=settings.max_steerers,
            closed="the session has ended or its steering was revoked",
            gauge=metrics.steerers,
            buffer_bytes=settings.watcher_buffer_bytes,
        )
        super().__init__(rules, census, metrics)
        self._settings = settings

    def join(self, conn: Link, peer: str, start: dict[str, Any], init: Frame | None) -> GuestSteerer:
        """A steerer attaches: it gets `start` (the owner's video.start, marked) and the init pair
        first, then every pair from now on, and the answers to its own messages."""
        steerer = self._admit(GuestSteerer(self, conn, peer, self._settings, self._metrics), start, init)
        log.info("peer=%s steerer joined (%d on the session)", peer, len(self))
        return steerer

    def _slow(self, guest: GuestSteerer) -> None:
        self._metrics.steerers_dropped.labels("slow_consumer").inc()
        log.info("peer=%s a steerer was dropped: slow consumer", guest.peer)

    def revoke(self) -> int:
        """The owner revoked steering: every steerer is closed with REVOKED_CLOSE_CODE (what was
        queued for it is dropped), and nobody joins any more. Returns how many were closed."""
        self._closed = True
        revoked = list(self._guests)
        for steerer in revoked:
            self._metrics.steerers_dropped.labels("revoked").inc()
            self._remove(steerer)
            steerer.outbox.close()
            steerer.conn.close(REVOKED_CLOSE_CODE, REVOKED_REASON)
        if revoked:
            log.info("%d steerer(s) revoked by the owner", len(revoked))
        return len(revoked)
