"""Proxy metrics, exposed with `prometheus_client` on `GET /metrics`.

Every metric is declared once, as a `MetricSpec` in `ProxyMetrics`'s body (name, type, help,
labels, buckets); the registry is built from those declarations, and
tests/unit/proxy/observability/test_metric_specs.py checks docs/operations.md's tables and the
dashboards and alerts in deploy/ against them. On an instance each declaration reads as its metric object:
callers update it themselves (`metrics.errors.labels(code).inc()`); the few methods here do
more (two series together, every series of an endpoint). An attribute is named as its metric,
less `rtvideo_proxy_` (or `rtvideo_`).

Each proxy application has its own `CollectorRegistry` (tests run several proxies in one
process; the global registry would mix them), with the process collector
(`process_resident_memory_bytes`, CPU seconds, open fds, …), the platform and the GC
collectors. Everything is fed from the proxy's event loop; each session's own clocks for the
latency histograms are in rtvideo.proxy.observability.session_timing, its playback rules in
rtvideo.proxy.observability.playback_metrics.
"""

from __future__ import annotations

import contextlib
from collections import Counter as Tally
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

__all__ = ["DECLARED", "MetricSpec", "ProxyMetrics", "by_label", "value"]

M = TypeVar("M", bound=MetricWrapperBase)

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
#: ack latency histogram bounds in seconds (what a person looks at: 1, 2, 5 ms, …)
ACK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: session.start → first media chunk handed to the socket, in seconds
FIRST_CHUNK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: how far a stream runs ahead of real-time playback, in seconds (negative: behind)
LEAD_BUCKETS = (-10.0, -5.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: a prompt update's send (or its ack) → shown on the player (from its playhead reports), in seconds
TO_SCREEN_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
#: the buffer a player reports (session.playback), in seconds
REPORTED_LEAD_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
#: underrun lengths in seconds (a stall a person notices starts at a few hundred ms)
UNDERRUN_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
#: a move costs the new endpoint's time to rebuild and render one chunk, plus detection for a loss
MOVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: what a proxy finds of a shared session store (rtvideo.proxy.store.watch)
STORE_STATES = ("shared", "refusing_writes", "unreachable")
#: why a live recording is dropped (exported at 0 from the start)
RECORDING_FAILURES = ("the store is too slow", "write failed")


@dataclass(frozen=True)
class MetricSpec(Generic[M]):
    """One metric: its type (`kind`), family name, help, label names, histogram buckets, the
    values of its one label exported at 0 from the start (`initial`), and whether only a proxy
    that keeps recordings has it. Read on a `ProxyMetrics`, it is that registry's metric object."""

    kind: type[M]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    initial: tuple[str, ...] = ()
    recordings: bool = False

    def build(self, registry: CollectorRegistry) -> M:
        options: dict[str, Any] = {"registry": registry}
        if self.buckets is not None:
            options["buckets"] = self.buckets
        metric = self.kind(self.name, self.help, self.labels, **options)
        for label in self.initial:
            metric.labels(label)
        return metric

    @overload
    def __get__(self, obj: None, owner: type) -> MetricSpec[M]: ...

    @overload
    def __get__(self, obj: ProxyMetrics, owner: type) -> M: ...

    def __get__(self, obj: ProxyMetrics | None, owner: type) -> MetricSpec[M] | M:
        if obj is None:
            return self
        return cast(M, obj.families[self.name])


class ProxyMetrics:
    """The metrics of one proxy application, in their own registry."""

    # --- sessions, resume and attachments (docs/operations.md) ----------------------------
    sessions_active = MetricSpec(Gauge, "rtvideo_proxy_sessions_active", "WebSocket sessions open now")
    sessions = MetricSpec(Counter, "rtvideo_proxy_sessions", "WebSocket sessions opened")
    sessions_detached = MetricSpec(
        Gauge,
        "rtvideo_proxy_sessions_detached",
        "Sessions whose connection dropped, held for a resume (their generator paused)",
    )
    # --- HLS broadcasts (docs/protocol.md §9.6) ----------------------------------------------
    broadcasts_live = MetricSpec(Gauge, "rtvideo_proxy_broadcasts_live", "HLS broadcasts being written by this proxy")
    broadcast_segments = MetricSpec(
        Counter, "rtvideo_proxy_broadcast_segments", "Segments written to the broadcast store (one per chunk)"
    )
    broadcast_failures = MetricSpec(
        Counter,
        "rtvideo_proxy_broadcast_failures",
        "Broadcasts stopped by a failed write or a stuck store (their sessions went on)",
    )
    resumes = MetricSpec(
        Counter, "rtvideo_proxy_resumes", "session.resume answers, by outcome (resumed, refused)", ("outcome",)
    )
    watchers = MetricSpec(Gauge, "rtvideo_proxy_watchers", "Read-only watchers connected now")
    watchers_dropped = MetricSpec(Counter, "rtvideo_proxy_watchers_dropped", "Watchers dropped with slow_consumer")
    steerers = MetricSpec(Gauge, "rtvideo_proxy_steerers", "Steerers (besides owners) connected now")
    whep_viewers = MetricSpec(
        Gauge, "rtvideo_proxy_whep_viewers", "WebRTC (WHEP) viewers with a peer connection open now, of any session"
    )
    steer_messages = MetricSpec(
        Counter, "rtvideo_proxy_steer_messages", "Messages received from steerers (besides owners)"
    )
    steerers_dropped = MetricSpec(
        Counter,
        "rtvideo_proxy_steerers_dropped",
        "Steerers dropped by the proxy, by reason (slow_consumer, revoked)",
        ("reason",),
    )

    # --- delivery and latency (each session's clocks: session_timing) ----------------------
    bytes_out = MetricSpec(Counter, "rtvideo_proxy_bytes_out", "Bytes written to clients (text and binary frames)")
    chunks_out = MetricSpec(Counter, "rtvideo_proxy_chunks_out", "Binary chunk frames written to clients")
    ack_latency_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_ack_latency_seconds",
        "From a client's session.interaction to its ack, in the proxy",
        buckets=ACK_BUCKETS,
    )
    store_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_store_seconds",
        "Calls to the session store (--session-store), by call (acquire, write, renew, release, drop)",
        ("call",),
        buckets=ACK_BUCKETS,
    )
    store_errors = MetricSpec(
        Counter,
        "rtvideo_proxy_store_errors",
        "Session store calls that failed (the store unreachable); the session goes on without it",
        ("call",),
    )
    store_sessions_bounded = MetricSpec(
        Counter,
        "rtvideo_proxy_store_sessions_bounded",
        "Sessions whose keeping in the session store ended at --session-store-bytes: each goes on, "
        "no longer resumable at another replica",
    )
    store_state = MetricSpec(
        Gauge,
        "rtvideo_proxy_store_state",
        "1 for the session store's state as this proxy last found it (shared, refusing_writes: it "
        "answers but refuses writes, full or read-only; unreachable), 0 for the others",
        ("state",),
    )
    sessions_taken_over = MetricSpec(
        Counter,
        "rtvideo_proxy_sessions_taken_over",
        "Sessions another proxy held that this one took over at a resume, by reason: free (its "
        "holder released it: a shutdown), expired (its holder went: its lease ran out), handoff "
        "(its holder was alive and let go when asked)",
        ("reason",),
    )
    takeover_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_takeover_seconds",
        "From a resume of a session held elsewhere to its stream opened here (the lease wait included)",
        ("reason",),
        buckets=MOVE_BUCKETS,
    )
    store_refusals = MetricSpec(
        Counter,
        "rtvideo_proxy_store_refusals",
        "Interactions answered store_unavailable: the shared session store could not keep them "
        "(away, full, or the lease unsure), so they were neither acked nor applied; the video went on",
    )
    acks_refused = MetricSpec(
        Counter,
        "rtvideo_proxy_acks_refused",
        "Interactions acked by the proxy that the model refused (they raced the session's end; "
        "session.done lists each as unapplied)",
    )
    time_to_first_chunk_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_time_to_first_chunk_seconds",
        "From a session.start to its first media chunk handed to the socket",
        buckets=FIRST_CHUNK_BUCKETS,
    )
    chunk_lead_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_chunk_lead_seconds",
        "Per media chunk handed out: its end time in the stream minus the wall time since the first "
        "media chunk (how far ahead of real-time playback; negative = behind)",
        buckets=LEAD_BUCKETS,
    )
    interaction_visible_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_interaction_visible_seconds",
        "From a client's session.interaction to the player showing the first chunk that lists it in "
        "started_event_ids (from the client's session.playback reports; sessions without reports add none)",
        buckets=TO_SCREEN_BUCKETS,
    )
    reported_lead_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_reported_lead_seconds",
        "Per session.playback report: media the player holds beyond its playhead (buffered_seconds, "
        "else the media handed out minus position_seconds)",
        buckets=REPORTED_LEAD_BUCKETS,
    )

    # --- playback, as players live it (never a per-session label) -------------------------------
    playback_underruns = MetricSpec(
        Counter,
        "rtvideo_playback_underruns",
        "Underruns reported by players: the position stood still with nothing buffered (counted when one begins)",
    )
    playback_underrun_seconds = MetricSpec(
        Histogram,
        "rtvideo_playback_underrun_seconds",
        "How long each underrun lasted (observed when it ends: playback moves on, or the session ends)",
        buckets=UNDERRUN_BUCKETS,
    )
    delivery_late_chunks = MetricSpec(
        Counter,
        "rtvideo_delivery_late_chunks",
        "Media chunks handed to a client after a real-time player started on the first chunk needed "
        "them (pacing's view; the player's clock waits for a late chunk, then runs on)",
    )
    interaction_to_screen_seconds = MetricSpec(
        Histogram,
        "rtvideo_interaction_to_screen_seconds",
        "From a prompt update's ack handed to the client to the player showing its first chunk "
        "(from session.playback reports; sessions without reports add none)",
        buckets=TO_SCREEN_BUCKETS,
    )

    # --- admission ---------------------------------------------------------------------------
    errors = MetricSpec(Counter, "rtvideo_proxy_errors", "Error messages sent to clients, by code", ("code",))
    rejected = MetricSpec(
        Counter,
        "rtvideo_proxy_rejected",
        "Connections refused before the upgrade, by reason",
        ("reason",),
        initial=REJECT_REASONS,
    )
    draining = MetricSpec(Gauge, "rtvideo_proxy_draining", "1 while the proxy drains for shutdown (no new sessions)")

    # --- the backend -------------------------------------------------------------------------
    backend_up = MetricSpec(Gauge, "rtvideo_proxy_backend_up", "1 while the model answers the health probe, else 0")
    probe_latency_seconds = MetricSpec(
        Gauge, "rtvideo_proxy_probe_latency_seconds", "Round trip of the last answered health probe"
    )
    probe_failures = MetricSpec(Counter, "rtvideo_proxy_probe_failures", "Health probes that failed or timed out")
    probe_busy = MetricSpec(
        Counter,
        "rtvideo_proxy_probe_busy",
        "Health probes not answered while the model's heartbeat moved and it reported every sequence slot "
        "held (busy, not down)",
    )
    probe_late = MetricSpec(
        Counter,
        "rtvideo_proxy_probe_late",
        "Health probes not answered in time while the model's heartbeat moved and it had a free sequence "
        "slot (late: a loaded host, neither busy nor down)",
    )
    backend_restarts = MetricSpec(
        Counter, "rtvideo_proxy_backend_restarts", "Restarts of the Triton started by rtvideo serve"
    )

    # --- per Triton endpoint (rtvideo.proxy.placement.pool); `endpoint_removed` drops them ----
    endpoint_up = MetricSpec(
        Gauge, "rtvideo_proxy_endpoint_up", "1 while the endpoint's model answers the health probe", ("endpoint",)
    )
    endpoint_sessions_active = MetricSpec(
        Gauge,
        "rtvideo_proxy_endpoint_sessions_active",
        "This proxy's sessions on the endpoint (placed or being placed)",
        ("endpoint",),
    )
    endpoint_capacity = MetricSpec(
        Gauge,
        "rtvideo_proxy_endpoint_capacity",
        "Session slots of the endpoint: max_sessions times its model instances",
        ("endpoint",),
    )
    endpoint_placements = MetricSpec(
        Counter, "rtvideo_proxy_endpoint_placements", "Sessions the endpoint accepted", ("endpoint",)
    )
    endpoint_refusals = MetricSpec(
        Counter,
        "rtvideo_proxy_endpoint_refusals",
        "Session starts the endpoint answered with server_busy",
        ("endpoint",),
    )
    endpoint_start_failures = MetricSpec(
        Counter,
        "rtvideo_proxy_endpoint_start_failures",
        "Session starts that failed on the endpoint before an answer",
        ("endpoint",),
    )
    endpoint_probe_latency_seconds = MetricSpec(
        Gauge,
        "rtvideo_proxy_endpoint_probe_latency_seconds",
        "Round trip of the endpoint's last answered health probe",
        ("endpoint",),
    )
    endpoint_probe_failures = MetricSpec(
        Counter,
        "rtvideo_proxy_endpoint_probe_failures",
        "Health probes of the endpoint that failed or timed out",
        ("endpoint",),
    )

    # --- live sessions moved between Tritons (rtvideo.proxy.session.mover) -----------------
    sessions_moved = MetricSpec(
        Counter,
        "rtvideo_proxy_sessions_moved",
        "Live sessions that went on on another Triton (or the same one restarted), by reason",
        ("reason",),
    )
    session_moves_failed = MetricSpec(
        Counter,
        "rtvideo_proxy_session_moves_failed",
        "Live sessions that could not move and ended (backend_unavailable), by reason",
        ("reason",),
    )
    session_move_seconds = MetricSpec(
        Histogram,
        "rtvideo_proxy_session_move_seconds",
        "From the move's start to the new stream's first chunk: the wait a move added",
        ("reason",),
        buckets=MOVE_BUCKETS,
    )

    # --- recordings (docs/recordings.md), only with --recordings -----------------------------
    recordings_written = MetricSpec(
        Counter, "rtvideo_recordings_written", "Recordings finished and stored", recordings=True
    )
    recording_bytes = MetricSpec(
        Counter, "rtvideo_recording_bytes", "Bytes of the recordings stored (video and event log)", recordings=True
    )
    recording_failures = MetricSpec(
        Counter,
        "rtvideo_recording_failures",
        "Recordings dropped while live (the session went on), by reason",
        ("reason",),
        initial=RECORDING_FAILURES,
        recordings=True,
    )

    def __init__(self, registry: CollectorRegistry | None = None, *, recordings: bool = False) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        #: every declared metric this proxy has, by name (what the declarations read)
        self.families: dict[str, MetricWrapperBase] = {
            spec.name: spec.build(r) for spec in DECLARED if recordings or not spec.recordings
        }

    # --- what updates more than one series ---------------------------------------------------
    def session_opened(self) -> None:
        self.sessions_active.inc()
        self.sessions.inc()

    def sent(self, nbytes: int, chunk: bool) -> None:
        """A frame written to a client: its bytes, and a chunk frame when it carries media."""
        self.bytes_out.inc(nbytes)
        if chunk:
            self.chunks_out.inc()

    def session_moved(self, reason: str, seconds: float) -> None:
        self.sessions_moved.labels(reason).inc()
        self.session_move_seconds.labels(reason).observe(seconds)

    def taken_over(self, reason: str, seconds: float) -> None:
        self.sessions_taken_over.labels(reason).inc()
        self.takeover_seconds.labels(reason).observe(seconds)

    def store_call(self, call: str, seconds: float, ok: bool) -> None:
        """One call to the session store: its time, and whether it failed."""
        self.store_seconds.labels(call).observe(seconds)
        if not ok:
            self.store_errors.labels(call).inc()

    def store_session_bounded(self) -> None:
        self.store_sessions_bounded.inc()

    def store_found(self, state: str) -> None:
        """The session store's state, as the last look found it (`STORE_STATES`)."""
        for name in STORE_STATES:
            self.store_state.labels(name).set(1.0 if name == state else 0.0)

    def recording_written(self, size: int) -> None:
        self.recordings_written.inc()
        self.recording_bytes.inc(size)

    def endpoint_added(self, endpoint: str) -> None:
        """Export the endpoint's series (at 0) from the moment it is known."""
        for spec in ENDPOINT_SERIES:
            self.families[spec.name].labels(endpoint)

    def endpoint_removed(self, endpoint: str) -> None:
        for spec in ENDPOINT_SERIES:
            with contextlib.suppress(KeyError):
                self.families[spec.name].remove(endpoint)

    # --- exposition --------------------------------------------------------------------------
    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The body and content type for `GET /metrics`, negotiated from the `Accept` header
        (Prometheus text unless OpenMetrics is asked for)."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    def render(self) -> str:
        """The Prometheus text exposition."""
        return generate_latest(self.registry).decode("utf-8")


#: every metric of the proxy, in the order of their declaration (and of the exposition)
DECLARED: tuple[MetricSpec[Any], ...] = tuple(v for v in vars(ProxyMetrics).values() if isinstance(v, MetricSpec))
#: the series of one Triton endpoint (labelled `endpoint` alone)
ENDPOINT_SERIES = tuple(spec for spec in DECLARED if spec.labels == ("endpoint",))


# --- current values, as a scrape would show them (for tests and status pages) -------------------
def _samples(metric: MetricWrapperBase, suffix: str) -> list[Any]:
    """The samples of `metric`'s family named with `suffix` (`_total`, `_count`, or none)."""
    return [s for family in metric.collect() for s in family.samples if s.name == family.name + suffix]


def _suffix(metric: MetricWrapperBase, suffix: str | None) -> str:
    if suffix is not None:
        return suffix
    return "_total" if isinstance(metric, Counter) else ""


def value(metric: MetricWrapperBase, suffix: str | None = None) -> float:
    """The value of an unlabelled metric: a counter's `_total`, a gauge, or a histogram's `suffix`
    (`_count`, `_sum`)."""
    return sum(s.value for s in _samples(metric, _suffix(metric, suffix)))


def by_label(metric: MetricWrapperBase, label: str, suffix: str | None = None) -> Tally:
    """A labelled metric's values by `label` (0 for a value never seen)."""
    return Tally({s.labels[label]: s.value for s in _samples(metric, _suffix(metric, suffix))})
