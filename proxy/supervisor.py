"""Supervision: notice a dead or wedged model by a real round trip, report it, recover.

Triton's own readiness does not show a dead Python-backend stub (it stays "ready"), so
every `probe_interval` seconds the supervisor sends the model's health probe
(`TritonBridge.probe`, docs/protocol.md §8). After `probe_failures` consecutive failures
(an error, a wrong answer, or no answer within `probe_timeout`) the backend is *down*:
`on_down(reason)` ends the live sessions, no new session goes there, and, when a
`restart` coroutine was given (`rtvideo serve` started Triton itself), Triton is
restarted; a later answered probe makes it *up* again. Every transition is logged once,
with its reason. With several Triton endpoints (rtvideo.proxy.placement) each has its own
supervisor, named after its address. Everything runs on the proxy's event loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from rtvideo.proxy.bridge import BackendUnavailable, TritonBridge
from rtvideo.proxy.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: the wait before another restart, after one that did not bring the backend up: doubles up to the cap
RESTART_BACKOFF_SECONDS = (5.0, 60.0)


class ProbeMetrics(Protocol):
    """What a supervisor reports: `ProxyMetrics`, or one endpoint's view of it (rtvideo.proxy.placement)."""

    def probe_answered(self, seconds: float) -> None: ...

    def probe_failed(self) -> None: ...

    def backend_restarted(self) -> None: ...

    def set_backend_up(self, up: bool) -> None: ...


class BackendState(str, enum.Enum):
    STARTING = "starting"  # no probe has been answered or failed often enough yet
    UP = "up"
    DOWN = "down"
    RESTARTING = "restarting"


class Supervisor:
    """Probes the backend and keeps `state`; `admitting` and `ready` are what the proxy asks."""

    def __init__(
        self,
        bridge: TritonBridge,
        metrics: ProbeMetrics,
        *,
        interval: float,
        timeout: float,
        failures: int,
        on_down: Callable[[str], None],
        restart: Callable[[], Awaitable[None]] | None = None,
        on_up: Callable[[], None] | None = None,
        name: str = "backend",
    ) -> None:
        self._bridge = bridge
        self._metrics = metrics
        self._interval = interval
        self._timeout = timeout
        self._failures_allowed = failures
        self._on_down = on_down
        self._restart = restart
        self._on_up = on_up
        self.name = name  # in log lines: "backend" alone, or the Triton endpoint's address
        self.state = BackendState.STARTING
        self.failures = 0  # consecutive
        self.last_latency: float | None = None  # seconds, of the last answered probe
        self.last_error: str | None = None
        self.restarts = 0
        self._restart_delay = 0.0
        self._next_restart = 0.0
        self._task: asyncio.Task | None = None

    @property
    def admitting(self) -> bool:
        """Whether a new session may be opened (not while the backend is known to be down)."""
        return self.state not in (BackendState.DOWN, BackendState.RESTARTING)

    @property
    def ready(self) -> bool:
        """Whether the last probe was answered."""
        return self.state is BackendState.UP

    def status(self) -> dict[str, object]:
        """For `/healthz`."""
        return {
            "backend": self.state.value,
            "probe_latency_ms": round(self.last_latency * 1000, 3) if self.last_latency is not None else None,
            "probe_failures": self.failures,
            "last_error": self.last_error,
            "restarts": self.restarts,
        }

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])

    async def check(self) -> bool:
        """One probe; updates the state (and ends sessions when it turns down). True when answered."""
        try:
            latency = await self._bridge.probe(self._timeout)
        except BackendUnavailable as exc:
            self._failed(str(exc))
            return False
        self._answered(latency)
        return True

    async def _run(self) -> None:
        while True:
            began = time.monotonic()  # probes start every `interval` s, however long one took
            if self.state in (BackendState.DOWN, BackendState.RESTARTING):
                # A fresh channel connects at once; the old one may wait out gRPC's reconnect backoff
                # (growing to 2 min), so a server back on the same address would be noticed late.
                await self._bridge.reconnect()
            await self.check()
            if self.state is BackendState.DOWN and self._restart is not None and time.monotonic() >= self._next_restart:
                await self._restart_backend()
                continue  # probe the restarted backend at once
            await asyncio.sleep(max(0.0, began + self._interval - time.monotonic()))

    def _answered(self, latency: float) -> None:
        self.failures, self.last_latency = 0, latency
        self._metrics.probe_answered(latency)
        if self.state is not BackendState.UP:
            self._restart_delay, self._next_restart = 0.0, 0.0
            self._set(BackendState.UP, f"the health probe was answered in {latency * 1000:.1f} ms")
            if self._on_up is not None:
                self._on_up()

    def _failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
        self._metrics.probe_failed()
        log.debug("%s: health probe failed (%d in a row): %s", self.name, self.failures, reason)
        if self.state is not BackendState.DOWN and self.failures >= self._failures_allowed:
            self._set(BackendState.DOWN, f"{self.failures} health probe(s) in a row failed; last: {reason}")
            self._on_down(reason)

    async def _restart_backend(self) -> None:
        self.restarts += 1
        self._metrics.backend_restarted()
        self._set(BackendState.RESTARTING, f"restart {self.restarts} (last probe error: {self.last_error})")
        self.failures = 0
        try:
            assert self._restart is not None
            await self._restart()
        except Exception as exc:  # noqa: BLE001 - a failed restart is retried later
            self.failures = self._failures_allowed
            self._set(BackendState.DOWN, f"the restart failed: {type(exc).__name__}: {exc}")
        low, high = RESTART_BACKOFF_SECONDS  # the next restart, if this one does not help, waits
        self._restart_delay = min(max(self._restart_delay * 2, low), high)
        self._next_restart = time.monotonic() + self._restart_delay

    def _set(self, state: BackendState, reason: str) -> None:
        if state is self.state:
            return
        previous, self.state = self.state, state
        self._metrics.set_backend_up(state is BackendState.UP)
        level = logging.INFO if state in (BackendState.UP, BackendState.RESTARTING) else logging.ERROR
        log.log(level, "%s %s (was %s): %s", self.name, state.value, previous.value, reason)
