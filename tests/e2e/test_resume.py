"""Resume after a dropped connection, through real Triton and the real proxy (docs/protocol.md §9).

Each drop aborts the client's TCP connection (no close frame) at a chosen point; a new
connection resumes with the token and the last payload it read whole. What the client
decodes across both connections must equal an uninterrupted session of the same seed and
events (the built-in generator is deterministic), with every transport index once.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator
from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import Leg, continuous_stream, leg_stream, media_pairs
from tests.support.streams import ENDS, FAST_MODEL, PACED_MODEL, decode, metric, wait_for_metric
from tests.support.undisturbed import regenerate

PROMPT = "a lighthouse on a cliff at dusk"


async def _uninterrupted(url: str, frames: int, seed: int) -> tuple[Leg, bytes]:
    leg = await Leg.open(url)
    start = await leg.start(PROMPT, num_frames=frames, seed=seed)
    assert "resume_token" not in start and "resume_grace_seconds" not in start["config"]  # not asked for
    await leg.until("session.done")
    await leg.conn.close()
    return leg, b"".join(d for _, d in leg.pairs)


def _check_indices(legs: list[Leg]) -> None:
    pairs = media_pairs(legs)
    assert [m["transport_chunk_index"] for m, _ in pairs] == list(range(len(pairs)))  # no repeat, no skip
    done = legs[-1].messages[-1]
    assert done["type"] == "session.done" and done["chunks"] == len(pairs)


def _check_resumed(first: Leg, second: Leg, start: dict) -> None:
    old = first.messages[0]
    assert start["type"] == "video.start" and start["resumed"] is True
    assert start["request_id"] == old["request_id"] and start["resume_token"] != old["resume_token"]
    assert start["config"] == old["config"]
    init, _ = second.pairs[0]
    assert init["kind"] == "init" and init["transport_chunk_index"] is None and init["num_frames"] == 0
    assert [m["kind"] for m in second.messages[2:] if m["type"] == "video.chunk_metadata"].count("init") == 0


@pytest.mark.parametrize(
    ("case", "frames"),
    [(0, 90), (1, 90), (2, 900), (3, 900)],
)
@pytest.mark.parametrize("between", [False, True], ids=["after_payload", "between_metadata_and_payload"])
def test_a_dropped_connection_resumes_with_nothing_lost(proxies, triton, case: int, frames: int, between: bool) -> None:
    wait_idle(triton)
    url = proxies.url()
    seed = 40 + case
    rng = random.Random(case * 2 + between)

    async def body() -> None:
        _, reference = await _uninterrupted(url, frames, seed)
        first = await Leg.open(url)
        start = await first.start(PROMPT, num_frames=frames, seed=seed, resumable=True)
        token = start["resume_token"]
        assert start["config"]["resume_grace_seconds"] == 30 and len(token) > 40
        drop_after = rng.randrange(1, frames // 9)
        while len(first.pairs) < drop_after:
            await first.read()
        if between:  # read a metadata message, not its payload
            while (await first.read(payload=False))["type"] != "video.chunk_metadata":
                pass
        lost_meta = first.messages[-1]
        first.drop()
        second, resumed = await Leg.resumed(url, token, first.last_index)
        await second.until("session.done")
        _check_resumed(first, second, resumed)
        _check_indices([first, second])
        if between:  # the replayed metadata is what was sent the first time
            assert second.pairs[1][0] == lost_meta
        frames_seen = decode(continuous_stream([first, second]))
        np.testing.assert_array_equal(frames_seen, decode(reference))
        tail = decode(leg_stream(second))  # a fresh decoder starts at the init pair
        np.testing.assert_array_equal(tail, frames_seen[len(frames_seen) - len(tail) :])
        assert len(tail) == sum(m["num_frames"] for m, _ in second.pairs)

    run(body())


# --- drops with events (the paced model: events take effect while the session streams) ---
def _check_event_ends(legs: list[Leg]) -> None:
    """Every acked event (on any connection) has exactly one end; no chunk names an event before its ack."""
    acked: set[str] = set()
    ends: dict[str, int] = {}
    for leg in legs:
        for m in leg.messages:
            if m["type"] == "session.interaction.queued":
                acked.add(m["event_id"])
            elif m["type"] == "video.chunk_metadata" and m["kind"] == "media":
                named = {e for key in ("started_event_ids", "active_event_ids", *ENDS) for e in m[key]}
                assert named <= acked, f"{named - acked} named before their ack"
    for m, _ in media_pairs(legs):
        for key in ENDS:
            for e in m[key]:
                ends[e] = ends.get(e, 0) + 1
    done = legs[-1].messages[-1]
    for e in (*done["unapplied_event_ids"], *done["unfinished_event_ids"]):
        ends[e] = ends.get(e, 0) + 1
    assert acked and all(ends.get(e) == 1 for e in acked), (acked, ends)


def _undisturbed(legs: list[Leg], generator: BuiltinGenerator, config: dict) -> np.ndarray:
    """The session re-generated in this process from what its client sent and received (its
    events where they took effect), through one encoder: the uninterrupted session, whatever
    chunk a loaded machine let each event start at (tests/support/undisturbed.py)."""
    lines = [{"dir": "in", "message": m} for leg in legs for m in leg.sent if m["type"] != "session.resume"]
    lines += [{"dir": "out", "message": m} for leg in legs for m in leg.messages]
    return regenerate(lines, generator, config["width"], config["height"])


@pytest.mark.parametrize("point", ["during_transition", "right_after_ack"])
def test_a_drop_with_events_resumes_like_an_uninterrupted_session(
    proxies, triton, generator: BuiltinGenerator, point: str
) -> None:
    wait_idle(triton, PACED_MODEL)
    url = proxies.url(model=PACED_MODEL)
    frames, seed = 9 * 10, 61

    async def body() -> tuple[list[Leg], dict]:
        first = await Leg.open(url)
        start = await first.start(PROMPT, num_frames=frames, seed=seed, resumable=True)
        while (await first.read())["type"] != "video.chunk_metadata" or len(first.pairs) < 2:
            pass
        await first.interact("a snowy forest at night", "e1", 3)
        if point == "right_after_ack":
            await first.until("session.interaction.queued", event_id="e1")
        else:  # a payload whose event is mid-transition
            while not any(
                0 < p < 1 for p in (await first.until("video.chunk_metadata"))["transition_progress"].values()
            ):
                pass
        first.drop()
        second, resumed = await Leg.resumed(url, start["resume_token"], first.last_index)
        assert resumed["resumed"] is True
        while (m := await second.read())["type"] != "session.done":
            if m["type"] == "video.chunk_metadata" and m["transport_chunk_index"] == 6:
                await second.interact("a red desert canyon", "e2", 1)  # interactions work after a resume
        await second.conn.close()  # the proxy counts a client's session until its connection goes
        return [first, second], start["config"]

    legs, config = run(body(), timeout=240)
    _check_indices(legs)
    _check_event_ends(legs)
    assert {"e1", "e2"} <= {e for m, _ in media_pairs(legs) for e in m["started_event_ids"]}
    np.testing.assert_array_equal(decode(continuous_stream(legs)), _undisturbed(legs, generator, config))


# --- the generator pauses while detached ---------------------------------------------------------------
def test_a_detached_session_holds_its_slot_and_generates_nothing(proxies, triton) -> None:
    wait_idle(triton)
    server = proxies.server()
    url = server.url

    async def body() -> None:
        first = await Leg.open(url)
        start = await first.start(PROMPT, seed=5, resumable=True)  # endless
        while len(first.pairs) < 3:
            await first.read()
        first.drop()
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", FAST_MODEL, 1)
        gauge = server.context.metrics.registry.get_sample_value
        for _ in range(200):
            if gauge("rtvideo_proxy_sessions_detached") == 1:
                break
            await asyncio.sleep(0.05)
        assert gauge("rtvideo_proxy_sessions_detached") == 1
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_paused_sessions", FAST_MODEL, 1)
        await asyncio.sleep(1.0)  # the chunk in hand when the pause came is out
        before = await asyncio.to_thread(_chunks, triton)
        await asyncio.sleep(2.0)
        assert await asyncio.to_thread(_chunks, triton) == before  # no generation while detached
        second = await Leg.open(url)
        await second.resume(start["resume_token"], first.last_index)
        while len([p for p in second.pairs if p[0]["kind"] == "media"]) < 5:
            await second.read()
        assert gauge("rtvideo_proxy_sessions_detached") == 0
        await second.send({"type": "session.stop"})
        done = await second.until("session.done")
        assert done["stopped"] is True
        _check_indices([first, second])

    run(body())


def _chunks(triton) -> float:
    return metric(triton, "rtvideo_chunks_total", FAST_MODEL)


# --- refusals: invalid_resume, and the connection closes ----------------------------------------------
async def _refused(url: str, token: str, last: int = -1) -> dict:
    leg = await Leg.open(url)
    answer = await leg.resume(token, last)
    assert answer["type"] == "error" and answer["code"] == "invalid_resume", answer
    await asyncio.wait_for(leg.conn.wait_closed(), 10)
    assert leg.conn.close_code == 1000
    return answer


async def _detached(url: str, seed: int, pairs: int = 2, linger: float = 0.0, **fields) -> tuple[Leg, str]:
    first = await Leg.open(url)
    start = await first.start(PROMPT, seed=seed, resumable=True, **fields)
    while len(first.pairs) < pairs:
        await first.read()
    await asyncio.sleep(linger)  # the proxy hands out more meanwhile (into the socket's buffers)
    first.drop()
    return first, start["resume_token"]


async def _read_on(leg: Leg) -> None:
    while True:
        await leg.read()


async def _finish(url: str, token: str, last: int) -> Leg:
    leg, resumed = await Leg.resumed(url, token, last)
    assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
    await leg.send({"type": "session.stop"})
    await leg.until("session.done")
    await leg.conn.close()
    return leg


def test_forged_used_and_attached_tokens_are_refused(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        live = await Leg.open(url)
        start = await live.start(PROMPT, seed=8, resumable=True)
        token = start["resume_token"]
        prefix, instance, _ = token.split(".")
        reading = asyncio.ensure_future(_read_on(live))  # the owner reads all along
        # one controller at a time: the token of an attached session does not take it over
        assert "attached" in (await _refused(url, token))["message"]
        seen = len(live.pairs)
        while len(live.pairs) == seen:  # ... and the owner goes on undisturbed
            await asyncio.sleep(0.01)
        assert "unknown" in (await _refused(url, f"{prefix}.{instance}.{'A' * 43}"))["message"]
        assert "another proxy" in (await _refused(url, f"{prefix}.{'0' * 16}.{'A' * 43}"))["message"]
        await _refused(url, "not a token")
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        live.drop()
        await asyncio.sleep(0.5)
        second = await _finish(url, token, live.last_index)  # the refusals did not spend it
        assert "used" in (await _refused(url, token))["message"]  # single use
        assert second.messages[0]["resume_token"] != token

    run(body())


def test_two_resumers_at_once_one_wins(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        first, token = await _detached(url, seed=9)
        await asyncio.sleep(0.5)
        a, b = await Leg.open(url), await Leg.open(url)
        answers = await asyncio.gather(a.resume(token, first.last_index), b.resume(token, first.last_index))
        kinds = sorted(m["type"] for m in answers)
        assert kinds == ["error", "video.start"], answers
        winner = a if answers[0]["type"] == "video.start" else b
        assert next(m for m in answers if m["type"] == "error")["code"] == "invalid_resume"
        await winner.send({"type": "session.stop"})
        await winner.until("session.done")
        _check_indices([first, winner])

    run(body())


def test_an_expired_grace_ends_the_session(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url(resume_grace_seconds=1.0)

    async def body() -> None:
        first, token = await _detached(url, seed=10)
        await asyncio.sleep(3.0)
        assert "expired" in (await _refused(url, token, first.last_index))["message"]

    run(body())
    wait_idle(triton, timeout=15)  # the slot is free again


def test_an_index_older_than_the_replay_buffer_names_the_oldest(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url(replay_buffer_bytes=20_000)

    async def body() -> None:
        _first, token = await _detached(url, seed=11, pairs=1, linger=1.0, num_frames=900)
        await asyncio.sleep(1.0)
        answer = await _refused(url, token, 0)
        oldest = answer["oldest_resumable_index"]
        assert oldest > 0 and str(oldest) in answer["message"]
        leg = await Leg.open(url)
        assert (await leg.resume(token, oldest))["resumed"] is True  # the client may resume from there
        await leg.until("session.done")
        assert media_pairs([leg])[0][0]["transport_chunk_index"] == oldest + 1

    run(body())


def test_resume_off_and_a_plain_drop(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url(resume_grace_seconds=0)

    async def body() -> None:
        leg = await Leg.open(url)
        start = await leg.start(PROMPT, seed=12, resumable=True)
        assert start["config"]["resume_grace_seconds"] == 0 and "resume_token" not in start
        await leg.read()
        leg.drop()

    run(body())
    wait_idle(triton, timeout=15)  # ended at once, as without resume


def test_after_a_proxy_restart_resume_fails_cleanly(proxies, triton) -> None:
    from rtvideo.proxy.app import ProxyServer
    from rtvideo.proxy.settings import ProxySettings
    from rtvideo.triton.access import key_from_env

    wait_idle(triton)
    settings = ProxySettings(port=0, triton_url=triton.grpc_url, model=FAST_MODEL, triton_key=key_from_env())

    async def start(s: ProxySettings) -> ProxyServer:
        server = ProxyServer(s)
        await server.start()
        return server

    old = proxies.call(start(settings))
    port = old.port

    async def drop() -> tuple[Leg, str]:
        return await _detached(old.url, seed=13)

    first, token = run(drop())
    proxies.call(old.stop(), timeout=90)
    new = proxies.call(start(ProxySettings(**{**settings.__dict__, "port": port})))
    try:

        async def body() -> None:
            answer = await _refused(new.url, token, first.last_index)
            assert "restarted" in answer["message"]

        run(body())
    finally:
        proxies.call(new.stop(), timeout=90)
    wait_idle(triton, timeout=15)


# --- the Python client resumes by itself ----------------------------------------------------------------
def test_the_python_client_resumes_with_no_gap_and_no_duplicate(proxies, triton, tmp_path) -> None:
    from rtvideo.client.session import RealtimeVideoClient
    from tests.support.tcp_relay import TcpRelay

    wait_idle(triton)
    server = proxies.server()
    frames, seed = 9 * 40, 71

    async def body() -> None:
        _, reference = await _uninterrupted(server.url, frames, seed)
        relay = await TcpRelay(server.port).up()
        url = server.url.replace(f":{server.port}/", f":{relay.port}/")
        try:
            async with RealtimeVideoClient(url, resume_backoff=0.05) as client:
                start = await client.start(PROMPT, num_frames=frames, seed=seed, resumable=True)
                assert start["resume_token"]
                received = bytearray()
                indices = []
                async for chunk in client.chunks():
                    received += chunk.data
                    indices.append(chunk.metadata["transport_chunk_index"])
                    if len(indices) in (3, 17):  # twice, mid-stream: the network drops (RST, no close frame)
                        relay.cut()
                    if len(indices) == 20:
                        ack = await client.interact(PROMPT)  # interactions go on after resumes
                        assert ack["type"] == "session.interaction.queued"
                assert client.resumes == 2 and client.done is not None
                assert indices == list(range(len(indices)))
                (tmp_path / "resumed.mp4").write_bytes(received)
        finally:
            await relay.down()
        # the event changes the frames after chunk 20; the frames before it equal the reference's
        ours, theirs = decode(bytes(received)), decode(reference)
        assert len(ours) == len(theirs) == frames
        np.testing.assert_array_equal(ours[: 9 * 20], theirs[: 9 * 20])

    run(body())


# --- rtvideo record resumes by itself ------------------------------------------------------------------
def test_rtvideo_record_resumes_and_its_mp4_has_no_gap_and_no_duplicate(proxies, triton, tmp_path) -> None:
    import json
    import sys

    import av

    from tests.support.tcp_relay import TcpRelay

    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL)
    frames, seed = 9 * 12, 17
    out, timeline = tmp_path / "resumed.mp4", tmp_path / "resumed.json"

    async def body() -> None:
        relay = await TcpRelay(server.port).up()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rtvideo.cli", "record", PROMPT, "--url", f"ws://127.0.0.1:{relay.port}",
                "--num-frames", str(frames), "--seed", str(seed), "-o", str(out), "--timeline", str(timeline),
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            await asyncio.sleep(3.0)  # a few chunks in (the paced model: about 0.56 s a chunk)
            relay.cut()
            _, stderr = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, stderr.decode()[-2000:]
            assert b"resuming" in stderr
        finally:
            await relay.down()
        _, reference = await _uninterrupted(server.url, frames, seed)
        record = json.loads(timeline.read_text())
        starts = [e["message"] for e in record["messages"] if e.get("message", {}).get("type") == "video.start"]
        assert len(starts) == 2 and starts[1]["resumed"] is True
        with av.open(str(out)) as container:
            recorded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        np.testing.assert_array_equal(recorded, decode(reference))  # every frame once, none missing

    run(body(), timeout=240)


def test_a_detached_session_leaves_room_for_its_own_resume(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url(max_connections=1, max_sessions_per_client=1)

    async def body() -> None:
        first, token = await _detached(url, seed=14)
        await asyncio.sleep(0.5)
        leg = await _finish(url, token, first.last_index)  # the only connection place is free for it
        _check_indices([first, leg])

    run(body())


def test_a_silent_connection_gives_way_to_its_resume(proxies, triton) -> None:
    """A network change leaves the old connection open but silent (no FIN, no RST): TCP would
    not see it gone for minutes. A resume naming the session makes the proxy ping that
    connection: no pong within its resume_probe_seconds (2 s as shipped, kept here) and it is
    taken for dropped, so the resume is taken at once instead of being refused as attached until
    the keep-alive notices."""
    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        first = await Leg.open(url)
        start = await first.start(PROMPT, seed=13, resumable=True)
        while len(first.pairs) < 2:
            await first.read()
        first.conn.transport.pause_reading()  # silent: it reads nothing more, so it answers no ping
        leg = await Leg.open(url)
        resumed = await leg.resume(start["resume_token"], first.last_index)
        assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
        await leg.send({"type": "session.stop"})
        done = await leg.until("session.done")
        assert done["stopped"] is True
        _check_indices([first, leg])
        first.drop()

    run(body())
