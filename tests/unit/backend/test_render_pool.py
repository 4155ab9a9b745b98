"""Render workers: chunks rendered and encoded in another process decode like local ones, a
worker's death fails its sessions loudly, and a new session gets a new worker."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from rtvideo.backend.builtin.render_pool import RenderPool, RenderWorker, WorkerDied
from tests.support.processes import policies
from tests.support.streams import decode


@pytest.fixture(scope="module")
def pool() -> Iterator[RenderPool]:
    pool = RenderPool(1, {"device": "cpu", "fps": 16})
    try:
        yield pool
    finally:
        pool.close()


def test_chunks_from_a_worker_decode(pool: RenderPool) -> None:
    session = pool.open_session(width=64, height=48, seed=1, fps=16)
    chunks = [session.render({"a red fire": 1.0}, 9), session.render({"a red fire": 0.5, "a blue sea": 0.5}, 5)]
    trailer = session.close()
    assert [c.frames for c in chunks] == [9, 5] and chunks[0].payload[4:8] == b"ftyp"
    frames = decode(b"".join(c.payload for c in chunks) + trailer)
    assert frames.shape == (14, 48, 64, 3)
    assert session.close() == b"", "a second close is a no-op"


def test_workers_run_at_idle_priority_by_default_or_at_the_nice_asked(pool: RenderPool) -> None:
    """SCHED_IDLE on every thread (torch's too), so a request-path thread preempts rendering at once."""
    (pid,) = pool.worker_pids
    assert policies(pid) == {(os.SCHED_IDLE, 0)}
    worker = RenderWorker(0, {"device": "cpu", "fps": 16}, "7")
    try:
        worker.ready.result(60)
        assert policies(worker.pid) == {(os.SCHED_OTHER, 7)}
    finally:
        worker.close()


def test_a_dead_worker_fails_its_sessions_and_is_replaced_in_the_background(pool: RenderPool) -> None:
    session = pool.open_session(width=64, height=48, seed=2, fps=16)
    (pid,) = pool.worker_pids
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDied):
        session.render({"a red fire": 1.0}, 9)
    session.close()
    t0 = time.monotonic()
    orphan = pool.open_session(width=64, height=48, seed=3, fps=16)  # before the replacement is up
    opened = time.monotonic() - t0
    if pool.worker_pids == [pid]:
        with pytest.raises(WorkerDied):  # no worker running: it fails at once, loudly
            orphan.render({"a quiet harbour": 1.0}, 3)
    orphan.close()
    deadline = time.monotonic() + 120
    while pool.worker_pids == [pid] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pool.worker_pids != [pid], "the dead worker was not replaced"
    # Measured against the load itself, not a fixed time: a loaded machine slows both alike.
    replaced = time.monotonic() - t0
    assert opened < replaced / 2, f"a start waited for a worker to load: {opened:.2f} s, the load {replaced:.2f} s"
    fresh = pool.open_session(width=64, height=48, seed=4, fps=16)
    assert fresh.render({"a quiet harbour": 1.0}, 3).frames == 3
    fresh.close()


def test_errors_in_the_worker_come_back_as_exceptions(pool: RenderPool) -> None:
    refused = pool.open_session(width=63, height=48, seed=1, fps=16)  # opening runs in the background
    with pytest.raises(RuntimeError, match="width"):
        refused.render({"a red fire": 1.0}, 9)
    assert refused.close() == b"", "a session that never opened has no trailer"
    session = pool.open_session(width=64, height=48, seed=1, fps=16)
    with pytest.raises(RuntimeError, match="mix"):
        session.render({}, 9)
    session.close()
