"""A session's engine outputs on their way from the engine's loop to the session's worker,
bounded in bytes where they first reach our code.

Why the bound is enforced here and not by holding the engine back (docs/decisions.md, "One
truth about a vLLM-Omni session's memory"): vLLM-Omni 0.30 gives each request an unbounded output
queue of its own (`client_request_state.py`, filled by `inline_stage_diffusion_client.py` as
each chunk is decoded) and has no way to pause a request, so a reader that stops reading holds
nothing back: the chunks only move into upstream's queue, out of sight and out of any bound.
The engine's loop therefore always reads every output as soon as the engine yields it
(upstream's queue stays empty), and this queue is where a session's decoded frames wait.

The rule (`offer`): an output is taken while the outputs the session holds are below
`max_bytes`; the one that arrives when they are at or over it is refused. The engine's loop then
aborts the engine request (no more frames are made for a session that cannot take them), the
outputs still queued are freed at once (not shown: the session is ending), and an `overflow`
item tells the session's worker, which ends the session with `generation_failed` naming the
bound (`EngineChunkSource`). So one session's decoded frames in host memory are at most
`max_bytes` plus one output waiting here, plus the one output the worker is encoding.
Control items (an error, the end, a failed event, an interrupt, the overflow) count no bytes
and are never refused.

Invariant: `_bytes` is the sum of the sizes of the outputs in `_items`; once `overflowed` is
set no output is taken again.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any

#: what one session's queue may hold by default (`vllm_omni_output_queue_bytes`): two Helios
#: chunks at 640x384 (2 x 97 MB), so the worker always has the next chunk ready, while a session
#: whose worker has stopped (a paused session, an encoder far behind) is ended after its model's
#: own number of chunks (`ModelRules.paused_chunks`): 3 of Helios' 97 MB float32 ones (~7 s), 19
#: of LingBot-World's 14.4 MB uint8 ones (~48 s at 5 fps)
DEFAULT_OUTPUT_QUEUE_BYTES = 256 * 2**20

OUTPUT = "output"
OVERFLOW = "overflow"


def _frames_of(output: Any) -> Any:
    frames = getattr(output, "images", None)
    if not frames:
        multimodal = getattr(output, "multimodal_output", None)
        frames = multimodal.get("video") if isinstance(multimodal, dict) else None
    return frames


def output_bytes(output: Any) -> int:
    """The bytes an engine output's frames hold (`images` or `multimodal_output["video"]`), 0 when unknown."""
    frames = _frames_of(output)
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
    frames = _frames_of(output)
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
    """A FIFO of `(kind, value, at)` items whose outputs are counted in bytes (see the module)."""

    def __init__(self, max_bytes: int = DEFAULT_OUTPUT_QUEUE_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("the output queue bound must be positive")
        self.max_bytes = max_bytes
        # (kind, value, at, nbytes); `_ready` guards it, `_bytes` and `overflowed` (loop vs worker)
        self._items: collections.deque[tuple[str, Any, float, int]] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._bytes = 0
        #: the sentence the session ends with, once an output was refused (None until then)
        self.overflowed: str | None = None

    @property
    def bytes(self) -> int:
        with self._ready:
            return self._bytes

    def put(self, kind: str, value: Any, at: float) -> None:
        """A control item: never refused, counts no bytes."""
        with self._ready:
            self._items.append((kind, value, at, 0))
            self._ready.notify()

    def offer(self, output: Any, at: float, nbytes: int) -> bool:
        """An engine output: taken (True) while the outputs held are below the bound; else refused
        (False), the held outputs freed, and an `overflow` item queued for the worker."""
        with self._ready:
            if self.overflowed is None and self._bytes < self.max_bytes:
                self._items.append((OUTPUT, output, at, nbytes))
                self._bytes += nbytes
                self._ready.notify()
                return True
            if self.overflowed is None:
                self.overflowed = (
                    f"the session fell behind its engine: {self._bytes + nbytes} bytes of decoded frames "
                    f"waiting for it, over its bound of {self.max_bytes} (vllm_omni_output_queue_bytes); "
                    "the engine request was aborted"
                )
                self._items = collections.deque(item for item in self._items if item[0] != OUTPUT)
                self._bytes = 0
                self._items.append((OVERFLOW, self.overflowed, at, 0))
                self._ready.notify()
            return False

    def get(self, timeout: float | None = None) -> tuple[str, Any, float]:
        """The next item, waiting for it; `queue.Empty` after `timeout` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self._items:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                self._ready.wait(left)
            kind, value, at, nbytes = self._items.popleft()
            self._bytes -= nbytes
        return kind, value, at
