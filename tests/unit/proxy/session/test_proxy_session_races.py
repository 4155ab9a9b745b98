"""Races of the proxy session and the client, driven by hand: a fake WebSocket and a fake Triton
stream for `ProxySession`, a scripted `websockets` server for `RealtimeVideoClient`. No Triton."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from websockets.asyncio.server import ServerConnection, serve

from rtvideo.client.session import RealtimeVideoClient, RealtimeVideoError
from rtvideo.proxy.session import session as proxy_session
from rtvideo.triton.wire import START_TAG, Reply
from tests.support.fake_bridge import (
    VIDEO_START,
    FakeConnection,
    begin,
    chunk,
    ended,
    kinds,
    reply,
    run,
    session,
    settle,
)

T = TypeVar("T")


# --- ProxySession ------------------------------------------------------------------------------
def test_a_refused_chunk_stops_everything_after_it_in_the_same_burst() -> None:
    """Chunk 0 is being written; chunk 1 does not fit, the trailer and done arriving in the same
    synchronous burst would: none of them may go out, the end is slow_consumer with the ledger's done."""

    async def body() -> FakeConnection:
        s, conn, _ = session(outbound_buffer_bytes=3000)
        begin(s)
        s.on_reply(VIDEO_START)
        await settle()
        conn.paused = True
        s.on_reply(chunk(0, 2000))
        await settle()  # handed to the socket, write in progress
        s.on_reply(chunk(1, 2500))  # refused
        s.on_reply(chunk(2, 100, kind="trailer"))
        s.on_reply(reply(START_TAG, {"type": "session.done", "request_id": "r", "chunks": 3, "stopped": False}))
        conn.resume()
        await ended(s, conn)
        return conn

    conn = run(body())
    assert kinds(conn.frames) == [
        ("video.start", None),
        ("video.chunk_metadata", 0),
        "<2000 bytes>",
        ("error", "slow_consumer"),
        ("session.done", None),
    ]
    done = conn.texts()[-1]
    assert done["chunks"] == 1 and done["stopped"] is False and done["request_id"] == "r"
    assert conn.closed == 1000


def test_answers_never_overtake_video_start() -> None:
    """An ack (from Triton) and a proxy's own error that come before video.start wait behind it."""

    async def body() -> FakeConnection:
        s, conn, _ = session()
        begin(s)
        s.steering.frame(
            s.owner,
            json.dumps({"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "b"}}}),
            False,
        )
        s.on_reply(reply("m2", {"type": "session.interaction.queued", "request_id": "r", "event_id": "e1"}))
        s.steering.frame(s.owner, b"binary", True)  # answered by the proxy itself
        await settle()
        assert conn.frames == [], "an answer went out before video.start"
        s.on_reply(VIDEO_START)
        s.on_reply(chunk(0, 10))
        await settle()
        s.on_disconnect()
        await ended(s, conn)
        return conn

    conn = run(body())
    assert kinds(conn.frames) == [
        ("video.start", None),
        ("session.interaction.queued", "e1"),
        ("error", "invalid_message"),
        ("video.chunk_metadata", 0),
        "<10 bytes>",
    ]
    assert conn.texts()[2]["request_id"] == "r"  # sent after video.start, so it names the request


def test_a_held_chunk_waits_for_its_ack_from_its_own_arrival(monkeypatch) -> None:
    """A chunk held after another waits its full ack wait, not what is left of the first one's."""
    # Chunk 1 comes 0.3 s after chunk 0; the ack wait is long enough that a loaded machine's
    # late wake-up does not let chunk 0's own wait run out first.
    monkeypatch.setattr(proxy_session, "ACK_WAIT_SECONDS", 1.5)

    def naming(index: int, event_id: str) -> Reply:
        meta = {
            "type": "video.chunk_metadata",
            "request_id": "r",
            "kind": "media",
            "transport_chunk_index": index,
            "started_event_ids": [event_id],
            "byte_length": 1,
        }
        return reply(START_TAG, meta, b"x")

    async def body() -> tuple[FakeConnection, float]:
        s, conn, _ = session()
        begin(s)
        s.on_reply(VIDEO_START)
        s.on_reply(naming(0, "e1"))  # overtook its ack
        await asyncio.sleep(0.3)
        s.on_reply(naming(1, "e2"))  # an ack that never comes
        held = time.monotonic()
        s.on_reply(reply("m2", {"type": "session.interaction.queued", "request_id": "r", "event_id": "e1"}))
        while len(conn.texts()) < 4:
            await asyncio.sleep(0.01)
        waited = time.monotonic() - held
        s.on_disconnect()
        await ended(s, conn)
        return conn, waited

    conn, waited = run(body())
    assert kinds(conn.frames) == [
        ("video.start", None),
        ("session.interaction.queued", "e1"),
        ("video.chunk_metadata", 0),
        "<1 bytes>",
        ("video.chunk_metadata", 1),
        "<1 bytes>",
    ]
    assert waited >= 1.5 - 0.02, f"chunk 1 was released after {waited:.2f} s"


@pytest.mark.parametrize("answer", ["error", "pong"])
def test_a_local_answer_that_does_not_fit_ends_the_session(monkeypatch, answer: str) -> None:
    """A pong or error the proxy writes itself is bounded like any reply: refused → slow_consumer."""
    monkeypatch.setattr(proxy_session, "END_GRACE_SECONDS", 0.1)

    async def body() -> FakeConnection:
        s, conn, bridge = session(outbound_buffer_bytes=3000)
        begin(s)
        s.on_reply(VIDEO_START)
        await settle()
        conn.paused = True
        s.on_reply(chunk(0, 2950))
        await settle()
        if answer == "pong":
            bridge.streams[0].auto_done = False  # the model has not confirmed the stop yet
            s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
            s.steering.frame(s.owner, json.dumps({"type": "session.ping"}), False)  # answered by the proxy itself
        else:
            s.steering.frame(s.owner, b"binary", True)
        conn.resume()
        await ended(s, conn)
        return conn

    conn = run(body())
    assert kinds(conn.frames) == [
        ("video.start", None),
        ("video.chunk_metadata", 0),
        "<2950 bytes>",
        ("error", "slow_consumer"),
        ("session.done", None),
    ]
    assert conn.texts()[-1]["chunks"] == 1


# --- RealtimeVideoClient against a scripted server -----------------------------------------------
Script = Callable[[ServerConnection, dict[str, Any]], Awaitable[None]]


async def scripted(script: Script, body: Callable[[RealtimeVideoClient], Awaitable[T]]) -> T:
    """A WebSocket server that calls `script` for every client message and never closes first."""

    async def handler(ws: ServerConnection) -> None:
        async for frame in ws:
            await script(ws, json.loads(frame))

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        async with RealtimeVideoClient(f"ws://127.0.0.1:{port}") as client:
            return await body(client)


async def send(ws: ServerConnection, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


def test_client_an_ending_error_before_video_start_wakes_start_and_interact() -> None:
    async def script(ws: ServerConnection, m: dict[str, Any]) -> None:
        if m["type"] == "session.interaction":  # the session ends before video.start; done is late
            await send(ws, {"type": "error", "code": "backend_unavailable", "message": "gone"})

    async def body(c: RealtimeVideoClient) -> list[Any]:
        started = asyncio.ensure_future(c.start("x"))
        await asyncio.sleep(0.05)
        return await asyncio.wait_for(asyncio.gather(started, c.interact("y", timeout=10), return_exceptions=True), 2)

    results = run(scripted(script, body))
    assert [type(r) for r in results] == [RealtimeVideoError, RealtimeVideoError]
    assert [r.code for r in results] == ["backend_unavailable", "backend_unavailable"]


def test_client_interact_after_the_end_fails_fast() -> None:
    async def script(ws: ServerConnection, m: dict[str, Any]) -> None:
        if m["type"] == "session.start":
            await send(ws, {"type": "video.start", "request_id": "r"})
            await send(ws, {"type": "session.done", "request_id": "r", "chunks": 0, "stopped": False})

    async def body(c: RealtimeVideoClient) -> float:
        await c.start("x")
        while c.done is None:
            await asyncio.sleep(0.01)
        began = time.monotonic()
        with pytest.raises(RealtimeVideoError) as err:
            await c.interact("y", timeout=5.0, attempts=2)
        assert err.value.code == "session_done"
        return time.monotonic() - began

    # fast: well within one attempt's wait (waiting them out takes 10 s), whatever the machine's load
    assert run(scripted(script, body)) < 2.5


def test_client_concurrent_interacts_with_one_event_id_all_resolve() -> None:
    """The first caller gives up before the ack; the second, on the same event id, still gets it."""
    acks: list[asyncio.Future[None]] = []

    async def script(ws: ServerConnection, m: dict[str, Any]) -> None:
        if m["type"] == "session.start":
            await send(ws, {"type": "video.start", "request_id": "r"})
        elif m["type"] == "session.interaction":

            async def ack_later() -> None:
                await asyncio.sleep(0.4)
                await send(
                    ws,
                    {"type": "session.interaction.queued", "request_id": "r", "event_id": m["interaction"]["event_id"]},
                )

            acks.append(asyncio.ensure_future(ack_later()))  # held: a task nobody references may be collected

    async def body(c: RealtimeVideoClient) -> list[Any]:
        await c.start("x")
        impatient = c.interact("y", event_id="e", timeout=0.2, attempts=1)
        patient = c.interact("y", event_id="e", timeout=3, attempts=1)
        results = await asyncio.gather(impatient, patient, return_exceptions=True)
        assert c.awaiting_acks == (), "a finished interact left its waiter behind"
        return results

    impatient, patient = run(scripted(script, body))
    assert isinstance(impatient, asyncio.TimeoutError)
    assert patient == {"type": "session.interaction.queued", "request_id": "r", "event_id": "e"}
