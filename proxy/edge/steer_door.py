"""`/v1/realtime/video/steer`: the door a guest steerer comes in by (docs/protocol.md §9.3).

Steering is attaching a participant to a live session (rtvideo.proxy.participants.steerers) whose frames
go to the session's steering: the steer token names the session, which says whether a
steerer may join (`steer_refusal`), attaches it once the WebSocket is open
(`attach_steerer`), and takes each of its frames (`steer`). The admission is the watch
door's (rtvideo.proxy.edge.token_door): the `--token` rules first, then 403 for an unknown or
ended token, 503 with the reason when a bound is reached.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any

from tornado.websocket import WebSocketHandler

from rtvideo.proxy.edge import token_door
from rtvideo.proxy.edge.access import origin_allowed
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.participants.features import Steerable
from rtvideo.proxy.participants.steerers import GuestSteerer

log = logging.getLogger(__name__)

STEER_PATH = "/v1/realtime/video/steer"


class SteerHandler(WebSocketHandler):
    """`/v1/realtime/video/steer?steer_token=...`: the --token rules, then a known token of a
    live session with room for a steerer (403 / 503 before the upgrade otherwise)."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.session: Steerable | None = None
        self.steerer: GuestSteerer | None = None

    def prepare(self) -> None:
        ctx = self.context
        self.session = token_door.admit(
            self,
            bearer=ctx.settings.token,
            rejected=ctx.metrics.connection_rejected,
            book=ctx.features.steer_tokens,
            kind="steer",
            refusal=lambda session: session.steer_refusal(),
            no_room=lambda why: f"No room for a steerer: {why}",
        )

    def check_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)

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
        # counted by the steering (rtvideo.proxy.session.steering), which knows a playhead report from a steer
        return self.session.steer(self.steerer, message, isinstance(message, bytes))

    def on_close(self) -> None:
        if self.steerer is not None:
            self.steerer.leave()
