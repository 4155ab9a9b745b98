"""A session's engine outputs are bounded in bytes where they first reach our code: the engine's
loop reads every output at once (upstream's own per-request queue is unbounded, so holding the
reading back would only move the frames there), an output that arrives while the session holds
its bound or more ends the session, the engine request is aborted, the held outputs are freed,
and control items are never refused."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.vllm_omni.engine import EngineError, EngineHost
from rtvideo.backend.vllm_omni.output_queue import OVERFLOW, OutputQueue, output_bytes
from rtvideo.backend.vllm_omni.source import EngineChunkSource
from rtvideo.core.session_config import SessionConfig
from tests.support.omni_standin import StandInAsyncOmni, StandInOutput
from tests.support.session_configs import session_config

HELIOS_CHUNK = 97_320_960  # one 640x384 Helios chunk: 33 x 384 x 640 x 3 float32


def _chunk(frames: int = 33, height: int = 384, width: int = 640) -> StandInOutput:
    return StandInOutput("r", {}, images=[np.zeros((1, frames, height, width, 3), np.float32)])


def test_an_output_counts_the_bytes_of_its_frames() -> None:
    assert output_bytes(_chunk()) == 33 * 384 * 640 * 3 * 4 == HELIOS_CHUNK
    assert output_bytes(object()) == 0


def test_outputs_are_taken_below_the_bound_and_the_first_one_at_it_ends_the_session() -> None:
    q = OutputQueue(max_bytes=2 * HELIOS_CHUNK)
    assert q.offer("c0", 0.0, HELIOS_CHUNK) and q.offer("c1", 0.0, HELIOS_CHUNK)
    assert q.bytes == 2 * HELIOS_CHUNK
    q.put("event_failed", ("e", ValueError("no")), 0.0)  # a control item is never refused
    assert not q.offer("c2", 0.0, HELIOS_CHUNK)  # at the bound: refused
    assert q.bytes == 0  # the held outputs are freed at once, not shown
    assert not q.offer("c3", 0.0, 1)  # and nothing is taken after
    kinds = [q.get(timeout=1) for _ in range(2)]
    assert [k for k, _, _ in kinds] == ["event_failed", OVERFLOW]
    message = kinds[1][1]
    assert "fell behind its engine" in message and str(2 * HELIOS_CHUNK) in message
    assert "vllm_omni_output_queue_bytes" in message and "aborted" in message


def test_one_output_larger_than_the_bound_is_taken_when_nothing_waits() -> None:
    """A 1280x720 Helios chunk (365 MB) is over the 256 MiB default: a worker that keeps up
    still gets every chunk (the bound is what waits, not one chunk's size)."""
    q = OutputQueue()
    big = 33 * 720 * 1280 * 3 * 4
    for n in range(3):
        assert q.offer(n, 0.0, big)
        assert q.get(timeout=1)[1] == n
    assert q.overflowed is None


def test_a_worker_that_keeps_up_gets_everything_in_order() -> None:
    q = OutputQueue(max_bytes=1)
    q.offer("a", 0.0, 10)
    q.put("interrupt", None, 0.0)
    assert [q.get(timeout=1)[0] for _ in range(2)] == ["output", "interrupt"]
    assert q.offer("b", 0.0, 10) and q.get(timeout=1)[1] == "b"
    with pytest.raises(ValueError):
        OutputQueue(max_bytes=0)


def _config(frames: int) -> SessionConfig:
    return session_config(
        prompt="p",
        format="h264",
        width=128,
        height=128,
        frames_per_chunk=8,
        default_transition_chunks=1,
        num_frames=frames,
    )


class _NullEncoder:
    def encode_chunk(self, frames: np.ndarray) -> bytes:
        return b"x"

    def close(self) -> bytes:
        return b""


def test_a_session_that_stops_reading_is_ended_and_its_engine_request_aborted(tmp_path: Path) -> None:
    """Filled for real: the stand-in engine's own per-request queue is unbounded and its pipeline
    goes on whatever the reader does, as upstream's (`client_request_state.py`). The session's
    worker reads nothing: its bound fills, the engine request is aborted before the engine has
    made the rest of it, upstream's queue holds nothing of it, and the worker's next read ends
    the session with the bound named."""
    record = tmp_path / "calls.jsonl"
    engines: list[StandInAsyncOmni] = []

    def engine_of(**kwargs: Any) -> StandInAsyncOmni:
        engines.append(StandInAsyncOmni(**kwargs))
        return engines[-1]

    host = EngineHost(
        engine_of,
        model="m",
        engine_args={"record": str(record), "chunk_seconds": 0.02, "frames_per_chunk": 8},
        health_seconds=60,
    )
    (engine,) = engines
    chunk = 8 * 128 * 128 * 3 * 4  # 1,572,864 bytes of float32 RGB (Helios' smallest side)
    try:
        source = EngineChunkSource(
            host, _config(800), "r", 800, {}, _NullEncoder, output_queue_bytes=3 * chunk
        )  # 100 chunks asked for; the worker takes none
        calls = []
        deadline = time.monotonic() + 30
        while not any(c["call"] == "abort" for c in calls):  # the bound filled (its freeing: the test above)
            assert time.monotonic() < deadline, "the engine request was not aborted"
            time.sleep(0.01)
            calls = [json.loads(line) for line in record.read_text().splitlines()]
        time.sleep(0.2)  # the stand-in's pipeline would have made ~10 more chunks by now
        assert "r" not in engine._queues  # upstream's queue: gone with the request, nothing piled up
        with pytest.raises(EngineError, match=r"fell behind its engine: \d+ bytes .* bound of 4718592"):
            source.next_chunk(8)
        source.close()
    finally:
        host.shutdown()
