"""Sessions placed over many Triton servers (README "Beyond one machine", docs/protocol.md §8).

Triton cannot move a sequence between servers, so a session lives on one server, on its own
gRPC stream, for its whole life; placing it is the proxy's job.

`EndpointPool` holds the endpoints (`Endpoint`, rtvideo.proxy.placement.endpoint): each `--triton-url
HOST:PORT`, and for a HOST that is a name, one endpoint per address it resolves to, resolved
again every `resolve_interval` seconds so that servers that come and go join and leave (one
that leaves takes no new session; its live sessions run to their end). It gives each its
`Supervisor` and reads its capacity.

A new session starts on the admitting endpoint with the most free slots (capacity minus this
proxy's sessions there; ties rotate); its `PlacedStream` (rtvideo.proxy.placement.placed_stream) moves on
to the next when one refuses or fails, and tells the pool of every slot taken and left.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.placement.addresses import is_ip_address, join_address, parse_urls, split_address
from rtvideo.proxy.placement.bridge import END_GRACE_SECONDS, TritonBridge
from rtvideo.proxy.placement.endpoint import Endpoint, Resolver, capacity_of, system_resolver
from rtvideo.proxy.placement.heartbeat import Heartbeat, metrics_url
from rtvideo.proxy.placement.placed_stream import PlacedStream
from rtvideo.proxy.placement.supervisor import BackendState, Supervisor
from rtvideo.proxy.tasks import TaskSet, cancel_and_wait

log = logging.getLogger(__name__)

#: an endpoint that answered `server_busy` is tried after the others for this long
REFUSED_HOLD_SECONDS = 2.0
_STATE_ORDER = (
    BackendState.UP,
    BackendState.LATE,
    BackendState.BUSY,
    BackendState.STARTING,
    BackendState.RESTARTING,
    BackendState.DOWN,
)


class EndpointProbes:
    """What one endpoint's supervisor reports: the endpoint's series and the proxy-wide ones."""

    def __init__(self, metrics: ProxyMetrics, endpoint: str, changed: Callable[[], None]) -> None:
        self._metrics, self._endpoint, self._changed = metrics, endpoint, changed

    def probe_answered(self, seconds: float) -> None:
        self._metrics.probe_latency_seconds.set(seconds)
        self._metrics.endpoint_probe_latency_seconds.labels(self._endpoint).set(seconds)

    def probe_failed(self) -> None:
        self._metrics.probe_failures.inc()
        self._metrics.endpoint_probe_failures.labels(self._endpoint).inc()

    def probe_busy(self) -> None:
        self._metrics.probe_busy.inc()

    def probe_late(self) -> None:
        self._metrics.probe_late.inc()

    def backend_restarted(self) -> None:
        self._metrics.backend_restarts.inc()

    def set_backend_up(self, up: bool) -> None:
        self._metrics.endpoint_up.labels(self._endpoint).set(int(up))
        self._changed()


# --- the pool ------------------------------------------------------------------------------------
class EndpointPool:
    """The Triton endpoints of one proxy; everything runs on the proxy's event loop.

    `restart` (only with a single URL: the Triton `rtvideo serve` started) restarts that server
    after its supervisor found it down. `key`: the Tritons' access key (every call carries it).
    `metrics_port`: the Tritons' metrics port, where each supervisor reads its model's heartbeat
    (rtvideo.proxy.placement.heartbeat); 0: not read, a probe without an answer is a failure."""

    def __init__(
        self,
        urls: str | Iterable[str],
        model: str,
        metrics: ProxyMetrics,
        *,
        probe_interval: float,
        probe_timeout: float,
        probe_failures: int,
        resolve_interval: float = 10.0,
        resolver: Resolver | None = None,
        restart: Callable[[], Awaitable[None]] | None = None,
        key: str | None = None,
        metrics_port: int = 0,
    ) -> None:
        self.urls = parse_urls(urls)
        self._metrics_port = metrics_port
        self._key = key  # Triton's access key, for every endpoint's bridge
        if restart is not None and len(self.urls) != 1:
            raise ValueError("a restart is for the single Triton rtvideo serve started")
        self.model = model
        self._metrics = metrics
        self._probe = {"interval": probe_interval, "timeout": probe_timeout, "failures": probe_failures}
        self._resolve_interval = resolve_interval
        self._resolver = resolver or system_resolver
        self._restart = restart
        self.endpoints: dict[str, Endpoint] = {}
        self._turn = 0  # rotates the choice among equally free endpoints
        self._tasks = TaskSet()  # ending refused attempts, closing endpoints that left, reading capacities
        self._resolving: asyncio.Task | None = None
        self._started = False
        self._closed = False

    # --- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.refresh()
        self._started = True
        for endpoint in self.endpoints.values():
            endpoint.supervisor.start()
        if self._resolve_interval > 0 and any(not is_ip_address(split_address(u)[0]) for u in self.urls):
            self._resolving = asyncio.ensure_future(self._resolve_loop())

    async def stop(self) -> None:
        """Stop probing and resolving; end the refused sequences still being ended; close channels."""
        self._closed = True
        if self._resolving is not None:
            await cancel_and_wait([self._resolving])
        await asyncio.gather(*(e.supervisor.stop() for e in self.endpoints.values()))
        await self._tasks.wait(END_GRACE_SECONDS + 1)
        await asyncio.gather(*(e.bridge.close() for e in self.endpoints.values()), return_exceptions=True)

    async def _resolve_loop(self) -> None:
        while True:
            await asyncio.sleep(self._resolve_interval)
            try:
                await self.refresh()
            except Exception:
                log.exception("resolving the Triton endpoints failed")

    async def refresh(self) -> None:
        """Resolve every URL once more: new addresses join, addresses no longer given leave."""
        wanted: dict[str, str] = {}
        for url in self.urls:
            host, port = split_address(url)
            if is_ip_address(host):
                wanted[join_address(host, port)] = url
                continue
            try:
                addresses = list(await self._resolver(host, port))
            except Exception as exc:  # noqa: BLE001 - DNS errors come in several types
                log.warning("could not resolve %s (%s); its endpoints stay as they are", url, exc)
                addresses = []
            if not addresses:  # a failure or an empty answer removes nothing; the probes judge them
                wanted.update({e.address: url for e in self.endpoints.values() if e.source == url and not e.leaving})
            for address in addresses:
                wanted.setdefault(join_address(address, port), url)
        if self._closed:
            return
        for address, source in wanted.items():
            endpoint = self.endpoints.get(address)
            if endpoint is None:
                self._add(address, source)
            elif endpoint.leaving:
                endpoint.leaving = False
                log.info("triton endpoint %s is back (from %s)", address, source)
        for address, endpoint in list(self.endpoints.items()):
            if address not in wanted and not endpoint.leaving:
                endpoint.leaving = True
                log.info(
                    "triton endpoint %s left %s; its %d session(s) run to their end",
                    address,
                    endpoint.source,
                    len(endpoint.streams),
                )
                self._retire_if_idle(endpoint)

    def _add(self, address: str, source: str) -> None:
        endpoint = Endpoint(address, source, TritonBridge(address, self.model, self._key))
        endpoint.supervisor = Supervisor(
            endpoint.bridge,
            EndpointProbes(self._metrics, address, self._health_changed),
            interval=self._probe["interval"],
            timeout=self._probe["timeout"],
            failures=int(self._probe["failures"]),
            on_down=lambda reason: self.down(endpoint, reason),
            restart=self._restart,
            on_up=lambda: self.spawn(self._read_capacity(endpoint)),
            name=f"triton {address}",
            heartbeat=Heartbeat(metrics_url(address, self._metrics_port), self.model) if self._metrics_port else None,
        )
        self.endpoints[address] = endpoint
        self._metrics.endpoint_added(address)
        if self._started:
            endpoint.supervisor.start()
        log.info("triton endpoint %s joined (from %s)", address, source)

    def _retire_if_idle(self, endpoint: Endpoint) -> None:
        if endpoint.leaving and not endpoint.streams and self._current(endpoint):
            del self.endpoints[endpoint.address]
            self._metrics.endpoint_removed(endpoint.address)
            self._health_changed()
            self.spawn(self._close_endpoint(endpoint))

    def _current(self, endpoint: Endpoint) -> bool:
        """Whether `endpoint` is still the pool's at its address (not one removed since)."""
        return self.endpoints.get(endpoint.address) is endpoint

    @staticmethod
    async def _close_endpoint(endpoint: Endpoint) -> None:
        await endpoint.supervisor.stop()
        await endpoint.bridge.close()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background; the pool's stop waits for it (bounded)."""
        self._tasks.spawn(coro)

    # --- health and capacity --------------------------------------------------------------------
    def _health_changed(self) -> None:
        self._metrics.backend_up.set(int(any(e.supervisor.ready for e in self.endpoints.values())))

    @property
    def metrics(self) -> ProxyMetrics:
        return self._metrics

    def down(self, endpoint: Endpoint, reason: str) -> None:
        """The endpoint's model stopped answering: its sessions move to another endpoint, or end
        (backend_unavailable) when they cannot (rtvideo.proxy.session.mover); one not placed yet moves on."""
        if endpoint.streams:
            log.warning(
                "triton endpoint %s down: %d session(s) there move or end", endpoint.address, len(endpoint.streams)
            )
        for stream in list(endpoint.streams):
            stream.lost(reason)

    async def _read_capacity(self, endpoint: Endpoint) -> None:
        try:
            response = await endpoint.bridge.client.get_model_config(
                self.model, headers=endpoint.bridge.headers, client_timeout=self._probe["timeout"]
            )
        except Exception as exc:  # noqa: BLE001 - read again when it is next up
            log.warning(
                "triton endpoint %s: model config not read (%s); its capacity is unknown", endpoint.address, exc
            )
            return
        capacity = capacity_of(response.config, endpoint.bridge.model_status)
        if capacity != endpoint.capacity:
            log.info("triton endpoint %s: %s session slot(s)", endpoint.address, capacity)
        endpoint.capacity = capacity
        if capacity is not None:
            self._metrics.endpoint_capacity.labels(endpoint.address).set(capacity)

    # --- placement ----------------------------------------------------------------------------
    def candidates(self) -> list[Endpoint]:
        """Where a new session may go, best first: admitting endpoints with free slots by most free
        (those of unknown capacity after, by fewest sessions; one that just answered server_busy
        after the others), ties rotated. When this proxy's own sessions fill them all, the best
        full one alone, so that the model's own server_busy is the answer."""
        eligible = sorted((e for e in self.endpoints.values() if e.admitting), key=lambda e: e.address)
        if not eligible:
            return []
        count, turn, now = len(eligible), self._turn, time.monotonic()
        self._turn += 1

        def rank(item: tuple[int, Endpoint]) -> tuple:
            index, endpoint = item
            free = endpoint.free
            return (
                free is not None and free <= 0,
                now - endpoint.refused_at < REFUSED_HOLD_SECONDS,
                free is None,
                len(endpoint.streams) if free is None else -free,
                (index - turn) % count,
            )

        ordered = [e for _, e in sorted(enumerate(eligible), key=rank)]
        with_room = [e for e in ordered if e.free is None or e.free > 0]
        return with_room or ordered[:1]

    def open_stream(self, patience: float = 0.0) -> PlacedStream:
        """A new session's stream (the `open_stream` of `TritonBridge`, placed); `patience`: how
        long it waits for an endpoint when none takes it now (a moving session's)."""
        return PlacedStream(self, self.candidates(), patience)

    # --- what a placed stream tells the pool -------------------------------------------------
    def attach(self, endpoint: Endpoint, stream: PlacedStream) -> None:
        """`stream` takes a slot at `endpoint` (an attempt begins there)."""
        endpoint.streams.add(stream)
        self._metrics.endpoint_sessions_active.labels(endpoint.address).set(len(endpoint.streams))

    def detach(self, endpoint: Endpoint, stream: PlacedStream) -> None:
        """`stream` left `endpoint` (its attempt was refused or failed, or the session is over)."""
        if stream.admitted and stream in endpoint.streams:
            endpoint.refused_at = -math.inf  # a session that had a slot there ended: one is free
        endpoint.streams.discard(stream)
        if self._current(endpoint):
            self._metrics.endpoint_sessions_active.labels(endpoint.address).set(len(endpoint.streams))
        self._retire_if_idle(endpoint)

    def start_answered(self, endpoint: Endpoint, busy: bool) -> None:
        """The model at `endpoint` answered a session.start: placed there, or (last candidate) busy."""
        if busy:
            self.start_refused(endpoint, final=True)
        else:
            endpoint.refused_at = -math.inf  # it took a session: it had room after all
            self._metrics.endpoint_placements.labels(endpoint.address).inc()

    def start_refused(self, endpoint: Endpoint, final: bool = False) -> None:
        """The model at `endpoint` answered `server_busy` (`final`: no other endpoint is left)."""
        endpoint.refused_at = time.monotonic()
        self._metrics.endpoint_refusals.labels(endpoint.address).inc()
        log.info(
            "triton endpoint %s answered server_busy%s",
            endpoint.address,
            "; no other endpoint is left to try" if final else "; trying the next",
        )

    def start_failed(self, endpoint: Endpoint, reason: str) -> None:
        """A session start at `endpoint` failed (the stream broke, or the endpoint went down):
        it is not healthy until its next probe is answered (`Supervisor.suspect`)."""
        self._metrics.endpoint_start_failures.labels(endpoint.address).inc()
        endpoint.supervisor.suspect(f"a session start failed: {reason}")
        log.warning("triton endpoint %s: a session start failed (%s); trying the next", endpoint.address, reason)

    def stream_failed(self, endpoint: Endpoint, reason: str) -> None:
        """A placed session's stream at `endpoint` broke (the session ends with backend_unavailable)."""
        endpoint.supervisor.suspect(f"a session's stream failed: {reason}")

    def drain(self, address: str, draining: bool = True) -> list[object] | None:
        """Drain the endpoint at `address` (no new session there; the caller moves its live ones)
        or take it back; its sessions' streams, or None when no endpoint is at `address`."""
        endpoint = self.endpoints.get(address)
        if endpoint is None:
            return None
        endpoint.draining = draining
        log.warning("triton endpoint %s %s", address, "drained" if draining else "taken back after a drain")
        self._health_changed()
        return list(endpoint.streams)

    # --- what the proxy asks -------------------------------------------------------------------
    @property
    def admitting(self) -> bool:
        """Whether some endpoint may take a new session."""
        return any(e.admitting for e in self.endpoints.values())

    @property
    def ready(self) -> bool:
        """Whether some endpoint that takes new sessions answered its last probe."""
        return any(e.admitting and e.supervisor.ready for e in self.endpoints.values())

    @property
    def alive(self) -> bool:
        """Whether some endpoint's model works: it answered its last probe, or it is busy (every
        sequence slot held, its heartbeat moving): a full server is not an unhealthy one."""
        return any(not e.leaving and e.supervisor.alive for e in self.endpoints.values())

    @property
    def known_slots(self) -> int | None:
        """Session slots of every endpoint (None while one's capacity is not known yet: a share of
        some of them would be too small a share of all)."""
        capacities = [e.capacity for e in self.endpoints.values()]
        if not capacities or None in capacities:
            return None
        return sum(c for c in capacities if c is not None)

    @property
    def has_free_slot(self) -> bool:
        """Whether some endpoint may have a session slot free (`Endpoint.has_free_slot`)."""
        return any(e.has_free_slot for e in self.endpoints.values())

    @property
    def state(self) -> BackendState:
        """The best state of any endpoint (down only when all are)."""
        states = {e.supervisor.state for e in self.endpoints.values() if not e.leaving}
        return next((s for s in _STATE_ORDER if s in states), BackendState.DOWN)

    def status(self) -> dict[str, Any]:
        """For `/healthz`: the backend as a whole and every endpoint."""
        endpoints = sorted(self.endpoints.values(), key=lambda e: e.address)
        summary: dict[str, Any] = {
            "backend": self.state.value,
            "restarts": sum(e.supervisor.restarts for e in endpoints),
        }
        if len(endpoints) == 1:  # one server: its own probe figures
            summary = {**endpoints[0].supervisor.status(), **summary}
        return {**summary, "endpoints": [e.status() for e in endpoints]}

    async def readiness(self) -> dict[str, bool]:
        """Triton's own readiness: true when some endpoint's server (and model) is ready."""
        # Each in its own task: a channel closed under a call (a supervisor renews the connection of
        # an endpoint that is down) cancels that call, which is "not ready", not a cancelled request.
        tasks = [asyncio.ensure_future(e.bridge.readiness()) for e in self.endpoints.values()]
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        return {key: any(isinstance(a, dict) and a[key] for a in answers) for key in ("server_ready", "model_ready")}
