"""The proxy application and a server object that starts and stops it cleanly."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

import tornado.web
from tornado.httputil import HTTPServerRequest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from rtvideo.core.protocol import MAX_START_BYTES
from rtvideo.proxy import accesslog
from rtvideo.proxy.access import host_allowed, token_ok
from rtvideo.proxy.bridge import TritonBridge
from rtvideo.proxy.handler import ProxyContext, RealtimeVideoHandler
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.supervisor import Supervisor

log = logging.getLogger(__name__)

WEBSOCKET_PATH = "/v1/realtime/video"
#: the single-file browser demo served at `GET /`
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: request bodies: no endpoint takes one, and Tornado reads a body whole before any handler (its
#: default allows 100 MB a request, held in memory, token or not); beyond: 400 and closed, unread
MAX_REQUEST_BODY_BYTES = 64 * 1024


class _JsonHandler(tornado.web.RequestHandler):
    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def reply(self, ok: bool, body: dict) -> None:
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class HealthHandler(_JsonHandler):
    """200 when Triton and the model say they are ready and the model answers the health probe;
    503 (same JSON) otherwise."""

    async def get(self) -> None:
        ctx = self.context
        triton = await ctx.bridge.readiness()
        ready = triton["server_ready"] and triton["model_ready"] and ctx.supervisor.ready
        self.reply(ready, {
            "proxy": "ok", "ready": ready, "model": ctx.bridge.model,
            "triton": triton, "sessions": len(ctx.sessions), **ctx.supervisor.status(),
        })


class ReadyHandler(_JsonHandler):
    """200 when a new session can be taken: the model answers the probe and there is room."""

    def get(self) -> None:
        ctx = self.context
        room = len(ctx.sessions) < ctx.settings.max_connections
        self.reply(ctx.supervisor.ready and room, {"ready": ctx.supervisor.ready and room,
                                                   "backend": ctx.supervisor.state.value, "room": room})


class LiveHandler(_JsonHandler):
    """200 while the proxy process serves (whatever the backend's state)."""

    def get(self) -> None:
        self.reply(True, {"proxy": "ok"})


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus text (OpenMetrics when the `Accept` header asks for it); behind the token when one is set."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def get(self) -> None:
        if not token_ok(self.request, self.context.settings.token):
            self.set_header("WWW-Authenticate", 'Bearer realm="rtvideo"')
            self.send_error(401)
            return
        body, content_type = self.context.metrics.exposition(self.request.headers.get("Accept"))
        self.set_header("Content-Type", content_type)
        self.finish(body)


class HostRefusedHandler(tornado.web.RequestHandler):
    """The answer to a request whose `Host` this server does not serve (DNS rebinding)."""

    def prepare(self) -> None:
        self.set_status(403, "Host not allowed")
        self.finish("Host not allowed\n")


class ProxyApplication(tornado.web.Application):
    """Checks the `Host` of every request (page, WebSocket, health, metrics) in one place."""

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Any:
        settings: ProxySettings = self.settings["context"].settings
        if not host_allowed(request.host, settings.host, settings.allowed_hosts):
            log.info("peer=%s Host %r refused", request.remote_ip, request.host)
            return self.get_handler_delegate(request, HostRefusedHandler)
        return super().find_handler(request, **kwargs)


def make_app(settings: ProxySettings, restart: Callable[[], Awaitable[None]] | None = None) -> tornado.web.Application:
    """The Tornado application; its shared state is `app.settings["context"]`. `restart`, when given,
    restarts the backend after the supervisor found it down (`rtvideo serve` with its own Triton)."""
    context = ProxyContext(settings=settings, bridge=TritonBridge(settings.triton_url, settings.model))
    context.supervisor = Supervisor(
        context.bridge, context.metrics, interval=settings.probe_interval, timeout=settings.probe_timeout,
        failures=settings.probe_failures, on_down=context.backend_lost, restart=restart,
    )
    handlers = [
        (WEBSOCKET_PATH, RealtimeVideoHandler, {"context": context}),
        (r"/healthz", HealthHandler, {"context": context}),
        (r"/readyz", ReadyHandler, {"context": context}),
        (r"/livez", LiveHandler, {"context": context}),
        (r"/metrics", MetricsHandler, {"context": context}),
        (r"/()", tornado.web.StaticFileHandler, {"path": str(STATIC_DIR), "default_filename": "index.html"}),
    ]
    accesslog.install_filter()
    return ProxyApplication(
        handlers,
        context=context,
        log_function=accesslog.log_request,  # `?token=` values masked, refusals not at ERROR
        # Above the protocol's limits, so that the proxy answers `message_too_large` itself.
        websocket_max_message_size=2 * MAX_START_BYTES,
        websocket_ping_interval=settings.ping_interval or None,
        websocket_ping_timeout=settings.ping_timeout,
    )


class ProxyServer:
    """Listens for `settings` (port 0: any free port) on the running event loop; supervises the
    backend (see `make_app` for `restart`)."""

    def __init__(self, settings: ProxySettings, restart: Callable[[], Awaitable[None]] | None = None) -> None:
        self.settings = settings
        self.app = make_app(settings, restart)
        self.context: ProxyContext = self.app.settings["context"]
        self.supervisor = self.context.supervisor
        self._server: HTTPServer | None = None
        self.port = settings.port

    @property
    def url(self) -> str:
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"ws://{host}:{self.port}{WEBSOCKET_PATH}"

    async def start(self) -> None:
        sockets = bind_sockets(self.settings.port, self.settings.host)
        self.port = sockets[0].getsockname()[1]
        self._server = HTTPServer(self.app, xheaders=False, max_body_size=MAX_REQUEST_BODY_BYTES)
        self._server.add_sockets(sockets)
        self.supervisor.start()
        log.info("proxy listening on %s (triton %s, model %s)", self.url, self.settings.triton_url, self.settings.model)

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every session (as a session.stop would), close connections."""
        if self._server is None:
            return
        self._server.stop()
        await self.supervisor.stop()
        sessions = list(self.context.sessions)
        await asyncio.gather(*(s.shutdown(timeout) for s in sessions), return_exceptions=True)
        await self._server.close_all_connections()
        await self.context.bridge.close()
        self._server = None
        log.info("proxy on %s stopped (%d session(s) ended)", self.url, len(sessions))
