"""Session runtime without Triton: failure paths that an end-to-end test cannot provoke.

The encoder is the real one; the generator is a small stand-in that can crash or stall.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from rtvideo.backend.loading.settings import BackendSettings
from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.backend.runtime.manager import SessionManager
from rtvideo.backend.runtime.session import EndReason, Limits
from rtvideo.backend.runtime.sources import FailedEvent, GeneratorSources, Interaction, RenderedChunk, SourceChunk
from rtvideo.core.interaction.types import InteractionRequest
from rtvideo.core.transitions import ChunkPlan
from rtvideo.triton.access import short_hash
from tests.support.recorder import Recorder
from tests.support.runtime_standins import SECRET, StandInGenerator


def manager(behaviour: str = "ok", **limits: Any) -> tuple[SessionManager, StandInGenerator]:
    gen = StandInGenerator(behaviour)
    settings = BackendSettings(width=64, height=64, max_sessions=1)
    mgr = SessionManager(
        sources=GeneratorSources(gen, FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(
            **{"pacing_lead_chunks": None, "max_session_seconds": 60.0, "stall_timeout_seconds": 60.0, **limits}
        ),
        max_sessions=1,
        watchdog_interval=0.05,
    )
    return mgr, gen


def start(mgr: SessionManager, corrid: int = 1, **fields: Any) -> Recorder:
    ch = Recorder()
    mgr.on_request(
        corrid,
        json.dumps({"type": "session.start", "prompt": "p", **fields}).encode(),
        start=True,
        end=False,
        channel=ch,
        secret=SECRET,
    )
    return ch


def test_generator_crash_gives_generation_failed_then_done() -> None:
    mgr, gen = manager("crash")
    ch = start(mgr)
    assert ch.finished.wait(5)
    assert ch.types() == ["video.start", "error", "session.done"]
    assert ch.sent[1][0]["code"] == "generation_failed" and "GPU fell off the bus" in ch.sent[1][0]["message"]
    assert ch.sent[2][2] is True
    assert gen.closed == 1 and mgr.active_sessions == 0


def test_stall_timeout() -> None:
    mgr, _ = manager("stall", stall_timeout_seconds=0.3)
    ch = start(mgr)
    assert ch.finished.wait(5)
    assert ch.types() == ["video.start", "error", "session.done"]
    assert ch.sent[1][0]["code"] == "stall_timeout"
    time.sleep(1.6)  # the stalled worker wakes, finds the session over, sends nothing
    assert ch.types() == ["video.start", "error", "session.done"] and mgr.active_sessions == 0


def test_session_length_limit_ends_with_done() -> None:
    mgr, _ = manager(max_session_seconds=0.2)
    ch = start(mgr)
    assert ch.finished.wait(5)
    types = ch.types()
    assert types[0] == "video.start" and types[-1] == "session.done"
    assert ch.sent[-1][0]["stopped"] is False


def test_cancel_completes_quietly_and_frees() -> None:
    mgr, gen = manager()
    ch = start(mgr)
    time.sleep(0.2)
    ch.cancelled = True
    assert ch.finished.wait(5)
    assert ch.sent[-1] == (None, b"", True), "the start request is completed with a flags-only FINAL"
    assert gen.closed == 1 and mgr.active_sessions == 0


def test_requests_after_end_and_unknown_sequences_get_one_answer() -> None:
    mgr, _ = manager()
    ch = Recorder()
    mgr.on_request(42, b'{"type":"session.ping"}', start=False, end=False, channel=ch, secret=SECRET)
    assert ch.types() == ["error"] and ch.sent[0][2] is True


def test_capacity_refusal_and_stop_with_end_flag() -> None:
    mgr, _ = manager()
    first = start(mgr, 1)
    second = start(mgr, 2)
    assert second.types() == ["error", "session.done"] and second.sent[0][0]["code"] == "server_busy"
    deadline = time.monotonic() + 5
    while "video.chunk_metadata" not in first.types() and time.monotonic() < deadline:
        time.sleep(0.01)  # a chunk is out, so the stop ends with its trailer
    stop = Recorder()
    mgr.on_request(1, b'{"type":"session.stop"}', start=False, end=True, channel=stop, secret=SECRET)
    assert stop.sent == [(None, b"", True)]
    assert first.finished.wait(5)
    assert first.sent[-1][0]["stopped"] is True
    assert first.sent[-2][0]["kind"] == "trailer"


@pytest.mark.parametrize(
    "params,fragment",
    [
        ({"width": "255"}, "even"),
        ({"fps": "zero"}, "not a valid value"),
        ({"generator": "sora"}, "not available"),
        ({"pacing_lead_chunks": "-1"}, ">= 0"),
        ({"colour": "red"}, "unknown model parameter"),
        ({"device": "tpu"}, "device"),
        ({"default_transition_chunks": "-1"}, ">= 0"),
        ({"render_priority": "20"}, "render_priority"),
        ({"render_priority": "-5"}, "render_priority"),
        ({"render_priority": "low"}, "render_priority"),
    ],
)
def test_backend_settings_reject_bad_parameters(params: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        BackendSettings.from_parameters(params)


def test_backend_settings_parse() -> None:
    s = BackendSettings.from_parameters({"pacing_lead_chunks": "off", "width": "320", "max_session_seconds": "90"})
    assert s.pacing_lead_chunks is None and s.width == 320 and s.max_session_seconds == 90.0
    assert s.render_priority == "idle"
    assert BackendSettings.from_parameters({"render_priority": "7"}).render_priority == "7"


def test_interaction_after_the_end_is_refused_not_lost() -> None:
    mgr, _ = manager("stall", stall_timeout_seconds=60.0)
    ch = start(mgr)
    (session,) = mgr.live_sessions()
    session.fail(EndReason.GENERATION_FAILED, "boom")
    late = Recorder()
    session.interact(InteractionRequest(event={"prompt": "late"}, event_id="late"), late)
    assert late.types() == ["error"] and late.sent[0][0]["code"] == "invalid_message"
    assert late.sent[0][0]["request_id"] == session.request_id
    done = ch.sent[-1][0]
    assert done["type"] == "session.done" and done["unapplied_event_ids"] == []


def test_requests_after_the_end_carry_the_request_id_and_stop_completes() -> None:
    mgr, _ = manager()
    ch = start(mgr, num_frames=9)
    assert ch.finished.wait(5)
    rid = ch.sent[0][0]["request_id"]
    ping = Recorder()
    mgr.on_request(1, b'{"type":"session.ping"}', start=False, end=False, channel=ping, secret=SECRET)
    assert ping.sent[0][0]["request_id"] == rid and ping.sent[0][2] is True
    stop = Recorder()
    mgr.on_request(1, b'{"type":"session.stop"}', start=False, end=True, channel=stop, secret=SECRET)
    assert stop.sent == [(None, b"", True)]


def test_session_that_cannot_build_its_encoder_fails_and_frees_everything() -> None:
    """The encoder opens on the session's thread (not on the request path), so the start is
    answered first and the failure ends the session like any generation failure."""
    gen = StandInGenerator()
    settings = BackendSettings(width=64, height=64, max_sessions=1)

    def broken_encoder(width: int, height: int, fps: int) -> Any:
        raise RuntimeError("no libx264")

    mgr = SessionManager(
        sources=GeneratorSources(gen, broken_encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(None, 60.0, 60.0),
        max_sessions=1,
    )
    ch = start(mgr)
    assert ch.finished.wait(5)
    assert ch.types() == ["video.start", "error", "session.done"] and ch.sent[1][0]["code"] == "generation_failed"
    assert "no libx264" in ch.sent[1][0]["message"] and ch.sent[-1][2] is True
    assert gen.closed == 1 and mgr.active_sessions == 0


def test_pacing_rebases_after_a_pause_instead_of_bursting() -> None:
    """A 1.5 s freeze (stand-in: one slow chunk) must not be followed by a burst of chunks."""
    mgr, gen = manager(pacing_lead_chunks=1.0)
    ch = start(mgr, fps=16)  # 9 frames a chunk: 0.5625 s per chunk
    time.sleep(1.3)
    gen.behaviour = "stall"  # the next chunk takes 1.5 s
    time.sleep(1.6)
    gen.behaviour = "ok"
    mark = len(ch.sent)
    time.sleep(1.2)
    after = [m for m, _, _ in ch.sent[mark:] if m and m["type"] == "video.chunk_metadata"]
    mgr.on_request(1, b'{"type":"session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    assert ch.finished.wait(5)
    # paced: about 1.2 / 0.5625 ≈ 2 chunks (+1 for the lead), never the ~3 missed during the freeze at once
    assert len(after) <= 4, f"{len(after)} chunks in 1.2 s after a freeze: a burst"


def test_json_log_fields_come_from_the_code_not_the_client() -> None:
    """JSON log lines lift `request_id=`/`event_id=`/`sequence=`/`peer=` into fields. Client text
    saying the same (a prompt, a field name) must not become a field of its own (a refused
    start naming `peer=6.6.6.6`, a prompt naming an event): only the keys the code writes are lifted."""
    import io
    import logging

    from rtvideo import logsetup

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    try:
        logsetup.configure("INFO", stream=out, fmt="json")
        mgr, _ = manager()
        refused = Recorder()
        mgr.on_request(
            2,
            json.dumps({"type": "session.start", "prompt": "p", "peer=6.6.6.6": 1}).encode(),
            start=True,
            end=False,
            channel=refused,
            secret=SECRET,
        )
        ch = start(mgr, prompt="event_id=forged peer=6.6.6.6 sequence=7", num_frames=1)
        assert refused.finished.wait(5) and ch.finished.wait(5)
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    refusal = next(line for line in lines if "start refused" in line["message"])
    assert "peer" not in refusal, refusal
    started = next(line for line in lines if " started config=" in line["message"])
    assert started["request_id"] == ch.sent[0][0]["request_id"] and started["sequence"] == short_hash(1)
    assert "peer" not in started and "event_id" not in started, started


def test_dispatcher_keeps_order_survives_a_failing_handler_and_drains_on_close() -> None:
    """`execute()` only queues (Triton runs it serially per instance); one thread hands requests
    on in arrival order, so a sequence's start, updates and stop stay in order."""
    from rtvideo.backend.runtime.dispatch import RequestDispatcher

    seen: list[tuple[int, bytes, float]] = []
    gate = threading.Event()

    def handle(corrid: int, payload: bytes, *, start: bool, end: bool, channel: Any, received: float, **_: Any) -> None:
        gate.wait(5)  # the first request holds the thread: the rest must queue, not run beside it
        if payload == b"boom":
            raise RuntimeError("a bug in a handler")
        seen.append((corrid, payload, received))

    dispatcher = RequestDispatcher(handle)
    before = time.monotonic()
    for i in range(50):
        dispatcher.submit(i % 3, b"boom" if i == 7 else f"m{i}".encode(), start=False, end=False, channel=Recorder())
    assert seen == []
    gate.set()
    dispatcher.close()
    assert [p for _, p, _ in seen] == [f"m{i}".encode() for i in range(50) if i != 7]
    assert all(before <= r <= time.monotonic() for _, _, r in seen), "received is when execute() queued it"


def test_the_ack_time_counts_the_wait_before_dispatch() -> None:
    from rtvideo.backend.runtime import metrics

    recorded = metrics.BufferedMetrics()
    settings = BackendSettings(width=64, height=64, max_sessions=1)
    mgr = SessionManager(
        sources=GeneratorSources(StandInGenerator(), FragmentedMp4Encoder),
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(None, 60.0, 60.0),
        max_sessions=1,
        metrics=recorded,
    )
    ch = start(mgr)
    ack = Recorder()
    mgr.on_request(
        1,
        b'{"type":"session.interaction","interaction":{"event":{"prompt":"q"}}}',
        start=False,
        end=False,
        channel=ack,
        received=time.monotonic() - 0.5,
        secret=SECRET,
    )
    assert ack.types() == ["session.interaction.queued"]
    mgr.on_request(1, b'{"type":"session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    assert ch.finished.wait(5)
    counted = recorded.drain().increments
    assert counted[(metrics.ACKS, "", "")] == 1 and 0.5 <= counted[(metrics.ACK_SECONDS, "", "")] < 5


# --- one path through a session: scripted sources -------------------------------------------
class ScriptedSource:
    """A `ChunkSource` whose worker side takes what the test puts in `items` (a chunk, a failed
    event, or None as `interrupt()` does); a callable item runs first (to hold the worker)."""

    pacing = False

    def __init__(self) -> None:
        self.items: queue.Queue[Any] = queue.Queue()
        self.admitted: list[tuple[str, str, int]] = []
        self.interrupts = 0
        self.closed = threading.Event()

    def admit_event(self, interaction: Interaction) -> None:
        assert interaction.prompt is not None  # this source takes prompts only
        self.admitted.append((interaction.event_id, interaction.prompt, interaction.prompt_chunks))

    def next_chunk(self, max_frames: int) -> Any:
        item = self.items.get()
        return item() if callable(item) else item

    def interrupt(self) -> None:
        self.interrupts += 1
        self.items.put(None)

    def close(self) -> bytes:
        self.closed.set()
        return b""


class ScriptedSources:
    def __init__(self) -> None:
        self.source = ScriptedSource()

    def open(self, config: Any, request_id: str) -> ScriptedSource:
        return self.source

    def close(self) -> None:
        pass


def chunk(index: int, **lists: tuple[str, ...]) -> SourceChunk:
    return SourceChunk(ChunkPlan(index, {}, **lists), RenderedChunk(b"media", 3, 0.0, 0.0))


def scripted(channel: Recorder | None = None, **limits: Any) -> tuple[SessionManager, ScriptedSource, Recorder]:
    sources = ScriptedSources()
    settings = BackendSettings(width=64, height=64, max_sessions=1, default_transition_chunks=2)
    mgr = SessionManager(
        sources=sources,
        capabilities=settings.capabilities("realtime_video"),
        limits=Limits(
            **{"pacing_lead_chunks": None, "max_session_seconds": 60.0, "stall_timeout_seconds": 60.0, **limits}
        ),
        max_sessions=1,
        watchdog_interval=0.05,
    )
    ch = channel or Recorder()
    mgr.on_request(1, b'{"type": "session.start", "prompt": "p"}', start=True, end=False, channel=ch, secret=SECRET)
    return mgr, sources.source, ch


def interact(mgr: SessionManager, event_id: str, n: int | None = None) -> Recorder:
    ack = Recorder()
    interaction: dict[str, Any] = {"event_id": event_id, "event": {"prompt": event_id}}
    if n is not None:
        interaction["transition_chunks"] = n
    payload = json.dumps({"type": "session.interaction", "interaction": interaction}).encode()
    mgr.on_request(1, payload, start=False, end=False, channel=ack, secret=SECRET)
    return ack


def test_sources_get_the_resolved_transition_length() -> None:
    mgr, source, ch = scripted()
    interact(mgr, "a")
    interact(mgr, "b", 0)
    assert source.admitted == [("a", "a", 2), ("b", "b", 0)], "the session's default, resolved before the source"
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(5)


def test_an_end_wakes_a_source_waiting_for_the_generator() -> None:
    """No wait polls: a failure from another thread posts the source's wake-up, and the worker
    frees the source at once (it waited on its queue, with no timeout)."""
    mgr, source, ch = scripted()
    time.sleep(0.1)  # the worker waits in next_chunk
    mgr.backend_failed("gone")
    assert source.closed.wait(1) and source.interrupts >= 1
    assert ch.types() == ["video.start", "error", "session.done"]


def test_a_cancelled_stream_wakes_the_wait_and_ends_quietly() -> None:
    mgr, source, ch = scripted()
    time.sleep(0.1)
    ch.cancelled = True  # the watch loop's poll finds it and interrupts the source
    assert ch.finished.wait(2) and source.closed.wait(1)
    assert ch.sent[-1] == (None, b"", True) and mgr.active_sessions == 0


def test_a_paced_wait_wakes_on_a_stop() -> None:
    mgr, _gen = manager(pacing_lead_chunks=0.0)
    ch = start(mgr, fps=1)  # 9 s a chunk: the second chunk is due in 9 s
    deadline = time.monotonic() + 5
    while "video.chunk_metadata" not in ch.types():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    began = time.monotonic()
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    assert ch.finished.wait(2) and time.monotonic() - began < 1
    assert ch.sent[-1][0]["stopped"] is True


def test_an_ack_does_not_wait_for_a_chunk_send_in_progress() -> None:
    """Lock order: a chunk's send holds the stream lock only; an ack takes the state lock only."""
    gate = threading.Event()

    class SlowStream(Recorder):
        def send(self, message: Mapping[str, Any] | None, data: bytes = b"", *, final: bool = False) -> None:
            if data == b"media":
                gate.wait(5)
            super().send(message, data, final=final)

    mgr, source, ch = scripted(SlowStream())
    source.items.put(chunk(0))
    time.sleep(0.1)  # the worker is in the chunk's send
    began = time.monotonic()
    ack = interact(mgr, "a")
    assert ack.types() == ["session.interaction.queued"] and time.monotonic() - began < 1
    gate.set()
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(5)
    assert ch.sent[-1][0]["unapplied_event_ids"] == ["a"]


def test_session_done_lists_come_from_the_chunks_actually_sent() -> None:
    """A chunk planned but never sent (the session ended while it rendered) starts nothing."""
    mgr, source, ch = scripted()
    interact(mgr, "a")
    interact(mgr, "b")
    source.items.put(chunk(0, started=("a",), active=("a",)))
    rendering, release = threading.Event(), threading.Event()

    def render_late() -> SourceChunk:
        rendering.set()
        release.wait(5)
        return chunk(1, started=("b",), active=("b",), interrupted=("a",))

    source.items.put(render_late)
    assert rendering.wait(5)
    mgr.backend_failed("gone")
    release.set()
    assert source.closed.wait(5)
    done = ch.sent[-1][0]
    assert done["type"] == "session.done" and done["unfinished_event_ids"] == ["a"]
    assert done["unapplied_event_ids"] == ["b"], "b's chunk was never sent"
    assert [m["started_event_ids"] for m, _, _ in ch.sent if m and m["type"] == "video.chunk_metadata"] == [["a"]]


def test_an_event_gets_one_end_even_when_its_failure_comes_late() -> None:
    mgr, source, ch = scripted()
    interact(mgr, "a")
    interact(mgr, "b")
    source.items.put(chunk(0, started=("b",), active=("b",), completed=("b",), superseded=("a",)))
    source.items.put(FailedEvent("a", "refused after it was superseded"))  # a already has its end
    source.items.put(FailedEvent("ghost", "never admitted here"))
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(5)
    assert "error" not in ch.types()
    done = ch.sent[-1][0]
    assert done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []


def test_unsupported_fields_fail_the_event_once_on_the_start_stream() -> None:
    mgr, source, ch = scripted()
    ack = Recorder()
    payload = json.dumps(
        {
            "type": "session.interaction",
            "interaction": {"event_id": "x", "event": {"prompt": "p", "negative_prompt": "n"}},
        }
    )
    mgr.on_request(1, payload.encode(), start=False, end=False, channel=ack, secret=SECRET)
    assert ack.types() == ["session.interaction.queued"] and source.admitted == []
    errors = [m for m, _, _ in ch.sent if m and m["type"] == "error"]
    assert [(e["code"], e["event_id"]) for e in errors] == [("interaction_failed", "x")]
    mgr.on_request(1, b'{"type": "session.stop"}', start=False, end=True, channel=Recorder(), secret=SECRET)
    source.items.put(None)
    assert ch.finished.wait(5) and ch.sent[-1][0]["unapplied_event_ids"] == []
