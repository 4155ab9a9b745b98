"""On vLLM-Omni 0.32's engine the host drives its pacing: a paced start's `streaming_pacing` goes
on the request (`streaming_buffer_seconds` and the two bounds), each `session.playback` goes to
`update_streaming_playback`, the engine's `output_chunk_index` and `pacing` reach the chunk as
they are, and its "Streaming idle timeout" is our `stall_timeout`. The capability is read from
the engine's public API at load; a 0.30 engine (no such API) keeps `streaming_pacing` ignored.

The stand-in engine is given 0.32's API shape, each part checked here against the 0.32.0rc1
wheel's code."""

from __future__ import annotations

import ast
import json
import queue
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import Limits
from rtvideo.backend.runtime.sources import PlayerIdle, PlayerReports, RenderedChunk, SourceChunk
from rtvideo.backend.vllm_omni.engine import EngineHost, engine_paces
from rtvideo.backend.vllm_omni.source import ENGINE_IDLE_ERROR, EngineChunkSource
from rtvideo.core.streaming_pacing import StreamingPacing
from rtvideo.core.transitions import ChunkPlan
from tests.support.omni_standin import StandInAsyncOmni, StandInOutput, StandInSamplingParams
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET
from tests.support.session_configs import session_config
from tests.support.vllm_omni_wheel import rc_wheel_path, wheel_source


@dataclass
class Params032(StandInSamplingParams):
    """With 0.32's `OmniDiffusionSamplingParams` streaming fields and defaults (`inputs/data.py`)."""

    streaming_buffer_seconds: float | None = None
    streaming_max_output_bytes: int = 64 * 1024 * 1024
    streaming_idle_timeout_s: float = 30.0


class StandIn032(StandInAsyncOmni):
    """The stand-in with 0.32's pacing API: what a paced request's chunks carry
    (`output_formatter.py`), the playback calls it was given, and an idle end on demand."""

    def __init__(self, model: str = "", **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.default_sampling_params_list = [Params032()]
        self.playback_calls: list[tuple[str, float]] = []
        self.paced_params: list[Params032] = []
        self.idle_after: int | None = None  # end a paced request as idle after this many chunks

    async def update_streaming_playback(self, request_id: str, position_seconds: float) -> None:
        self.playback_calls.append((request_id, position_seconds))

    async def generate(self, prompt: Any, *args: Any, **kwargs: Any) -> AsyncIterator[StandInOutput]:  # type: ignore[override]
        (params,) = kwargs["sampling_params_list"]
        paced = params.streaming_buffer_seconds is not None
        if paced:
            self.paced_params.append(params)
        index = 0
        async for output in super().generate(prompt, *args, **kwargs):
            if paced and output.images:
                if self.idle_after is not None and index >= self.idle_after:
                    output.error = "Streaming idle timeout: no playback or output consumption progress"
                metadata = dict(output.multimodal_output.get("metadata") or {})
                stream = dict(metadata.get("stream") or {})
                stream.update(
                    output_chunk_index=index,
                    pacing={"lead_seconds": 0.5, "wait_seconds": 0.0, "retained_bytes": 1024 * (index + 1)},
                )
                output.multimodal_output = {**output.multimodal_output, "metadata": {**metadata, "stream": stream}}
                index += 1
            yield output


class _NullEncoder:
    def encode_chunk(self, frames: np.ndarray) -> bytes:
        return b"x"

    def close(self) -> bytes:
        return b""


PACING = StreamingPacing(max_lead_ms=1500.0, max_output_bytes=8 * 1024 * 1024, idle_timeout_s=7.0)


def _config(pacing: StreamingPacing | None) -> Any:
    return session_config(
        prompt="p",
        format="h264",
        width=128,
        height=128,
        frames_per_chunk=8,
        default_transition_chunks=1,
        num_frames=40,
        streaming_buffer_seconds=None if pacing is None else pacing.max_lead_seconds,
        streaming_pacing=pacing,
    )


def _host(engines: list[StandIn032], **args: Any) -> EngineHost:
    def engine_of(**kwargs: Any) -> StandIn032:
        engines.append(StandIn032(**kwargs))
        return engines[-1]

    return EngineHost(
        engine_of, model="m", engine_args={"chunk_seconds": 0.01, "frames_per_chunk": 8, **args}, health_seconds=60
    )


def _next(source: EngineChunkSource) -> SourceChunk:
    item = source.next_chunk(8)
    assert isinstance(item, SourceChunk)
    return item


def test_a_paced_session_sets_the_request_forwards_playback_and_passes_the_figures_through() -> None:
    engines: list[StandIn032] = []
    host = _host(engines)
    (engine,) = engines
    try:
        assert host.paces  # 0.32's API, max_num_seqs 1
        source = EngineChunkSource(host, _config(PACING), "r1", 40, {}, _NullEncoder)
        assert isinstance(source, PlayerReports)
        first, second = _next(source), _next(source)
        (params,) = engine.paced_params
        assert params.streaming_buffer_seconds == 1.5  # max_lead_ms / 1000
        assert params.streaming_max_output_bytes == 8 * 1024 * 1024
        assert params.streaming_idle_timeout_s == 7.0
        assert first.stream == {
            "output_chunk_index": 0,
            "pacing": {"lead_seconds": 0.5, "wait_seconds": 0.0, "retained_bytes": 1024},
        }
        assert second.stream is not None and second.stream["output_chunk_index"] == 1
        source.playback(0.25)
        source.playback(0.75)
        deadline = time.monotonic() + 30
        while len(engine.playback_calls) < 2:
            assert time.monotonic() < deadline, "playback was not forwarded"
            time.sleep(0.01)
        assert engine.playback_calls == [("r1", 0.25), ("r1", 0.75)]  # in order, by request id
        source.close()
    finally:
        host.shutdown()


def test_an_unpaced_session_on_the_same_engine_sets_nothing_and_forwards_nothing() -> None:
    engines: list[StandIn032] = []
    host = _host(engines)
    (engine,) = engines
    try:
        source = EngineChunkSource(host, _config(None), "r2", 40, {}, _NullEncoder)
        assert _next(source).stream is None
        source.playback(1.0)
        time.sleep(0.2)
        assert engine.paced_params == [] and engine.playback_calls == []
        source.close()
    finally:
        host.shutdown()


def test_the_engines_idle_end_is_a_stall_not_a_failure() -> None:
    engines: list[StandIn032] = []
    host = _host(engines)
    (engine,) = engines
    engine.idle_after = 1
    try:
        source = EngineChunkSource(host, _config(PACING), "r3", 40, {}, _NullEncoder)
        _next(source)
        with pytest.raises(PlayerIdle, match=ENGINE_IDLE_ERROR):
            source.next_chunk(8)
        source.close()
    finally:
        host.shutdown()


def test_pacing_is_detected_from_the_api_and_needs_one_sequence() -> None:
    paced = StandIn032()
    old = StandInAsyncOmni()  # 0.30's shape: neither the method nor the field
    assert engine_paces(paced, 1)
    assert not engine_paces(paced, 2)  # 0.32 refuses a paced request unless max_num_seqs == 1
    assert not engine_paces(old, 1)
    settings = BackendSettings(generator="vllm_omni")
    assert settings.capabilities("m", engine_paces=True).paces
    assert not settings.capabilities("m").paces  # 0.30: streaming_pacing stays in ignored_fields


def test_the_stand_ins_pacing_shape_is_the_032_wheels() -> None:
    wheel = rc_wheel_path()
    omni = ast.parse(wheel_source("vllm_omni/entrypoints/async_omni.py", wheel))
    (method,) = [
        node
        for node in ast.walk(omni)
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "update_streaming_playback"
    ]
    assert [a.arg for a in method.args.args] == ["self", "request_id", "position_seconds"]
    data = wheel_source("vllm_omni/inputs/data.py", wheel)
    for name in ("streaming_buffer_seconds: float | None = None", "streaming_max_output_bytes: int = 64 * 1024 * 1024"):
        assert name in data
    assert "streaming_idle_timeout_s: float = 30.0" in data
    formatter = wheel_source("vllm_omni/diffusion/output_formatter.py", wheel)
    assert (
        '{"output_chunk_index": diffusion_output.chunk_index, "pacing": diffusion_output.streaming_metrics}'
        in formatter
    )
    engine = wheel_source("vllm_omni/diffusion/diffusion_engine.py", wheel)
    assert f'state.error = "{ENGINE_IDLE_ERROR}: no playback or output consumption progress"' in engine
    # generate() gives the output credit back itself when its consumer asks for the next output
    assert "release_streaming_output" in wheel_source("vllm_omni/entrypoints/async_omni.py", wheel)


# --- the session with a source that paces itself (what EngineChunkSource is on 0.32) ------------
class SelfPacedSource:
    """Gives what the test puts in `items`: a chunk, or an exception to raise."""

    pacing = False

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.positions: list[float] = []

    def admit_event(self, interaction: Any) -> None:
        pass

    def playback(self, position_seconds: float) -> None:
        self.positions.append(position_seconds)

    def next_chunk(self, max_frames: int) -> Any:
        item = self.items.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def interrupt(self) -> None:
        self.items.put(None)

    def close(self) -> bytes:
        return b""


class _Sources:
    def __init__(self) -> None:
        self.source = SelfPacedSource()

    def open(self, config: Any, request_id: str) -> SelfPacedSource:
        return self.source

    def close(self) -> None:
        pass


def _session(engine_pacing: bool) -> tuple[SessionManager, SelfPacedSource, Recorder]:
    sources = _Sources()
    settings = BackendSettings(generator="vllm_omni", width=128, height=128, frames_per_chunk=8, max_sessions=1)
    mgr = SessionManager(
        sources=sources,
        capabilities=settings.capabilities("realtime_video", engine_paces=engine_pacing),
        limits=Limits(pacing_lead_chunks=None, max_session_seconds=60.0, stall_timeout_seconds=60.0),
        max_sessions=1,
        watchdog_interval=0.05,
    )
    ch = Recorder()
    start = {"type": "session.start", "prompt": "p", "streaming_pacing": {"max_lead_ms": 2000}}
    mgr.on_request(1, json.dumps(start).encode(), start=True, end=False, channel=ch, secret=SECRET)
    return mgr, sources.source, ch


def _paced_chunk(index: int) -> SourceChunk:
    figures = {"lead_seconds": 1.0, "wait_seconds": 0.25, "retained_bytes": 4096}
    return SourceChunk(
        ChunkPlan(index, {}), RenderedChunk(b"media", 8, 0.0, 0.0), {"output_chunk_index": index, "pacing": figures}
    )


def _playback(mgr: SessionManager, position: float) -> None:
    report = json.dumps({"type": "session.playback", "position_seconds": position}).encode()
    mgr.on_request(1, report, start=False, end=False, channel=Recorder(), secret=SECRET)


def test_the_session_forwards_playback_and_sends_the_engines_figures_then_its_idle_end_is_a_stall() -> None:
    mgr, source, ch = _session(engine_pacing=True)
    (start,) = [m for m, _, _ in ch.sent if m and m["type"] == "video.start"]
    assert start["config"]["ignored_fields"] == [] and start["config"]["streaming_pacing"]["max_lead_ms"] == 2000
    source.items.put(_paced_chunk(0))
    deadline = time.monotonic() + 30
    while not [m for m, _, _ in ch.sent if m and m.get("kind") == "media"]:
        assert time.monotonic() < deadline, "no chunk sent"
        time.sleep(0.01)
    _playback(mgr, 0.5)
    assert source.positions == [0.5]  # on the request path, before the report is answered
    source.items.put(PlayerIdle("the engine ended the paced request: Streaming idle timeout"))
    assert ch.finished.wait(30)
    (media,) = [m for m, _, _ in ch.sent if m and m.get("kind") == "media"]
    assert media["output_chunk_index"] == 0
    assert media["pacing"] == {"lead_seconds": 1.0, "wait_seconds": 0.25, "retained_bytes": 4096}
    (error,) = [m for m, _, _ in ch.sent if m and m["type"] == "error"]
    assert error["code"] == "stall_timeout" and "Streaming idle timeout" in error["message"]


def test_on_an_engine_without_pacing_nothing_is_forwarded_and_the_field_is_ignored() -> None:
    mgr, source, ch = _session(engine_pacing=False)
    (start,) = [m for m, _, _ in ch.sent if m and m["type"] == "video.start"]
    assert start["config"]["ignored_fields"] == ["streaming_pacing"]
    _playback(mgr, 0.5)
    assert source.positions == []
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(30)
