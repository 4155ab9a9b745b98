"""Moves of live sessions between Tritons (docs/operations.md "Moves")."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

#: a move costs the new endpoint's time to rebuild and render one chunk, plus detection for a loss
MOVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class MoveMetrics:
    """Sessions moved and moves that failed, by reason (`loss`, `drain`), and the wait a move cost."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._moved = Counter(
            "rtvideo_proxy_sessions_moved",
            "Live sessions that went on on another Triton (or the same one restarted), by reason",
            ["reason"],
            registry=r,
        )
        self._failed = Counter(
            "rtvideo_proxy_session_moves_failed",
            "Live sessions that could not move and ended (backend_unavailable), by reason",
            ["reason"],
            registry=r,
        )
        self._wait = Histogram(
            "rtvideo_proxy_session_move_seconds",
            "From the move's start to the new stream's first chunk: the wait a move added",
            ["reason"],
            buckets=MOVE_BUCKETS,
            registry=r,
        )

    def moved(self, reason: str, seconds: float) -> None:
        self._moved.labels(reason).inc()
        self._wait.labels(reason).observe(seconds)

    def failed(self, reason: str) -> None:
        self._failed.labels(reason).inc()
