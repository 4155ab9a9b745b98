"""The Triton model end to end: a real tritonserver, real tritonclient gRPC streams, real decoding."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rtvideo.client.triton_stream import TritonStreamSession
from tests.support.paths import REPO_ROOT
from tests.support.processes import descendants, policies, stub_pid
from tests.support.streams import (
    FAST_MODEL,
    PACED_MODEL,
    Transcript,
    check_stream_rules,
    decode,
    distance,
    ids,
    metric,
    split_chunks,
    wait_for_metric,
)


def collect(session: TritonStreamSession, timeout: float = 120.0) -> Transcript:
    t = Transcript()
    for reply in session.until("session.done", timeout):
        t.add(reply.message, reply.data)
    return t


def next_media(session: TritonStreamSession, t: Transcript, timeout: float = 30.0) -> dict[str, Any]:
    """Read until the next media metadata (recording everything on the way)."""
    deadline = time.monotonic() + timeout
    while True:
        reply = session.next(max(0.01, deadline - time.monotonic()))
        t.add(reply.message, reply.data)
        if reply.message and reply.message.get("type") == "video.chunk_metadata":
            return reply.message


def test_full_session_decodes(triton) -> None:
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.start("A quiet harbour at dawn", num_frames=30, seed=7)
        t = collect(s)
    check_stream_rules(t)
    start = t.messages[0]
    assert start["request_id"].startswith("video_stream-")
    cfg = start["config"]
    assert (cfg["width"], cfg["height"], cfg["fps"], cfg["frames_per_chunk"]) == (256, 256, 16, 9)
    assert cfg["num_frames"] == 30 and cfg["default_transition_chunks"] == 3 and cfg["seed"] == 7
    assert [m["num_frames"] for m in t.media] == [9, 9, 9, 3]
    frames = decode(t.video)
    assert frames.shape == (30, 256, 256, 3)
    done = t.messages[-1]
    assert done["stopped"] is False and done["unapplied_event_ids"] == [] and done["unfinished_event_ids"] == []


def test_bad_start_is_refused_with_done(triton) -> None:
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.send({"type": "session.start", "prompt": "x", "format": "webm"}, start=True)
        first, second = s.next(), s.next()
        s.send({"type": "session.ping"})
        late = s.next()
        s.send({"type": "session.stop"}, end=True)  # completes flags-only: nothing reaches this client
    assert first.message["code"] == "unsupported_format"
    assert second.message["type"] == "session.done" and second.message["chunks"] == 0
    assert late.message["code"] == "invalid_message", "a request after the end still gets its one answer"


def run_trace(triton, steps: list[list[dict[str, Any]]], chunks_after: int) -> list[dict[str, Any]]:
    """On the paced model: after chunk 1, before each following boundary, send that step's updates."""
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:
        t = Transcript()
        s.start("source", seed=1)
        next_media(s, t)
        next_media(s, t)  # chunk 1 arrived: the next boundary is about a chunk away
        metas = []
        for step in steps + [[]] * chunks_after:
            tags = [s.interact(**u) for u in step]
            for _ in tags:  # wait for this step's acks so they precede the boundary
                while True:
                    r = s.next()
                    t.add(r.message, r.data)
                    if r.tag in tags:
                        break
            metas.append(next_media(s, t))
        s.stop()
        for reply in s.until("session.done"):
            t.add(reply.message, reply.data)
    check_stream_rules(t)
    return metas


def test_golden_hard_update(triton) -> None:
    (m1, m2) = run_trace(triton, [[dict(prompt="A", event_id="A", transition_chunks=0)]], 1)
    assert ids(m1) == (["A"], ["A"], ["A"], [], []) and m1["transition_progress"] == {"A": 1.0}
    assert ids(m2) == ([], [], [], [], [])


def test_golden_default_n(triton) -> None:
    m1, m2, m3, m4 = run_trace(triton, [[dict(prompt="A", event_id="A")]], 3)
    assert ids(m1) == (["A"], ["A"], [], [], [])
    assert ids(m2) == ([], ["A"], [], [], [])
    assert ids(m3) == ([], ["A"], ["A"], [], [])
    assert [m["transition_progress"]["A"] for m in (m1, m2, m3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert ids(m4) == ([], [], [], [], [])


def test_golden_interrupt(triton) -> None:
    m1, m2, m3 = run_trace(
        triton,
        [[dict(prompt="A", event_id="A", transition_chunks=3)], [dict(prompt="B", event_id="B", transition_chunks=2)]],
        1,
    )
    assert ids(m1) == (["A"], ["A"], [], [], [])
    assert ids(m2) == (["B"], ["A", "B"], [], [], ["A"])
    assert m2["transition_progress"] == pytest.approx({"A": 2 / 3, "B": 0.5})
    assert ids(m3) == ([], ["B"], ["B"], [], [])


def test_golden_overlap(triton) -> None:
    _m1, m2, m3 = run_trace(
        triton,
        [[dict(prompt="A", event_id="A", transition_chunks=2)], [dict(prompt="B", event_id="B", transition_chunks=2)]],
        1,
    )
    assert ids(m2) == (["B"], ["A", "B"], ["A"], [], [])
    assert ids(m3) == ([], ["B"], ["B"], [], [])


def test_golden_supersede(triton) -> None:
    (m1, m2) = run_trace(
        triton, [[dict(prompt="A", event_id="A"), dict(prompt="B", event_id="B", transition_chunks=0)]], 1
    )
    assert ids(m1) == (["B"], ["B"], ["B"], ["A"], [])
    assert ids(m2) == ([], [], [], [], [])


def test_retry_conflict_and_generated_ids(triton) -> None:
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as s:
        s.start("source", num_frames=90, seed=3)
        tags = [
            s.interact("snow", event_id="e1", transition_chunks=1),
            s.interact("snow", event_id="e1", transition_chunks=1),
            s.interact("rain", event_id="e1", transition_chunks=1),
            s.interact("fog"),
            s.interact(event={"prompt": "x", "negative_prompt": "blur"}, event_id="neg"),
            s.send('{"type":"session.interaction","interaction":{"event":{"prompt":""},"event_id":"bad"}}'),
            s.send({"type": "session.ping"}),
            s.send(b"\xff"),
        ]
        t = Transcript()
        answers: dict[str, dict] = {}
        for reply in s.until("session.done"):
            t.add(reply.message, reply.data)
            if reply.tag in tags:
                assert reply.tag not in answers, "exactly one response per request"
                answers[reply.tag] = reply.message
    check_stream_rules(t)
    a = [answers[tag] for tag in tags]
    assert (
        a[0]
        == a[1]
        == {"type": "session.interaction.queued", "request_id": t.messages[0]["request_id"], "event_id": "e1"}
    )
    assert a[2]["code"] == "event_id_conflict" and a[2]["event_id"] == "e1"
    assert a[3]["type"] == "session.interaction.queued" and len(a[3]["event_id"]) == 36
    assert a[4]["type"] == "session.interaction.queued" and a[4]["event_id"] == "neg"
    assert a[5]["code"] == "invalid_interaction" and a[5]["event_id"] == "bad"
    assert a[6] == {"type": "session.pong"}
    assert a[7]["code"] == "invalid_json"
    failed = [m for m in t.of_type("error") if m["code"] == "interaction_failed"]
    assert [m["event_id"] for m in failed] == ["neg"]
    started = [e for m in t.media for e in m["started_event_ids"]]
    assert started.count("e1") <= 1 and "neg" not in started and "bad" not in started
    named = {e for m in t.media for k in ("started_event_ids", "superseded_event_ids") for e in m[k]}
    done = t.messages[-1]
    for eid in ("e1", a[3]["event_id"]):
        assert eid in named or eid in done["unapplied_event_ids"]


def test_stop_sends_trailer_and_done(triton) -> None:
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:
        t = Transcript()
        s.start("lanterns", seed=5)
        next_media(s, t)
        s.interact("snowy street", event_id="late", transition_chunks=5)
        next_media(s, t)
        s.stop()
        for reply in s.until("session.done"):
            t.add(reply.message, reply.data)
    check_stream_rules(t)
    trailer, data = t.pairs[-1]
    assert trailer["kind"] == "trailer" and trailer["byte_length"] == len(data) > 0
    done = t.messages[-1]
    assert done["stopped"] is True
    assert done["unfinished_event_ids"] == ["late"] or done["unapplied_event_ids"] == ["late"]
    assert decode(t.video).shape[0] == sum(m["num_frames"] for m in t.media)


def test_cancel_frees_session(triton) -> None:
    s = TritonStreamSession(triton.grpc_url, FAST_MODEL)
    t = Transcript()
    s.start("endless", seed=2)
    next_media(s, t)
    next_media(s, t)
    wait_for_metric(triton, "rtvideo_active_sessions", FAST_MODEL, 1)
    ends = metric(triton, "rtvideo_session_ends_total", FAST_MODEL)
    s.cancel()  # the stream only: no sequence_end
    wait_for_metric(triton, "rtvideo_active_sessions", FAST_MODEL, 0, timeout=10)
    deadline = time.monotonic() + 5
    while metric(triton, "rtvideo_session_ends_total", FAST_MODEL) <= ends:
        assert time.monotonic() < deadline, "the session end was not counted"
        time.sleep(0.05)


def test_close_without_stop_ends_the_sequence_and_frees_the_slot(triton) -> None:
    """close() of a running session sends session.stop with sequence_end and waits for session.done:
    the session ends as stopped (not cancelled), its slot of the max_sessions: 2 model is free at
    once for a new session, and the model's active count returns to 0."""
    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    stopped = metric(triton, "rtvideo_session_ends_total", PACED_MODEL, 'reason="stopped"')
    held = [TritonStreamSession(triton.grpc_url, PACED_MODEL) for _ in range(2)]
    late = TritonStreamSession(triton.grpc_url, PACED_MODEL)
    try:
        for s in held:
            s.start("holding a slot", seed=1)
            assert s.next().message["type"] == "video.start"
        wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 2)
        began = time.monotonic()
        held[0].close(timeout=30)  # the caller never sent session.stop (30 s: room for a loaded machine)
        assert time.monotonic() - began < 30, "close() waits for session.done, boundedly"
        wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 1, timeout=30)
        late.start("the freed slot", seed=2)
        assert late.next(10).message["type"] == "video.start", "the closed session's slot was not free"
        for s in (held[1], late):
            s.close()
        wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0, timeout=30)
        deadline = time.monotonic() + 30  # ended by the stop, not by the stream's cancellation
        while metric(triton, "rtvideo_session_ends_total", PACED_MODEL, 'reason="stopped"') < stopped + 3:
            assert time.monotonic() < deadline, "the closed sessions did not end as stopped"
            time.sleep(0.05)
    finally:
        for s in (*held, late):
            s.cancel()


def test_capacity_gives_server_busy(triton) -> None:
    sessions = [TritonStreamSession(triton.grpc_url, PACED_MODEL) for _ in range(3)]
    try:
        for s in sessions[:2]:
            s.start("busy", seed=1)
            assert s.next().message["type"] == "video.start"
        refused = sessions[2]
        refused.start("one too many")
        err, done = refused.next(10), refused.next(10)
        assert err.message["code"] == "server_busy" and "2 session slots" in err.message["message"]
        assert done.message["type"] == "session.done"
        refused.stop()
    finally:
        for s in sessions[:2]:
            s.stop()
            list(s.until("session.done"))
        for s in sessions:
            s.close()


def test_four_concurrent_sessions_are_independent(triton) -> None:
    sessions = [TritonStreamSession(triton.grpc_url, FAST_MODEL) for _ in range(4)]
    try:
        for i, s in enumerate(sessions):  # 16 chunks: long enough that the update lands in time
            s.start(f"scene {i}", num_frames=144, seed=i)
            s.interact(f"update {i}", event_id=f"u{i}", transition_chunks=1)
        transcripts = [collect(s) for s in sessions]
    finally:
        for s in sessions:
            s.close()
    rids = {t.messages[0]["request_id"] for t in transcripts}
    assert len(rids) == 4
    for i, t in enumerate(transcripts):
        check_stream_rules(t)
        assert sum(m["num_frames"] for m in t.media) == 144
        events = {e for m in t.media for e in m["active_event_ids"]} | set(t.messages[-1]["unapplied_event_ids"])
        assert events == {f"u{i}"}
        assert decode(t.video).shape[0] == 144


def paced_frames(triton, prompt: str, update: str | None, chunks: int) -> tuple[list, list]:
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as s:
        t = Transcript()
        s.start(prompt, seed=11)
        next_media(s, t)
        next_media(s, t)
        if update is not None:
            tag = s.interact(update, event_id="to-b", transition_chunks=4)
            while True:
                reply = s.next()
                t.add(reply.message, reply.data)
                if reply.tag == tag:
                    break
        for _ in range(chunks):
            next_media(s, t)
        s.stop()
        for reply in s.until("session.done"):
            t.add(reply.message, reply.data)
    frames = split_chunks(decode(t.video), [m["num_frames"] for m in t.media])
    return frames, t.media


def test_transition_moves_frames_toward_target(triton) -> None:
    a_frames, _ = paced_frames(triton, "a red desert canyon", None, 4)
    b_frames, _ = paced_frames(triton, "a blue frozen ocean", None, 4)
    morph, metas = paced_frames(triton, "a red desert canyon", "a blue frozen ocean", 4)
    assert distance(a_frames[2], b_frames[2]) > 15, "two prompts must give clearly different frames"
    assert metas[2]["started_event_ids"] == ["to-b"]
    dists = [distance(morph[k], b_frames[k]) for k in range(2, 6)]
    assert all(x > y for x, y in itertools.pairwise(dists)), dists
    assert dists[-1] < 0.25 * dists[0]


def test_readme_tritonclient_example(triton, tmp_path: Path) -> None:
    """The direct `tritonclient.grpc` script of docs/triton-model.md runs as written (pointed at
    this Triton), and the README's excerpt of it is made of its lines, in its order."""
    guide = (REPO_ROOT / "docs" / "triton-model.md").read_text()
    match = re.search(r"<!-- tritonclient-example -->\n```python\n(.*?)```", guide, re.S)
    assert match, "docs/triton-model.md lost its tritonclient example"
    script = match.group(1)
    assert len(script.splitlines()) <= 45
    readme = (REPO_ROOT / "README.md").read_text()
    excerpt = re.search(r"<!-- tritonclient-excerpt -->\n```python\n(.*?)```", readme, re.S)
    assert excerpt, "the README lost its tritonclient excerpt"
    lines = [line for line in excerpt.group(1).splitlines() if not line.strip().startswith("...")]  # "...": elided
    rest = iter(script.splitlines())
    assert len(lines) >= 8 and all(line in rest for line in lines), "the README's excerpt is not the script in order"
    here = 'URL, MODEL = "127.0.0.1:8001", "realtime_video"'
    assert here in script
    script = script.replace(here, f'URL, MODEL = "{triton.grpc_url}", "{FAST_MODEL}"')
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "'type': 'session.interaction.queued'" in out.stdout and "'event_id': 'u1'" in out.stdout, out.stdout
    assert "'type': 'error'" not in out.stdout
    assert decode((tmp_path / "harbour.mp4").read_bytes()).shape[0] >= 6 * 9  # stopped after chunk 5
    wait_for_metric(triton, "rtvideo_active_sessions", FAST_MODEL, 0, timeout=10)


def test_a_killed_render_worker_fails_its_session_and_is_replaced_without_blocking(triton) -> None:
    """The shipped model renders in worker processes. Killing them ends their sessions with
    generation_failed and session.done; a start meanwhile is answered at once (it does not
    wait seconds for a worker to load); once replaced, sessions play again."""
    import os
    import signal

    def workers() -> set[int]:
        """Workers past their launcher (which has the worker's command in its own, and sets the
        priority just before it execs: a replacement caught there was not SCHED_IDLE yet)."""
        found = set()
        for p in descendants(stub_pid(triton, PACED_MODEL)):
            try:
                argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[1:3] == [b"-m", b"rtvideo.backend.builtin.render_worker"]:
                found.add(p)
        return found

    wait_for_metric(triton, "rtvideo_active_sessions", PACED_MODEL, 0)
    before = workers()
    assert len(before) == 2, f"the shipped model runs 2 render workers, found {before}"
    assert all(policies(p) == {(os.SCHED_IDLE, 0)} for p in before), "render workers run under SCHED_IDLE"
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as victim:
        victim.start("a lighthouse in a storm", seed=3)
        next_media(victim, Transcript())
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        t = collect(victim, timeout=15)
        assert any(m.get("code") == "generation_failed" for m in t.messages), t.messages
        assert t.messages[-1]["type"] == "session.done"
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as meanwhile:
        began = time.monotonic()
        meanwhile.start("started while the workers reload", seed=4)
        assert meanwhile.next(10).message["type"] == "video.start"
        started = time.monotonic() - began
        meanwhile.stop()
        collect(meanwhile, timeout=30)  # ends either way: with a chunk, or generation_failed
    deadline = time.monotonic() + 90
    while not (len(now := workers()) == 2 and not now & before):
        assert time.monotonic() < deadline, f"the render workers were not replaced: {now}"
        time.sleep(0.2)
    # Against the reload itself, not a fixed time: a loaded machine slows both alike.
    reloaded = time.monotonic() - killed
    assert started < reloaded / 2, f"a start waited for a render worker to load: {started:.2f} s, {reloaded:.2f} s"
    assert all(policies(p) == {(os.SCHED_IDLE, 0)} for p in now), "replacements run under SCHED_IDLE too"
    with TritonStreamSession(triton.grpc_url, PACED_MODEL) as after:
        after.start("a calm sea after the storm", seed=5)
        assert next_media(after, Transcript())["kind"] == "media"
        after.stop()
        assert collect(after).messages[-1]["stopped"] is True
