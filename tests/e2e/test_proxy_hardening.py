"""The proxy against hostile clients: forged Host names, cross-site pages, one client holding
every slot, bad bytes, floods. Real proxies, the session's real Triton, real WebSocket clients."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import logging
import math
import pickle
import socket
import sys
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from rtvideo.core import protocol, server_messages
from rtvideo.core.event_book import MAX_EVENTS_PER_SESSION
from rtvideo.proxy.edge.access import host_allowed, origin_allowed
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.limits import RecentIds, TokenBucket
from rtvideo.proxy.observability.metrics import by_label
from rtvideo.proxy.session import session as proxy_session
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.session.ordering import OutboundOrder
from tests.support.fake_bridge import VIDEO_START, FakeConnection, begin, kinds
from tests.support.fake_bridge import chunk as unit_chunk
from tests.support.fake_bridge import ended as unit_ended
from tests.support.fake_bridge import reply as unit_reply
from tests.support.fake_bridge import run as run_unit
from tests.support.fake_bridge import session as unit_session
from tests.support.paths import REPO_ROOT
from tests.support.proxy_client import Ws, http_status, ws
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import (
    FAST_MODEL,
    PACED_MODEL,
    Transcript,
    check_stream_rules,
    event_ends,
)

REPO = REPO_ROOT


def test_host_allow_list_on_loopback(proxies) -> None:
    """DNS rebinding: a page on attacker.example that resolves to 127.0.0.1 names its own Host."""
    server = proxies.server()
    for path in ("/", "/healthz", "/metrics", "/v1/realtime/video"):
        assert http_status(server.port, path, f"attacker.example:{server.port}") == 403
        assert http_status(server.port, path, f"localhost:{server.port}") != 403
        assert http_status(server.port, path, f"127.0.0.1:{server.port}") != 403
    listed = proxies.server(allowed_hosts=("video.internal",))
    assert http_status(listed.port, "/", "video.internal") == 200
    assert http_status(listed.port, "/", "other.internal") == 403


def test_a_request_body_is_refused_unread(proxies) -> None:
    """No endpoint takes a body, and Tornado reads one whole before any handler (100 MB by
    default, held in memory, token or not: four such POSTs took a proxy from 68 to 516 MB).
    A large Content-Length is answered at once, the body unread."""
    server = proxies.server(token="secret")
    for path in ("/", "/v1/realtime/video", "/healthz"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {90 << 20}\r\n\r\n".encode())
            sock.sendall(b"x" * 65536)  # a start of the body; the rest never comes
            head = sock.recv(200)  # answered before the body is in (a timeout here otherwise)
        assert head.startswith(b"HTTP/1.1 400"), head


def test_host_rule() -> None:
    assert host_allowed("localhost:8080", "127.0.0.1", ())
    assert host_allowed("[::1]:8080", "::1", ())
    assert not host_allowed("evil.example", "127.0.0.1", ())
    assert host_allowed("pod-7.svc", "0.0.0.0", ())  # bound to every address: any name unless listed
    assert not host_allowed("pod-7.svc", "0.0.0.0", ("video.example",))
    assert host_allowed("anything", "127.0.0.1", ("*",))


def test_origin_rule_is_explicit() -> None:
    assert origin_allowed("https://video.example", [], "video.example")  # the page we served
    assert origin_allowed("http://video.example:8080", [], "video.example:8080")
    assert not origin_allowed("http://video.example:9999", [], "video.example:8080")  # another port
    assert not origin_allowed("https://evil.example", [], "video.example")
    assert origin_allowed("http://127.0.0.1:5173", [], "video.example")  # local development page


def test_one_client_cannot_hold_every_slot(proxies) -> None:
    """Two sessions from one address hold its share; a third start is server_busy at once (its
    connection was taken: connections are bounded apart, and a resume needs no new share), and
    the share is free again once one of the two ends."""
    url = proxies.url(max_sessions_per_client=2, max_connections=10)

    async def started(conn: Any) -> dict[str, Any]:
        await conn.send(json.dumps({"type": "session.start", "prompt": "a share", "num_frames": 9 * 200}))
        return json.loads(await asyncio.wait_for(conn.recv(), 30))

    async def body() -> None:
        async with connect(url) as a, connect(url) as b:
            assert (await started(a))["type"] == "video.start" and (await started(b))["type"] == "video.start"
            async with connect(url) as c:
                refused = await started(c)
                assert refused["code"] == "server_busy" and "its share" in refused["message"], refused
                assert json.loads(await asyncio.wait_for(c.recv(), 30))["type"] == "session.done"
        for _ in range(100):  # the share is free once the proxy sees the closes
            async with connect(url) as d:
                if (await started(d))["type"] == "video.start":
                    return
            await asyncio.sleep(0.05)
        raise AssertionError("the client's share was not freed")

    run(body(), 60)


# --- bounded resources: rate, requests in flight, pings, per-event sets ----------------------------
def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def triton_rss_mb(triton) -> float:
    """tritonserver and its Python-backend stubs (the model's memory lives there)."""
    total = 0.0
    for pid in triton.process_pids():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, StopIteration):
            total += rss_mb(pid)
    return total


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def transcript_of(result: dict[str, Any]) -> Transcript:
    """The flooder's session as a Transcript (binary frames in order behind their metadata)."""
    t, data = Transcript(), iter(result["data"])
    for message in result["messages"]:
        t.add(message, next(data) if message["type"] == "video.chunk_metadata" else b"")
    return t


BURST_SECONDS = 0.5  # the flood's allowed burst is over by then


#: the neighbour's acks timed before the flood starts: the baseline its acks under the flood are held to
BASELINE_ACKS = 20


async def timed_ack(s: Ws, event_id: str) -> float:
    """One interaction of the neighbour, timed from its send to its ack; then the rest of 100 ms."""
    sent = time.perf_counter()
    await s.interact(f"calm {int(event_id[1:]) % 2}", event_id, 1)  # two prompts: their embeddings are cached
    await s.until(lambda m: m["type"] == "session.interaction.queued" and m["event_id"] == event_id)
    latency = time.perf_counter() - sent
    await asyncio.sleep(max(0.0, 0.1 - latency))
    return latency


def flood_beside_a_neighbour(proxies, triton, tmp_path, mode: str, seconds: float = 5.0) -> dict[str, Any]:
    """A flooding client (its own process) and, on the same proxy, a neighbour session sending an
    interaction every 100 ms; both on the paced model. Returns the figures and both transcripts."""
    wait_idle(triton, PACED_MODEL)
    url = proxies.url(model=PACED_MODEL, max_sessions_per_client=2)  # the flooder and its neighbour: one address
    out = tmp_path / "flood.pickle"
    before: dict[str, float] = {}

    async def body() -> dict[str, Any]:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("a calm neighbour", seed=12)
            baseline = [await timed_ack(s, f"b{i}") for i in range(BASELINE_ACKS)]
            flooder = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.support.flood_client",
                url,
                mode,
                str(seconds),
                str(out),
                stdout=asyncio.subprocess.PIPE,
                cwd=str(REPO),
            )
            assert flooder.stdout is not None
            assert (await asyncio.wait_for(flooder.stdout.readline(), 30)).strip() == b"flooding"
            # Both sessions are running (their generators and encoders exist): the flood starts now.
            before.update(proxy=rss_mb(), triton=triton_rss_mb(triton))
            # Its first message_burst (40) messages pass at once, as allowed, and reach the model
            # together, so an ack sent beside them waits behind up to 40. The neighbour is timed
            # under the sustained flood that follows, to its end.
            await asyncio.sleep(BURST_SECONDS)
            latencies: list[float] = []
            peak_proxy, peak_triton = before["proxy"], before["triton"]
            began = time.monotonic()
            while time.monotonic() - began < seconds - BURST_SECONDS:
                latencies.append(await timed_ack(s, f"n{len(latencies)}"))
                peak_proxy = max(peak_proxy, rss_mb())
                if len(latencies) % 5 == 0:
                    peak_triton = max(peak_triton, triton_rss_mb(triton))
            assert await asyncio.wait_for(flooder.wait(), 90) == 0
            await s.send({"type": "session.stop"})
            neighbour = await s.finish()
        return {
            "latencies": latencies,
            "baseline": baseline,
            "peak_proxy": peak_proxy,
            "peak_triton": peak_triton,
            "neighbour": neighbour,
        }

    figures = run(body(), 180)
    with open(out, "rb") as f:
        flood = pickle.load(f)
    proxy_before, triton_before = before["proxy"], before["triton"]
    figures.update(
        flood=flood,
        proxy_before=proxy_before,
        triton_before=triton_before,
        proxy_after=rss_mb(),
        triton_after=triton_rss_mb(triton),
    )
    print(
        f"\n{mode} flood: {flood['sent']} messages in {flood['elapsed']:.1f} s, all answered after "
        f"{flood['answered']:.1f} s; proxy RSS "
        f"{proxy_before:.0f} MB → peak {figures['peak_proxy']:.0f} → {figures['proxy_after']:.0f}; triton RSS "
        f"{triton_before:.0f} MB → peak {figures['peak_triton']:.0f} → {figures['triton_after']:.0f}; neighbour ack "
        f"p50 {sorted(figures['latencies'])[len(figures['latencies']) // 2] * 1000:.1f} ms, "
        f"p99 {p99(figures['latencies']) * 1000:.1f} ms over {len(figures['latencies'])}"
    )
    return figures


def check_flood_bounds(figures: dict[str, Any]) -> None:
    assert figures["peak_proxy"] - figures["proxy_before"] < 100, "the proxy's memory grew with the flood"
    assert figures["proxy_after"] - figures["proxy_before"] < 100
    assert figures["peak_triton"] - figures["triton_before"] < 100, "Triton's memory grew with the flood"
    assert figures["triton_after"] - figures["triton_before"] < 100
    # Relative to the same session's acks before the flood, on the same machine at the same
    # time: a flood that queued the neighbour's acks behind its own messages would add its whole
    # backlog (seconds), while a busy machine only scales both figures alike.
    bound = max(0.05, 4 * p99(figures["baseline"]) + 0.02)
    assert p99(figures["latencies"]) < bound, ("a neighbour's acks slowed down under the flood", figures["baseline"])
    neighbour = figures["neighbour"]
    check_stream_rules(neighbour)
    assert not neighbour.of_type("error") and len(neighbour.of_type("session.interaction.queued")) == len(
        figures["latencies"]
    ) + len(figures["baseline"])


def answers_of(t: Transcript) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in t.messages:
        if m["type"] in ("session.pong", "session.interaction.queued", "error"):
            key = m["code"] if m["type"] == "error" else m["type"]
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_a_ping_flood_is_bounded(proxies, triton, tmp_path) -> None:
    """120 KB pings as fast as the client can send: one answer each, most of them rate_limited;
    neither the proxy nor Triton holds on to them, and a neighbour's acks stay fast."""
    figures = flood_beside_a_neighbour(proxies, triton, tmp_path, "ping")
    check_flood_bounds(figures)
    flood = figures["flood"]
    t = transcript_of(flood)
    check_stream_rules(t)
    assert flood["close_code"] == 1000
    answers = answers_of(t)
    assert sum(answers.values()) == flood["sent"], answers  # one answer per ping, never two
    assert set(answers) == {"session.pong", "rate_limited"}, answers
    assert answers["session.pong"] <= 40 + 20 * (flood["answered"] + 0.5)  # the rate, over the whole flood
    limited = [m for m in t.of_type("error")]
    assert all(m["request_id"] == t.messages[0]["request_id"] for m in limited)


def test_an_interaction_flood_is_bounded_and_loses_nothing(proxies, triton, tmp_path) -> None:
    """Interactions as fast as the client can send: beyond the rate each is answered rate_limited
    and not forwarded; every one acked still reaches exactly one end."""
    figures = flood_beside_a_neighbour(proxies, triton, tmp_path, "interaction")
    check_flood_bounds(figures)
    flood = figures["flood"]
    t = transcript_of(flood)
    check_stream_rules(t)
    answers = answers_of(t)
    assert sum(answers.values()) == flood["sent"] and set(answers) == {"session.interaction.queued", "rate_limited"}
    acked = [m["event_id"] for m in t.of_type("session.interaction.queued")]
    assert len(acked) == len(set(acked)) <= 40 + 20 * (flood["answered"] + 0.5)
    ends = event_ends(t)
    assert sorted(ends) == sorted(acked), "each acked event reaches exactly one end"


def test_pings_beyond_the_burst_are_rate_limited_and_each_has_one_answer(proxies, triton) -> None:
    """Pings are answered by the proxy (one pong each, before video.start too, held behind it);
    beyond the burst they are rate_limited; the model's pong to a forwarded one never shows."""
    wait_idle(triton, PACED_MODEL)

    async def body() -> Transcript:
        async with ws(proxies.url(model=PACED_MODEL)) as conn:
            s = Ws(conn)
            await s.send({"type": "session.start", "prompt": "pings", "seed": 13})
            for _ in range(60):
                await s.send({"type": "session.ping"})
            await asyncio.sleep(1.5)  # tokens again; and a ping may be forwarded again
            for _ in range(5):
                await s.send({"type": "session.ping"})
                await asyncio.sleep(0.3)
            await asyncio.sleep(0.5)
            await s.send({"type": "session.stop"})
            return await s.finish()

    t = run(body())
    check_stream_rules(t)
    answers = answers_of(t)
    assert sum(answers.values()) == 65, answers
    assert 40 <= answers["session.pong"] - 5 <= 42 and answers["rate_limited"] == 65 - answers["session.pong"]
    first_limited = next(i for i, m in enumerate(t.messages) if m["type"] == "error")
    assert t.messages[first_limited]["request_id"] == t.messages[0]["request_id"]


def interaction(i: int) -> str:
    return json.dumps({"type": "session.interaction", "interaction": {"event_id": f"e{i}", "event": {"prompt": "p"}}})


PING = json.dumps({"type": "session.ping"})
GENEROUS = {"max_messages_per_second": 1000.0, "message_burst": 1000}


def test_requests_in_flight_to_triton_are_bounded() -> None:
    async def body() -> tuple[list[Any], list[Any]]:
        s, conn, bridge = unit_session(max_requests_in_flight=3, **GENEROUS)
        begin(s)
        s.on_reply(VIDEO_START)
        for i in range(5):
            s.steering.frame(s.owner, interaction(i), False)
        s.steering.frame(s.owner, PING, False)  # answered here; not forwarded while the bound is reached
        stream = bridge.streams[0]
        assert [json.loads(raw)["type"] for raw, _, _ in stream.sent] == ["session.start"] + ["session.interaction"] * 3
        s.on_reply(unit_reply("m2", {"type": "session.interaction.queued", "request_id": "r", "event_id": "e0"}))
        s.steering.frame(s.owner, interaction(5), False)  # one answer came: room for one more
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)  # never counted, never refused
        sent = [(json.loads(raw).get("interaction", {}).get("event_id"), end) for raw, _, end in stream.sent]
        await unit_ended(s, conn)
        return sent, conn.texts()

    sent, texts = run_unit(body())
    assert sent == [(None, False), ("e0", False), ("e1", False), ("e2", False), ("e5", False), (None, True)]
    limited = [m for m in texts if m["type"] == "error"]
    assert [m["code"] for m in limited] == ["rate_limited", "rate_limited"]
    assert all("in flight" in m["message"] and m["request_id"] == "r" for m in limited)
    assert sum(m["type"] == "session.pong" for m in texts) == 1


def test_pings_are_answered_here_and_coalesced(monkeypatch) -> None:
    """Every ping gets the proxy's pong; at most one a PING_FORWARD_SECONDS, and only one at a
    time, goes on to Triton; the model's pong to it is dropped."""
    monkeypatch.setattr(proxy_session, "PING_FORWARD_SECONDS", 0.2)

    async def body() -> tuple[list[str], list[Any]]:
        s, conn, bridge = unit_session(**GENEROUS)
        begin(s)
        s.steering.frame(s.owner, PING, False)  # before video.start: the pong waits behind it
        s.on_reply(VIDEO_START)
        stream = bridge.streams[0]
        for _ in range(9):
            s.steering.frame(s.owner, PING, False)

        def forwarded() -> list[int]:
            return [tag for tag, (raw, _, _) in enumerate(stream.sent) if json.loads(raw)["type"] == "session.ping"]

        assert forwarded() == [1]
        await asyncio.sleep(0.25)
        s.steering.frame(s.owner, PING, False)  # the first is still unanswered: nothing more goes on
        assert forwarded() == [1]
        s.on_reply(unit_reply("m2", {"type": "session.pong"}))  # the model's pong: dropped
        s.steering.frame(s.owner, PING, False)
        assert forwarded() == [1, 2]
        s.steering.frame(s.owner, PING, False)  # too soon after the last
        assert forwarded() == [1, 2]
        s.on_reply(unit_reply("m3", {"type": "session.pong"}))
        await asyncio.sleep(0.01)
        s.on_disconnect()
        await unit_ended(s, conn)
        return [f["type"] for f in conn.texts()], stream.sent

    types, _ = run_unit(body())
    assert types == ["video.start"] + ["session.pong"] * 13


def test_the_rate_limit_answers_and_lets_a_stop_through() -> None:
    async def body() -> tuple[list[Any], list[Any]]:
        # a slow refill: a loaded machine's late wake-ups add no token where the test counts them
        s, conn, bridge = unit_session(max_messages_per_second=1.0, message_burst=3)
        begin(s)  # the start is not counted
        s.on_reply(VIDEO_START)
        for _ in range(5):
            s.steering.frame(s.owner, PING, False)
        s.steering.frame(s.owner, b"\x00" * 100_000, True)  # refused before it is even looked at
        await asyncio.sleep(1.2)  # one token back (a second one only 0.8 s later)
        s.steering.frame(s.owner, interaction(1), False)
        s.steering.frame(s.owner, interaction(2), False)
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)  # over the rate, yet a stop
        await unit_ended(s, conn)
        return conn.texts(), bridge.streams[0].sent

    texts, sent = run_unit(body())
    kinds_ = [m["code"] if m["type"] == "error" else m["type"] for m in texts]
    assert kinds_ == [
        "video.start",
        "session.pong",
        "session.pong",
        "session.pong",
        "rate_limited",
        "rate_limited",
        "rate_limited",
        "session.interaction.queued",
        "rate_limited",
        "session.done",
    ]
    assert [(json.loads(raw)["type"], end) for raw, _, end in sent] == [
        ("session.start", False),
        ("session.ping", False),
        ("session.interaction", False),
        ("session.stop", True),
    ]


def test_rate_limited_names_the_interaction_it_refused(proxies, triton) -> None:
    """Through the real proxy: an interaction over the rate is answered `rate_limited` with its
    `event_id` (so the client knows which update to send again); a frame without a readable one
    (not a string, not JSON, over the size limit) is answered without one."""
    wait_idle(triton, PACED_MODEL)
    url = proxies.url(model=PACED_MODEL, max_messages_per_second=0.05, message_burst=2)

    async def body() -> Transcript:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.start("refused updates", seed=5)
            for i in range(4):
                await s.interact(f"update {i}", f"u{i}")
            await s.send({"type": "session.interaction", "interaction": {"event_id": 7, "event": {"prompt": "p"}}})
            await s.send('{"type": "session.interaction", "interaction": {"event_id": "u9"')
            await s.send({"type": "session.interaction", "interaction": {"event_id": "u8"}, "pad": "x" * 200_000})
            await s.send({"type": "session.stop"})  # over the rate, yet a stop
            return await s.finish()

    t = run(body())  # every message is checked against the published schema as it arrives
    check_stream_rules(t)
    answers = [
        (m["type"], m.get("code"), m.get("event_id"))
        for m in t.messages
        if m["type"] == "session.interaction.queued" or m["type"] == "error"
    ]
    assert answers == [
        ("session.interaction.queued", None, "u0"),
        ("session.interaction.queued", None, "u1"),
        ("error", "rate_limited", "u2"),
        ("error", "rate_limited", "u3"),
        ("error", "rate_limited", None),
        ("error", "rate_limited", None),
        ("error", "rate_limited", None),
    ], answers
    assert t.messages[-1]["stopped"] is True


def test_token_bucket() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.5) and not bucket.take(0.5)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # never more than the burst


def test_per_event_sets_are_bounded() -> None:
    recent = RecentIds(limit=3)
    for event_id in "abcdb":
        recent.add(event_id)
    assert len(recent) == 3 and "a" not in recent and recent.issuperset("bcd")
    ledger = Ledger()  # its EventBook records at most the model's bound of events
    order: OutboundOrder[str] = OutboundOrder(ack_wait=1.0)
    order.stream("video.start", {"type": "video.start", "request_id": "r"}, 0.0)
    for i in range(MAX_EVENTS_PER_SESSION + 5):
        for message in (
            server_messages.queued("r", f"e{i}"),
            server_messages.error(protocol.ErrorCode.INTERACTION_FAILED, "x", event_id=f"e{i}"),
        ):
            ledger.taken(Frame(server_messages.encode(message), message))
        order.answer(f"ack e{i}", 10, ack=f"e{i}")
    assert len(ledger.book) == len(order.acked) == MAX_EVENTS_PER_SESSION
    assert "e0" not in order.acked and f"e{MAX_EVENTS_PER_SESSION + 4}" in order.acked
    assert ledger.done()["unapplied_event_ids"] == []  # every one it recorded ended


# --- ends: the model's end closes at once; a silent backend ends the session ------------------------
@pytest.mark.parametrize("case", ["complete", "server_busy", "refused_start"])
def test_a_session_the_model_ends_closes_at_once(proxies, triton, caplog, case: str) -> None:
    """After the model's session.done the proxy ends the sequence and half-closes the request
    stream; Triton ends the call at once, so the close follows within 0.5 s, without a warning."""
    model = PACED_MODEL if case == "server_busy" else FAST_MODEL
    wait_idle(triton, model)

    async def body() -> float:
        async with contextlib.AsyncExitStack() as stack:
            if case == "server_busy":  # the paced model takes two sessions
                for i in range(2):
                    await Ws(
                        await stack.enter_async_context(ws(proxies.url(model=model, max_sessions_per_client=8)))
                    ).start("busy", seed=i)
            conn = await stack.enter_async_context(ws(proxies.url(model=model, max_sessions_per_client=8)))
            s = Ws(conn)
            if case == "complete":
                await s.start("to the end", num_frames=18, seed=14)
            else:
                await s.send(
                    {"type": "session.start", "prompt": "x", **({"format": "webm"} if case == "refused_start" else {})}
                )
            done = await s.until(lambda m: m["type"] == "session.done")
            at = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(conn.recv(), 10)
            closed = time.monotonic() - at
            assert conn.close_code == 1000
            if case == "complete":
                assert done["stopped"] is False and done["chunks"] == 3
            else:
                codes = [m["code"] for m in s.t.of_type("error")]
                assert codes == ["server_busy" if case == "server_busy" else "unsupported_format"]
            return closed

    with caplog.at_level(logging.WARNING, logger="rtvideo.proxy"):
        closed = run(body())
    print(f"\n{case}: closed {closed * 1000:.0f} ms after session.done")
    # at once, not after END_GRACE_SECONDS (3 s); half that leaves room for a loaded machine
    assert closed < 1.5, f"the close came {closed:.2f} s after session.done"
    warnings = [
        r.getMessage() for r in caplog.records if r.name.startswith("rtvideo.proxy") and r.levelno >= logging.WARNING
    ]
    assert warnings == []


def test_a_silent_backend_ends_the_session() -> None:
    """Nothing from Triton for backend_silence_seconds: backend_unavailable, a complete
    session.done, close 1000, the stream dropped; replies that keep coming keep it alive."""

    async def body() -> tuple[FakeConnection, float, bool]:
        s, conn, bridge = unit_session(backend_silence_seconds=0.3)
        begin(s)
        s.on_reply(VIDEO_START)
        for i in range(4):  # 0.8 s in all, never 0.3 s quiet
            await asyncio.sleep(0.2)
            s.on_reply(unit_chunk(i, 5))
        quiet_from = time.monotonic()
        await unit_ended(s, conn)
        return conn, time.monotonic() - quiet_from, bridge.streams[0].sent[-1][2]

    conn, after, sent_end = run_unit(body())
    assert kinds(conn.frames)[-2:] == [("error", "backend_unavailable"), ("session.done", None)]
    assert [f["type"] for f in conn.texts()].count("video.chunk_metadata") == 4
    done = conn.texts()[-1]
    assert done["chunks"] == 4 and done["request_id"] == "r" and done["stopped"] is False
    assert conn.closed == 1000 and 0.25 < after < 1.5
    assert not sent_end  # like a broken stream: dropped, nothing more sent on it


# --- open connections: a bound on every kind, idle ones closed, the fd limit made to fit ---------
async def _eof_after(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closes `sock` (it sends nothing), or None within `timeout`."""
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    try:
        data = await asyncio.wait_for(loop.sock_recv(sock, 1024), timeout)
    except asyncio.TimeoutError:
        return None
    assert data == b"", data
    return time.monotonic() - t0


def test_open_connections_are_bounded_and_idle_ones_closed(proxies) -> None:
    """A session and idle sockets fill the bound; one more connection is closed unanswered at
    once; the idle ones go after `http_idle_seconds`; the session plays on throughout."""
    server = proxies.server(max_open_connections=6, max_connections=4, http_idle_seconds=3)
    host, port = "127.0.0.1", server.port

    def refused() -> int:
        return by_label(server.context.metrics.rejected, "reason")["open_connections"]

    def raw() -> socket.socket:
        sock = socket.create_connection((host, port))
        sock.setblocking(False)
        return sock

    async def body() -> None:
        async with ws(server.url) as conn:
            session = Ws(conn)
            await session.start()
            idle = [raw() for _ in range(5)]  # the session and these: 6 open
            opened = time.monotonic()
            try:
                before = refused()
                one_more = raw()
                took = await _eof_after(one_more, 2.0)
                assert took is not None and took < 2.0, "a connection beyond the bound was not closed at once"
                one_more.close()
                assert refused() == before + 1
                # The idle ones: closed by the server after http_idle_seconds, not before.
                closed = await asyncio.gather(*(_eof_after(sock, 15.0) for sock in idle))
                assert all(c is not None for c in closed), closed
                assert time.monotonic() - opened >= 2.5, closed
            finally:
                for sock in idle:
                    sock.close()
            # Room again: a plain request is answered, and the session still plays.
            for _ in range(100):
                try:
                    conn_http = http.client.HTTPConnection(host, port, timeout=5)
                    conn_http.request("GET", "/livez")
                    assert conn_http.getresponse().status == 200
                    conn_http.close()
                    break
                except (ConnectionError, http.client.RemoteDisconnected):
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("no room after the idle connections were closed")
            assert (await session.next_media())["kind"] == "media"

    run(body(), 60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="all of 127/8 is loopback on Linux")
def test_one_client_cannot_hold_every_open_connection(proxies) -> None:
    server = proxies.server(
        max_open_connections=20, max_connections=4, max_open_connections_per_client=3, max_sessions_per_client=2
    )

    def raw(source: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", server.port), source_address=(source, 0))
        sock.setblocking(False)
        return sock

    async def livez(sock: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)

    async def body() -> None:
        held = [raw("127.0.0.1") for _ in range(3)]
        try:
            before = by_label(server.context.metrics.rejected, "reason")["client_connections"]
            one_more = raw("127.0.0.1")
            took = await _eof_after(one_more, 2.0)
            one_more.close()
            assert took is not None, "a client's connection beyond its bound was not closed at once"
            assert by_label(server.context.metrics.rejected, "reason")["client_connections"] == before + 1
            other = raw("127.0.0.2")  # another client is still served
            try:
                assert (await livez(other)).startswith(b"HTTP/1.1 200"), "another client was refused"
            finally:
                other.close()
            assert (await livez(held[0])).startswith(b"HTTP/1.1 200")  # the held ones work
        finally:
            for sock in held:
                sock.close()

    run(body(), 60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_NOFILE as Linux sets it")
def test_the_open_file_limit_is_raised_to_fit_the_bound_or_the_bound_to_fit_it() -> None:
    import subprocess

    probe = (
        "import resource, sys; from rtvideo.proxy.edge.connections import fd_room; "
        "soft, hard = map(int, sys.argv[1:]); resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)); "
        "print(fd_room(1024), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cases = [(300, 300, "172 300")]  # a low hard limit: the bound shrinks to fit (with a warning)
    if hard == resource.RLIM_INFINITY or hard >= 1024 + 128:
        cases.append((256, -1 if hard == resource.RLIM_INFINITY else hard, "1024 1152"))  # raised to fit
    for soft, hard_limit, expected in cases:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(soft), str(hard_limit)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == expected.split(), (soft, hard_limit, out.stdout, out.stderr)
        assert ("raise the hard limit" in out.stderr) == (expected.startswith("172")), out.stderr
