"""A session's engine outputs are bounded in bytes: the engine's loop waits for room, the
session's worker makes it, nothing is dropped, and control items are never held back."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from rtvideo.backend.vllm_omni.output_queue import OutputQueue, output_bytes
from tests.support.omni_standin import StandInOutput


def _chunk(frames: int = 33) -> StandInOutput:
    return StandInOutput("r", {}, images=[np.zeros((1, frames, 384, 640, 3), np.float32)])


def test_an_output_counts_the_bytes_of_its_frames() -> None:
    assert output_bytes(_chunk()) == 33 * 384 * 640 * 3 * 4 == 97_320_960  # one 640x384 Helios chunk
    assert output_bytes(object()) == 0


def test_the_loop_waits_for_room_until_the_worker_takes_an_output() -> None:
    q = OutputQueue(max_bytes=2 * output_bytes(_chunk()))
    taken = threading.Event()

    async def produce() -> list[str]:
        order = []
        for n in range(4):
            q.put("output", n, 0.0, output_bytes(_chunk()))
            order.append(f"put {n}")
            await q.wait_for_room()
        q.put("end", None, 0.0)
        return order

    def consume() -> list[object]:
        got = []
        taken.wait(10)
        while True:
            kind, value, _ = q.get(timeout=10)
            got.append(value)
            if kind == "end":
                return got

    async def main() -> tuple[list[str], list[object]]:
        worker = asyncio.get_running_loop().run_in_executor(None, consume)
        producer = asyncio.ensure_future(produce())
        await asyncio.sleep(0.2)
        assert not producer.done() and q.bytes == 2 * output_bytes(_chunk())  # held at its bound
        taken.set()
        return await asyncio.wait_for(producer, 10), await asyncio.wait_for(worker, 10)

    order, got = asyncio.run(main())
    assert order == ["put 0", "put 1", "put 2", "put 3"] and got == [0, 1, 2, 3, None]  # nothing dropped
    assert q.bytes == 0


def test_control_items_are_never_held_back() -> None:
    q = OutputQueue(max_bytes=1)
    q.put("output", "big", 0.0, 10)
    q.put("event_failed", ("e", ValueError("no")), 0.0)
    q.put("interrupt", None, 0.0)
    assert [q.get(timeout=1)[0] for _ in range(3)] == ["output", "event_failed", "interrupt"]
    with pytest.raises(ValueError):
        OutputQueue(max_bytes=0)
