"""Read-only watchers of a live session (docs/protocol.md §9.2).

A session that asked for it (`"watchable": true`) gets a `watch_token` in `video.start`.
`WebSocket /v1/realtime/video/watch?watch_token=...` then receives `video.start` (same
`request_id`, `"watcher": true`), an init pair, and every chunk pair the owner is handed
from then on, the very frames (same metadata text, same bytes), then `session.done`.

Fan-out never waits: each pair is queued on every watcher's own `Outbox` (the frame
objects are shared, nothing is copied), bounded by `--watcher-buffer-bytes`; a watcher
whose queue is full is dropped with `slow_consumer`, so it delays neither the owner nor
another watcher. A watcher may send `session.ping` (answered `session.pong`); anything
else is answered with `invalid_message` and the watch goes on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tornado.websocket import WebSocketHandler

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.access import origin_allowed, refused_without_token
from rtvideo.proxy.metrics import ProxyMetrics
from rtvideo.proxy.outbox import Frame, Outbox
from rtvideo.proxy.resume import Features, ResumeRefused
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.tasks import TaskSet

if TYPE_CHECKING:
    from rtvideo.proxy.handler import ProxyContext

log = logging.getLogger(__name__)

WATCH_PATH = "/v1/realtime/video/watch"
#: seconds a watcher's last frames (session.done, or the slow_consumer error) may take before the close
WATCH_FLUSH_SECONDS = 5.0


class Watcher:
    """One watcher's connection and its bounded outbox."""

    def __init__(self, conn: WebSocketHandler, limit: int, metrics: ProxyMetrics) -> None:
        self.conn = conn
        self.outbox = Outbox(conn, limit, metrics, lambda frame: frame)
        self.over = False  # dropped, ended or gone: nothing more is queued

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        return self.over or self.outbox.put(frame, urgent=urgent, force=force)


class WatchHub:
    """The watchers of one session."""

    def __init__(self, settings: ProxySettings, features: Features, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._features = features
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
        if self._features.watchers >= self._settings.max_watchers:
            return f"this server has {self._settings.max_watchers} watchers (--max-watchers)"
        return None

    def join(self, conn: WebSocketHandler, start: dict[str, Any], init: Frame | None) -> Watcher:
        watcher = Watcher(conn, self._settings.watcher_buffer_bytes, self._metrics)
        watcher.put(Frame(protocol.encode(start), start), force=True)
        if init is not None:
            watcher.put(init, force=True)
        self._watchers.append(watcher)
        self._features.watchers += 1
        self._metrics.watcher_joined(1)
        return watcher

    def leave(self, watcher: Watcher) -> None:
        watcher.over = True
        if watcher in self._watchers:
            self._watchers.remove(watcher)
            self._features.watchers -= 1
            self._metrics.watcher_joined(-1)
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

    def _drop(self, watcher: Watcher) -> None:
        """A watcher that reads too slowly: its queue goes, the error is written at once, close."""
        self._metrics.watcher_dropped()
        watcher.outbox.discard()
        limit = self._settings.watcher_buffer_bytes
        message = protocol.error(
            ErrorCode.SLOW_CONSUMER, f"the watcher reads too slowly: more than {limit} bytes are waiting"
        )
        watcher.outbox.write_now(Frame(protocol.encode(message), message))
        log.info("a watcher was dropped: slow consumer")
        self._end(watcher, 1000)

    def _end(self, watcher: Watcher, code: int) -> None:
        watcher.over = True
        if watcher in self._watchers:
            self._watchers.remove(watcher)
            self._features.watchers -= 1
            self._metrics.watcher_joined(-1)
        conn = watcher.conn

        async def close() -> None:
            await watcher.outbox.flush(WATCH_FLUSH_SECONDS)
            conn.close(code)

        self._closing.spawn(close())

    def close(self) -> None:
        """The session is over without a session.done handed out: the watchers close."""
        self._closed = True
        for watcher in list(self._watchers):
            self._end(watcher, 1000)


class WatchHandler(WebSocketHandler):
    """`/v1/realtime/video/watch?watch_token=...`: the --token rules, then a known token of a
    live session with room for a watcher (403 / 503 before the upgrade otherwise)."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.hub: WatchHub | None = None
        self.watcher: Watcher | None = None
        self._start: dict[str, Any] | None = None
        self._init: Frame | None = None

    def prepare(self) -> None:
        ctx = self.context
        if refused_without_token(self, ctx.settings.token, ctx.metrics.connection_rejected):
            return
        values = self.request.query_arguments.get("watch_token") or [b""]
        token = values[-1].decode("utf-8", "replace")
        try:
            session = ctx.features.watch_tokens.find(token)
        except ResumeRefused as exc:
            log.info("peer=%s watch refused: %s", self.request.remote_ip, exc.message)
            self.send_error(403, reason="Unknown or ended watch token")
            return
        hub, start = session.watch_hub, session.watcher_start()
        why = "the session has ended" if hub is None or start is None else hub.room()
        if why is not None or hub is None or start is None:
            log.info("peer=%s watch refused: %s", self.request.remote_ip, why)
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="No room for a watcher")
            return
        self.hub, self._start, self._init = hub, start, session.init_frame()

    def check_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)
        assert self.hub is not None and self._start is not None
        self.watcher = self.hub.join(self, self._start, self._init)

    def on_message(self, message: str | bytes) -> None:
        """A watcher cannot steer: ping is answered, anything else is an error (the watch goes on)."""
        if self.watcher is None:
            return
        try:
            kind = protocol.decode_later(message, binary=isinstance(message, bytes))["type"]
        except ProtocolError as exc:
            answer = protocol.error(exc.code, exc.message)
        else:
            if kind == protocol.PING:
                answer = protocol.pong()
            else:
                answer = protocol.error(
                    ErrorCode.INVALID_MESSAGE, "a watcher cannot send messages other than session.ping"
                )
        self.watcher.put(Frame(protocol.encode(answer), answer), urgent=True, force=True)

    def on_close(self) -> None:
        if self.hub is not None and self.watcher is not None:
            self.hub.leave(self.watcher)
