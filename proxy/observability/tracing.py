"""OpenTelemetry traces of the proxy's sessions (docs/operations.md "Traces"): off unless
`--otlp-endpoint` is given, and then the only module of the proxy that touches OpenTelemetry.

Off, a session's trace is `NO_TRACE`, whose methods do nothing, and nothing of OpenTelemetry
is imported (it is an optional extra, `rtvideo[otel]`). On, each session is one `session`
span (from its accepted `session.start` to its end) and each interaction one `interaction`
span under it, from the frame's arrival to its completion chunk, a failure or the session's
end, with the events `forwarded`, `acked`, `started` (the chunk) and `on_screen` (from the
player's `session.playback` reports). The session span's W3C `traceparent` goes to Triton
on every request of the session's stream (rtvideo.proxy.placement.bridge reads it with
`current_traceparent`), where the model hangs its `generate_chunk` spans under it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode
from rtvideo.redaction import redact_url

log = logging.getLogger(__name__)

#: the traceparent of the session whose stream is being opened: a context variable, so the
#: streams a session opens later (a placed stream's next attempt, in the session's pump task,
#: which copied the context) carry it too, with no signature between session and bridge
_TRACEPARENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("rtvideo_traceparent", default=None)
#: interaction spans a session keeps open (and ended ones it remembers for a late on_screen)
MAX_OPEN_INTERACTIONS = 256
#: the exporter's batch goes out this often: a trace is in the collector about a second after it ends
EXPORT_DELAY_MILLIS = 500

_providers: dict[str, Any] = {}  # endpoint → TracerProvider (one per process and endpoint)


def current_traceparent() -> str | None:
    """The traceparent of the traced session opening a stream now (None: not traced)."""
    return _TRACEPARENT.get()


class SessionTrace:
    """What a session tells its trace. This base is the trace of an untraced session: every
    method does nothing, so the session calls them unconditionally."""

    def begin(self) -> contextlib.AbstractContextManager[None]:
        """The accepted session.start: the session span starts; streams opened in the block
        (and in tasks spawned in it) carry its traceparent."""
        return contextlib.nullcontext()

    def named(self, request_id: str | None) -> None:
        """The model's video.start named the session."""

    def interaction(self, event_id: str | None, received: float) -> None:
        """An interaction that arrived at `received` (perf_counter) was forwarded to Triton."""

    def taken(self, message: Mapping[str, Any] | None) -> None:
        """A message handed to the owner's socket (acks, chunk metadata, errors)."""

    def on_screen(self, event_id: str, shown: float) -> None:
        """The player showed the first chunk of `event_id` at `shown` (perf_counter)."""

    def end(self) -> None:
        """The session ended (once): every span still open ends."""


NO_TRACE = SessionTrace()


def session_trace(endpoint: str | None, model: str) -> SessionTrace:
    """The trace of a new session: `NO_TRACE` unless `endpoint` (an OTLP gRPC collector) is set."""
    if endpoint is None:
        return NO_TRACE
    return _OtelTrace(_provider(endpoint).get_tracer("rtvideo.proxy"), model)


def install(endpoint: str, provider: Any) -> None:
    """Use `provider` (an SDK TracerProvider) for `endpoint` instead of an OTLP exporter (tests:
    an in-memory exporter)."""
    _providers[endpoint] = provider


def _provider(endpoint: str) -> Any:
    provider = _providers.get(endpoint)
    if provider is None:
        provider = _providers[endpoint] = otlp_provider(endpoint, "rtvideo-proxy")
        log.info("traces exported over OTLP gRPC to %s", shown_endpoint(endpoint))
    return provider


def otlp_provider(endpoint: str, service: str) -> Any:
    """A TracerProvider exporting to the OTLP gRPC collector at `endpoint` (`http://HOST:PORT`,
    `https://` for TLS, or `HOST:PORT`); its batches go out every `EXPORT_DELAY_MILLIS`, and
    the SDK flushes it at exit."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=EXPORT_DELAY_MILLIS))
    return provider


def shown_endpoint(endpoint: str) -> str:
    """`endpoint` as it may be logged: its password and secret query values masked
    (rtvideo.redaction.redact_url, which never raises on a malformed one)."""
    return redact_url(endpoint)


def wall_ns(perf: float) -> int:
    """A `time.perf_counter()` reading as the wall-clock nanoseconds OpenTelemetry stamps with."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


class _OtelTrace(SessionTrace):
    """A traced session: its `session` span and one `interaction` span per event id."""

    def __init__(self, tracer: Any, model: str) -> None:
        self._tracer = tracer
        self._model = model
        self._span: Any = None
        self._request_id: str | None = None
        self._open: dict[str, Any] = {}  # event id → its interaction span, while open
        self._ended: dict[str, Any] = {}  # event id → span context of an ended one (a late on_screen)

    @contextlib.contextmanager
    def begin(self) -> Iterator[None]:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._span = self._tracer.start_span("session", attributes={"rtvideo.model": self._model})
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(self._span))
        token = _TRACEPARENT.set(carrier.get("traceparent"))
        try:
            yield
        finally:
            _TRACEPARENT.reset(token)

    def named(self, request_id: str | None) -> None:
        if self._span is None or not isinstance(request_id, str):
            return
        self._request_id = request_id
        self._span.set_attribute("rtvideo.request_id", request_id)
        for span in self._open.values():
            span.set_attribute("rtvideo.request_id", request_id)

    def interaction(self, event_id: str | None, received: float) -> None:
        if self._span is None or event_id is None:
            return  # no id yet (the model names it): nothing to follow it by
        span = self._open.get(event_id)
        if span is None:
            if len(self._open) >= MAX_OPEN_INTERACTIONS:
                self._close(next(iter(self._open)), "untracked")
            from opentelemetry import trace

            attributes = {"rtvideo.event_id": event_id, "rtvideo.model": self._model}
            if self._request_id is not None:
                attributes["rtvideo.request_id"] = self._request_id
            span = self._open[event_id] = self._tracer.start_span(
                "interaction",
                context=trace.set_span_in_context(self._span),
                attributes=attributes,
                start_time=wall_ns(received),
            )
            span.add_event("received", timestamp=wall_ns(received))
        span.add_event("forwarded")

    def taken(self, message: Mapping[str, Any] | None) -> None:
        if self._span is None or message is None:
            return
        kind = message.get("type")
        if kind == protocol.QUEUED:
            self._event(message.get("event_id"), "acked", {})
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == "media":
            chunk = {"rtvideo.generation_chunk_index": message.get("generation_chunk_index", -1)}
            for event_id in message.get("started_event_ids") or ():
                self._event(event_id, "started", chunk)
            for field in ("completed", "superseded", "interrupted"):
                for event_id in message.get(f"{field}_event_ids") or ():
                    self._event(event_id, field, chunk)
                    self._close(event_id, field)
        elif kind == protocol.ERROR and message.get("code") == ErrorCode.INTERACTION_FAILED.value:
            # only this error ends an event: others naming one (rate_limited, a conflict) are
            # about a later message with its id, and the event goes on
            self._event(message.get("event_id"), "failed", {})
            self._close(str(message.get("event_id")), "interaction_failed")

    def on_screen(self, event_id: str, shown: float) -> None:
        span = self._open.get(event_id)
        if span is not None:
            span.add_event("on_screen", timestamp=wall_ns(shown))
            return
        parent = self._ended.get(event_id)
        if parent is not None:  # it completed before the player showed it: a child span marks the moment
            from opentelemetry import trace

            at = wall_ns(shown)
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent))
            self._tracer.start_span(
                "on_screen", context=context, attributes={"rtvideo.event_id": event_id}, start_time=at
            ).end(end_time=at)

    def end(self) -> None:
        if self._span is None:
            return
        for event_id in list(self._open):
            self._close(event_id, "session_ended")
        self._span.end()
        self._span = None

    def _event(self, event_id: Any, name: str, attributes: dict[str, Any]) -> None:
        span = self._open.get(event_id) if isinstance(event_id, str) else None
        if span is not None:
            span.add_event(name, attributes=attributes)

    def _close(self, event_id: str, why: str) -> None:
        span = self._open.pop(event_id, None)
        if span is None:
            return
        span.set_attribute("rtvideo.outcome", why)
        span.end()
        if len(self._ended) >= MAX_OPEN_INTERACTIONS:
            del self._ended[next(iter(self._ended))]
        self._ended[event_id] = span.get_span_context()
