"""A session's engine outputs on their way from the engine's loop to the session's worker,
bounded in bytes.

One Helios chunk at 640x384 is about 97 MB of float32 frames; a session whose encoding or
client falls behind would otherwise hold every chunk the engine makes. The loop side awaits
room (`wait_for_room`) before it takes the next output from the engine, so the engine's
request is held back instead; nothing is dropped. Control items (an error, the end, a failed
event, an interrupt) count no bytes and are never held back.

Invariant: `_bytes` is the sum of the sizes of the outputs put and not yet got; the waiter
event is set whenever `_bytes` is below the bound (so a waiter never sleeps past room).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

#: what one session's queue may hold by default (`vllm_omni_output_queue_bytes`): two Helios
#: chunks at 640x384 (2 x 97 MB), so the worker always has the next chunk ready
DEFAULT_OUTPUT_QUEUE_BYTES = 256 * 2**20


def output_bytes(output: Any) -> int:
    """The bytes an engine output's frames hold (`images` or `multimodal_output["video"]`), 0 when unknown."""
    frames = getattr(output, "images", None)
    if not frames:
        multimodal = getattr(output, "multimodal_output", None)
        frames = multimodal.get("video") if isinstance(multimodal, dict) else None
    items: list[Any] = list(frames) if isinstance(frames, (list, tuple)) else [frames]
    total = 0
    for item in items:
        if hasattr(item, "element_size") and hasattr(item, "nelement"):
            total += int(item.element_size() * item.nelement())  # a torch tensor
        else:
            total += int(getattr(item, "nbytes", 0) or 0)  # a numpy array; 0 for what has no size
    return total


def output_frames(output: Any) -> int:
    """How many frames an engine output carries (an RGB array's leading dimensions, or a list's
    length), 0 when unknown: the engine's running rate counts them (`EngineHost`)."""
    frames = getattr(output, "images", None)
    if not frames:
        multimodal = getattr(output, "multimodal_output", None)
        frames = multimodal.get("video") if isinstance(multimodal, dict) else None
    if isinstance(frames, (list, tuple)) and len(frames) == 1:
        frames = frames[0]
    if isinstance(frames, (list, tuple)):
        return len(frames)  # one image per frame (PIL)
    shape = getattr(frames, "shape", None)
    if shape is None or len(shape) < 3:
        return 0
    count = 1
    for side in tuple(shape)[:-3]:  # [..., H, W, 3]
        count *= int(side)
    return count


class OutputQueue:
    """`queue.Queue` of `(kind, value, at)` items whose outputs are counted in bytes."""

    def __init__(self, max_bytes: int = DEFAULT_OUTPUT_QUEUE_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("the output queue bound must be positive")
        self.max_bytes = max_bytes
        self._items: queue.Queue[tuple[str, Any, float, int]] = queue.Queue()
        self._lock = threading.Lock()  # `_bytes` and `_room` (the loop vs the session's worker)
        self._bytes = 0
        self._room: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes

    def put(self, kind: str, value: Any, at: float, nbytes: int = 0) -> None:
        with self._lock:
            self._bytes += nbytes
        self._items.put((kind, value, at, nbytes))

    def get(self, timeout: float | None = None) -> tuple[str, Any, float]:
        kind, value, at, nbytes = self._items.get(timeout=timeout)
        if nbytes:
            with self._lock:
                self._bytes -= nbytes
                room = self._room if self._bytes < self.max_bytes else None
            if room is not None:
                loop, event = room
                loop.call_soon_threadsafe(event.set)
        return kind, value, at

    async def wait_for_room(self) -> bool:
        """On the engine's loop: return once the queue holds less than its bound; True when it
        had to wait."""
        loop = asyncio.get_running_loop()
        waited = False
        while True:
            with self._lock:
                if self._bytes < self.max_bytes:
                    self._room = None
                    return waited
                event = asyncio.Event()
                self._room = (loop, event)
            waited = True
            await event.wait()
