"""The model's memory under many large interactions: per-event state is fixed-size, so a long
session of prompt updates does not grow the backend stub (real tritonserver, direct gRPC)."""

from __future__ import annotations

import time
from pathlib import Path

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.core.fields import MAX_PROMPT_CHARS
from tests.support.processes import stub_pid
from tests.support.streams import PACED_MODEL, wait_for_metric

#: interactions sent between two chunk boundaries: under the 64 that may wait at once
WAVE = 50


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_3000_large_prompt_interactions_grow_the_stub_by_less_than_20_mb(triton) -> None:
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    pid = stub_pid(triton, PACED_MODEL)
    count, filler = 3000, "x" * (MAX_PROMPT_CHARS - 40)

    def wave(s: TritonStreamSession, first: int, n: int) -> None:
        """`n` interactions acked, then the chunk where the last one starts (the others coalesce
        there): no more than one wave waits at once (the model refuses a 65th waiting event)."""
        tags = {s.interact(f"{i} {filler}", event_id=f"e{i}") for i in range(first, first + n)}
        deadline = time.monotonic() + 120
        while tags:
            reply = s.next(max(0.01, deadline - time.monotonic()))
            if reply.tag in tags:
                assert reply.message is not None and reply.message["type"] == "session.interaction.queued", reply
                tags.discard(reply.tag)
        last = f"e{first + n - 1}"  # the wave's last target starts; the others coalesce before it
        while True:
            reply = s.next(max(0.01, deadline - time.monotonic()))
            if reply.message is not None and last in reply.message.get("started_event_ids", ()):
                return

    def burst(s: TritonStreamSession, first: int, n: int) -> None:
        for start in range(first, first + n, WAVE):
            wave(s, start, min(WAVE, first + n - start))

    with TritonStreamSession(triton.grpc_url, model=PACED_MODEL) as s:
        s.start("a harbour")
        burst(s, 0, 200)  # warm up: allocator arenas, the first embeddings
        before = rss_mb(pid)
        for first in range(200, count, 400):
            burst(s, first, min(400, count - first))
        after = rss_mb(pid)
        s.stop()
        for _reply in s.until("session.done", 60):
            pass
    print(f"stub RSS {before:.1f} -> {after:.1f} MB")
    # The bound is 20 MB; holding each fingerprint whole (the prompt in it) grew it by ~13 MB here.
    assert after - before < 5, f"stub RSS grew {after - before:.1f} MB over {count - 200} interactions"
