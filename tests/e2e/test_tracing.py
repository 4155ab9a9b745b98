"""Traces through the real proxy and the real Triton (docs/operations.md "Traces"): the proxy's
span tree with an in-memory exporter, and `rtvideo serve --otlp-endpoint` exporting the
proxy's and the model's spans, under one trace id, to a collector stand-in here."""

from __future__ import annotations

import asyncio
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from rtvideo.proxy.observability import tracing
from tests.support.processes import end_all, stop_serve
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import run
from tests.support.serve_session import launch

grpc = pytest.importorskip("grpc")
pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402


def started(event_id: str) -> Any:
    return lambda m: m["type"] == "video.chunk_metadata" and event_id in m.get("started_event_ids", [])


async def two_updates(url: str) -> str:
    """A session with two prompt updates, each seen starting in a chunk; its request id."""
    async with ws(url) as conn:
        s = Ws(conn)
        start = await s.start("a harbour", num_frames=60, seed=3)
        await s.next_media()
        await s.interact("a harbour at night", "ev-1", transition_chunks=1)
        await s.until(started("ev-1"))
        await s.interact("a harbour in snow", "ev-2", transition_chunks=1)
        await s.until(started("ev-2"))
        await s.send({"type": "session.stop"})
        await s.finish()
        return str(start["request_id"])


def test_session_span_tree_through_proxy_and_triton(proxies) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install("memory://e2e", provider)
    server = proxies.server(otlp_endpoint="memory://e2e")
    request_id = run(two_updates(server.url))
    deadline = time.monotonic() + 10
    while not any(s.name == "session" for s in exporter.get_finished_spans()):  # ends at the close
        assert time.monotonic() < deadline
        time.sleep(0.05)
    spans = exporter.get_finished_spans()
    (session,) = [s for s in spans if s.name == "session"]
    assert session.attributes["rtvideo.request_id"] == request_id
    interactions = {s.attributes["rtvideo.event_id"]: s for s in spans if s.name == "interaction"}
    assert set(interactions) == {"ev-1", "ev-2"}
    for span in interactions.values():
        assert span.parent.span_id == session.context.span_id
        assert span.context.trace_id == session.context.trace_id
        assert span.attributes["rtvideo.request_id"] == request_id
        names = [e.name for e in span.events]
        assert names[:3] == ["received", "forwarded", "acked"], names
        (start,) = [e for e in span.events if e.name == "started"]
        assert start.attributes["rtvideo.generation_chunk_index"] >= 1
        assert span.attributes["rtvideo.outcome"] in ("completed", "session_ended")


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP gRPC trace receiver: the spans it got, with their service names."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []

    def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            for scope in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        value = a.value
        if value.HasField("array_value"):
            out[a.key] = [v.string_value for v in value.array_value.values]
        elif value.HasField("int_value"):
            out[a.key] = value.int_value
        else:
            out[a.key] = value.string_value
    return out


def test_serve_exports_proxy_and_model_spans_over_otlp(tmp_path: Path) -> None:
    collector = Collector()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, grpc_server)
    otlp_port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    served = launch(
        tmp_path,
        *("--pacing-lead", "off", "--frames-per-chunk", "6", "--render-workers", "0"),
        *("--otlp-endpoint", f"http://127.0.0.1:{otlp_port}"),
    )
    proc = served.proc
    children: set[int] = set()
    try:
        line = served.ready_line()
        assert line.startswith("rtvideo ready:"), line + served.tail()
        children = served.children()
        request_id = asyncio.run(asyncio.wait_for(two_updates(served.url), 120))
        deadline = time.monotonic() + 20
        while True:
            services = {service for service, span in collector.spans}
            names = {span.name for _, span in collector.spans}
            if {"rtvideo-proxy", "rtvideo-model"} <= services and "session" in names:
                break
            assert time.monotonic() < deadline, (services, names, served.tail())
            time.sleep(0.1)
        time.sleep(1.0)  # the model's last batch
        (session,) = [s for service, s in collector.spans if s.name == "session"]
        assert attributes(session)["rtvideo.request_id"] == request_id
        interactions = [s for _, s in collector.spans if s.name == "interaction"]
        assert {attributes(s)["rtvideo.event_id"] for s in interactions} == {"ev-1", "ev-2"}
        chunks = [s for service, s in collector.spans if service == "rtvideo-model" and s.name == "generate_chunk"]
        assert chunks
        for span in chunks:
            assert span.trace_id == session.trace_id
            assert span.parent_span_id == session.span_id
            assert attributes(span)["rtvideo.request_id"] == request_id
        applied = {i for span in chunks for i in attributes(span).get("rtvideo.started_event_ids", [])}
        assert applied == {"ev-1", "ev-2"}
    finally:
        stop_serve(proc)
        end_all(proc, children)
        grpc_server.stop(0)
