"""vLLM-Omni's example client's session loop (examples/online_serving/streaming_video_generation/
streaming_video_client.py), as the compatibility tests play it: send the start, send each
scheduled message at its time after `video.start`, keep each binary chunk with the metadata
text before it, stop at `session.done`."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from websockets.asyncio.client import connect

from tests.support.streams import Transcript


async def play_example_client(
    url: str, payload: dict[str, Any], scheduled: list[tuple[float, dict[str, Any]]]
) -> Transcript:
    """`scheduled`: (seconds after video.start, message), in time order, as its schedulers send them."""
    t = Transcript()
    send_lock = asyncio.Lock()
    task: asyncio.Task[None] | None = None
    pending: dict[str, Any] | None = None

    async def scheduler(websocket: Any, started_at: float) -> None:
        for at, message in scheduled:
            delay = started_at + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with send_lock:
                await websocket.send(json.dumps(message, ensure_ascii=False))

    async with connect(url, max_size=None, proxy=None) as websocket:
        async with send_lock:
            await websocket.send(json.dumps(payload))
        while True:
            message = await asyncio.wait_for(websocket.recv(), 60)
            if isinstance(message, bytes):
                assert pending is not None, "a binary chunk without its metadata"
                t.add(pending, message)
                pending = None
                continue
            msg = json.loads(message)
            if msg["type"] == "video.chunk_metadata":
                pending = msg
                continue
            t.add(msg, b"")
            if msg["type"] == "video.start" and scheduled and task is None:
                task = asyncio.create_task(scheduler(websocket, time.perf_counter()))
            elif msg["type"] == "session.done":
                break
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return t
