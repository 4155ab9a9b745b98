"""Read-only watchers of a live session (docs/protocol.md §9.2).

A session that asked for it (`"watchable": true`) gets a `watch_token` in `video.start`.
`WebSocket /v1/realtime/video/watch?watch_token=...` then receives `video.start` (same
`request_id`, `"watcher": true`), an init pair, and every chunk pair the owner is handed
from then on, the very frames (same metadata text, same bytes), then `session.done`.

Fan-out never waits: each pair is queued on every watcher's own `Outbox` (the frame
objects are shared, nothing is copied), bounded by `--watcher-buffer-bytes`; a watcher
whose queue is full is dropped with `slow_consumer`, so it delays neither the owner nor
another watcher. A watcher may send `session.ping` (answered `session.pong`); anything
else is answered with `invalid_message` and the watch goes on (rtvideo.proxy.edge.guest_doors,
the door a watcher comes in by).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Frame, Link, Outbox
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.tasks import TaskSet

log = logging.getLogger(__name__)

#: seconds a watcher's last frames (session.done, or the slow_consumer error) may take before the close
WATCH_FLUSH_SECONDS = 5.0


@dataclass
class WatcherCensus:
    """The watchers on this proxy now, across its sessions (bounded by --max-watchers)."""

    count: int = 0


class Watcher:
    """A read-only participant: one link and its bounded outbox."""

    def __init__(self, hub: WatchHub, conn: Link, limit: int, metrics: ProxyMetrics) -> None:
        self._hub = hub
        self.conn = conn
        self.outbox = Outbox(conn, limit, metrics, lambda frame: frame)
        self.over = False  # dropped, ended or gone: nothing more is queued

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        return self.over or self.outbox.put(frame, urgent=urgent, force=force)

    def leave(self) -> None:
        """Its link closed."""
        self._hub.leave(self)


class WatchHub:
    """The watchers of one session."""

    def __init__(self, settings: ProxySettings, census: WatcherCensus, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._census = census
        self._metrics = metrics
        self._watchers: list[Watcher] = []
        self._closing = TaskSet()  # watchers flushing their last bytes before their close
        self._closed = False

    def __len__(self) -> int:
        return len(self._watchers)

    def room(self) -> str | None:
        """Why no watcher may join now (None: one may)."""
        if self._closed:
            return "the session has ended"
        if len(self._watchers) >= self._settings.max_watchers_per_session:
            return f"the session has {self._settings.max_watchers_per_session} watchers (--max-watchers-per-session)"
        if self._census.count >= self._settings.max_watchers:
            return f"this server has {self._settings.max_watchers} watchers (--max-watchers)"
        return None

    def join(self, conn: Link, start: dict[str, Any], init: Frame | None) -> Watcher:
        """A watcher attaches: it gets `start` (the owner's video.start, marked) and the init pair
        first, then every pair from now on."""
        watcher = Watcher(self, conn, self._settings.watcher_buffer_bytes, self._metrics)
        watcher.put(Frame(server_messages.encode(start), start), force=True)
        if init is not None:
            watcher.put(init, force=True)
        self._watchers.append(watcher)
        self._census.count += 1
        self._metrics.watchers.inc()
        return watcher

    def leave(self, watcher: Watcher) -> None:
        watcher.over = True
        if watcher in self._watchers:
            self._watchers.remove(watcher)
            self._census.count -= 1
            self._metrics.watchers.dec()
        watcher.outbox.close()

    def publish(self, frame: Frame) -> None:
        """A frame handed to the owner: chunk pairs go to every watcher; `session.done` too, and
        ends the watch."""
        kind = frame.message.get("type")
        if kind == protocol.DONE:
            for watcher in list(self._watchers):
                watcher.put(frame, force=True)
                self._end(watcher, 1000)
            self._closed = True
            return
        if frame.data is None or kind != protocol.CHUNK_METADATA:
            return
        for watcher in list(self._watchers):
            if not watcher.put(frame):
                self._drop(watcher)

    def share(self, frame: Frame, sender: object = None) -> None:
        """Another participant's interaction (`session.interaction.shared`, docs/protocol.md §9.4):
        ahead of queued video, so that it precedes every chunk that names its event."""
        for watcher in list(self._watchers):
            if not watcher.put(frame, urgent=True):
                self._drop(watcher)

    def _drop(self, watcher: Watcher) -> None:
        """A watcher that reads too slowly: its queue goes, the error is written at once, close."""
        self._metrics.watchers_dropped.inc()
        watcher.outbox.discard()
        limit = self._settings.watcher_buffer_bytes
        message = server_messages.error(
            ErrorCode.SLOW_CONSUMER, f"the watcher reads too slowly: more than {limit} bytes are waiting"
        )
        watcher.outbox.write_now(Frame(server_messages.encode(message), message))
        log.info("a watcher was dropped: slow consumer")
        self._end(watcher, 1000)

    def _end(self, watcher: Watcher, code: int) -> None:
        watcher.over = True
        if watcher in self._watchers:
            self._watchers.remove(watcher)
            self._census.count -= 1
            self._metrics.watchers.dec()
        conn = watcher.conn

        async def close() -> None:
            await watcher.outbox.flush(WATCH_FLUSH_SECONDS)
            conn.close(code)

        self._closing.spawn(close())

    def close(self, code: int = 1000) -> None:
        """The session is over without a session.done handed out: the watchers close (1012: it
        goes on at another replica, where they rejoin)."""
        self._closed = True
        for watcher in list(self._watchers):
            self._end(watcher, code)
