"""Read-only watchers of a live session, through real Triton and the real proxy (docs/protocol.md §9.2)."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse

import numpy as np
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import NO_KEEPALIVE, Leg, leg_stream
from tests.support.streams import decode

PROMPT = "boats in a harbour at noon"


def _watch_url(url: str, token: str) -> str:
    return url + "/watch?watch_token=" + urllib.parse.quote(token)


def test_watchers_see_the_owners_bytes_from_their_join_point(proxies, triton) -> None:
    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=21, num_frames=9 * 30, watchable=True)
        token = start["watch_token"]
        assert "resume_token" not in start
        while len(owner.pairs) < 3:
            await owner.read()
        watchers = [await Leg.open(_watch_url(url, token)) for _ in range(3)]
        for w in watchers:
            first = await w.read()
            assert first["type"] == "video.start" and first["watcher"] is True
            assert first["request_id"] == start["request_id"] and "watch_token" not in first
        await owner.interact("a stormy sea", "e1", 2)
        await owner.until("session.done")
        for w in watchers:
            await w.until("session.done")
            await asyncio.wait_for(w.conn.wait_closed(), 10)
            init, _ = w.pairs[0]
            assert init["kind"] == "init" and init["transport_chunk_index"] is None
            joined = w.pairs[1][0]["transport_chunk_index"]
            owners = {m["transport_chunk_index"]: (m, d) for m, d in owner.pairs}
            for meta, data in w.pairs[1:]:  # the same metadata and bytes, every pair from the join on
                assert owners[meta["transport_chunk_index"]] == (meta, data)
            assert [m["transport_chunk_index"] for m, _ in w.pairs[1:]] == list(range(joined, len(owner.pairs)))
            frames = decode(leg_stream(w))  # a fresh decoder starts at the init pair
            everything = decode(b"".join(d for _, d in owner.pairs))
            np.testing.assert_array_equal(frames, everything[len(everything) - len(frames) :])
            assert w.messages[-1] == owner.messages[-1]  # the same session.done

    run(body())


async def _read_on(leg: Leg) -> None:
    while (await leg.read(60))["type"] != "session.done":
        pass


def test_a_watcher_cannot_steer_and_bad_tokens_are_refused(proxies, triton) -> None:
    wait_idle(triton)
    server = proxies.server(max_watchers_per_session=1)
    url = server.url

    async def body() -> None:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=22, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))  # the owner reads all along
        watcher = await Leg.open(_watch_url(url, start["watch_token"]))
        await watcher.read()
        errors = server.context.metrics.registry.get_sample_value
        refused = errors("rtvideo_proxy_errors_total", {"code": "invalid_message"}) or 0.0
        # a playhead report is taken without an answer (a page reports whatever its role)
        await watcher.send({"type": "session.playback", "position_seconds": 1.5, "buffered_seconds": 0.2})
        await watcher.send({"type": "session.interaction", "interaction": {"event": {"prompt": "x"}}})
        await watcher.send({"type": "session.ping"})
        answers = []
        while len(answers) < 2:
            m = await watcher.read()
            if m["type"] in ("error", "session.pong"):
                answers.append(m)
        assert answers[0]["code"] == "invalid_message" and answers[1]["type"] == "session.pong"
        assert errors("rtvideo_proxy_errors_total", {"code": "invalid_message"}) == refused + 1  # counted
        await watcher.until("video.chunk_metadata")  # the watch goes on
        with pytest.raises(InvalidStatus) as full:  # --max-watchers-per-session 1
            await connect(_watch_url(url, start["watch_token"]), **NO_KEEPALIVE)
        assert full.value.response.status_code == 503
        with pytest.raises(InvalidStatus) as forged:
            await connect(_watch_url(url, "wv1.0000000000000000.AAAA"), **NO_KEEPALIVE)
        assert forged.value.response.status_code == 403
        await owner.send({"type": "session.stop"})
        await reading  # to the session's end
        assert owner.messages[-1]["type"] == "session.done"
        await watcher.until("session.done")

    run(body())


def test_a_stuck_watcher_harms_no_one(proxies, triton) -> None:
    """A watcher that never reads is dropped with slow_consumer; the owner and another watcher
    get every pair, and the owner's acks come as for a session without watchers."""
    wait_idle(triton)
    server = proxies.server(watcher_buffer_bytes=64 * 1024)
    url = server.url

    async def body() -> None:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=23, num_frames=9 * 400, watchable=True)
        await owner.read()
        stuck = socket.socket()  # a raw socket with a small window: upgrades, never reads
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", server.port))
        path = "/v1/realtime/video/watch?watch_token=" + urllib.parse.quote(start["watch_token"])
        stuck.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        good = await Leg.open(_watch_url(url, start["watch_token"]))
        await good.read()
        for i in range(5):
            await owner.interact(f"scene {i}", f"e{i}", 1)
            await owner.until("session.interaction.queued", event_id=f"e{i}")
        await owner.until("session.done", timeout=120)
        await good.until("session.done", timeout=120)
        gauge = server.context.metrics.registry.get_sample_value
        assert gauge("rtvideo_proxy_watchers_dropped_total") >= 1
        joined = good.pairs[1][0]["transport_chunk_index"]
        assert [m["transport_chunk_index"] for m, _ in good.pairs[1:]] == list(range(joined, len(owner.pairs)))
        assert [m["transport_chunk_index"] for m, _ in owner.pairs] == list(range(len(owner.pairs)))
        stuck.close()

    run(body(), timeout=240)
