"""What the proxy hands to clients and how quickly: bytes and chunks out, ack latency, time to
the first chunk, how far the stream runs ahead of playback, and an update's send to screen.

Each session's clocks for these histograms are in rtvideo.proxy.observability.session_timing; this module
only holds the families.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from rtvideo.proxy.observability.metric_reads import value

__all__ = [
    "ACK_BUCKETS",
    "FIRST_CHUNK_BUCKETS",
    "LEAD_BUCKETS",
    "REPORTED_LEAD_BUCKETS",
    "VISIBLE_BUCKETS",
    "DeliveryMetrics",
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


class DeliveryMetrics:
    """The delivery and latency families of one proxy application's registry."""

    def __init__(self, r: CollectorRegistry) -> None:
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

    @property
    def bytes_out(self) -> int:
        return int(value(self._bytes_out))

    @property
    def chunks_out(self) -> int:
        return int(value(self._chunks_out))

    @property
    def ack_count(self) -> int:
        return int(value(self._ack, "_count"))

    @property
    def visible_count(self) -> int:
        return int(value(self._visible, "_count"))

    @property
    def reported_lead_count(self) -> int:
        return int(value(self._reported_lead, "_count"))
