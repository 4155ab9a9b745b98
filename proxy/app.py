"""The composition root: the proxy's parts built from its settings (`make_app`), its routes wired
(their handlers live in `edge/`: the WebSocket doors, `/healthz` `/readyz` `/livez`
(`edge/health.py`), `/metrics` (`edge/metrics_http.py`), `/v1/models` (`edge/models_http.py`),
the operator's and recordings' routes), and a server object that starts and stops it cleanly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import tornado.web
from tornado.netutil import bind_sockets

from rtvideo.core.protocol import MAX_START_BYTES
from rtvideo.proxy.broadcasts.http import routes as broadcast_routes
from rtvideo.proxy.broadcasts.service import Broadcasts
from rtvideo.proxy.edge import drain as drain_http
from rtvideo.proxy.edge.connections import BoundedHTTPServer, fd_room
from rtvideo.proxy.edge.guest_doors import STEER_PATH, WATCH_PATH, SteerHandler, WatchHandler
from rtvideo.proxy.edge.health import HealthHandler, LiveHandler, ReadyHandler
from rtvideo.proxy.edge.host_check import ProxyApplication
from rtvideo.proxy.edge.metrics_http import MetricsHandler
from rtvideo.proxy.edge.models_http import ModelsHandler
from rtvideo.proxy.edge.recordings_http import routes as recording_routes
from rtvideo.proxy.edge.relay import Advertisement, Relays
from rtvideo.proxy.edge.socket import ProxyContext, RealtimeVideoHandler
from rtvideo.proxy.edge.whep import whep_routes
from rtvideo.proxy.observability import accesslog
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.whep_viewer import WhepViewers
from rtvideo.proxy.placement.addresses import is_trusted, trusted_networks
from rtvideo.proxy.placement.endpoint import Resolver
from rtvideo.proxy.placement.pool import EndpointPool
from rtvideo.proxy.recordings.service import Recordings
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.settings import HEALTH_IDLE_SECONDS, ProxySettings
from rtvideo.proxy.store import open_store
from rtvideo.redaction import redact_url

log = logging.getLogger(__name__)

WEBSOCKET_PATH = "/v1/realtime/video"
#: the browser demo served at `GET /` and its client module at `GET /rtvideo.js`
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: how long ending one session at shutdown may take (its sequence end and flush are bounded too)
SHUTDOWN_SECONDS = 15.0
#: request bodies: no endpoint takes one, and Tornado reads a body whole before any handler (its
#: default allows 100 MB a request, held in memory, token or not); beyond: 400 and closed, unread
MAX_REQUEST_BODY_BYTES = 64 * 1024


def health_routes(context: ProxyContext) -> list[tuple[str, type[tornado.web.RequestHandler], dict[str, Any]]]:
    """The probe and scrape routes: on the main port, and alone on the health listener."""
    return [
        (r"/healthz", HealthHandler, {"context": context}),
        (r"/readyz", ReadyHandler, {"context": context}),
        (r"/livez", LiveHandler, {"context": context}),
        (r"/metrics", MetricsHandler, {"context": context}),
    ]


def make_health_app(context: ProxyContext) -> tornado.web.Application:
    """The health listener's application (`--health-port`): the same handlers and state as the
    main application's, the `Host` check too, and nothing else (no WebSocket, no page)."""
    return ProxyApplication(health_routes(context), context=context, log_function=accesslog.log_request)


def make_app(
    settings: ProxySettings, restart: Callable[[], Awaitable[None]] | None = None, resolver: Resolver | None = None
) -> tornado.web.Application:
    """The Tornado application; its shared state is `app.settings["context"]`. `restart`, when given,
    restarts the backend after the supervisor found it down (`rtvideo serve` with its own Triton);
    `resolver` resolves the names among the Triton URLs (default: the system's)."""
    metrics = ProxyMetrics(recordings=bool(settings.recordings))
    pool = EndpointPool(
        settings.triton_url,
        settings.model,
        metrics,
        probe_interval=settings.probe_interval,
        probe_timeout=settings.probe_timeout,
        probe_failures=settings.probe_failures,
        resolve_interval=settings.resolve_interval,
        resolver=resolver,
        restart=restart,
        key=settings.triton_key,
        metrics_port=settings.triton_metrics_port,
    )
    # a session's keys live as long as it can still be resumed: the grace, and the lease
    store = open_store(settings.session_store, keep_seconds=settings.store_keep_seconds)
    context = ProxyContext(settings=settings, metrics=metrics, pool=pool, store=store)
    context.features.recordings = Recordings.create(
        settings.recordings,
        max_bytes=settings.recordings_max_bytes,
        max_age=settings.recordings_max_age,
        record_all=settings.record_all,
        metrics=metrics,
        per_recording=settings.recording_cap,
        max_count=settings.recordings_max_count,
    )
    context.features.broadcasts = Broadcasts.create(settings, metrics)  # --broadcast-store (rtvideo.proxy.broadcasts)
    relays = Relays(settings, metrics)  # guests forwarded to the replica that holds their session
    guests: dict[str, Any] = {"context": context, "relays": relays}
    viewers = WhepViewers(metrics.whep_viewers)  # WebRTC viewers (rtvideo.proxy.edge.whep)
    handlers = [
        (WEBSOCKET_PATH, RealtimeVideoHandler, {"context": context}),
        (WATCH_PATH, WatchHandler, guests),
        (STEER_PATH, SteerHandler, guests),
        *whep_routes(context, viewers),
        *health_routes(context),
        (r"/v1/models", ModelsHandler, {"context": context}),
        *recording_routes(context.features.recordings, settings),
        *broadcast_routes(context.features.broadcasts),
        (
            drain_http.PATH,
            drain_http.DrainHandler,
            {
                "drain": pool.drain,
                "sessions": lambda: list(context.sessions),
                "admin_token": settings.admin_token,
                "allowed_origins": settings.allowed_origins,
            },
        ),
        (
            r"/(|rtvideo\.js|rtvideo\.css|recordings\.html|favicon\.ico)",
            tornado.web.StaticFileHandler,
            {"path": str(STATIC_DIR), "default_filename": "index.html"},
        ),
    ]
    accesslog.install_filter()
    return ProxyApplication(
        handlers,
        context=context,
        relays=relays,
        whep_viewers=viewers,
        log_function=accesslog.log_request,  # `?token=` values masked, refusals not at ERROR
        # Above the protocol's limits, so that the proxy answers `message_too_large` itself.
        websocket_max_message_size=2 * MAX_START_BYTES,
        websocket_ping_interval=settings.ping_interval or None,
        websocket_ping_timeout=settings.ping_timeout,
    )


class ProxyServer:
    """Listens for `settings` (port 0: any free port) on the running event loop; places sessions
    over the Triton endpoints and supervises them (see `make_app` for `restart` and `resolver`)."""

    def __init__(
        self,
        settings: ProxySettings,
        restart: Callable[[], Awaitable[None]] | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.settings = settings
        self.app = make_app(settings, restart, resolver)
        self.context: ProxyContext = self.app.settings["context"]
        self.health_app = make_health_app(self.context)
        self.pool = self.context.pool
        self.relays: Relays = self.app.settings["relays"]
        self.whep_viewers: WhepViewers = self.app.settings["whep_viewers"]
        self._advertisement: Advertisement | None = None
        self._server: BoundedHTTPServer | None = None
        self._health_server: BoundedHTTPServer | None = None
        self.port = settings.port
        self.health_port: int | None = settings.health_port  # the bound one once started (None: off)

    @property
    def url(self) -> str:
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"ws://{host}:{self.port}{WEBSOCKET_PATH}"

    @property
    def health_url(self) -> str | None:
        """`http://HOST:PORT` of the health listener (None when it is off)."""
        if self.health_port is None:
            return None
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.health_port}"

    async def start(self) -> None:
        await self.pool.start()
        s = self.settings
        health_open = s.health_max_open_connections if s.health_port is not None else 0
        room = max(1, fd_room(s.max_open_connections + health_open) - health_open)  # both fit the file limit
        trusted = trusted_networks(s.trusted_proxies)
        sockets = bind_sockets(s.port, s.host)
        self.port = sockets[0].getsockname()[1]
        self._server = BoundedHTTPServer(
            self.app,
            xheaders=False,
            max_body_size=MAX_REQUEST_BODY_BYTES,
            idle_connection_timeout=s.http_idle_seconds,
            body_timeout=s.http_idle_seconds,
            max_open=room,
            max_per_client=s.max_open_connections_per_client,
            trusted=lambda address: is_trusted(address, trusted),
            group=s.client_group,
            on_refused=lambda reason: self.context.metrics.rejected.labels(reason).inc(),
        )
        self._server.add_sockets(sockets)
        if s.health_port is not None:
            try:
                health_sockets = bind_sockets(s.health_port, s.host)
            except OSError:
                self._server.stop()
                self._server = None
                await self.pool.stop()
                raise
            self.health_port = health_sockets[0].getsockname()[1]
            # Its own bound, short idle time and no session: the main port's connections, all
            # taken, leave probes and scrapes their own way in (docs/operations.md "Health").
            self._health_server = BoundedHTTPServer(
                self.health_app,
                xheaders=False,
                max_body_size=MAX_REQUEST_BODY_BYTES,
                idle_connection_timeout=HEALTH_IDLE_SECONDS,
                body_timeout=HEALTH_IDLE_SECONDS,
                max_open=health_open,
                max_per_client=max(1, health_open // 4),
                group=s.client_group,
                on_refused=lambda reason: self.context.metrics.rejected.labels(f"health_{reason}").inc(),
            )
            self._health_server.add_sockets(health_sockets)
            log.info("health and metrics listening on %s", self.health_url)
        self._advertise()
        self.context.store_watch.start()  # a shared store: its state looked at, leftovers dropped
        settings = self.settings
        log.info(
            "proxy listening on %s (triton %s, model %s, session store %s, recordings %s)",
            self.url,
            settings.triton_url,
            settings.model,
            redact_url(settings.session_store),  # a store URL's password is never shown
            redact_url(settings.recordings) if settings.recordings else "off",
        )

    def _advertise(self) -> None:
        """With a shared store: where the other replicas forward this proxy's sessions' guests
        (`--advertise-url`, else the address it listens on), renewed while it runs."""
        wildcard = self.settings.host in ("0.0.0.0", "::", "")
        host = "127.0.0.1" if wildcard else self.settings.host
        url = self.settings.advertise_url or f"http://{f'[{host}]' if ':' in host else host}:{self.port}"
        ctx = self.context
        if ctx.store.shared and wildcard and not self.settings.advertise_url:
            log.warning("advertised to other replicas as %s, which only this machine reaches: set --advertise-url", url)
        self._advertisement = Advertisement(
            ctx.store, ctx.holder, url.rstrip("/"), ctx.metrics.store_call, ctx.settings.lease_seconds
        )
        self._advertisement.start()

    async def drain(self, seconds: float | None = None, cut: asyncio.Event | None = None) -> int:
        """Shutting down: `/readyz` turns 503 and new connections are refused (503) at once; live
        sessions run for up to `seconds` (default: the `drain_seconds` setting, or until `cut` is
        set); each one left then ends with `server_shutdown`, a complete `session.done` and close
        1001. Returns how many sessions were ended so."""
        ctx = self.context
        ctx.draining = True
        ctx.metrics.draining.set(1)
        seconds = self.settings.drain_seconds if seconds is None else seconds
        deadline = asyncio.get_running_loop().time() + seconds
        if handed := [s for s in ctx.sessions if s.continuable]:  # a shared store: another replica goes on
            log.info("draining: %d session(s) handed off (close 1012: their clients resume elsewhere)", len(handed))
            await asyncio.gather(*(s.hand_off(SHUTDOWN_SECONDS) for s in handed), return_exceptions=True)
        log.info("draining: no new sessions; %d live session(s) get up to %g s", len(ctx.sessions), seconds)
        while ctx.sessions and asyncio.get_running_loop().time() < deadline and not (cut and cut.is_set()):
            await asyncio.sleep(0.05)
        remaining = list(ctx.sessions)
        if remaining:
            log.info("drain over: ending %d session(s) with server_shutdown", len(remaining))
        await self._end_all(remaining)
        return len(remaining)

    async def _end_all(self, sessions: list[ProxySession]) -> None:
        """`server_shutdown` for each of `sessions` and each connection still waiting to start; a
        session another replica can continue (a shared store) is handed off instead (1012)."""
        waiting = list(self.context.waiting)
        ends = (s.hand_off(SHUTDOWN_SECONDS) if s.continuable else s.shutdown(SHUTDOWN_SECONDS) for s in sessions)
        await asyncio.gather(*ends, *(c.shutdown() for c in waiting), return_exceptions=True)

    async def stop(self) -> None:
        """Stop listening and probing; end what is left at once (see `drain` for the graceful way)."""
        if self._server is None:
            return
        self.context.draining = True
        self._server.stop()
        health, self._health_server = self._health_server, None
        if health is not None:
            health.stop()
        sessions = list(self.context.sessions)
        if self._advertisement is not None:
            await self._advertisement.stop()
        self.relays.close_all()  # relayed guests come back through another replica (1012)
        await self._end_all(sessions)
        await self.whep_viewers.close_all()  # their peer connections closed, not left to the loop
        await self._server.close_all_connections()
        if health is not None:
            await health.close_all_connections()
        await self.pool.stop()
        await self.context.shares.close()
        await self.context.store_watch.stop()
        await self.context.store.close()
        if (recordings := self.context.features.recordings) is not None:
            await asyncio.to_thread(recordings.close)  # what the ended sessions left to write
        if (broadcasts := self.context.features.broadcasts) is not None:
            await asyncio.to_thread(broadcasts.close)  # their last playlists written
        self._server = None
        log.info("proxy on %s stopped (%d session(s) ended at the stop)", self.url, len(sessions))
