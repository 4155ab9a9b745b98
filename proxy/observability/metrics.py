"""Proxy metrics, exposed with `prometheus_client` on `GET /metrics`.

Each proxy application has its own `CollectorRegistry` (tests run several proxies in one
process; the global registry would mix them), with the process collector
(`process_resident_memory_bytes`, CPU seconds, open fds, …), the platform and the GC
collectors. Everything is fed from the proxy's event loop; each session's own clocks for the
latency histograms are in rtvideo.proxy.observability.session_timing.

The families are held by concern (sessions and attachments, delivery and latency, playback,
admission, the backend and its endpoints); `ProxyMetrics` composes them in one registry and is
the one object the rest of the proxy reports to.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from rtvideo.proxy.observability.admission_metrics import REJECT_REASONS, AdmissionMetrics
from rtvideo.proxy.observability.attach_metrics import AttachMetrics
from rtvideo.proxy.observability.backend_metrics import BackendMetrics, EndpointMetrics
from rtvideo.proxy.observability.delivery_metrics import (
    ACK_BUCKETS,
    FIRST_CHUNK_BUCKETS,
    LEAD_BUCKETS,
    REPORTED_LEAD_BUCKETS,
    VISIBLE_BUCKETS,
    DeliveryMetrics,
)
from rtvideo.proxy.observability.move_metrics import MoveMetrics
from rtvideo.proxy.observability.playback_metrics import PlaybackMetrics

__all__ = [
    "ACK_BUCKETS",
    "FIRST_CHUNK_BUCKETS",
    "LEAD_BUCKETS",
    "REJECT_REASONS",
    "REPORTED_LEAD_BUCKETS",
    "VISIBLE_BUCKETS",
    "ProxyMetrics",
]


class ProxyMetrics:
    """The metrics of one proxy application, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        #: sessions open, detached, resumed; watchers and steerers
        self.attach = AttachMetrics(r)
        #: bytes and chunks out, ack and first-chunk latency, lead, send to screen
        self.delivery = DeliveryMetrics(r)
        #: underruns, late chunks, ack to screen (rtvideo.proxy.observability.playback_metrics)
        self.playback = PlaybackMetrics(r)
        #: refusals before the upgrade, errors sent, the drain
        self.admission = AdmissionMetrics(r)
        #: the model's health probe and restarts
        self.backend = BackendMetrics(r)
        #: the same per Triton endpoint (rtvideo.proxy.placement.pool)
        self.endpoints = EndpointMetrics(r)
        #: live sessions moved between Tritons (rtvideo.proxy.placement.mover)
        self.moves = MoveMetrics(r)

    # --- sessions, resume and attachments (docs/operations.md) ----------------------------
    def session_opened(self) -> None:
        self.attach.session_opened()

    def session_closed(self) -> None:
        self.attach.session_closed()

    def session_detached(self, delta: int) -> None:
        self.attach.session_detached(delta)

    def resume_answered(self, outcome: str) -> None:
        self.attach.resume_answered(outcome)

    def watcher_joined(self, delta: int) -> None:
        self.attach.watcher_joined(delta)

    def watcher_dropped(self) -> None:
        self.attach.watcher_dropped()

    def steerer_joined(self, delta: int) -> None:
        self.attach.steerer_joined(delta)

    def steer_message(self) -> None:
        self.attach.steer_message()

    def steerer_dropped(self, reason: str) -> None:
        self.attach.steerer_dropped(reason)

    # --- delivery and latency ----------------------------------------------------------------
    def sent(self, nbytes: int, chunk: bool) -> None:
        self.delivery.sent(nbytes, chunk)

    def observe_ack(self, seconds: float) -> None:
        self.delivery.observe_ack(seconds)

    def ack_refused(self) -> None:
        self.delivery.ack_refused()

    def first_chunk(self, seconds: float) -> None:
        self.delivery.first_chunk(seconds)

    def chunk_lead(self, seconds: float) -> None:
        self.delivery.chunk_lead(seconds)

    def interaction_visible(self, seconds: float) -> None:
        self.delivery.interaction_visible(seconds)

    def reported_lead(self, seconds: float) -> None:
        self.delivery.reported_lead(seconds)

    # --- admission ---------------------------------------------------------------------------
    def error_sent(self, code: str) -> None:
        self.admission.error_sent(code)

    def connection_rejected(self, reason: str) -> None:
        self.admission.connection_rejected(reason)

    def set_draining(self, draining: bool) -> None:
        self.admission.set_draining(draining)

    # --- the backend -------------------------------------------------------------------------
    def probe_answered(self, seconds: float) -> None:
        self.backend.probe_answered(seconds)

    def probe_failed(self) -> None:
        self.backend.probe_failed()

    def probe_busy(self) -> None:
        self.backend.probe_busy()

    def backend_restarted(self) -> None:
        self.backend.backend_restarted()

    def set_backend_up(self, up: bool) -> None:
        self.backend.set_backend_up(up)

    # --- per Triton endpoint -----------------------------------------------------------------
    def endpoint_added(self, endpoint: str) -> None:
        """Export the endpoint's series (at 0) from the moment it is known."""
        self.endpoints.added(endpoint)

    def endpoint_removed(self, endpoint: str) -> None:
        self.endpoints.removed(endpoint)

    def endpoint_up(self, endpoint: str, up: bool) -> None:
        self.endpoints.up(endpoint, up)

    def endpoint_sessions(self, endpoint: str, count: int) -> None:
        self.endpoints.sessions(endpoint, count)

    def endpoint_capacity(self, endpoint: str, slots: int) -> None:
        self.endpoints.capacity(endpoint, slots)

    def endpoint_placed(self, endpoint: str) -> None:
        self.endpoints.placed(endpoint)

    def endpoint_refused(self, endpoint: str) -> None:
        self.endpoints.refused(endpoint)

    def endpoint_start_failed(self, endpoint: str) -> None:
        self.endpoints.start_failed(endpoint)

    def endpoint_probe_answered(self, endpoint: str, seconds: float) -> None:
        self.endpoints.probe_answered(endpoint, seconds)

    def endpoint_probe_failed(self, endpoint: str) -> None:
        self.endpoints.probe_failed(endpoint)

    # --- exposition --------------------------------------------------------------------------
    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The body and content type for `GET /metrics`, negotiated from the `Accept` header
        (Prometheus text unless OpenMetrics is asked for)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text exposition."""
        return generate_latest(self.registry).decode("utf-8")

    # --- current values (for tests and status pages) -----------------------------------------
    @property
    def sessions_active(self) -> int:
        return self.attach.sessions_active

    @property
    def sessions_total(self) -> int:
        return self.attach.sessions_total

    @property
    def bytes_out(self) -> int:
        return self.delivery.bytes_out

    @property
    def chunks_out(self) -> int:
        return self.delivery.chunks_out

    @property
    def ack_count(self) -> int:
        return self.delivery.ack_count

    @property
    def visible_count(self) -> int:
        return self.delivery.visible_count

    @property
    def reported_lead_count(self) -> int:
        return self.delivery.reported_lead_count

    @property
    def errors(self) -> Tally:
        """Errors sent, by code (0 for a code never sent)."""
        return self.admission.errors

    @property
    def rejected(self) -> Tally:
        return self.admission.rejected

    @property
    def backend_up(self) -> int:
        return self.backend.backend_up

    @property
    def probe_latency(self) -> float:
        return self.backend.probe_latency

    @property
    def probe_failures(self) -> int:
        return self.backend.probe_failures

    @property
    def probe_busy_count(self) -> int:
        return self.backend.probe_busy_count

    @property
    def backend_restarts(self) -> int:
        return self.backend.backend_restarts

    def by_endpoint(self, name: str) -> dict[str, float]:
        """One per-endpoint series by endpoint: `up`, `sessions_active`, `capacity`, `placements`,
        `refusals`, `start_failures`, `probe_latency_seconds`, `probe_failures`."""
        return self.endpoints.series(name)
