"""`/v1/realtime/video`: admission before the upgrade, then frames in and out of a `ProxySession`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from tornado.websocket import WebSocketClosedError, WebSocketHandler, WebSocketProtocol, WebSocketProtocol13

from rtvideo.core import resume
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.edge.access import client_of, origin_allowed, refused_without_token
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.resume import Features, drop_silent_owner, take_over
from rtvideo.proxy.placement.pool import EndpointPool
from rtvideo.proxy.placement.supervisor import BackendState
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.settings import AWAITING_START_GRACE_SECONDS, ProxySettings

log = logging.getLogger(__name__)


@dataclass
class ProxyContext:
    """What every handler of one proxy application shares."""

    settings: ProxySettings
    metrics: ProxyMetrics
    pool: EndpointPool  # the Triton endpoints, their health, and where a new session goes
    sessions: set[ProxySession] = field(default_factory=set)
    draining: bool = False  # shutting down: no new session (ProxyServer.drain)
    features: Features = field(init=False)  # resume tokens and watchers (rtvideo.proxy.participants.resume)

    def __post_init__(self) -> None:
        self.features = Features(self.settings)


class RealtimeVideoHandler(WebSocketHandler):
    """Thin: refuses what it must before the upgrade, delegates everything else."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.session: ProxySession | None = None
        self.client = str(self.request.remote_ip)  # the client address (a trusted proxy's report), set in prepare
        self._pong: asyncio.Event | None = None  # set by the pong of the latest `responsive` ping

    def prepare(self) -> None:
        ctx = self.context
        self.client = client_of(self.request, ctx.settings.trusted_proxies)
        if refused_without_token(self, ctx.settings.token, ctx.metrics.connection_rejected):
            return
        if ctx.draining:
            ctx.metrics.connection_rejected("draining")
            self.set_header("Retry-After", "1")
            self.send_error(503, reason="Server shutting down")
        elif len(_attached(ctx.sessions)) >= ctx.settings.max_connections:
            ctx.metrics.connection_rejected("capacity")
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Too many connections")
        elif not ctx.pool.admitting:
            busy = ctx.pool.state is BackendState.BUSY  # alive, every sequence slot held
            ctx.metrics.connection_rejected("backend_busy" if busy else "backend_down")
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Video backend busy" if busy else "Video backend unavailable")
        elif not self._room_to_wait():
            ctx.metrics.connection_rejected("awaiting_start")
            self.set_header("Retry-After", "1")
            self.send_error(503, reason="Too many connections waiting to start")

    def _room_to_wait(self) -> bool:
        """Whether this connection may join those waiting for their session.start: they are at
        most `awaiting_start_bound` (a share of --max-connections), so connections that never
        start cannot take every slot. When the share is full, the one that waited longest takes
        its leave if it waited over AWAITING_START_GRACE_SECONDS (a real client starts at once):
        holding the share then costs a client a new upgrade for each place every grace period."""
        ctx = self.context
        waiting = [s for s in ctx.sessions if s.awaiting_start]
        if len(waiting) < ctx.settings.awaiting_start_bound:
            return True
        oldest = max(waiting, key=lambda s: s.waited)
        if oldest.waited < AWAITING_START_GRACE_SECONDS:
            return False
        log.info("peer=%s displaced after %.1f s without session.start", oldest.peer, oldest.waited)
        oldest.displace()
        return True

    def check_origin(self, origin: str) -> bool:
        allowed = origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)
        if not allowed:
            self.context.metrics.connection_rejected("origin")
            log.info("peer=%s origin %r refused", self.request.remote_ip, origin)
        return allowed

    def open(self, *args: Any, **kwargs: Any) -> None:
        ctx = self.context
        self.set_nodelay(True)  # small messages (acks) must not wait for Nagle
        self.session = ProxySession(
            self, ctx.pool, ctx.settings, ctx.metrics, self.client, ctx.sessions.discard, ctx.features
        )
        ctx.sessions.add(self.session)

    def get_websocket_protocol(self) -> WebSocketProtocol | None:
        """Tornado's own choice of protocol and parameters, built as `_StrictTextProtocol`."""
        built = super().get_websocket_protocol()
        if type(built) is not WebSocketProtocol13:  # no upgrade (unsupported version): Tornado answers
            return built
        return _StrictTextProtocol(self, mask_outgoing=False, params=built.params)

    def on_invalid_text(self) -> None:
        """A text frame that is not UTF-8 (RFC 6455 §8.1): the session ends with close 1007."""
        if self.session is not None:
            self.session.on_invalid_text()
        else:
            self.close(1007, "text frames must be UTF-8")

    def on_message(self, message: str | bytes) -> Awaitable[None] | None:
        """Tornado reads the next frame only once an awaitable returned here is done."""
        assert self.session is not None
        binary = isinstance(message, bytes)
        if self.session.awaiting_start:
            if resume.is_resume(message, binary=binary):
                return self._resume(message)  # its session is counted already: no share is asked
            if (over := self._over_share()) is not None:
                self.context.metrics.connection_rejected("per_client")
                self.session.refuse_start(ErrorCode.SERVER_BUSY, over)
                return None
        return self.session.on_frame(message, binary)

    def _over_share(self) -> str | None:
        """Why a new session of this client would pass its address's share of the model's slots
        (`ProxySettings.sessions_per_client`), or None. Asked when a connection becomes a session,
        not at the upgrade: a connection that resumes a session of its own needs no new share."""
        ctx = self.context
        share = ctx.settings.sessions_per_client(ctx.pool.known_slots)
        held = sum(1 for s in ctx.sessions if s.peer == self.client and s is not self.session and not s.awaiting_start)
        if held < share:
            return None
        return (
            f"this client address holds {held} session(s), its share of the model's slots "
            f"({share}, --max-sessions-per-client); end one first"
        )

    async def _resume(self, message: str | bytes) -> None:
        await drop_silent_owner(self.context.features, message)
        assert self.session is not None
        self.session = take_over(self.context.features, self.session, self, message)

    async def responsive(self, timeout: float) -> bool:
        """A ping, and whether its pong comes within `timeout` (the session's connection check)."""
        pong = self._pong = asyncio.Event()
        try:
            self.ping(b"rtvideo")
            await asyncio.wait_for(pong.wait(), timeout)
        except (WebSocketClosedError, asyncio.TimeoutError):
            return False
        return True

    def on_pong(self, data: bytes) -> None:
        if self._pong is not None:
            self._pong.set()

    def abandon(self) -> None:
        """The TCP connection closed at once, no close frame (`on_close` follows, as for a drop)."""
        if self.ws_connection is not None and self.ws_connection.stream is not None:
            self.ws_connection.stream.close()

    def on_close(self) -> None:
        if self.session is not None:  # without a close frame, or not 1000: a resumable session detaches
            self.session.on_disconnect(dropped=self.close_code != 1000)


def _attached(sessions: set[ProxySession]) -> list[ProxySession]:
    """The sessions that hold a connection: a detached one (waiting for its resume, bounded by the
    grace and the model's slots) counts in neither connection bound, so that its own resume fits."""
    return [s for s in sessions if not s.detached]


class _StrictTextProtocol(WebSocketProtocol13):
    """A text frame that is not UTF-8 goes to the handler, which answers and closes with 1007
    (RFC 6455 §8.1); Tornado itself aborts the TCP connection, with no close frame, so a client
    could not tell a bad frame from a network drop and would resume into the same error.

    Why a subclass: Tornado has no public hook for a frame's bytes before it decodes them. This
    class is the proxy's whole dependency on Tornado internals: it overrides
    `_handle_message(opcode, data)` and reads `client_terminated`, `_frame_compressed` and
    `handler`; it is built with the public constructor arguments Tornado's own
    `get_websocket_protocol` chose (`params`), so the message-size bound, ping interval and
    timeout set on the application apply unchanged. Every other frame, a compressed one
    included, takes Tornado's path. pyproject.toml pins tornado to the major version tested;
    tests/unit/proxy/test_tornado_boundary.py reads each internal named here in the installed
    Tornado and drives a bad frame through this class, so a release that changes them fails
    there."""

    def _handle_message(self, opcode: int, data: bytes) -> Any:
        if opcode == 0x1 and not self.client_terminated and not self._frame_compressed:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                if isinstance(self.handler, RealtimeVideoHandler):  # built only there
                    self.handler.on_invalid_text()
                    return None
        return super()._handle_message(opcode, data)
