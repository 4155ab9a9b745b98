"""Admission: connections refused before the upgrade, error messages sent, and the drain."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge

from rtvideo.proxy.observability.metric_reads import by_label

__all__ = ["REJECT_REASONS", "AdmissionMetrics"]

#: reasons a connection is refused before the upgrade (exported at 0 from the start)
REJECT_REASONS = (
    "unauthorized",
    "origin",
    "capacity",
    "per_client",
    "backend_down",
    "backend_busy",  # the model is alive but every sequence slot of its batcher is held
    "draining",
    "open_connections",
    "client_connections",
    "awaiting_start",  # the share of connections waiting for their session.start is full
    "health_open_connections",  # the health listener's own bounds (--health-port)
    "health_client_connections",
)


class AdmissionMetrics:
    """The admission families of one proxy application's registry."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._errors = Counter("rtvideo_proxy_errors", "Error messages sent to clients, by code", ["code"], registry=r)
        self._rejected = Counter(
            "rtvideo_proxy_rejected", "Connections refused before the upgrade, by reason", ["reason"], registry=r
        )
        for reason in REJECT_REASONS:
            self._rejected.labels(reason)
        self._draining = Gauge(
            "rtvideo_proxy_draining", "1 while the proxy drains for shutdown (no new sessions)", registry=r
        )

    def error_sent(self, code: str) -> None:
        self._errors.labels(code).inc()

    def connection_rejected(self, reason: str) -> None:
        self._rejected.labels(reason).inc()

    def set_draining(self, draining: bool) -> None:
        self._draining.set(int(draining))

    @property
    def errors(self) -> Tally:
        """Errors sent, by code (0 for a code never sent)."""
        return by_label(self._errors, "code")

    @property
    def rejected(self) -> Tally:
        return by_label(self._rejected, "reason")
