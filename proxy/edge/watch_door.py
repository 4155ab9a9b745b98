"""`/v1/realtime/video/watch`: the door a watcher comes in by (docs/protocol.md §9.2).

Watching is attaching a read-only participant to a live session (rtvideo.proxy.participants.watchers):
the watch token names the session, which says whether a watcher may join
(`watch_refusal`) and attaches it once the WebSocket is open (`attach_watcher`). A watcher
may send `session.ping` (answered) and `session.playback` (checked, never answered, dropped:
a page reports its playhead whatever its role); anything else is `invalid_message`, counted in
`rtvideo_proxy_errors_total` as every refusal is.
"""

from __future__ import annotations

import logging
from typing import Any

from tornado.websocket import WebSocketHandler

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.edge import token_door
from rtvideo.proxy.edge.access import origin_allowed
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.participants.features import Watchable
from rtvideo.proxy.participants.watchers import Watcher
from rtvideo.proxy.session.outbox import Frame

log = logging.getLogger(__name__)

WATCH_PATH = "/v1/realtime/video/watch"


class WatchHandler(WebSocketHandler):
    """`/v1/realtime/video/watch?watch_token=...`: the --token rules, then a known token of a
    live session with room for a watcher (403 / 503 before the upgrade otherwise)."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.session: Watchable | None = None
        self.watcher: Watcher | None = None

    def prepare(self) -> None:
        ctx = self.context
        self.session = token_door.admit(
            self,
            bearer=ctx.settings.token,
            rejected=ctx.metrics.connection_rejected,
            book=ctx.features.watch_tokens,
            kind="watch",
            refusal=lambda session: session.watch_refusal(),
            no_room=lambda why: "No room for a watcher",
        )

    def check_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)

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
            self.context.metrics.error_sent(str(answer["code"]))  # counted as every other refusal is
        self.watcher.put(Frame(server_messages.encode(answer), answer), urgent=True, force=True)

    def on_close(self) -> None:
        if self.watcher is not None:
            self.watcher.leave()
