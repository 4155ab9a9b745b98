"""The proxy application and a server object that starts and stops it cleanly."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import tornado.web
from tornado.httputil import HTTPServerRequest
from tornado.netutil import bind_sockets

from rtvideo.core.protocol import MAX_START_BYTES
from rtvideo.proxy.broadcasts.http import routes as broadcast_routes
from rtvideo.proxy.broadcasts.service import Broadcasts
from rtvideo.proxy.edge import drain as drain_http
from rtvideo.proxy.edge.access import host_allowed, refused_without_token, token_ok
from rtvideo.proxy.edge.connections import BoundedHTTPServer, fd_room
from rtvideo.proxy.edge.guest_doors import STEER_PATH, WATCH_PATH, SteerHandler, WatchHandler
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
from rtvideo.proxy.placement.supervisor import BackendState
from rtvideo.proxy.recordings.service import Recordings
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.settings import HEALTH_IDLE_SECONDS, ProxySettings
from rtvideo.proxy.store import open_store
from rtvideo.proxy.store.base import LEASE_SECONDS
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


class _JsonHandler(tornado.web.RequestHandler):
    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def reply(self, ok: bool, body: dict) -> None:
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))


class HealthHandler(_JsonHandler):
    """200 when some Triton endpoint and its model say they are ready and the model answers the
    health probe there, or is busy (every sequence slot held, its heartbeat moving), and no
    session's start or stream has failed there since its last answered probe; 503 otherwise.
    With the token (when one is set), the JSON lists every endpoint and its state; without it,
    only the status: no Triton address, no gRPC error reaches a stranger."""

    async def get(self) -> None:
        ctx = self.context
        triton = await ctx.pool.readiness()
        # A busy model (every sequence slot held, its heartbeat moving) is full, not unhealthy.
        ready = triton["server_ready"] and triton["model_ready"] and ctx.pool.alive
        if not token_ok(self.request, ctx.settings.token):
            self.reply(ready, {"status": "ok" if ready else "unavailable"})
            return
        self.reply(
            ready,
            {
                "status": "ok" if ready else "unavailable",
                "proxy": "ok",
                "ready": ready,
                "draining": ctx.draining,
                "model": ctx.settings.model,
                "served_model_names": await served_model_names(ctx) if triton["model_ready"] else [],
                "triton": triton,
                "sessions": len(ctx.sessions),
                "session_store": await ctx.store_watch.look(),
                **ctx.pool.status(),
            },
        )


async def served_models(context: ProxyContext) -> dict[str, dict[str, Any]]:
    """The model names a start may ask for (`--served-model-name`, else the Triton model's name
    and its generator's model ids), each with what `/v1/models` says of it: the interactions it
    takes (`interactions`, as `video.start` `config.interactions`) and the deployed model's own
    rules as `config.model_rules` states them (`model_rules`, when it has any), read from the model configs of the
    Triton endpoints as the model reads them (`BackendSettings`); and, from every endpoint that
    serves the name, what its model measured of itself (`endpoint_capacity`):
    `realtime_capacity_fps` is their sum (None while none has a figure), `endpoints` each one's.
    In order, each once. Empty when no endpoint's config could be read."""
    from rtvideo.backend.loading.settings import BackendSettings  # torch-free, like the proxy

    model = context.settings.model

    async def read(endpoint: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
        try:
            response = await endpoint.bridge.client.get_model_config(
                model, headers=endpoint.bridge.headers, client_timeout=context.settings.probe_timeout
            )
            params = {key: value.string_value for key, value in response.config.parameters.items()}
            settings = BackendSettings.from_parameters(params)
            rules = settings.model_rules()
            card = {"interactions": settings.interactions().describe()}
            if rules is not None:
                card["model_rules"] = rules.describe()
            return settings.served_names(model), card
        except Exception as exc:  # noqa: BLE001 - that endpoint is down or its config unusable: the others say
            log.info("triton endpoint %s: served model names not read (%s)", endpoint.address, exc)
            return (), {}

    # every endpoint not known to be down, at once (a hung one holds the answer up by one timeout at most)
    up = [
        e
        for e in context.pool.endpoints.values()
        if e.supervisor.state not in (BackendState.DOWN, BackendState.RESTARTING)
    ]
    models: dict[str, dict[str, Any]] = {}
    for endpoint, (served, card) in zip(up, await asyncio.gather(*(read(e) for e in up)), strict=True):
        measured = endpoint_capacity(endpoint)
        for name in served:
            entry = models.setdefault(name, {**card, "realtime_capacity_fps": None, "endpoints": []})
            entry["endpoints"].append(measured)
            if measured["realtime_capacity_fps"] is not None:
                entry["realtime_capacity_fps"] = (entry["realtime_capacity_fps"] or 0) + measured[
                    "realtime_capacity_fps"
                ]
    return models


def endpoint_capacity(endpoint: Any) -> dict[str, Any]:
    """What the model at `endpoint` said of itself in its last answered health probe (its pong's
    `model`, docs/protocol.md §8): frames per second it delivers in real time at its default size
    (measured by the model: `realtime_capacity_fps`, None until it has a figure), how much of it
    its live sessions take, and its session limit and why (`max_sessions_reason`)."""
    status = endpoint.bridge.model_status or {}
    return {
        "endpoint": endpoint.address,
        "realtime_capacity_fps": status.get("realtime_capacity_fps"),
        "realtime_capacity_from": status.get("realtime_capacity_from"),
        "realtime_load_fps": status.get("realtime_load_fps"),
        "max_sessions": status.get("max_sessions"),
        "max_sessions_reason": status.get("max_sessions_reason"),
        "sessions": status.get("sessions"),
    }


async def served_model_names(context: ProxyContext) -> list[str]:
    """`served_models`' names, in order."""
    return list(await served_models(context))


#: `created` of every model in `GET /v1/models`: when this proxy process started (vLLM's is the request's time)
STARTED_AT = int(time.time())


class ModelsHandler(_JsonHandler):
    """`GET /v1/models` in the OpenAI list format (as vLLM's server answers it): the served model
    names, the first the one `video.start` reports, each with `interactions` (the kinds, event
    fields and interpolations it takes), `model_rules` (sizes, fps, interaction kinds, whether
    a first frame is required) when the model has rules of its own, and `realtime_capacity_fps`
    with `endpoints` (`served_models`). Behind the token when one is set; 503 when
    no Triton endpoint's model config could be read."""

    async def get(self) -> None:
        ctx = self.context
        if refused_without_token(self, ctx.settings.token):
            return
        models = await served_models(ctx)
        root = next(iter(models), None)
        data = [
            {
                "id": name,
                "object": "model",
                "created": STARTED_AT,
                "owned_by": "rtvideo",
                "root": root,
                "parent": None,
                **card,
            }
            for name, card in models.items()
        ]
        self.reply(bool(models), {"object": "list", "data": data})


class ReadyHandler(_JsonHandler):
    """200 when a new session can be taken: not draining, an endpoint answers the probe and has a
    free session slot (`EndpointPool.has_free_slot`), and the proxy has room for a connection."""

    def get(self) -> None:
        ctx = self.context
        room = ctx.connections() < ctx.settings.max_connections  # as the upgrade counts them
        slot = ctx.pool.has_free_slot
        ready = ctx.pool.ready and slot and room and not ctx.draining
        self.reply(
            ready,
            {
                "ready": ready,
                "backend": ctx.pool.state.value,
                "room": room,
                "free_slot": slot,
                "draining": ctx.draining,
                # the last look (rtvideo.proxy.store.watch): refusing_writes, unreachable or shared;
                # new sessions are served either way, continued elsewhere only when shared
                "session_store": ctx.store_watch.state,
            },
        )


class LiveHandler(_JsonHandler):
    """200 while the proxy process serves (whatever the backend's state)."""

    def get(self) -> None:
        self.reply(True, {"proxy": "ok"})


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus text (OpenMetrics when the `Accept` header asks for it); behind the token when one is set."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def get(self) -> None:
        if refused_without_token(self, self.context.settings.token):
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
    store = open_store(settings.session_store, keep_seconds=settings.resume_grace_seconds + LEASE_SECONDS)
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
        self._advertisement = Advertisement(ctx.store, ctx.holder, url.rstrip("/"), ctx.metrics.store_call)
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
