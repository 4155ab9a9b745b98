"""The WebSocket proxy end to end: real proxies in a background event loop, the session's real
Triton behind them, real WebSocket clients (`websockets`) in front, real decoding."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.client.session import RealtimeVideoClient, RealtimeVideoError
from rtvideo.core.protocol import MAX_MESSAGE_BYTES, MAX_START_BYTES
from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.edge.access import origin_allowed
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import by_label
from rtvideo.proxy.placement import bridge as bridge_module
from rtvideo.proxy.placement.bridge import TritonBridge
from rtvideo.proxy.session import session as proxy_session
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.server import free_port
from rtvideo.triton.wire import START_TAG, Reply
from tests.support.fake_bridge import build
from tests.support.proxy_client import Ws, first_message_answers, is_error, status_of, ws
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import (
    FAST_MODEL,
    PACED_MODEL,
    Transcript,
    check_stream_rules,
    decode,
    event_ends,
    ids,
    wait_for_metric,
)


# --- sessions through the proxy ----------------------------------------------------------------
def test_full_session_pairs_trailer_done_close(proxies) -> None:
    async def body() -> Transcript:
        async with ws(proxies.url()) as conn:
            s = Ws(conn)
            start = await s.start("A quiet harbour at dawn", num_frames=30, seed=7)
            assert start["request_id"].startswith("video_stream-") and start["config"]["num_frames"] == 30
            return await s.finish()

    t = run(body())
    check_stream_rules(t)
    assert [m["num_frames"] for m in t.media] == [9, 9, 9, 3]
    assert t.pairs[-1][0]["kind"] == "trailer"
    assert decode(t.video).shape == (30, 256, 256, 3)
    done = t.messages[-1]
    assert done["stopped"] is False and done["chunks"] == 5


def test_stop_ends_with_trailer_and_done(proxies) -> None:
    async def body() -> Transcript:
        async with ws(proxies.url()) as conn:
            s = Ws(conn)
            await s.start("lanterns", seed=5)
            await s.next_media()
            await s.send({"type": "session.stop"})
            await s.send({"type": "session.stop"})  # a second stop is harmless
            return await s.finish()

    t = run(body())
    check_stream_rules(t)
    assert t.messages[-1]["stopped"] is True and t.pairs[-1][0]["kind"] == "trailer"
    assert decode(t.video).shape[0] == sum(m["num_frames"] for m in t.media)


def test_retry_conflict_and_interaction_failed(proxies) -> None:
    async def body() -> tuple[Transcript, list[dict[str, Any]]]:
        async with ws(proxies.url()) as conn:
            s = Ws(conn)
            await s.start("source", num_frames=90, seed=3)
            await s.interact("snow", "e1", 1)
            await s.interact("snow", "e1", 1)
            await s.interact("rain", "e1", 1)
            await s.send(
                {
                    "type": "session.interaction",
                    "interaction": {"event_id": "neg", "event": {"prompt": "x", "negative_prompt": "blur"}},
                }
            )
            await s.send({"type": "session.ping"})
            t = await s.finish()
        answers = [
            m
            for m in t.messages
            if m["type"] in ("session.interaction.queued", "session.pong") or (m["type"] == "error")
        ]
        return t, answers

    t, answers = run(body())
    check_stream_rules(t)
    rid = t.messages[0]["request_id"]
    queued = [m for m in answers if m["type"] == "session.interaction.queued"]
    assert [m["event_id"] for m in queued] == ["e1", "e1", "neg"] and all(m["request_id"] == rid for m in queued)
    errors = {m["code"]: m for m in answers if m["type"] == "error"}
    assert errors["event_id_conflict"]["event_id"] == "e1"
    assert errors["interaction_failed"]["event_id"] == "neg"
    assert sum(m["type"] == "session.pong" for m in answers) == 1
    started = [e for m in t.media for e in m["started_event_ids"]]
    assert started.count("e1") == 1 and "neg" not in started


def run_trace(proxies, steps: list[list[dict[str, Any]]], chunks_after: int) -> list[dict[str, Any]]:
    """tests/e2e/test_model_grpc.py::run_trace through the paced proxy: after chunk 1, before each
    following boundary, send that step's updates and wait for their acks."""

    async def body() -> tuple[Transcript, list[dict[str, Any]]]:
        async with ws(proxies.url(model=PACED_MODEL)) as conn:
            s = Ws(conn)
            await s.start("source", seed=1)
            await s.next_media()
            await s.next_media()
            metas = []
            for step in steps + [[]] * chunks_after:
                for u in step:
                    await s.interact(u["prompt"], u["event_id"], u.get("transition_chunks"))
                for u in step:
                    await s.until(
                        lambda m, eid=u["event_id"]: m["type"] == "session.interaction.queued" and m["event_id"] == eid
                    )
                metas.append(await s.next_media())
            await s.send({"type": "session.stop"})
            return await s.finish(), metas

    t, metas = run(body())
    check_stream_rules(t)
    return metas


GOLDEN = {
    "hard": (
        [[dict(prompt="A", event_id="A", transition_chunks=0)]],
        1,
        [(["A"], ["A"], ["A"], [], []), ([], [], [], [], [])],
    ),
    "default_n": (
        [[dict(prompt="A", event_id="A")]],
        3,
        [(["A"], ["A"], [], [], []), ([], ["A"], [], [], []), ([], ["A"], ["A"], [], []), ([], [], [], [], [])],
    ),
    "interrupt": (
        [[dict(prompt="A", event_id="A", transition_chunks=3)], [dict(prompt="B", event_id="B", transition_chunks=2)]],
        1,
        [(["A"], ["A"], [], [], []), (["B"], ["A", "B"], [], [], ["A"]), ([], ["B"], ["B"], [], [])],
    ),
    "overlap": (
        [[dict(prompt="A", event_id="A", transition_chunks=2)], [dict(prompt="B", event_id="B", transition_chunks=2)]],
        1,
        [(["A"], ["A"], [], [], []), (["B"], ["A", "B"], ["A"], [], []), ([], ["B"], ["B"], [], [])],
    ),
    "supersede": (
        [[dict(prompt="A", event_id="A"), dict(prompt="B", event_id="B", transition_chunks=0)]],
        1,
        [(["B"], ["B"], ["B"], ["A"], []), ([], [], [], [], [])],
    ),
}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_golden_traces(proxies, case: str) -> None:
    steps, after, expected = GOLDEN[case]
    metas = run_trace(proxies, steps, after)
    assert [ids(m) for m in metas] == expected
    # vLLM-Omni 0.32's coalescing: the superseded pending targets under its name, only when not empty
    assert [m.get("coalesced_event_ids", []) for m in metas] == [list(lists[3]) for lists in expected]
    assert all(m["coalesced_event_ids"] for m in metas if "coalesced_event_ids" in m)
    if case == "default_n":
        assert [m["transition_progress"]["A"] for m in metas[:3]] == pytest.approx([1 / 3, 2 / 3, 1.0])
    if case == "interrupt":
        assert metas[1]["transition_progress"] == pytest.approx({"A": 2 / 3, "B": 0.5})


def test_ack_precedes_first_mention_under_load(proxies) -> None:
    """Hard updates sent back to back on an unpaced stream: each is named by the very next chunk."""

    async def body() -> Transcript:
        async with ws(proxies.url()) as conn:
            s = Ws(conn)
            await s.start("source", seed=4)
            for i in range(40):
                await s.interact(f"p{i}", f"h{i}", 0)
                if i % 8 == 0:
                    await s.next_media()
            await s.send({"type": "session.stop"})
            return await s.finish()

    t = run(body())
    check_stream_rules(t)  # asserts every named id was acked earlier
    assert len(t.of_type("session.interaction.queued")) == 40


def test_session_forwards_a_mention_only_after_its_ack(monkeypatch) -> None:
    """Replies interleaved the wrong way round on the gRPC stream still reach the client in order."""
    # long enough that the ack, 0.05 s behind chunk 0, is not overtaken by the bound on a loaded machine
    monkeypatch.setattr(proxy_session, "ACK_WAIT_SECONDS", 1.0)

    def reply(tag: str, message: dict[str, Any], data: bytes = b"") -> Reply:
        return Reply(tag, json.dumps(message), message, data)

    def chunk(index: int, started: list[str]) -> Reply:
        meta = {
            "type": "video.chunk_metadata",
            "request_id": "r",
            "kind": "media",
            "transport_chunk_index": index,
            "started_event_ids": started,
            "active_event_ids": started,
            "byte_length": 3,
        }
        return reply(START_TAG, meta, b"abc")

    async def body() -> list[Any]:
        bridge = TritonBridge("127.0.0.1:1", ProxySettings().model)
        s, conn, _, _, _ = build(bridge=bridge, triton_url="127.0.0.1:1")
        s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r"}))
        s.on_reply(chunk(0, ["e1"]))  # overtook its ack
        s.on_reply(chunk(1, []))  # and must stay behind it
        await asyncio.sleep(0.05)
        s.on_reply(reply("m1", {"type": "session.interaction.queued", "request_id": "r", "event_id": "e1"}))
        s.on_reply(chunk(2, ["e2"]))  # an ack that never comes: released after the bound
        await asyncio.sleep(2.0)
        s.on_disconnect()
        return conn.frames

    frames = run(body())
    kinds = [
        f if isinstance(f, bytes) else (f["type"], f.get("transport_chunk_index", f.get("event_id"))) for f in frames
    ]
    assert kinds == [
        ("video.start", None),
        ("session.interaction.queued", "e1"),
        ("video.chunk_metadata", 0),
        b"abc",
        ("video.chunk_metadata", 1),
        b"abc",
        ("video.chunk_metadata", 2),
        b"abc",
    ]


def test_ledger_gives_every_acked_event_one_end() -> None:
    ledger = Ledger()

    def taken(message: dict[str, Any], data: bytes | None = None) -> None:
        ledger.taken(Frame(json.dumps(message), message, data))

    taken({"type": "video.start", "request_id": "r"})
    for eid in ("a", "b", "c", "d"):
        taken({"type": "session.interaction.queued", "event_id": eid})
    taken({"type": "video.chunk_metadata", "started_event_ids": ["a"], "superseded_event_ids": ["b"]}, b"x")
    taken({"type": "error", "code": "interaction_failed", "event_id": "c"})
    done = ledger.done()
    assert (done["request_id"], done["chunks"]) == ("r", 1)
    assert done["unapplied_event_ids"] == ["d"] and done["unfinished_event_ids"] == ["a"]


BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("bad json", "{", "invalid_json"),
    ("NaN", '{"type": "session.ping", "x": NaN}', "invalid_json"),
    ("too deep", '{"type": "session.ping", "x": ' + "[" * 40 + "]" * 40 + "}", "invalid_json"),
    ("array", "[1, 2]", "invalid_message"),
    ("string", '"hello"', "invalid_message"),
    ("no type", '{"prompt": "x"}', "invalid_message"),
    ("unknown type", '{"type": "session.bogus"}', "invalid_message"),
    ("binary frame", b"\x00\x01binary", "invalid_message"),
    ("second start", '{"type": "session.start", "prompt": "again"}', "invalid_message"),
    ("oversized", '{"type": "session.ping", "pad": "' + "x" * MAX_MESSAGE_BYTES + '"}', "message_too_large"),
    ("interaction not object", '{"type": "session.interaction", "interaction": 3}', "invalid_interaction"),
    ("no event", '{"type": "session.interaction", "interaction": {"event_id": "x1"}}', "invalid_interaction"),
    (
        "empty prompt",
        '{"type": "session.interaction", "interaction": {"event": {"prompt": "  "}}}',
        "invalid_interaction",
    ),
    (
        "negative transition",
        '{"type": "session.interaction", "interaction": {"event": {"prompt": "a"}, "transition_chunks": -1}}',
        "invalid_interaction",
    ),
    (
        "string transition",
        '{"type": "session.interaction", "interaction": {"event": {"prompt": "a"}, "transition_chunks": "3"}}',
        "invalid_interaction",
    ),
    (
        "empty event id",
        '{"type": "session.interaction", "interaction": {"event_id": "", "event": {"prompt": "a"}}}',
        "invalid_interaction",
    ),
    (
        "long event id",
        json.dumps({"type": "session.interaction", "interaction": {"event_id": "e" * 257, "event": {"prompt": "a"}}}),
        "invalid_interaction",
    ),
    (
        "unknown event field",
        '{"type": "session.interaction", "interaction": {"event": {"prompt": "a", "colour": "red"}}}',
        "invalid_interaction",
    ),
]


def test_bad_inputs_are_answered_and_the_session_goes_on(proxies) -> None:
    async def body() -> tuple[Transcript, list[str]]:
        codes = []
        async with ws(proxies.url(model=PACED_MODEL)) as conn:
            s = Ws(conn)
            await s.start("source", seed=9)
            for _, raw, _code in BAD_INPUTS:
                await s.send(raw)
                error = await s.until(lambda m: m["type"] == "error")
                assert error["request_id"] == s.t.messages[0]["request_id"]
                codes.append(error["code"])
            before = len(s.t.media)
            await s.next_media()  # chunks keep coming after all of it
            assert len(s.t.media) > before
            await s.send({"type": "session.stop"})
            return await s.finish(), codes

    t, codes = run(body())
    check_stream_rules(t)
    assert codes == [code for _, _, code in BAD_INPUTS], [
        name for (name, _, c), got in zip(BAD_INPUTS, codes, strict=False) if c != got
    ]


def test_start_timeout(proxies) -> None:
    async def body() -> list[dict[str, Any]]:
        async with ws(proxies.url(start_timeout=0.5)) as conn:
            s = Ws(conn)
            error = await s.next(5)
            done = await s.next(5)
            with pytest.raises(ConnectionClosed):
                await conn.recv()
            assert conn.close_code == 1000
            return [error, done]

    error, done = run(body())
    assert error["code"] == "start_timeout" and "request_id" not in error
    assert done["type"] == "session.done" and done["chunks"] == 0 and done["request_id"] is None


@pytest.mark.parametrize(
    "first, code",
    [
        (b"binary start", "invalid_start"),
        ('{"type": "session.ping"}', "invalid_start"),
        ("not json", "invalid_start"),
        ('{"type": "session.start", "prompt": "' + "x" * MAX_START_BYTES + '"}', "message_too_large"),
        ('{"type": "session.start", "prompt": "x", "format": "webm"}', "unsupported_format"),  # refused by the model
        ('{"type": "session.start", "prompt": "x", "model": "other"}', "model_mismatch"),
    ],
)
def test_invalid_first_message_ends_the_session(proxies, first: Any, code: str) -> None:
    error, done = run(first_message_answers(proxies.url(), first))
    assert error["type"] == "error" and error["code"] == code
    assert done["type"] == "session.done" and done["chunks"] == 0


# --- admission ---------------------------------------------------------------------------------
def test_origin_policy(proxies) -> None:
    url = proxies.url(allowed_origins=("https://app.example",))
    assert status_of(url, origin="http://evil.example") == 403
    assert status_of(url, origin="https://app.example") == 101
    assert status_of(url, origin="http://localhost:3000") == 101
    assert status_of(url, origin="http://" + url.split("/")[2]) == 101  # same origin
    assert status_of(url) == 101  # a program without Origin
    assert origin_allowed("https://x.example", ["*"]) and not origin_allowed("https://x.example", [])


def test_bearer_token(proxies) -> None:
    server = proxies.server(token="s3cret")
    assert status_of(server.url) == 401
    assert status_of(server.url, additional_headers={"Authorization": "Bearer wrong"}) == 401
    assert status_of(server.url, additional_headers={"Authorization": "Bearer s3cret"}) == 101
    assert status_of(server.url + "?token=s3cret") == 101
    metrics_url = f"http://127.0.0.1:{server.port}/metrics"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(metrics_url, timeout=5)
    assert err.value.code == 401
    request = urllib.request.Request(metrics_url, headers={"Authorization": "Bearer s3cret"})
    assert b"rtvideo_proxy_rejected_total" in urllib.request.urlopen(request, timeout=5).read()


def test_max_connections(proxies) -> None:
    url = proxies.url(max_connections=1)

    async def body() -> None:
        async with ws(url):
            with pytest.raises(InvalidStatus) as err:
                async with ws(url):
                    pass
            assert err.value.response.status_code == 503
        for _ in range(100):  # the slot frees when the proxy sees the close
            try:
                async with ws(url):
                    return
            except InvalidStatus:
                await asyncio.sleep(0.05)
        raise AssertionError("the slot was not freed")

    run(body())


# --- resources ---------------------------------------------------------------------------------
def test_disconnect_frees_the_triton_session(proxies, triton) -> None:
    wait_idle(triton)

    async def body() -> None:
        conn = await ws(proxies.url())
        s = Ws(conn)
        await s.start("endless", seed=2)
        await s.next_media()
        await s.next_media()
        await asyncio.to_thread(wait_for_metric, triton, "rtvideo_active_sessions", FAST_MODEL, 1)
        conn.transport.abort()  # gone without a close frame

    run(body())
    wait_idle(triton, timeout=10)


def test_a_stream_cancelled_before_it_is_read_never_reaches_triton(triton) -> None:
    """The supervisor may end a session (backend_lost: stream.cancel()) in the loop turn its
    session.start was queued in, before the pump first ran. replies() opened the call anyway:
    the start reached the model, the requests were half-closed, and with nobody left to end the
    sequence the model streamed into the void until the session limit, holding a slot."""
    wait_idle(triton)

    async def body() -> list[Reply]:
        bridge = TritonBridge(triton.grpc_url, FAST_MODEL, triton.config.key)
        try:
            stream = bridge.open_stream()
            stream.send(json.dumps({"type": "session.start", "prompt": "nobody is listening"}).encode(), start=True)
            stream.cancel()

            async def collect() -> list[Reply]:
                return [reply async for reply in stream.replies()]

            return await asyncio.wait_for(collect(), 5.0)
        finally:
            await bridge.close()

    assert run(body()) == []
    wait_idle(triton, timeout=10)


def test_a_cancelled_stream_still_ends_its_sequence_on_triton(triton) -> None:
    """The proxy cancels a stream it gives up on (the silence bound, its endpoint marked down).
    A cancelled call does not end its sequence: Triton's sequence batcher held the slot until
    the idle timeout (65 min), and enough of them left a live server taking no new session. The
    sequence is ended on a call of its own; after that Triton knows no such sequence, so a
    request on it is refused by Triton itself (no START), not answered by the model. The
    bridge is closed at once (as a proxy's stop does): its close waits for that call, which the
    closed channel must not cut, or the sequence stays held."""
    wait_idle(triton)

    async def on_sequence(client: Any, sequence_id: int) -> tuple[Any, Any]:
        """One `session.stop` with sequence_end on `sequence_id`, on a call of its own."""

        async def one() -> Any:
            yield bridge_module.triton_request(FAST_MODEL, bridge_module.STOP, "check", sequence_id, end=True)

        call = client.stream_infer(one(), headers=triton.client_headers())
        try:
            return await asyncio.wait_for(call.__anext__(), 10)
        except StopAsyncIteration:
            return None, None  # completed flags-only: the model took it
        finally:
            call.cancel()

    async def body() -> tuple[str, Any, Any]:
        key = triton.config.key
        bridge, checker = TritonBridge(triton.grpc_url, FAST_MODEL, key), TritonBridge(triton.grpc_url, FAST_MODEL, key)
        try:
            stream = bridge.open_stream()
            stream.send(json.dumps({"type": "session.start", "prompt": "given up on"}).encode(), start=True)
            replies = stream.replies().__aiter__()
            first = await asyncio.wait_for(replies.__anext__(), 10)
            stream.cancel()
            await replies.aclose()
            assert stream.ending is not None and not stream.ending.done(), (
                "an open sequence is ended on a call of its own"
            )
            await asyncio.wait_for(bridge.close(), 15)
            assert stream.ending.done()
            result, error = await on_sequence(checker.client, stream.sequence_id)
            return first.message["type"], result, error
        finally:
            await bridge.close()
            await checker.close()

    first, result, error = run(body())
    assert first == "video.start"
    assert result is None and error is not None and "START" in str(error), (result, error)
    wait_idle(triton, timeout=10)


async def _read_after_slow_consumer(server: ProxyServer, pause: float) -> tuple[list[Any], int | None]:
    """A session whose client reads nothing until the proxy ends it with slow_consumer, then,
    `pause` s later, reads everything: the frames and the close code."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # so the kernel buffers little
    sock.connect(("127.0.0.1", server.port))
    sock.setblocking(False)
    conn = await connect(server.url, sock=sock, max_size=None, max_queue=1, proxy=None)
    before = by_label(server.context.metrics.errors, "code")["slow_consumer"]
    await conn.send(json.dumps({"type": "session.start", "prompt": "firehose", "seed": 1}))
    deadline = time.monotonic() + 60
    while by_label(server.context.metrics.errors, "code")["slow_consumer"] == before:
        assert time.monotonic() < deadline, "the proxy never noticed the slow consumer"
        await asyncio.sleep(0.05)
    await asyncio.sleep(pause)
    frames = []
    try:
        async for frame in conn:
            frames.append(frame)
    except ConnectionClosed:
        pass
    return frames, conn.close_code


@pytest.mark.parametrize("pause", [0.0, 2.0])
def test_slow_consumer_is_cut_off(proxies, triton, pause: float) -> None:
    """The end (error, session.done, close) reaches a client that reads again, also one that
    reads only after the proxy's 1 s flush, within Tornado's 5 s wait for the client's close.
    It must not wait in the outbox behind the write in progress while the close goes out without it."""
    wait_idle(triton)
    server = proxies.server(outbound_buffer_bytes=64 * 1024)
    frames, close_code = run(_read_after_slow_consumer(server, pause))
    texts = [json.loads(f) for f in frames if isinstance(f, str)]
    assert [m["type"] for m in texts[-2:]] == ["error", "session.done"], [m["type"] for m in texts[-4:]]
    assert texts[-2]["code"] == "slow_consumer" and close_code == 1000
    assert texts[-1]["chunks"] == sum(isinstance(f, bytes) for f in frames)
    wait_idle(triton, timeout=10)


def test_eight_concurrent_sessions_lose_nothing(proxies, triton) -> None:
    wait_idle(triton)
    rng = random.Random(1234)

    async def one(i: int) -> tuple[Transcript, dict[str, int]]:
        sent: dict[str, int] = {}
        async with ws(proxies.url(max_sessions_per_client=8)) as conn:  # every slot, from one address
            s = Ws(conn)
            await s.start(f"scene {i}", seed=i)
            reader = asyncio.create_task(s.finish(120))
            for k in range(rng.randint(4, 10)):
                eid, n = f"s{i}-e{k}", rng.choice([None, 0, 1, 2, 3])
                for _ in range(1 + (rng.random() < 0.3)):  # some retries
                    await s.interact(f"prompt {i}.{k}", eid, n)
                    sent[eid] = sent.get(eid, 0) + 1
                await asyncio.sleep(rng.uniform(0, 0.15))
            while len(s.t.of_type("session.interaction.queued")) < sum(sent.values()):
                await asyncio.sleep(0.01)
            await s.send({"type": "session.stop"})
            return await reader, sent

    async def body() -> list[tuple[Transcript, dict[str, int]]]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    for t, sent in run(body(), 180):
        check_stream_rules(t)
        acks: dict[str, int] = {}
        for m in t.of_type("session.interaction.queued"):
            acks[m["event_id"]] = acks.get(m["event_id"], 0) + 1
        assert acks == sent, "every send is acked exactly once"
        assert not t.of_type("error")
        ends = event_ends(t)
        assert sorted(ends) == sorted(sent), "each admitted event reaches exactly one end"
        assert decode(t.video).shape[0] == sum(m["num_frames"] for m in t.media)


def test_client_library(proxies, tmp_path) -> None:
    async def body() -> dict[str, Any] | None:
        async with RealtimeVideoClient(proxies.url()) as c:
            start = await c.start("a red desert canyon", num_frames=45, seed=3)
            assert start["config"]["num_frames"] == 45
            ack = await c.interact("a blue frozen ocean", transition_chunks=2, event_id="to-b")
            assert await c.interact("a blue frozen ocean", transition_chunks=2, event_id="to-b") == ack
            with pytest.raises(RealtimeVideoError) as conflict:
                await c.interact("something else", event_id="to-b")
            assert conflict.value.code == "event_id_conflict" and conflict.value.event_id == "to-b"
            generated = await c.interact("fog")
            assert len(generated["event_id"]) == 36
            return await c.save_mp4(tmp_path / "out.mp4")

    done = run(body())
    assert done is not None and done["chunks"] == 6
    assert decode((tmp_path / "out.mp4").read_bytes()).shape[0] == 45


def test_client_raises_session_ending_errors(proxies) -> None:
    async def body() -> None:
        async with RealtimeVideoClient(proxies.url()) as c:
            with pytest.raises(RealtimeVideoError) as err:
                await c.start("x", format="webm")
            assert err.value.code == "unsupported_format"
            with pytest.raises(RealtimeVideoError):
                async for _ in c.chunks():
                    pass

    run(body())


def test_shutdown_ends_sessions_with_server_shutdown(proxies, triton) -> None:
    """Stopping a proxy (no drain left) ends its sessions with server_shutdown, a session.done that
    accounts for what the client got, and close 1001; the sequence is ended on Triton."""
    server = proxies.server(max_connections=7)  # a proxy of its own, stopped here

    async def body() -> Transcript:
        async with ws(server.url) as conn:
            s = Ws(conn)
            await s.start("until shutdown", seed=6)
            await s.next_media()
            stopping = asyncio.get_running_loop().run_in_executor(None, proxies.call, server.stop())
            await s.until(is_error("server_shutdown"))
            await s.until(lambda m: m["type"] == "session.done")
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(conn.recv(), 10)
            assert conn.close_code == 1001
            await stopping
            return s.t

    t = run(body())
    done = t.messages[-1]
    assert done["stopped"] is False and done["chunks"] == len(t.pairs)
    assert [m["type"] for m in t.messages if m["type"] != "video.chunk_metadata"][-2:] == ["error", "session.done"]
    assert status_of(server.url) == 0  # nothing listens any more
    wait_idle(triton)


# --- HTTP endpoints and a dead backend ---------------------------------------------------------
def test_healthz_and_metrics(proxies) -> None:
    server = proxies.server()
    base = f"http://127.0.0.1:{server.port}"

    async def body() -> None:  # something to count: a chunk, an ack, an error
        async with ws(server.url) as conn:
            s = Ws(conn)
            await s.start("counted", num_frames=9)
            await s.interact("counted too", "m1")
            await s.send("{")
            await s.finish()

    run(body())
    health = json.loads(urllib.request.urlopen(base + "/healthz", timeout=5).read())
    assert health["ready"] is True and health["triton"] == {"server_ready": True, "model_ready": True}
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    for name in (
        "rtvideo_proxy_sessions_active",
        "rtvideo_proxy_sessions_total",
        "rtvideo_proxy_bytes_out_total",
        "rtvideo_proxy_chunks_out_total",
        "rtvideo_proxy_ack_latency_seconds_count",
        'rtvideo_proxy_ack_latency_seconds_bucket{le="0.005"}',
        'rtvideo_proxy_errors_total{code="invalid_json"}',
    ):
        assert name in text, name
    values = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")
    }
    assert values["rtvideo_proxy_chunks_out_total"] > 0 and values["rtvideo_proxy_ack_latency_seconds_count"] > 0


def test_unreachable_triton(proxies) -> None:
    server = proxies.server(triton_url=f"127.0.0.1:{free_port()}", probe_interval=60)  # one probe: not down yet
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
    assert err.value.code == 503 and json.loads(err.value.read())["triton"]["server_ready"] is False

    error, done = run(first_message_answers(server.url, {"type": "session.start", "prompt": "x"}, timeout=20))
    assert error["code"] == "backend_unavailable" and done["type"] == "session.done"


def test_triton_dying_mid_session(proxies, tmp_path) -> None:
    """A second, throwaway tritonserver is killed under a live session and no endpoint takes the
    session within the move patience (docs/recordings.md "Moves"): the client gets
    backend_unavailable, then a session.done that still counts what it received, then 1000."""
    from rtvideo.triton.command import TritonConfig
    from rtvideo.triton.model_repo import derive_model
    from rtvideo.triton.server import TritonServer

    derive_model(tmp_path, FAST_MODEL, {"pacing_lead_chunks": "1.0", "max_sessions": "1"})
    doomed = TritonServer(
        TritonConfig(tmp_path, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()),
        stdout=tmp_path / "triton.log",
    )
    doomed.start(timeout=300)
    try:
        server = proxies.server(triton_url=doomed.grpc_url, move_patience_seconds=1.0)

        async def body() -> Ws:
            async with ws(server.url) as conn:
                s = Ws(conn)
                await s.start("doomed", seed=3)
                await s.next_media()
                await s.interact("still queued", event_id="late", transition_chunks=50)
                await s.until(lambda m: m["type"] == "session.interaction.queued")
                await asyncio.to_thread(os.killpg, doomed.pid, signal.SIGKILL)
                await s.until(lambda m: m["type"] == "error", timeout=30)
                await s.until(lambda m: m["type"] == "session.done", timeout=10)
                with pytest.raises(ConnectionClosed):
                    await conn.recv()
                assert conn.close_code == 1000
                return s

        s = run(body())
    finally:
        doomed.stop()
    errors = s.t.of_type("error")
    assert [e["code"] for e in errors] == ["backend_unavailable"]
    done = s.t.messages[-1]
    assert done["chunks"] == len(s.t.pairs)
    assert "late" in event_ends(s.t)
