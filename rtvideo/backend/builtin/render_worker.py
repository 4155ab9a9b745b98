"""A render worker process (see `render_pool`): hosts sessions' generator state and encoders and
renders their chunks one at a time. Started as `python -m rtvideo.backend.builtin.render_worker` (at
the priority the pool chose); requests arrive on stdin and answers leave on stdout, nothing else
is written there."""

from __future__ import annotations

import functools
import gc
import itertools
import sys
from collections.abc import Callable
from typing import Any

from rtvideo.backend.builtin.render_pool import WirePoses, poses_from_wire, read_message, write_message
from rtvideo.backend.runtime.sources import LocalRenderer, RenderedChunk
from rtvideo.core.conditioning import Conditioning


class Worker:
    def __init__(self) -> None:
        self._generator: Any = None
        self._limits: Any = None
        self._sessions: dict[int, LocalRenderer] = {}
        self._ids = itertools.count(1)

    def init(self, options: dict[str, Any]) -> None:
        from rtvideo.backend.builtin.generator import BuiltinGenerator
        from rtvideo.backend.runtime.cpu_threads import limit_cpu_threads

        limit_cpu_threads(int(options.get("torch_threads", 1)))
        self._generator = BuiltinGenerator(device=options.get("device", "cpu"), fps=int(options.get("fps", 16)))
        gc.freeze()  # torch and the text encoder stay: a full collection over them would stall a chunk

    def open(self, width: int, height: int, seed: int, fps: int | None, image: Any = None) -> int:
        from rtvideo.backend.media.encoder import FragmentedMp4Encoder

        generator_session = self._generator.open_session(width=width, height=height, seed=seed, fps=fps, image=image)
        open_encoder = functools.partial(
            FragmentedMp4Encoder, width, height, fps or self._generator.fps, self._generator.limits
        )
        session_id = next(self._ids)
        self._sessions[session_id] = LocalRenderer(generator_session, open_encoder)  # as in the model's process
        return session_id

    def render(
        self, session_id: int, mix: Conditioning, num_frames: int, poses: WirePoses | None = None
    ) -> RenderedChunk:
        renderer = self._sessions[session_id]
        if poses is None:
            return renderer.render(mix, num_frames)
        return renderer.render(mix, num_frames, poses_from_wire(poses))

    def skip(self, session_id: int, num_frames: int) -> None:
        self._sessions[session_id].skip(num_frames)

    def measure(self, width: int, height: int, fps: int, frames: int, device: str) -> float:
        """This worker's frames per second at a size (`warmup`: the model's capacity at load)."""
        from rtvideo.backend.builtin.warmup import frames_per_second

        return frames_per_second(self._generator, width, height, fps, frames, device)

    def close(self, session_id: int) -> bytes:
        return self._sessions.pop(session_id).close()


def main() -> None:
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must not corrupt the answer pipe
    worker = Worker()
    ops: dict[str, Callable[..., Any]] = {
        "init": worker.init,
        "open": worker.open,
        "render": worker.render,
        "skip": worker.skip,
        "measure": worker.measure,
        "close": worker.close,
    }
    while True:
        try:
            call_id, op, args = read_message(requests)
        except EOFError:
            return  # the model closed the pipe: shut down
        try:
            answer = (call_id, True, ops[op](*args))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
            answer = (call_id, False, RuntimeError(f"{type(exc).__name__}: {exc}"))
        write_message(answers, answer)


if __name__ == "__main__":
    main()
