"""Traces (docs/operations.md "Traces"): off, nothing of OpenTelemetry is imported; on, a session's
spans form the documented tree, and the model's chunk spans hang under the proxy's traceparent."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rtvideo.backend.runtime import tracing as model_tracing
from rtvideo.proxy.observability import tracing
from rtvideo.triton import wire
from rtvideo.triton.server import trace_args

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_off_imports_no_opentelemetry() -> None:
    code = (
        "import sys, rtvideo.proxy.app, rtvideo.backend.runtime.session, rtvideo.backend.runtime.tracing;"
        "from rtvideo.proxy.observability import tracing; assert tracing.session_trace(None, 'm') is tracing.NO_TRACE;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_traceparent_travels_in_the_request_parameters() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parameters = wire.secret_parameters("s" * 32, parent)
    assert parameters == {"rtvideo_session_secret": "s" * 32, "traceparent": parent}
    import json

    assert wire.request_traceparent(json.dumps(parameters)) == parent
    assert wire.session_secret(json.dumps(parameters)) == "s" * 32
    assert wire.request_traceparent(json.dumps({"rtvideo_session_secret": "x"})) is None
    assert wire.secret_parameters(None) is None


def test_session_and_interaction_spans() -> None:
    provider, exporter = memory_provider()
    tracing.install("memory://unit", provider)
    trace = tracing.session_trace("memory://unit", "realtime_video")
    with trace.begin():
        parent = tracing.current_traceparent()
    assert parent is not None and parent.startswith("00-")
    assert tracing.current_traceparent() is None  # only inside the block
    trace.named("req-1")
    received = time.perf_counter()
    trace.interaction("e1", received)
    trace.taken({"type": "session.interaction.queued", "request_id": "req-1", "event_id": "e1"})
    trace.interaction("e2", time.perf_counter())
    chunk = {"type": "video.chunk_metadata", "kind": "media", "generation_chunk_index": 4}
    trace.taken({**chunk, "started_event_ids": ["e1"], "completed_event_ids": []})
    trace.on_screen("e1", time.perf_counter())
    trace.taken({**chunk, "generation_chunk_index": 5, "started_event_ids": [], "completed_event_ids": ["e1"]})
    trace.on_screen("e1", time.perf_counter())  # after completion: a child span
    trace.end()
    trace.end()  # once
    spans = {(s.name, s.attributes.get("rtvideo.event_id")): s for s in exporter.get_finished_spans()}
    session = spans[("session", None)]
    assert session.attributes["rtvideo.request_id"] == "req-1"
    assert session.attributes["rtvideo.model"] == "realtime_video"
    assert parent.split("-")[2] == format(session.context.span_id, "016x")
    e1, e2 = spans[("interaction", "e1")], spans[("interaction", "e2")]
    for span in (e1, e2):
        assert span.parent.span_id == session.context.span_id
        assert span.context.trace_id == session.context.trace_id
        assert span.attributes["rtvideo.request_id"] == "req-1"
    assert [e.name for e in e1.events] == ["received", "forwarded", "acked", "started", "on_screen", "completed"]
    assert e1.events[3].attributes["rtvideo.generation_chunk_index"] == 4
    assert e1.attributes["rtvideo.outcome"] == "completed"
    assert e2.attributes["rtvideo.outcome"] == "session_ended"
    late = spans[("on_screen", "e1")]
    assert late.parent.span_id == e1.context.span_id


def test_model_chunk_span_is_a_child_of_the_traceparent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A traced start channel's chunk spans, recorded in memory (their export over OTLP, from a
    `traced` channel: tests/e2e/test_tracing.py)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider, exporter = memory_provider()
    sent: list[object] = []

    class Plain:
        def send(self, message: object, data: bytes = b"", *, final: bool = False) -> None:
            sent.append(message)

        def is_cancelled(self) -> bool:
            return False

    plain = Plain()
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    monkeypatch.setenv(model_tracing.ENDPOINT_ENV, "http://127.0.0.1:1")
    assert model_tracing.traced(plain, None) is plain  # no traceparent: off
    monkeypatch.delenv(model_tracing.ENDPOINT_ENV)
    assert model_tracing.traced(plain, parent) is plain  # no collector: off
    context = TraceContextTextMapPropagator().extract({"traceparent": parent})
    channel = model_tracing.TracedChannel(plain, provider.get_tracer("test"), context)
    meta = {"type": "video.chunk_metadata", "request_id": "r", "generation_chunk_index": 2, "num_frames": 6}
    channel.send(meta)
    model_tracing.chunk_sent(channel, {**meta, "started_event_ids": ["e1"], "active_event_ids": ["e1"]}, 0.25)
    model_tracing.chunk_sent(plain, meta, 0.25)  # an untraced channel: nothing
    assert sent == [meta]
    (span,) = exporter.get_finished_spans()
    assert span.name == "generate_chunk"
    assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert span.attributes["rtvideo.generation_chunk_index"] == 2
    assert list(span.attributes["rtvideo.started_event_ids"]) == ["e1"]
    assert 0.24 < (span.end_time - span.start_time) / 1e9 < 0.26


def test_triton_trace_flags_and_logged_endpoint() -> None:
    assert trace_args(None) == []
    args = trace_args("127.0.0.1:4318/v1/traces")
    assert "--trace-config=mode=opentelemetry" in args
    assert "--trace-config=opentelemetry,url=127.0.0.1:4318/v1/traces" in args
    assert tracing.shown_endpoint("https://user:pw@collector:4317/x") == "https://user:***@collector:4317/x"
    assert tracing.shown_endpoint("https://user:pw@collector:notaport") == "https://user:***@collector:notaport"
    assert tracing.shown_endpoint("collector:4317") == "collector:4317"
