"""`/healthz`, `/readyz` and `/livez`: what a load balancer or an orchestrator asks of the proxy
(docs/operations.md "Health").

One responsibility: answer the three probes from the state the proxy already keeps; a probe
changes nothing (it reads the pool, the sessions and the store's last look; `/healthz` asks
the endpoints for their model configs, through `models_http.served_model_names`, only for a
caller holding the token). Invariants:
- `/livez` is 200 while the process serves, whatever the backend's state.
- `/healthz` is 200 only when some endpoint and its model are ready and its probe answers (or
  the model is busy: full, not dead); without the token (when one is set) its body is only the
  status, so no Triton address or gRPC error reaches a stranger.
- `/readyz` is 200 only when a new session can be taken now: not draining, a free slot on an
  endpoint that answers, room for a connection as the upgrade counts it.
The same handlers serve the main port and the health listener (`--health-port`).
"""

from __future__ import annotations

from rtvideo.proxy.edge.access import token_ok
from rtvideo.proxy.edge.json_reply import JsonHandler
from rtvideo.proxy.edge.models_http import served_model_names


class HealthHandler(JsonHandler):
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


class ReadyHandler(JsonHandler):
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


class LiveHandler(JsonHandler):
    """200 while the proxy process serves (whatever the backend's state)."""

    def get(self) -> None:
        self.reply(True, {"proxy": "ok"})
