"""OpenTelemetry spans of the model (docs/operations.md "Traces"): one `generate_chunk` span per
media chunk of a traced session, a child of the proxy's `session` span.

Tracing is on in the model when `RTVIDEO_OTLP_ENDPOINT` names an OTLP gRPC collector (`rtvideo
serve --otlp-endpoint` sets it for the Triton it starts) and a session's start request carries a
`traceparent` parameter (the proxy's, rtvideo.triton.wire). Such a session's start channel is
wrapped in a `TracedChannel`; the session reports each chunk it sent with `chunk_sent`, which
does nothing for any other channel. Nothing of OpenTelemetry (an optional extra) is imported
unless a traced session starts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from rtvideo.backend.runtime.ports import Channel

log = logging.getLogger(__name__)

#: the collector the model exports to; unset: the model traces nothing
ENDPOINT_ENV = "RTVIDEO_OTLP_ENDPOINT"
#: the exporter's batch goes out this often
EXPORT_DELAY_MILLIS = 500

_lock = threading.Lock()
_provider: Any = None


class TracedChannel:
    """A traced session's start channel: sends pass through; `chunk` records a span under the
    proxy's session span (the remote parent of the request's traceparent)."""

    def __init__(self, channel: Channel, tracer: Any, parent: Any) -> None:
        self._channel = channel
        self._tracer = tracer
        self._parent = parent  # the OpenTelemetry context holding the proxy's span

    def send(self, message: Mapping[str, Any] | None, data: bytes = b"", *, final: bool = False) -> None:
        self._channel.send(message, data, final=final)

    def is_cancelled(self) -> bool:
        return self._channel.is_cancelled()

    def chunk(self, meta: Mapping[str, Any], seconds: float) -> None:
        """A `generate_chunk` span for the chunk just sent: `seconds` of generation and encoding,
        ending now; its index and the events it started, carried and completed."""
        end = time.time_ns()
        attributes = {
            "rtvideo.request_id": str(meta.get("request_id")),
            "rtvideo.generation_chunk_index": int(meta.get("generation_chunk_index") or 0),
            "rtvideo.num_frames": int(meta.get("num_frames") or 0),
        }
        for field in ("started", "active", "completed"):
            ids = meta.get(f"{field}_event_ids") or []
            if ids:
                attributes[f"rtvideo.{field}_event_ids"] = [str(i) for i in ids]
        span = self._tracer.start_span(
            "generate_chunk", context=self._parent, attributes=attributes, start_time=end - int(seconds * 1e9)
        )
        span.end(end_time=end)


def traced(channel: Channel, traceparent: str | None) -> Channel:
    """`channel` wrapped for tracing when the request carries a traceparent and the model has a
    collector; else `channel` itself."""
    endpoint = os.environ.get(ENDPOINT_ENV)
    if not traceparent or not endpoint:
        return channel
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        return TracedChannel(channel, _tracer(endpoint), parent)
    except Exception:  # tracing must never cost a session: it runs untraced
        log.warning("tracing is unavailable in the model (is rtvideo[otel] installed?)", exc_info=True)
        return channel


def chunk_sent(channel: Channel, meta: Mapping[str, Any], seconds: float) -> None:
    """The session sent chunk `meta` after `seconds` of work: a span when its channel is traced."""
    if isinstance(channel, TracedChannel):
        channel.chunk(meta, seconds)


def shutdown() -> None:
    """Flush what is left (the model's finalize)."""
    with _lock:
        if _provider is not None:
            _provider.shutdown()


def _tracer(endpoint: str) -> Any:
    global _provider
    with _lock:
        if _provider is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=Resource.create({"service.name": "rtvideo-model"}))
            exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
            provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MILLIS))
            _provider = provider
            log.info("traced sessions export their spans over OTLP gRPC")
        return _provider.get_tracer("rtvideo.model")
