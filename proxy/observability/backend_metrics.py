"""The model behind the proxy: its health probe and restarts (`BackendMetrics`), and the same
per Triton endpoint of the pool in rtvideo.proxy.placement.pool (`EndpointMetrics`)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge

from rtvideo.proxy.observability.metric_reads import samples, value

__all__ = ["BackendMetrics", "EndpointMetrics"]


class BackendMetrics:
    """The backend families of one proxy application's registry."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._backend_up = Gauge(
            "rtvideo_proxy_backend_up", "1 while the model answers the health probe, else 0", registry=r
        )
        self._probe_latency = Gauge(
            "rtvideo_proxy_probe_latency_seconds", "Round trip of the last answered health probe", registry=r
        )
        self._probe_failures = Counter(
            "rtvideo_proxy_probe_failures", "Health probes that failed or timed out", registry=r
        )
        self._probe_busy = Counter(
            "rtvideo_proxy_probe_busy",
            "Health probes not answered while the model's heartbeat moved (every sequence slot held: busy, not down)",
            registry=r,
        )
        self._backend_restarts = Counter(
            "rtvideo_proxy_backend_restarts", "Restarts of the Triton started by rtvideo serve", registry=r
        )

    def probe_answered(self, seconds: float) -> None:
        self._probe_latency.set(seconds)

    def probe_failed(self) -> None:
        self._probe_failures.inc()

    def probe_busy(self) -> None:
        self._probe_busy.inc()

    def backend_restarted(self) -> None:
        self._backend_restarts.inc()

    def set_backend_up(self, up: bool) -> None:
        self._backend_up.set(int(up))

    @property
    def backend_up(self) -> int:
        return int(value(self._backend_up))

    @property
    def probe_latency(self) -> float:
        return value(self._probe_latency)

    @property
    def probe_failures(self) -> int:
        return int(value(self._probe_failures))

    @property
    def probe_busy_count(self) -> int:
        return int(value(self._probe_busy))

    @property
    def backend_restarts(self) -> int:
        return int(value(self._backend_restarts))


class EndpointMetrics:
    """The per-endpoint families: every series is labelled `endpoint`, and an endpoint's labels
    leave with it (`removed`)."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._up = Gauge(
            "rtvideo_proxy_endpoint_up",
            "1 while the endpoint's model answers the health probe",
            ["endpoint"],
            registry=r,
        )
        self._sessions = Gauge(
            "rtvideo_proxy_endpoint_sessions_active",
            "This proxy's sessions on the endpoint (placed or being placed)",
            ["endpoint"],
            registry=r,
        )
        self._capacity = Gauge(
            "rtvideo_proxy_endpoint_capacity",
            "Session slots of the endpoint: max_sessions times its model instances",
            ["endpoint"],
            registry=r,
        )
        self._placements = Counter(
            "rtvideo_proxy_endpoint_placements", "Sessions the endpoint accepted", ["endpoint"], registry=r
        )
        self._refusals = Counter(
            "rtvideo_proxy_endpoint_refusals",
            "Session starts the endpoint answered with server_busy",
            ["endpoint"],
            registry=r,
        )
        self._start_failures = Counter(
            "rtvideo_proxy_endpoint_start_failures",
            "Session starts that failed on the endpoint before an answer",
            ["endpoint"],
            registry=r,
        )
        self._probe_latency = Gauge(
            "rtvideo_proxy_endpoint_probe_latency_seconds",
            "Round trip of the endpoint's last answered health probe",
            ["endpoint"],
            registry=r,
        )
        self._probe_failures = Counter(
            "rtvideo_proxy_endpoint_probe_failures",
            "Health probes of the endpoint that failed or timed out",
            ["endpoint"],
            registry=r,
        )
        #: by the names `series` takes
        self._series: dict[str, Gauge | Counter] = {
            "up": self._up,
            "sessions_active": self._sessions,
            "capacity": self._capacity,
            "placements": self._placements,
            "refusals": self._refusals,
            "start_failures": self._start_failures,
            "probe_latency_seconds": self._probe_latency,
            "probe_failures": self._probe_failures,
        }

    def added(self, endpoint: str) -> None:
        """Export the endpoint's series (at 0) from the moment it is known."""
        for metric in self._series.values():
            metric.labels(endpoint)

    def removed(self, endpoint: str) -> None:
        for metric in self._series.values():
            with contextlib.suppress(KeyError):
                metric.remove(endpoint)

    def up(self, endpoint: str, up: bool) -> None:
        self._up.labels(endpoint).set(int(up))

    def sessions(self, endpoint: str, count: int) -> None:
        self._sessions.labels(endpoint).set(count)

    def capacity(self, endpoint: str, slots: int) -> None:
        self._capacity.labels(endpoint).set(slots)

    def placed(self, endpoint: str) -> None:
        self._placements.labels(endpoint).inc()

    def refused(self, endpoint: str) -> None:
        self._refusals.labels(endpoint).inc()

    def start_failed(self, endpoint: str) -> None:
        self._start_failures.labels(endpoint).inc()

    def probe_answered(self, endpoint: str, seconds: float) -> None:
        self._probe_latency.labels(endpoint).set(seconds)

    def probe_failed(self, endpoint: str) -> None:
        self._probe_failures.labels(endpoint).inc()

    def series(self, name: str) -> dict[str, float]:
        """One series by endpoint: `up`, `sessions_active`, `capacity`, `placements`, `refusals`,
        `start_failures`, `probe_latency_seconds`, `probe_failures`."""
        metric = self._series[name]
        suffix = "_total" if isinstance(metric, Counter) else ""
        return {s.labels["endpoint"]: s.value for s in samples(metric, suffix)}
