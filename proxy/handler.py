"""`/v1/realtime/video`: admission before the upgrade, then frames in and out of a `ProxySession`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tornado.websocket import WebSocketHandler

from rtvideo.proxy.access import origin_allowed, token_ok
from rtvideo.proxy.bridge import TritonBridge
from rtvideo.proxy.metrics import ProxyMetrics
from rtvideo.proxy.session import ProxySession
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.supervisor import Supervisor

log = logging.getLogger(__name__)


@dataclass
class ProxyContext:
    """What every handler of one proxy application shares."""

    settings: ProxySettings
    bridge: TritonBridge
    metrics: ProxyMetrics = field(default_factory=ProxyMetrics)
    sessions: set[ProxySession] = field(default_factory=set)
    supervisor: Supervisor = field(init=False)  # set by make_app (it needs the context)

    def backend_lost(self, reason: str) -> None:
        """The supervisor found the backend down: every live session ends with backend_unavailable."""
        for session in list(self.sessions):
            session.backend_lost(reason)


class RealtimeVideoHandler(WebSocketHandler):
    """Thin: refuses what it must before the upgrade, delegates everything else."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.session: ProxySession | None = None

    def prepare(self) -> None:
        ctx = self.context
        if not token_ok(self.request, ctx.settings.token):
            ctx.metrics.connection_rejected("unauthorized")
            self.set_header("WWW-Authenticate", 'Bearer realm="rtvideo"')
            self.send_error(401)
        elif len(ctx.sessions) >= ctx.settings.max_connections:
            ctx.metrics.connection_rejected("capacity")
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Too many connections")
        elif not ctx.supervisor.admitting:
            ctx.metrics.connection_rejected("backend_down")
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Video backend unavailable")

    def check_origin(self, origin: str) -> bool:
        allowed = origin_allowed(origin, self.context.settings.allowed_origins)
        if not allowed:
            self.context.metrics.connection_rejected("origin")
            log.info("peer=%s origin %r refused", self.request.remote_ip, origin)
        return allowed

    def open(self, *args: Any, **kwargs: Any) -> None:
        ctx = self.context
        self.set_nodelay(True)  # small messages (acks) must not wait for Nagle
        self.session = ProxySession(
            self, ctx.bridge, ctx.settings, ctx.metrics, str(self.request.remote_ip), ctx.sessions.discard
        )
        ctx.sessions.add(self.session)

    def on_message(self, message: str | bytes) -> None:
        assert self.session is not None
        self.session.on_frame(message, isinstance(message, bytes))

    def on_close(self) -> None:
        if self.session is not None:
            self.session.on_disconnect()
