"""The doors a token opens for a participant besides the owner (docs/protocol.md §9.2-9.3):
`/v1/realtime/video/watch` for a read-only watcher, `/v1/realtime/video/steer` for a guest
steerer.

Both admit alike, before the upgrade: the `--token` rules first, then a live session named by
the query's token (403 otherwise), then room for one more participant there (503 with
`Retry-After` otherwise). Once open, the session attaches the participant; what its frames do
is the door's own: a watcher may send `session.ping` (answered) and `session.playback`
(checked, dropped), anything else is `invalid_message`; a steerer's frames go to the
session's steering (rtvideo.proxy.session.steering).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Generic, TypeVar

from tornado.websocket import WebSocketHandler

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.edge.access import origin_allowed, refused_without_token
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.participants.features import Steerable, Watchable
from rtvideo.proxy.participants.links import Frame
from rtvideo.proxy.participants.steerers import GuestSteerer
from rtvideo.proxy.participants.tokens import ResumeRefused, TokenBook
from rtvideo.proxy.participants.watchers import Watcher

log = logging.getLogger(__name__)

WATCH_PATH = "/v1/realtime/video/watch"
STEER_PATH = "/v1/realtime/video/steer"

S = TypeVar("S", Watchable, Steerable)


class _GuestDoor(WebSocketHandler, Generic[S]):
    """`?{kind}_token=...`: the admission both doors share; subclasses name their book, ask
    their session for room, and attach."""

    kind = ""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.session: S | None = None

    def book(self) -> TokenBook[S]:
        raise NotImplementedError

    def refusal(self, session: S) -> str | None:
        """Why `session` takes no participant of this kind now (None: it has room)."""
        raise NotImplementedError

    def prepare(self) -> None:
        ctx = self.context
        if refused_without_token(self, ctx.settings.token, lambda reason: ctx.metrics.rejected.labels(reason).inc()):
            return
        values = self.request.query_arguments.get(f"{self.kind}_token") or [b""]
        try:
            session = self.book().find(values[-1].decode("utf-8", "replace"))
        except ResumeRefused as exc:
            log.info("peer=%s %s refused: %s", self.request.remote_ip, self.kind, exc.message)
            self.send_error(403, reason=f"Unknown or ended {self.kind} token")
            return
        why = self.refusal(session)
        if why is not None:
            log.info("peer=%s %s refused: %s", self.request.remote_ip, self.kind, why)
            self.set_header("Retry-After", "5")
            self.send_error(503, reason=f"No room for a {self.kind}er: {why}")
            return
        self.session = session

    def check_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)


class WatchHandler(_GuestDoor[Watchable]):
    """`/v1/realtime/video/watch?watch_token=...`: a read-only watcher (rtvideo.proxy.participants.watchers)."""

    kind = "watch"

    def initialize(self, context: ProxyContext) -> None:
        super().initialize(context)
        self.watcher: Watcher | None = None

    def book(self) -> TokenBook[Watchable]:
        return self.context.features.watch_tokens

    def refusal(self, session: Watchable) -> str | None:
        return session.watch_refusal()

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)
        assert self.session is not None
        self.watcher = self.session.attach_watcher(self)
        if self.watcher is None:  # the session ended since the upgrade was granted
            self.close(1000)

    def on_message(self, message: str | bytes) -> None:
        """A watcher cannot steer: ping is answered, a well-formed playhead report is taken and
        dropped (only the owner's paces the stream), anything else is an error (the watch goes on)."""
        if self.watcher is None:
            return
        try:
            decoded = protocol.decode_later(message, binary=isinstance(message, bytes))
            if decoded["type"] == protocol.PLAYBACK:
                protocol.validate_playback(decoded)
                return  # never answered, as an owner's report is not (docs/protocol.md §2.6)
        except ProtocolError as exc:
            answer = server_messages.error(exc.code, exc.message)
        else:
            if decoded["type"] == protocol.PING:
                answer = server_messages.pong()
            else:
                answer = server_messages.error(
                    ErrorCode.INVALID_MESSAGE,
                    "a watcher cannot send messages other than session.ping and session.playback",
                )
        if answer.get("type") == protocol.ERROR:
            self.context.metrics.errors.labels(str(answer["code"])).inc()  # counted as every other refusal is
        self.watcher.put(Frame(server_messages.encode(answer), answer), urgent=True, force=True)

    def on_close(self) -> None:
        if self.watcher is not None:
            self.watcher.leave()


class SteerHandler(_GuestDoor[Steerable]):
    """`/v1/realtime/video/steer?steer_token=...`: a guest steerer (rtvideo.proxy.participants.steerers)."""

    kind = "steer"

    def initialize(self, context: ProxyContext) -> None:
        super().initialize(context)
        self.steerer: GuestSteerer | None = None

    def book(self) -> TokenBook[Steerable]:
        return self.context.features.steer_tokens

    def refusal(self, session: Steerable) -> str | None:
        return session.steer_refusal()

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)  # acks must not wait for Nagle
        assert self.session is not None
        self.steerer = self.session.attach_steerer(self, str(self.request.remote_ip))
        if self.steerer is None:  # the session ended (or filled up) since the upgrade was granted
            self.close(1000, "the session has ended or has no room for a steerer")

    def on_message(self, message: str | bytes) -> Awaitable[None] | None:
        """Tornado reads the next frame only once an awaitable returned here is done."""
        if self.steerer is None or self.steerer.over or self.session is None:
            return None
        # counted by the steering, which knows a playhead report from a steer
        return self.session.steer(self.steerer, message, isinstance(message, bytes))

    def on_close(self) -> None:
        if self.steerer is not None:
            self.steerer.leave()
