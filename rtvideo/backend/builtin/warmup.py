"""The built-in generator's real-time capacity, measured at model load.

One process renders and encodes a few chunks at the deployment's default size, exactly as a
session's chunks are made (`LocalRenderer`: the generator, then the encoder), and counts the
frames per second of its own work. On the CPU that is process CPU time, not wall time: a CI
machine or a host loaded by others stretches wall time, not the CPU time a chunk costs, so a
loaded machine does not measure a capacity it would then refuse its own sessions by. On a GPU
it is wall time (the device's time is what a chunk costs there).

The first chunks pay for lazy set-up (the encoder's open, caches), so the figure is the median
of the chunks after them.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any

from rtvideo.backend.runtime.sources import LocalRenderer

#: chunks rendered at load; the first `_SETTLING` are not counted
WARMUP_CHUNKS = 6
_SETTLING = 2
#: the scene the warm-up renders (any prompt costs the same)
_PROMPT = "a lighthouse on a cliff at dusk"


def frames_per_second(generator: Any, width: int, height: int, fps: int, frames: int, device: str) -> float:
    """Frames per second one process renders and encodes at `width`x`height`, in chunks of
    `frames` (CPU time on a CPU, wall time on a GPU)."""
    from rtvideo.backend.media.encoder import FragmentedMp4Encoder

    session = generator.open_session(width=width, height=height, seed=1, fps=fps)
    renderer = LocalRenderer(session, functools.partial(FragmentedMp4Encoder, width, height, fps, generator.limits))
    clock = time.perf_counter if device.startswith("cuda") else time.process_time
    rates = []
    try:
        for _ in range(WARMUP_CHUNKS):
            t0 = clock()
            renderer.render({_PROMPT: 1.0}, frames)
            rates.append(frames / max(clock() - t0, 1e-6))
    finally:
        renderer.close()
    return statistics.median(rates[_SETTLING:])


def parallel_processes(workers: int, device: str) -> int:
    """How many render processes work at once: one per worker up to the cores this process may
    use on a CPU (`render_workers 0`: the model's own process), one on a GPU (they share it)."""
    if device.startswith("cuda") or workers <= 0:
        return 1
    return max(1, min(workers, len(os.sched_getaffinity(0))))
