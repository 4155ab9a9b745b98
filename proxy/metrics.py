"""Proxy metrics in the Prometheus text format (no client library: a handful of numbers)."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

#: ack latency histogram bounds in seconds (what a person looks at: 1, 2, 5 ms, …)
ACK_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass
class ProxyMetrics:
    """Counters of one proxy application; everything runs on its event loop, so no locks."""

    sessions_active: int = 0
    sessions_total: int = 0
    bytes_out: int = 0
    chunks_out: int = 0
    ack_sum: float = 0.0
    ack_count: int = 0
    ack_buckets: list[int] = field(default_factory=lambda: [0] * len(ACK_BUCKETS))
    errors: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    backend_up: int = 0
    probe_latency: float = 0.0
    probe_failures: int = 0
    backend_restarts: int = 0

    def session_opened(self) -> None:
        self.sessions_active += 1
        self.sessions_total += 1

    def session_closed(self) -> None:
        self.sessions_active -= 1

    def sent(self, nbytes: int, chunk: bool) -> None:
        self.bytes_out += nbytes
        self.chunks_out += int(chunk)

    def observe_ack(self, seconds: float) -> None:
        self.ack_sum += seconds
        self.ack_count += 1
        at = bisect.bisect_left(ACK_BUCKETS, seconds)
        if at < len(ACK_BUCKETS):
            self.ack_buckets[at] += 1

    def error_sent(self, code: str) -> None:
        self.errors[code] += 1

    def connection_rejected(self, reason: str) -> None:
        self.rejected[reason] += 1

    def probe_answered(self, seconds: float) -> None:
        self.probe_latency = seconds

    def probe_failed(self) -> None:
        self.probe_failures += 1

    def backend_restarted(self) -> None:
        self.backend_restarts += 1

    def set_backend_up(self, up: bool) -> None:
        self.backend_up = int(up)

    def render(self) -> str:
        """The exposition text served on `GET /metrics`."""
        out = [
            "# HELP rtvideo_proxy_sessions_active WebSocket sessions open now",
            "# TYPE rtvideo_proxy_sessions_active gauge",
            f"rtvideo_proxy_sessions_active {self.sessions_active}",
            "# HELP rtvideo_proxy_sessions_total WebSocket sessions opened",
            "# TYPE rtvideo_proxy_sessions_total counter",
            f"rtvideo_proxy_sessions_total {self.sessions_total}",
            "# HELP rtvideo_proxy_bytes_out_total Bytes written to clients (text and binary frames)",
            "# TYPE rtvideo_proxy_bytes_out_total counter",
            f"rtvideo_proxy_bytes_out_total {self.bytes_out}",
            "# HELP rtvideo_proxy_chunks_out_total Binary chunk frames written to clients",
            "# TYPE rtvideo_proxy_chunks_out_total counter",
            f"rtvideo_proxy_chunks_out_total {self.chunks_out}",
            "# HELP rtvideo_proxy_ack_latency_seconds From a client's session.interaction to its ack, in the proxy",
            "# TYPE rtvideo_proxy_ack_latency_seconds histogram",
        ]
        cumulative = 0
        for bound, count in zip(ACK_BUCKETS, self.ack_buckets):
            cumulative += count
            out.append(f'rtvideo_proxy_ack_latency_seconds_bucket{{le="{bound:g}"}} {cumulative}')
        out += [
            f'rtvideo_proxy_ack_latency_seconds_bucket{{le="+Inf"}} {self.ack_count}',
            f"rtvideo_proxy_ack_latency_seconds_sum {self.ack_sum:.6f}",
            f"rtvideo_proxy_ack_latency_seconds_count {self.ack_count}",
            "# HELP rtvideo_proxy_errors_total Error messages sent to clients, by code",
            "# TYPE rtvideo_proxy_errors_total counter",
            *(f'rtvideo_proxy_errors_total{{code="{code}"}} {n}' for code, n in sorted(self.errors.items())),
            "# HELP rtvideo_proxy_rejected_total Connections refused before the upgrade, by reason",
            "# TYPE rtvideo_proxy_rejected_total counter",
            *(f'rtvideo_proxy_rejected_total{{reason="{r}"}} {n}' for r, n in sorted(self.rejected.items())),
            "# HELP rtvideo_proxy_backend_up 1 while the model answers the health probe, else 0",
            "# TYPE rtvideo_proxy_backend_up gauge",
            f"rtvideo_proxy_backend_up {self.backend_up}",
            "# HELP rtvideo_proxy_probe_latency_seconds Round trip of the last answered health probe",
            "# TYPE rtvideo_proxy_probe_latency_seconds gauge",
            f"rtvideo_proxy_probe_latency_seconds {self.probe_latency:.6f}",
            "# HELP rtvideo_proxy_probe_failures_total Health probes that failed or timed out",
            "# TYPE rtvideo_proxy_probe_failures_total counter",
            f"rtvideo_proxy_probe_failures_total {self.probe_failures}",
            "# HELP rtvideo_proxy_backend_restarts_total Restarts of the Triton started by rtvideo serve",
            "# TYPE rtvideo_proxy_backend_restarts_total counter",
            f"rtvideo_proxy_backend_restarts_total {self.backend_restarts}",
        ]
        return "\n".join(out) + "\n"
