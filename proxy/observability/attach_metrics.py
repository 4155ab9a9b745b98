"""Sessions and who is attached to them: sessions open, detached ones held for a resume,
resume answers, watchers and steerers (docs/operations.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from rtvideo.proxy.observability.metric_reads import value

__all__ = ["AttachMetrics"]


class AttachMetrics:
    """The session and attachment families of one proxy application's registry."""

    def __init__(self, r: CollectorRegistry) -> None:
        self._sessions_active = Gauge("rtvideo_proxy_sessions_active", "WebSocket sessions open now", registry=r)
        self._sessions = Counter("rtvideo_proxy_sessions", "WebSocket sessions opened", registry=r)
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
        self._steerers = Gauge("rtvideo_proxy_steerers", "Steerers (besides owners) connected now", registry=r)
        self._steer_messages = Counter(
            "rtvideo_proxy_steer_messages", "Messages received from steerers (besides owners)", registry=r
        )
        self._steerers_dropped = Counter(
            "rtvideo_proxy_steerers_dropped",
            "Steerers dropped by the proxy, by reason (slow_consumer, revoked)",
            ["reason"],
            registry=r,
        )

    def session_opened(self) -> None:
        self._sessions_active.inc()
        self._sessions.inc()

    def session_closed(self) -> None:
        self._sessions_active.dec()

    def session_detached(self, delta: int) -> None:
        self._detached.inc(delta)

    def resume_answered(self, outcome: str) -> None:
        self._resumes.labels(outcome=outcome).inc()

    def watcher_joined(self, delta: int) -> None:
        self._watchers.inc(delta)

    def watcher_dropped(self) -> None:
        self._watchers_dropped.inc()

    def steerer_joined(self, delta: int) -> None:
        self._steerers.inc(delta)

    def steer_message(self) -> None:
        self._steer_messages.inc()

    def steerer_dropped(self, reason: str) -> None:
        self._steerers_dropped.labels(reason=reason).inc()

    @property
    def sessions_active(self) -> int:
        return int(value(self._sessions_active))

    @property
    def sessions_total(self) -> int:
        return int(value(self._sessions))
