"""Several people steering one session, through real Triton and the real proxy (docs/protocol.md §9.3)."""

from __future__ import annotations

import asyncio
import socket
import urllib.parse
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.proxy.session.ordering import named_event_ids
from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import NO_KEEPALIVE, Leg
from tests.support.streams import (
    ENDS,
    Transcript,
    check_event_lifetimes,
    check_server_message,
    check_stream_rules,
)

PROMPT = "a market square at dawn"


def _steer_url(url: str, token: str) -> str:
    return url + "/steer?steer_token=" + urllib.parse.quote(token)


async def _read_to_done(leg: Leg, timeout: float = 60.0) -> None:
    while (await leg.read(timeout))["type"] != "session.done":
        pass


def _answers(leg: Leg) -> list[dict[str, Any]]:
    """What answered this participant's own messages: acks, pongs and errors."""
    kinds = ("session.interaction.queued", "session.pong", "error", "session.steering_revoked")
    return [m for m in leg.messages if m["type"] in kinds]


def _acked(leg: Leg) -> set[str]:
    return {m["event_id"] for m in leg.messages if m["type"] == "session.interaction.queued"}


async def _interact(leg: Leg, event_id: str, prompt: str, chunks: int = 1) -> None:
    await leg.interact(prompt, event_id, chunks)


def test_owner_and_three_steerers_steer_one_session(proxies, triton) -> None:
    """Interleaved updates and retries from four participants: every answer reaches its sender
    only, the stream and session.done account for every event of everyone."""
    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=31, steerable=True)
        token = start["steer_token"]
        assert "watch_token" not in start and "resume_token" not in start
        steerers = [await Leg.open(_steer_url(url, token)) for _ in range(3)]
        for s in steerers:
            first = await s.read()
            assert first["type"] == "video.start" and first["steerer"] is True
            assert first["request_id"] == start["request_id"] and "steer_token" not in first
        everyone = [owner, *steerers]
        readers = [asyncio.ensure_future(_read_to_done(leg)) for leg in everyone]
        sent: dict[int, set[str]] = {i: set() for i in range(4)}

        # Round-robin, one at a time: each event starts and completes (one chunk of transition).
        for i, leg in enumerate(everyone):
            event_id = f"p{i}-solo"
            await _interact(leg, event_id, f"solo scene {i}")
            sent[i].add(event_id)
            while not any(event_id in (m.get("completed_event_ids") or ()) for m in leg.messages):
                await asyncio.sleep(0.05)
        # Then all at once, interleaved, with retries (the same payload again: re-acked to its sender).
        for round_ in range(4):
            for i, leg in enumerate(everyone):
                event_id = f"p{i}-r{round_}"
                await _interact(leg, event_id, f"scene {round_} of {i}", 2)
                sent[i].add(event_id)
            for i, leg in enumerate(everyone):
                await _interact(leg, f"p{i}-r{round_}", f"scene {round_} of {i}", 2)  # a retry
            await asyncio.sleep(0.2)
        # An id another participant used, with another payload: event_id_conflict to its sender only.
        await _interact(steerers[1], "p0-r0", "something else entirely")
        while not any(m["type"] == "error" and m.get("event_id") == "p0-r0" for m in steerers[1].messages):
            await asyncio.sleep(0.05)  # its reader task reads
        await asyncio.sleep(1.0)
        await owner.send({"type": "session.stop"})
        await asyncio.wait_for(asyncio.gather(*readers), 120)

        for i, leg in enumerate(everyone):
            for m in leg.messages:
                check_server_message(m)
            assert leg.messages[-1]["type"] == "session.done"
            answers = _answers(leg)
            named = {m["event_id"] for m in answers if "event_id" in m}
            assert named <= sent[i] | ({"p0-r0"} if i == 2 else set()), (i, named - sent[i])
            assert _acked(leg) == sent[i], i  # every own event acked, nobody else's
            acks = [m["event_id"] for m in answers if m["type"] == "session.interaction.queued"]
            assert sorted(acks) == sorted([f"p{i}-solo"] + [f"p{i}-r{r}" for r in range(4)] * 2)
            errors = [m for m in answers if m["type"] == "error"]
            if i == 2:  # steerers[1]
                assert [(e["code"], e["event_id"]) for e in errors] == [("event_id_conflict", "p0-r0")]
            else:
                assert errors == [], (i, errors)
        # Every participant is told of everyone else's new events (not its own, not a retry, not a
        # refused reuse), with who sent it, before any chunk names it (docs/protocol.md §9.4).
        for i, leg in enumerate(everyone):
            shared = [m for m in leg.messages if m["type"] == "session.interaction.shared"]
            others = set().union(*(sent[j] for j in range(4) if j != i))
            assert sorted(m["event_id"] for m in shared) == sorted(others), i
            for m in shared:
                assert m["from"] == ("owner" if m["event_id"].startswith("p0-") else "steerer"), m
                assert m["interaction"]["event"]["prompt"].endswith(m["event_id"].split("-")[0][1:]), m
                told = leg.messages.index(m)
                named = [k for k, x in enumerate(leg.messages) if m["event_id"] in named_event_ids(x)]
                assert all(k > told for k in named), (i, m["event_id"])
        # One stream for everyone: the same pairs and the same done.
        owners = {m["transport_chunk_index"]: (m, d) for m, d in owner.pairs}
        for s in steerers:
            assert s.messages[-1] == owner.messages[-1]
            for meta, data in s.pairs[1:]:
                assert owners[meta["transport_chunk_index"]] == (meta, data)
        # The owner's stream obeys every rule, given every participant's acks.
        t = Transcript()
        t.messages = [owner.messages[0]]
        t.messages += [m for leg in steerers for m in leg.messages if m["type"] == "session.interaction.queued"]
        t.messages += owner.messages[1:]
        t.pairs = list(owner.pairs)
        check_stream_rules(t)
        media = [m for m, _ in owner.pairs if m["kind"] == "media"]
        check_event_lifetimes(media)
        done = owner.messages[-1]
        every = set().union(*sent.values())
        ends: dict[str, int] = {e: 0 for e in every}
        starts: dict[str, int] = {e: 0 for e in every}
        for m in media:
            for e in m["started_event_ids"]:
                starts[e] += 1
            for key in ENDS:
                for e in m[key]:
                    ends[e] += 1
        for e in (*done["unapplied_event_ids"], *done["unfinished_event_ids"]):
            ends[e] += 1
        assert all(n == 1 for n in ends.values()), {e: n for e, n in ends.items() if n != 1}
        assert all(n <= 1 for n in starts.values())
        for i in range(4):  # the solo events: exactly one start chunk and one completion chunk
            solo = f"p{i}-solo"
            assert starts[solo] == 1
            assert sum(solo in m["completed_event_ids"] for m in media) == 1

    run(body(), timeout=240)


def test_a_flooding_or_stopping_steerer_affects_only_itself(proxies, triton) -> None:
    wait_idle(triton)
    server = proxies.server(max_messages_per_second=5.0, message_burst=5)
    gauge = server.context.metrics.registry.get_sample_value

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=32, steerable=True)
        flood, calm = [await Leg.open(_steer_url(server.url, start["steer_token"])) for _ in range(2)]
        for s in (flood, calm):
            await s.read()
        await flood.send({"type": "session.stop"})
        stop_answer = await flood.until("error")
        assert stop_answer["code"] == "invalid_message" and "owner" in stop_answer["message"]
        await flood.send({"type": "session.playback", "position_seconds": 0.5})  # dropped, unanswered
        for _ in range(30):
            await flood.send({"type": "session.ping"})
        pongs = limited = 0
        while pongs + limited < 30:  # one answer per ping: a pong, or rate_limited past the burst
            m = await flood.read()
            pongs += m["type"] == "session.pong"
            limited += m.get("code") == "rate_limited"
        assert limited >= 20 and pongs >= 1
        await calm.interact("calm scene", "calm-1", 1)
        await owner.interact("owner scene", "own-1", 1)
        await calm.until("session.interaction.queued", event_id="calm-1")
        await owner.until("session.interaction.queued", event_id="own-1")
        await owner.until("video.chunk_metadata")  # the session goes on
        assert gauge("rtvideo_proxy_steerers") == 2
        # the stop, the pings and the two interactions; the playhead report is no steer message
        assert gauge("rtvideo_proxy_steer_messages_total") == 32
        await owner.send({"type": "session.stop"})
        readers = [asyncio.ensure_future(_read_to_done(leg)) for leg in (owner, flood, calm)]
        await asyncio.wait_for(asyncio.gather(*readers), 60)
        for leg in (owner, calm):
            assert [m for m in _answers(leg) if m["type"] == "error"] == []
        assert all(
            m.get("code") in ("rate_limited", "invalid_message") for m in _answers(flood) if m["type"] == "error"
        )
        assert not any(m["type"] == "session.pong" for m in _answers(owner) + _answers(calm))
        assert _acked(owner) == {"own-1"} and _acked(calm) == {"calm-1"} and _acked(flood) == set()
        assert owner.messages[-1]["stopped"] is True

    run(body())


def test_a_steerer_that_never_reads_is_dropped_alone(proxies, triton) -> None:
    wait_idle(triton)
    server = proxies.server(watcher_buffer_bytes=64 * 1024)
    gauge = server.context.metrics.registry.get_sample_value

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=33, num_frames=9 * 400, steerable=True)
        await owner.read()
        stuck = socket.socket()  # a raw socket with a small window: upgrades, never reads
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(("127.0.0.1", server.port))
        path = "/v1/realtime/video/steer?steer_token=" + urllib.parse.quote(start["steer_token"])
        stuck.sendall(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        good = await Leg.open(_steer_url(server.url, start["steer_token"]))
        await good.read()
        for i in range(4):
            await good.interact(f"scene {i}", f"g{i}", 1)
            await good.until("session.interaction.queued", event_id=f"g{i}")
            await owner.interact(f"owner scene {i}", f"o{i}", 1)
            await owner.until("session.interaction.queued", event_id=f"o{i}")
        await owner.until("session.done", timeout=120)
        await good.until("session.done", timeout=120)
        assert gauge("rtvideo_proxy_steerers_dropped_total", {"reason": "slow_consumer"}) >= 1
        joined = good.pairs[1][0]["transport_chunk_index"]
        assert [m["transport_chunk_index"] for m, _ in good.pairs[1:]] == list(range(joined, len(owner.pairs)))
        assert [m["transport_chunk_index"] for m, _ in owner.pairs] == list(range(len(owner.pairs)))
        stuck.close()

    run(body(), timeout=240)


def test_tokens_bounds_and_revoke(proxies, triton) -> None:
    wait_idle(triton)
    server = proxies.server(max_steerers_per_session=1)
    gauge = server.context.metrics.registry.get_sample_value

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=34, steerable=True, watchable=True)
        reading = asyncio.ensure_future(_read_to_done(owner))
        token = start["steer_token"]
        for bad in ("sv1.0000000000000000.AAAA", "nonsense", start["watch_token"]):
            with pytest.raises(InvalidStatus) as refused:
                await connect(_steer_url(server.url, bad), **NO_KEEPALIVE)
            assert refused.value.response.status_code == 403
        steerer = await Leg.open(_steer_url(server.url, token))
        await steerer.read()
        with pytest.raises(InvalidStatus) as full:  # --max-steerers-per-session 1
            await connect(_steer_url(server.url, token), **NO_KEEPALIVE)
        assert full.value.response.status_code == 503
        assert "max-steerers-per-session" in full.value.response.reason_phrase
        await steerer.send({"type": "session.revoke_steering"})
        assert (await steerer.until("error"))["code"] == "invalid_message"
        await owner.send({"type": "session.revoke_steering"})
        while not any(m["type"] == "session.steering_revoked" for m in owner.messages):
            await asyncio.sleep(0.05)
        answer = next(m for m in owner.messages if m["type"] == "session.steering_revoked")
        assert answer == {"type": "session.steering_revoked", "request_id": start["request_id"], "revoked": 1}
        with pytest.raises(ConnectionClosed):
            while True:
                await steerer.read()
        assert steerer.conn.close_code == 4001
        with pytest.raises(InvalidStatus) as revoked:
            await connect(_steer_url(server.url, token), **NO_KEEPALIVE)
        assert revoked.value.response.status_code == 403
        assert gauge("rtvideo_proxy_steerers") == 0
        assert gauge("rtvideo_proxy_steerers_dropped_total", {"reason": "revoked"}) >= 1
        await owner.send({"type": "session.revoke_steering"})  # again: none left
        await owner.send({"type": "session.stop"})
        await asyncio.wait_for(reading, 60)
        answers = [m for m in owner.messages if m["type"] == "session.steering_revoked"]
        assert [a["revoked"] for a in answers] == [1, 0]
        assert owner.messages[-1]["type"] == "session.done"

    run(body())


def test_steerable_must_be_a_boolean(proxies, triton) -> None:
    url = proxies.url()

    async def body() -> None:
        owner = await Leg.open(url)
        answer = await owner.start(PROMPT, steerable="yes")
        assert answer["type"] == "error" and answer["code"] == "invalid_start"

    run(body())


def test_the_python_steer_client(proxies, triton) -> None:
    """`rtvideo.client.steer`: an update acked to it, the stream, and the end of a revoked link."""
    from rtvideo.client.steer import steer

    wait_idle(triton)
    url = proxies.url()

    async def body() -> None:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=35, steerable=True)
        reading = asyncio.ensure_future(_read_to_done(owner))
        async with steer(url, start["steer_token"]) as s:
            seen: list[dict[str, Any]] = []
            async for message, payload in s.messages():
                seen.append(message)
                if message["type"] == "video.start":
                    assert await s.update_prompt("a harbour at night", event_id="py-1", transition_chunks=1) == "py-1"
                    await s.ping()
                if message["type"] == "video.chunk_metadata":
                    assert payload is not None and len(payload) == message["byte_length"]
                if any(m.get("event_id") == "py-1" and m["type"] == "session.interaction.queued" for m in seen) and any(
                    m["type"] == "session.pong" for m in seen
                ):
                    await owner.send({"type": "session.revoke_steering"})
                    break
            async for _ in s.messages():
                pass
            assert s.revoked and s.video_start is not None and s.video_start["steerer"] is True
        await owner.send({"type": "session.stop"})
        await asyncio.wait_for(reading, 60)
        assert _acked(owner) == set()
        assert [m["revoked"] for m in owner.messages if m["type"] == "session.steering_revoked"] == [1]

    run(body())


def test_the_python_client_hears_a_steerers_update(proxies, triton) -> None:
    """`RealtimeVideoClient.shared` holds the other participants' updates, as the page shows them."""
    from rtvideo.client.session import RealtimeVideoClient
    from tests.support.streams import PACED_MODEL

    wait_idle(triton, PACED_MODEL)
    url = proxies.url(model=PACED_MODEL)

    async def body() -> list[dict[str, Any]]:
        async with RealtimeVideoClient(url) as owner:
            start = await owner.start("a quiet harbour", num_frames=9 * 4, steerable=True)
            guest = await Leg.open(_steer_url(url, start["steer_token"]))
            await guest.read()  # its video.start
            await guest.interact("a storm rolls in", "guest-storm", 1)
            await guest.until("session.interaction.queued", event_id="guest-storm")
            async for _ in owner.chunks():
                if owner.shared:
                    break
            await owner.stop()
            await guest.conn.close()
            return owner.shared

    shared = run(body())
    assert shared[0]["event_id"] == "guest-storm" and shared[0]["from"] == "steerer", shared
