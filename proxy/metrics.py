"""Proxy metrics, exposed with `prometheus_client` on `GET /metrics`.

Each proxy application has its own `CollectorRegistry` (tests run several proxies in one
process; the global registry would mix them), with the process collector
(`process_resident_memory_bytes`, CPU seconds, open fds, …), the platform and the GC
collectors. Everything is fed from the proxy's event loop.

`StreamTiming` is one session's clock for the stream histograms: it sees every frame the
moment it is handed to the socket (`ProxySession._taken`).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter as Tally
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from rtvideo.core import protocol

__all__ = [
    "ACK_BUCKETS",
    "FIRST_CHUNK_BUCKETS",
    "LEAD_BUCKETS",
    "VISIBLE_BUCKETS",
    "PlayheadTiming",
    "ProxyMetrics",
    "StreamTiming",
]

#: ack latency histogram bounds in seconds (what a person looks at: 1, 2, 5 ms, …)
ACK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: session.start → first media chunk handed to the socket, in seconds
FIRST_CHUNK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: how far a stream runs ahead of real-time playback, in seconds (negative: behind)
LEAD_BUCKETS = (-10.0, -5.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: a prompt update's send → shown on the player (from its playhead reports), in seconds
VISIBLE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
#: the buffer a player reports (session.playback), in seconds
REPORTED_LEAD_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0)
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


class ProxyMetrics:
    """The metrics of one proxy application, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._sessions_active = Gauge("rtvideo_proxy_sessions_active", "WebSocket sessions open now", registry=r)
        self._sessions = Counter("rtvideo_proxy_sessions", "WebSocket sessions opened", registry=r)
        self._init_resume_metrics(r)
        self._bytes_out = Counter(
            "rtvideo_proxy_bytes_out", "Bytes written to clients (text and binary frames)", registry=r
        )
        self._chunks_out = Counter("rtvideo_proxy_chunks_out", "Binary chunk frames written to clients", registry=r)
        self._ack = Histogram(
            "rtvideo_proxy_ack_latency_seconds",
            "From a client's session.interaction to its ack, in the proxy",
            buckets=ACK_BUCKETS,
            registry=r,
        )
        self._acks_refused = Counter(
            "rtvideo_proxy_acks_refused",
            "Interactions acked by the proxy that the model refused (they raced the session's end; "
            "session.done lists each as unapplied)",
            registry=r,
        )
        self._first_chunk = Histogram(
            "rtvideo_proxy_time_to_first_chunk_seconds",
            "From a session.start to its first media chunk handed to the socket",
            buckets=FIRST_CHUNK_BUCKETS,
            registry=r,
        )
        self._lead = Histogram(
            "rtvideo_proxy_chunk_lead_seconds",
            "Per media chunk handed out: its end time in the stream minus the wall time since the first "
            "media chunk (how far ahead of real-time playback; negative = behind)",
            buckets=LEAD_BUCKETS,
            registry=r,
        )
        self._visible = Histogram(
            "rtvideo_proxy_interaction_visible_seconds",
            "From a client's session.interaction to the player showing the first chunk that lists it in "
            "started_event_ids (from the client's session.playback reports; sessions without reports add none)",
            buckets=VISIBLE_BUCKETS,
            registry=r,
        )
        self._reported_lead = Histogram(
            "rtvideo_proxy_reported_lead_seconds",
            "Per session.playback report: media the player holds beyond its playhead (buffered_seconds, "
            "else the media handed out minus position_seconds)",
            buckets=REPORTED_LEAD_BUCKETS,
            registry=r,
        )
        self._errors = Counter("rtvideo_proxy_errors", "Error messages sent to clients, by code", ["code"], registry=r)
        self._rejected = Counter(
            "rtvideo_proxy_rejected", "Connections refused before the upgrade, by reason", ["reason"], registry=r
        )
        for reason in REJECT_REASONS:
            self._rejected.labels(reason)
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
        self._draining = Gauge(
            "rtvideo_proxy_draining", "1 while the proxy drains for shutdown (no new sessions)", registry=r
        )
        # Per Triton endpoint (rtvideo.proxy.placement); a label leaves when its endpoint does.
        self._ep_up = Gauge(
            "rtvideo_proxy_endpoint_up",
            "1 while the endpoint's model answers the health probe",
            ["endpoint"],
            registry=r,
        )
        self._ep_sessions = Gauge(
            "rtvideo_proxy_endpoint_sessions_active",
            "This proxy's sessions on the endpoint (placed or being placed)",
            ["endpoint"],
            registry=r,
        )
        self._ep_capacity = Gauge(
            "rtvideo_proxy_endpoint_capacity",
            "Session slots of the endpoint: max_sessions times its model instances",
            ["endpoint"],
            registry=r,
        )
        self._ep_placements = Counter(
            "rtvideo_proxy_endpoint_placements", "Sessions the endpoint accepted", ["endpoint"], registry=r
        )
        self._ep_refusals = Counter(
            "rtvideo_proxy_endpoint_refusals",
            "Session starts the endpoint answered with server_busy",
            ["endpoint"],
            registry=r,
        )
        self._ep_start_failures = Counter(
            "rtvideo_proxy_endpoint_start_failures",
            "Session starts that failed on the endpoint before an answer",
            ["endpoint"],
            registry=r,
        )
        self._ep_probe_latency = Gauge(
            "rtvideo_proxy_endpoint_probe_latency_seconds",
            "Round trip of the endpoint's last answered health probe",
            ["endpoint"],
            registry=r,
        )
        self._ep_probe_failures = Counter(
            "rtvideo_proxy_endpoint_probe_failures",
            "Health probes of the endpoint that failed or timed out",
            ["endpoint"],
            registry=r,
        )
        self._ep_metrics = (
            self._ep_up,
            self._ep_sessions,
            self._ep_capacity,
            self._ep_placements,
            self._ep_refusals,
            self._ep_start_failures,
            self._ep_probe_latency,
            self._ep_probe_failures,
        )

    # --- resume and watchers (docs/operations.md) -------------------------------
    def _init_resume_metrics(self, r: CollectorRegistry) -> None:
        self._detached = Gauge(
            "rtvideo_proxy_sessions_detached",
            "Sessions whose connection dropped, held for a resume (their generator paused)",
            registry=r,
        )
        self._resumes = Counter(
            "rtvideo_proxy_resumes", "session.resume answers, by outcome (resumed, refused)", ["outcome"], registry=r
        )
        self._watchers = Gauge("rtvideo_proxy_watchers", "Read-only watchers connected now", registry=r)
        self._watchers_dropped = Counter(
            "rtvideo_proxy_watchers_dropped", "Watchers dropped with slow_consumer", registry=r
        )

    def session_detached(self, delta: int) -> None:
        self._detached.inc(delta)

    def resume_answered(self, outcome: str) -> None:
        self._resumes.labels(outcome=outcome).inc()

    def watcher_joined(self, delta: int) -> None:
        self._watchers.inc(delta)

    def watcher_dropped(self) -> None:
        self._watchers_dropped.inc()

    # --- what the proxy reports ------------------------------------------------------------
    def session_opened(self) -> None:
        self._sessions_active.inc()
        self._sessions.inc()

    def session_closed(self) -> None:
        self._sessions_active.dec()

    def sent(self, nbytes: int, chunk: bool) -> None:
        self._bytes_out.inc(nbytes)
        if chunk:
            self._chunks_out.inc()

    def observe_ack(self, seconds: float) -> None:
        self._ack.observe(seconds)

    def ack_refused(self) -> None:
        self._acks_refused.inc()

    def first_chunk(self, seconds: float) -> None:
        self._first_chunk.observe(seconds)

    def chunk_lead(self, seconds: float) -> None:
        self._lead.observe(seconds)

    def interaction_visible(self, seconds: float) -> None:
        self._visible.observe(seconds)

    def reported_lead(self, seconds: float) -> None:
        self._reported_lead.observe(seconds)

    def playhead_timing(self) -> PlayheadTiming:
        """One session's on-screen clock (see `PlayheadTiming`)."""
        return PlayheadTiming(self)

    @property
    def visible_count(self) -> int:
        return int(_value(self._visible, "_count"))

    @property
    def reported_lead_count(self) -> int:
        return int(_value(self._reported_lead, "_count"))

    def stream_timing(self) -> StreamTiming:
        """A clock for one session's stream histograms (see `StreamTiming`)."""
        return StreamTiming(self)

    def error_sent(self, code: str) -> None:
        self._errors.labels(code).inc()

    def connection_rejected(self, reason: str) -> None:
        self._rejected.labels(reason).inc()

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

    def set_draining(self, draining: bool) -> None:
        self._draining.set(int(draining))

    # --- per Triton endpoint ---------------------------------------------------------------
    def endpoint_added(self, endpoint: str) -> None:
        """Export the endpoint's series (at 0) from the moment it is known."""
        for metric in self._ep_metrics:
            metric.labels(endpoint)

    def endpoint_removed(self, endpoint: str) -> None:
        for metric in self._ep_metrics:
            with contextlib.suppress(KeyError):
                metric.remove(endpoint)

    def endpoint_up(self, endpoint: str, up: bool) -> None:
        self._ep_up.labels(endpoint).set(int(up))

    def endpoint_sessions(self, endpoint: str, count: int) -> None:
        self._ep_sessions.labels(endpoint).set(count)

    def endpoint_capacity(self, endpoint: str, slots: int) -> None:
        self._ep_capacity.labels(endpoint).set(slots)

    def endpoint_placed(self, endpoint: str) -> None:
        self._ep_placements.labels(endpoint).inc()

    def endpoint_refused(self, endpoint: str) -> None:
        self._ep_refusals.labels(endpoint).inc()

    def endpoint_start_failed(self, endpoint: str) -> None:
        self._ep_start_failures.labels(endpoint).inc()

    def endpoint_probe_answered(self, endpoint: str, seconds: float) -> None:
        self._ep_probe_latency.labels(endpoint).set(seconds)

    def endpoint_probe_failed(self, endpoint: str) -> None:
        self._ep_probe_failures.labels(endpoint).inc()

    # --- exposition ------------------------------------------------------------------------
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
        return int(_value(self._sessions_active))

    @property
    def sessions_total(self) -> int:
        return int(_value(self._sessions))

    @property
    def bytes_out(self) -> int:
        return int(_value(self._bytes_out))

    @property
    def chunks_out(self) -> int:
        return int(_value(self._chunks_out))

    @property
    def ack_count(self) -> int:
        return int(_value(self._ack, "_count"))

    @property
    def errors(self) -> Tally:
        """Errors sent, by code (0 for a code never sent)."""
        return _by_label(self._errors, "code")

    @property
    def rejected(self) -> Tally:
        return _by_label(self._rejected, "reason")

    @property
    def backend_up(self) -> int:
        return int(_value(self._backend_up))

    @property
    def probe_latency(self) -> float:
        return _value(self._probe_latency)

    @property
    def probe_failures(self) -> int:
        return int(_value(self._probe_failures))

    @property
    def probe_busy_count(self) -> int:
        return int(_value(self._probe_busy))

    @property
    def backend_restarts(self) -> int:
        return int(_value(self._backend_restarts))

    def by_endpoint(self, name: str) -> dict[str, float]:
        """One per-endpoint series by endpoint: `up`, `sessions_active`, `capacity`, `placements`,
        `refusals`, `start_failures`, `probe_latency_seconds`, `probe_failures`."""
        metric = getattr(
            self, "_ep_" + {"sessions_active": "sessions", "probe_latency_seconds": "probe_latency"}.get(name, name)
        )
        suffix = "_total" if isinstance(metric, Counter) else ""
        return {s.labels["endpoint"]: s.value for s in _samples(metric, suffix)}


def _samples(metric: Any, suffix: str) -> list[Any]:
    return [s for family in metric.collect() for s in family.samples if s.name == family.name + suffix]


def _value(metric: Any, suffix: str | None = None) -> float:
    """The value of an unlabelled metric (a counter's `_total`, a gauge, or a histogram's `suffix`)."""
    if suffix is None:
        suffix = "_total" if isinstance(metric, Counter) else ""
    return sum(s.value for s in _samples(metric, suffix))


def _by_label(counter: Counter, label: str) -> Tally:
    return Tally({s.labels[label]: int(s.value) for s in _samples(counter, "_total") if s.value})


def stream_fps(video_start: Mapping[str, Any]) -> float | None:
    """The fps of a `video.start`'s config (None when it names none): media time of the frames."""
    fps = (video_start.get("config") or {}).get("fps")
    return float(fps) if isinstance(fps, (int, float)) and fps > 0 else None


class StreamTiming:
    """One session's stream clock, fed every frame handed to the socket, in order.

    `started()` marks the session.start going to the model; the first media chunk handed out
    after it gives `rtvideo_proxy_time_to_first_chunk_seconds`. Every media chunk gives
    `rtvideo_proxy_chunk_lead_seconds`: the chunk's end time in the stream (frames so far /
    the fps of `video.start`'s config) minus the wall time since the first media chunk was
    handed out, i.e. how far a player that started on the first chunk is from running dry.
    """

    def __init__(self, metrics: ProxyMetrics, clock: Any = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock
        self._started: float | None = None
        self._fps: float | None = None
        self._first: float | None = None
        self._frames = 0

    def started(self) -> None:
        self._started = self._clock()

    def taken(self, message: Mapping[str, Any] | None) -> None:
        if message is None:
            return
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self._fps = stream_fps(message)
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == "media":
            now = self._clock()
            if self._first is None:
                self._first = now
                if self._started is not None:
                    self._metrics.first_chunk(now - self._started)
            frames = message.get("num_frames")
            self._frames += frames if isinstance(frames, int) else 0
            if self._fps:
                self._metrics.chunk_lead(self._frames / self._fps - (now - self._first))


#: event ids a session's `PlayheadTiming` keeps while waiting to see them on screen
MAX_TRACKED_EVENTS = 256


class PlayheadTiming:
    """One session's on-screen clock, fed from its playhead reports (`session.playback`).

    An update's media start is that of the first media chunk handed out whose
    `started_event_ids` lists it (frames before it / the fps of `video.start`). A report whose
    position has passed that start shows it; it was shown `position - start` seconds before the
    report (the player runs at real time), so `rtvideo_proxy_interaction_visible_seconds` is
    `report time - (position - start) - send time`, once per event, never negative. A session
    that sends no reports observes nothing. Bounded: at most `MAX_TRACKED_EVENTS` are kept.
    """

    def __init__(self, metrics: ProxyMetrics, clock: Any = time.perf_counter) -> None:
        self._metrics = metrics
        self._clock = clock
        self._fps: float | None = None
        self._seconds = 0.0  # media handed out so far
        self._sent_at: dict[str, float] = {}  # event id → when the client's update arrived
        self._starts: dict[str, float] = {}  # event id → media start of its first chunk

    def sent(self, event_id: str, at: float) -> None:
        if event_id in self._sent_at:
            return  # a retry: the first send counts
        if len(self._sent_at) >= MAX_TRACKED_EVENTS:  # forget the oldest (one that was never shown)
            oldest = next(iter(self._sent_at))
            del self._sent_at[oldest]
            self._starts.pop(oldest, None)
        self._sent_at[event_id] = at

    def taken(self, message: Mapping[str, Any] | None) -> None:
        if message is None:
            return
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self._fps = stream_fps(message)
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == "media" and self._fps:
            for event_id in message.get("started_event_ids") or ():
                if event_id in self._sent_at and event_id not in self._starts:
                    self._starts[event_id] = self._seconds
            frames = message.get("num_frames")
            self._seconds += frames / self._fps if isinstance(frames, int) else 0.0

    def report(self, position: float, buffered: float | None) -> None:
        now = self._clock()
        lead = buffered if buffered is not None else self._seconds - position
        self._metrics.reported_lead(max(0.0, min(lead, self._seconds)))
        for event_id, start in list(self._starts.items()):
            if position >= start:
                shown = now - (position - start)
                self._metrics.interaction_visible(max(0.0, shown - self._sent_at.pop(event_id)))
                del self._starts[event_id]
