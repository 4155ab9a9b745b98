"""Read-only watchers of a live session (docs/protocol.md §9.2).

A session that asked for it (`"watchable": true`) gets a `watch_token` in `video.start`.
`WebSocket /v1/realtime/video/watch?watch_token=...` then receives `video.start` (same
`request_id`, `"watcher": true`), an init pair, and every chunk pair the owner is handed
from then on, the very frames (same metadata text, same bytes), then `session.done`.

Fan-out never waits: each pair is queued on every watcher's own `Outbox` (the frame
objects are shared, nothing is copied), bounded by `--watcher-buffer-bytes`; a watcher
whose queue is full is dropped with `slow_consumer`, so it delays neither the owner nor
another watcher (the hub's invariants: rtvideo.proxy.participants.guest_hub). A watcher may
send `session.ping` (answered `session.pong`); anything else is answered with
`invalid_message` and the watch goes on (rtvideo.proxy.edge.guest_doors, the door a watcher
comes in by).
"""

from __future__ import annotations

import logging
from typing import Any

from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.guest_hub import GuestCensus, GuestHub, GuestRules, HubGuest
from rtvideo.proxy.participants.links import Link
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)

#: the watchers on this proxy now, across its sessions (bounded by --max-watchers)
WatcherCensus = GuestCensus


class Watcher(HubGuest):
    """A read-only participant: one link and its bounded outbox."""


class WatchHub(GuestHub[Watcher]):
    """The watchers of one session (bounded by --max-watchers-per-session and --max-watchers)."""

    def __init__(self, settings: ProxySettings, census: WatcherCensus, metrics: ProxyMetrics) -> None:
        rules = GuestRules(
            noun="watcher",
            per_session=settings.max_watchers_per_session,
            per_proxy=settings.max_watchers,
            closed="the session has ended",
            gauge=metrics.watchers,
            buffer_bytes=settings.watcher_buffer_bytes,
        )
        super().__init__(rules, census, metrics)

    def join(self, conn: Link, start: dict[str, Any], init: Frame | None) -> Watcher:
        """A watcher attaches: it gets `start` (the owner's video.start, marked) and the init pair
        first, then every pair from now on."""
        return self._admit(Watcher(self, conn, self._rules.buffer_bytes, self._metrics), start, init)

    def _slow(self, guest: Watcher) -> None:
        self._metrics.watchers_dropped.inc()
        log.info("a watcher was dropped: slow consumer")
