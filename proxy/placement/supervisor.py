"""Supervision: notice a dead or wedged model by a real round trip, report it, recover.

Triton's own readiness does not show a dead Python-backend stub (it stays "ready"), so
every `probe_interval` seconds the supervisor sends the model's health probe
(`TritonBridge.probe`, docs/protocol.md §8). After `probe_failures` consecutive failures
(an error, a wrong answer, or no answer within `probe_timeout`) the backend is *down*:
`on_down(reason)` ends the live sessions, no new session goes there, and, when a
`restart` coroutine was given (`rtvideo serve` started Triton itself), Triton is
restarted; a later answered probe makes it *up* again. Every transition is logged once,
with its reason. With several Triton endpoints (rtvideo.proxy.placement.pool) each has its own
supervisor, named after its address. Everything runs on the proxy's event loop.

Full is not dead, and late is not full. The probe is a sequence of its own, so when every
sequence slot of the model's batcher is held it waits in Triton's backlog and gets no answer,
like a probe to a wedged model; on a loaded host it may also be answered after its deadline
with most slots free. On a timeout the supervisor asks the model's metrics
(rtvideo.proxy.placement.heartbeat, read from the Triton's metrics port):
- the heartbeat moves and the model reports every slot held: *busy*. Its live sessions go on,
  nothing is restarted, it takes no new session until a probe is answered again (a start
  would wait in the backlog like the probe), and `/healthz` says "busy";
- the heartbeat moves and the model does not report every slot held (or reports no slots):
  *late*. Not a failure and not full: it takes new sessions as when up (the model itself
  answers server_busy beyond its sessions), `/healthz` says "late" with the probe's deadline;
- the heartbeat does not move or cannot be read, or the probe got an error answer: a failure.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from rtvideo.proxy.placement.bridge import BackendUnavailable, ProbeTimeout, TritonBridge
from rtvideo.proxy.placement.heartbeat import Heartbeat
from rtvideo.proxy.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: the wait before another restart, after one that did not bring the backend up: doubles up to the cap
RESTART_BACKOFF_SECONDS = (5.0, 60.0)
#: a probe that a failed session asked for (`Supervisor.suspect`) goes out this long after it (or
#: after the probe in flight then): many sessions failing at once ask for one probe
SUSPECT_PROBE_GAP_SECONDS = 0.2


class ProbeMetrics(Protocol):
    """What a supervisor reports: its endpoint's view of the proxy's metrics (rtvideo.proxy.placement.pool)."""

    def probe_answered(self, seconds: float) -> None: ...

    def probe_failed(self) -> None: ...

    def probe_busy(self) -> None: ...

    def probe_late(self) -> None: ...

    def backend_restarted(self) -> None: ...

    def set_backend_up(self, up: bool) -> None: ...


class BackendState(str, enum.Enum):
    STARTING = "starting"  # no probe has been answered or failed often enough yet
    UP = "up"
    BUSY = "busy"  # the probe got no answer, the model's heartbeat moves and it reports every slot held
    LATE = "late"  # the probe got no answer in time, the heartbeat moves, and the model has free slots
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
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self._bridge = bridge
        self._heartbeat = heartbeat  # the model's, read on a probe timeout (None: a timeout is a failure)
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
        self.last_error: str | None = None  # of the last failure; cleared when a probe is answered
        self._suspected_at: float | None = None  # a session's failure after the last answered probe began
        self._wake = asyncio.Event()  # probe now (a session failed), not at the next interval
        self.restarts = 0
        self._restart_delay = 0.0
        self._next_restart = 0.0
        self._task: asyncio.Task | None = None

    @property
    def admitting(self) -> bool:
        """Whether a new session may be opened (not while the backend is known to be down, nor
        while it is busy: a start would wait in Triton's backlog like the probe)."""
        return self.state not in (BackendState.DOWN, BackendState.RESTARTING, BackendState.BUSY)

    @property
    def alive(self) -> bool:
        """Whether the model works: it answered its last probe (`ready`), or it is busy; and no
        session's start or stream failed since (`suspect`)."""
        return self.ready or (self.state is BackendState.BUSY and not self.suspected)

    @property
    def ready(self) -> bool:
        """Whether the last probe was answered (or late with free slots: the model lives and has
        room) and no session's start or stream failed since."""
        return self.state in (BackendState.UP, BackendState.LATE) and not self.suspected

    @property
    def suspected(self) -> bool:
        """Whether a session's start or stream failed after the last answered probe began."""
        return self._suspected_at is not None

    def suspect(self, reason: str) -> None:
        """A session's start or stream failed (`backend_unavailable`): not ready (`/healthz`,
        `/readyz` 503) until a probe that began after it is answered, and a probe goes out now.
        Sessions are not ended and nothing is restarted on this alone: the probes decide that."""
        self.last_error = reason
        if not self.suspected and self.state in (BackendState.UP, BackendState.LATE):
            log.warning("%s: not ready until a health probe is answered: %s", self.name, reason)
        self._suspected_at = time.monotonic()
        self._metrics.set_backend_up(self.ready)
        if self.state in (BackendState.UP, BackendState.LATE, BackendState.STARTING):
            self._wake.set()

    def status(self) -> dict[str, object]:
        """For `/healthz`."""
        return {
            "backend": self.state.value,
            "probe_latency_ms": round(self.last_latency * 1000, 3) if self.last_latency is not None else None,
            "probe_failures": self.failures,
            "last_error": self.last_error,
            "session_failed": self.suspected,  # since the last answered probe: not ready until the next
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
        began = time.monotonic()
        self._wake.clear()  # a session failing from now on asks for the next probe
        try:
            latency = await self._bridge.probe(self._timeout)
        except ProbeTimeout as exc:  # full, late or wedged: the model's metrics tell which
            if self._heartbeat is None:
                self._failed(str(exc))
                return False
            pulse = await self._heartbeat.pulse()
            if not pulse.moving:
                self._failed(f"{exc}, and the model's heartbeat ({self._heartbeat.url}) does not move")
            elif pulse.full:
                self._busy(str(exc))
            else:
                self._late(str(exc), pulse.full is None)
            return False
        except BackendUnavailable as exc:
            self._failed(str(exc))
            return False
        self._answered(latency, began)
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
            await self._sleep(max(0.0, began + self._interval - time.monotonic()))

    async def _sleep(self, seconds: float) -> None:
        """Until the next probe: `seconds`, or less when a session failed (`suspect`) since the
        last probe began: then SUSPECT_PROBE_GAP_SECONDS after that, at most `seconds`."""
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            return
        await asyncio.sleep(min(seconds, SUSPECT_PROBE_GAP_SECONDS))

    def _answered(self, latency: float, began: float) -> None:
        self.failures, self.last_latency = 0, latency
        if self._suspected_at is None or self._suspected_at < began:  # a session failing during it: not yet
            self.last_error = None
            if self._suspected_at is not None:
                self._suspected_at = None
                if self.state is BackendState.UP:
                    log.info("%s: ready again: a health probe was answered", self.name)
                    self._metrics.set_backend_up(True)
        self._metrics.probe_answered(latency)
        if self.state is not BackendState.UP:
            self._restart_delay, self._next_restart = 0.0, 0.0
            self._set(BackendState.UP, f"the health probe was answered in {latency * 1000:.1f} ms")
            if self._on_up is not None:
                self._on_up()

    def _busy(self, reason: str) -> None:
        """No answer, but the model's heartbeat moves and it reports every sequence slot held.
        Not a failure: the live sessions go on, no restart (one from down is called off), no new
        session here until a probe is answered."""
        self.failures = 0
        self._metrics.probe_busy()
        log.debug("%s: health probe not answered, the model's heartbeat moves: busy (%s)", self.name, reason)
        self._set(
            BackendState.BUSY,
            f"{reason}, but the model's heartbeat moves and it reports every sequence slot held (busy, not dead)",
        )

    def _late(self, reason: str, unreported: bool) -> None:
        """No answer in time, but the model's heartbeat moves and it has a free sequence slot (or
        reports none): a loaded host, not a full model and not a dead one. Not a failure; new
        sessions go on being placed here, the model's own server_busy refusing beyond its room."""
        self.failures = 0
        slots = "reports no sequence slots" if unreported else "reports a free sequence slot"
        self.last_error = f"{reason}; the model's heartbeat moves and it {slots} (late, not busy)"
        self._metrics.probe_late()
        log.debug("%s: health probe late: %s", self.name, self.last_error)
        self._set(BackendState.LATE, self.last_error)

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
        self._metrics.set_backend_up(state in (BackendState.UP, BackendState.LATE))
        level = logging.INFO if state in (BackendState.UP, BackendState.RESTARTING) else logging.ERROR
        level = logging.WARNING if state in (BackendState.BUSY, BackendState.LATE) else level
        log.log(level, "%s %s (was %s): %s", self.name, state.value, previous.value, reason)
