"""The recordings' metrics (issue 30 item 7), in the proxy's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class RecordingMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._written = Counter("rtvideo_recordings_written", "Recordings finished and stored", registry=registry)
        self._bytes = Counter(
            "rtvideo_recording_bytes", "Bytes of the recordings stored (video and event log)", registry=registry
        )
        self._failures = Counter(
            "rtvideo_recording_failures",
            "Recordings dropped while live (the session went on), by reason",
            ["reason"],
            registry=registry,
        )
        for reason in ("the store is too slow", "write failed"):
            self._failures.labels(reason)

    def written(self, size: int) -> None:
        self._written.inc()
        self._bytes.inc(size)

    def failed(self, reason: str) -> None:
        self._failures.labels(reason).inc()
