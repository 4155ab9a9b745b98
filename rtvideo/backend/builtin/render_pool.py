"""Generation and encoding in worker processes, so the model's interpreter never waits for a
GIL that video work holds.

The Triton stub runs `execute()` (acks, pongs), every response send and every session's
pacing on one interpreter. Rendering a chunk (prompt embedding, the network, RGB→YUV,
x264) holds that interpreter's GIL for milliseconds at a time, and with many sessions the
ack path queues behind it. Here each chunk is rendered in one of a few worker processes
(at a lower scheduling priority), and the session thread only waits on a pipe.

A worker hosts many sessions (its generator state and encoder per session) and renders
their chunks one at a time: video work is CPU-bound, so one worker per core is the most
that helps. The wire between the stub and a worker is length-prefixed pickle over the
worker's stdin/stdout, private to this module.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import pickle
import queue
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import IO, Any

from rtvideo.backend.runtime.sources import GeneratorChunkSource, RenderedChunk
from rtvideo.core.conditioning import Conditioning
from rtvideo.core.pose import Pose
from rtvideo.core.session_config import SessionConfig
from rtvideo.process import launch
from rtvideo.process.interpreter import worker_python

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
RESPAWN_PAUSE_SECONDS = 2.0  # between tries to replace a worker that could not start


class WorkerDied(RuntimeError):
    """The worker process ended (crashed or was killed); its sessions cannot go on."""


def write_message(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the other side closed the pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(data)


#: poses on the wire: ((tx, ty, tz), (qx, qy, qz, qw)) per frame, plain tuples (no project classes in pickles)
WirePoses = tuple[tuple[tuple[float, float, float], tuple[float, float, float, float]], ...]


def poses_to_wire(poses: Sequence[Pose]) -> WirePoses:
    return tuple(
        (
            (float(p.translation[0]), float(p.translation[1]), float(p.translation[2])),
            (float(p.rotation[0]), float(p.rotation[1]), float(p.rotation[2]), float(p.rotation[3])),
        )
        for p in poses
    )


def poses_from_wire(wire: WirePoses) -> list[Pose]:
    return [Pose(translation=tuple(t), rotation=tuple(r)) for t, r in wire]  # type: ignore[arg-type]


class RenderWorker:
    """One worker process and the calls in flight to it (thread-safe)."""

    def __init__(
        self,
        index: int,
        options: Mapping[str, Any],
        priority: str = "idle",
        on_death: Callable[[RenderWorker], None] | None = None,
    ) -> None:
        self.index = index
        self._on_death = on_death  # called once, from the reader thread, when it dies unasked
        # Killed with the model's process, even by kill -9 (while loading it would not see the pipe
        # close). Video work yields to the request path: under SCHED_IDLE a waking request-path
        # thread preempts a worker at once, whereas a nice value only gives it a larger share. The
        # priority is set before the worker's exec, so every thread it starts inherits it.
        python = worker_python()
        self._proc = subprocess.Popen(
            launch.command([python, "-m", "rtvideo.backend.builtin.render_worker"], python=python, priority=priority),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            close_fds=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin, self._stdout = self._proc.stdin, self._proc.stdout
        self._write = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.sessions = 0  # sessions placed here (the pool balances on it)
        self._dead: str | None = None
        self._closing = False
        self._reader = threading.Thread(target=self._read, name=f"render-worker-{index}", daemon=True)
        self._reader.start()
        self.ready = self.call("init", dict(options))  # loading torch and the text encoder takes seconds

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc.poll() is None

    def call(self, op: str, *args: Any) -> Future:
        """Send one request; the future holds its answer (or the worker's exception)."""
        future: Future = Future()
        with self._lock:
            if self._dead is not None:
                future.set_exception(WorkerDied(self._dead))
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
        try:
            with self._write:
                write_message(self._stdin, (call_id, op, args))
        except (OSError, ValueError) as exc:
            self._fail(f"render worker {self.index} is gone ({exc})")
        return future

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = read_message(self._stdout)
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self._fail(f"render worker {self.index} (pid {self._proc.pid}) ended: {exc}")
                return
            with self._lock:
                future = self._pending.pop(call_id, None)
            if future is not None:
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value if isinstance(value, BaseException) else RuntimeError(str(value)))

    def _fail(self, reason: str) -> None:
        with self._lock:
            first = self._dead is None
            if first:
                self._dead = reason
                if not self._closing:
                    log.error("%s", reason)
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerDied(reason))
        if first and not self._closing and self._on_death is not None:
            self._on_death(self)

    def close(self, timeout: float = 5.0) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout)


class RenderPool:
    """A few workers; each session lives on the least loaded live one for its whole life. A
    worker that dies is replaced in the background: starting one takes seconds, which no
    request may wait for (meanwhile new sessions go to the live ones)."""

    def __init__(self, workers: int, options: Mapping[str, Any], priority: str = "idle") -> None:
        if workers < 1:
            raise ValueError("a render pool needs at least one worker")
        self._options = dict(options)
        self._priority = priority
        self._lock = threading.Lock()
        self._closing = False
        self._dead: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # indexes to replace
        self._workers = [self._spawn(i) for i in range(workers)]
        for worker in self._workers:  # started together, waited for together
            worker.ready.result()
        # Workers die with the thread that started them (PR_SET_PDEATHSIG), so replacements
        # are started by one thread that lives as long as the pool.
        self._keeper = threading.Thread(target=self._keep, name="render-pool-keeper", daemon=True)
        self._keeper.start()

    def _spawn(self, index: int) -> RenderWorker:
        return RenderWorker(index, self._options, self._priority, on_death=self._died)

    def _died(self, worker: RenderWorker) -> None:
        if self._workers[worker.index] is worker:  # a replacement that dies loading is retried by _keep
            self._dead.put(worker.index)

    def _keep(self) -> None:
        while (index := self._dead.get()) is not None:
            fresh = self._spawn(index)
            try:
                fresh.ready.result()
            except Exception:
                log.exception("render worker %d could not start; trying again in %g s", index, RESPAWN_PAUSE_SECONDS)
                fresh.close(0.1)
                time.sleep(RESPAWN_PAUSE_SECONDS)
                self._dead.put(index)
                continue
            with self._lock:
                if self._closing:
                    fresh.close()
                    return
                old, self._workers[index] = self._workers[index], fresh
            old.close(0.1)
            log.warning("render worker %d replaced (pid %d)", index, fresh.pid)

    def open_session(
        self, *, width: int, height: int, seed: int, fps: int | None = None, image: Any = None
    ) -> RemoteSession:
        """Place a session on the least loaded live worker. Returns at once: the worker opens it
        while it finishes the chunk in hand, and the session's first use waits for that (and
        raises what opening raised, or `WorkerDied` when no worker is running)."""
        with self._lock:
            live = [w for w in self._workers if w.alive] or self._workers  # none live: its call fails at once
            worker = min(live, key=lambda w: w.sessions)
            worker.sessions += 1
        args = (
            (width, height, seed, fps) if image is None else (width, height, seed, fps, image)
        )  # a numpy array pickles
        return RemoteSession(self, worker, worker.call("open", *args))

    def _released(self, worker: RenderWorker) -> None:
        with self._lock:
            worker.sessions -= 1

    def measure(self, width: int, height: int, fps: int, frames: int, device: str) -> float:
        """Frames per second one worker renders and encodes at a size (`warmup.frames_per_second`),
        measured in the first live worker at model load, before any session."""
        worker = next((w for w in self._workers if w.alive), self._workers[0])
        return float(worker.call("measure", width, height, fps, frames, device).result())

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            self._closing = True
            workers = list(self._workers)
        self._dead.put(None)
        for worker in workers:
            worker.close()
        self._keeper.join(10)


class RemoteSession:
    """A session's generator state and encoder, in a worker: render chunks, then close."""

    def __init__(self, pool: RenderPool, worker: RenderWorker, opened: Future) -> None:
        self._pool, self._worker, self._opened = pool, worker, opened
        self._open = True

    def render(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk:
        """One chunk; `poses` as in `GeneratorSession.generate` (None: the start pose throughout).
        A slerp recipe (`conditioning.Interp`, a frozen core dataclass) pickles as it is: the
        worker runs this same code."""
        wire = None if poses is None else poses_to_wire(poses)
        mix = dict(mix) if isinstance(mix, Mapping) else mix
        return self._worker.call("render", self._opened.result(), mix, num_frames, wire).result()

    def skip(self, num_frames: int) -> None:
        """Move the worker session's time cursor over frames it never renders (a rebuild)."""
        self._worker.call("skip", self._opened.result(), num_frames).result()

    def close(self) -> bytes:
        """The encoder's trailer; frees the session in the worker. Later calls return b''."""
        if not self._open:
            return b""
        self._open = False
        try:
            if self._opened.exception() is not None:
                return b""  # never opened: nothing to free in the worker
            return self._worker.call("close", self._opened.result()).result()
        except WorkerDied:
            return b""  # the worker is gone, and the session with it (whether it opened or not)
        finally:
            self._pool._released(self._worker)


class PooledSources:
    """`ChunkSourceFactory` over a `RenderPool`: each session's chunks are rendered and encoded
    in one of the pool's worker processes."""

    #: its sources take a start's `rebuild` (docs/triton-model.md "Rebuilding a session")
    rebuilds = True

    def __init__(self, pool: RenderPool) -> None:
        self.pool = pool

    def open(self, config: SessionConfig, request_id: str) -> GeneratorChunkSource:
        """The built-in source, rendering in a worker (the tracker stays here: it decides what
        the acks promise)."""
        session = self.pool.open_session(
            width=config.width, height=config.height, seed=config.seed, fps=config.fps, image=config.reference_image
        )
        return GeneratorChunkSource(session, config)

    def close(self) -> None:
        self.pool.close()
