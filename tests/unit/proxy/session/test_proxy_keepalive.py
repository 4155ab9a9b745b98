"""Sequences that cannot be abandoned and a supervisor that tells full from dead, on the proxy's
side, without Triton: the keep-alive a live session's sequence gets after 30 s of nothing
forwarded (its pong dropped, no client bound counted), a refused start's sequence ended at
once, the heartbeat's reading, and the supervisor's busy state (docs/protocol.md §8)."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.placement import heartbeat as heartbeat_module
from rtvideo.proxy.placement.bridge import KEEPALIVE, PING, STOP, BackendUnavailable, ProbeTimeout
from rtvideo.proxy.placement.heartbeat import Heartbeat, Pulse, heartbeat_in, metrics_url
from rtvideo.proxy.placement.pool import EndpointProbes
from rtvideo.proxy.placement.supervisor import BackendState, Supervisor
from rtvideo.proxy.session import session as proxy_session
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import VIDEO_START, begin, chunk, ended, kinds, reply, run, session, settle
from tests.support.probes import keepalives_unanswered


# --- the keep-alive ---------------------------------------------------------------------------------
def test_a_quiet_live_sequence_gets_keepalives_whose_pongs_never_reach_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(proxy_session, "KEEPALIVE_SECONDS", 0.1)

    async def body() -> tuple[list, list, Any]:
        s, conn, bridge = session(max_requests_in_flight=1, message_burst=1, max_messages_per_second=0.001)
        begin(s)
        s.on_reply(VIDEO_START)
        stream = bridge.streams[0]
        for index in range(4):  # video flows: the model speaks, but nothing goes to it
            await asyncio.sleep(0.12)
            s.on_reply(chunk(index, 10))
        keepalives = [i for i, (raw, _, _) in enumerate(stream.sent) if raw == KEEPALIVE]
        assert len(keepalives) >= 2, stream.sent
        for index in keepalives:  # the model's pongs to them
            s.on_reply(reply(f"m{index + 1}", {"type": "session.pong"}))
        await settle()
        # The bounds are the client's: a keep-alive counted in neither, so one message still passes.
        s.steering.frame(s.owner, json.dumps({"type": "session.ping"}), False)
        await settle()
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return conn.frames, stream.sent, s

    frames, sent, s = run(body())
    assert [k for k in kinds(frames) if k[0] == "session.pong"] == [("session.pong", None)]  # the client's own
    assert not any(k == ("error", "rate_limited") for k in kinds(frames))
    assert all(not start and not end for raw, start, end in sent if raw == KEEPALIVE)
    assert (STOP, False, True) in sent
    assert not keepalives_unanswered(s.upstream)


def test_forwarded_requests_put_the_keepalive_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_session, "KEEPALIVE_SECONDS", 0.3)
    monkeypatch.setattr(proxy_session, "PING_FORWARD_SECONDS", 0.05)

    async def body() -> list:
        s, conn, bridge = session()
        begin(s)
        s.on_reply(VIDEO_START)
        stream = bridge.streams[0]
        for _ in range(8):  # a client ping every 0.1 s, each forwarded: the sequence is never quiet
            s.steering.frame(s.owner, json.dumps({"type": "session.ping"}), False)
            await asyncio.sleep(0.1)
            s.on_reply(reply(f"m{len(stream.sent)}", {"type": "session.pong"}))
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await ended(s, conn)
        return stream.sent

    sent = run(body())
    assert KEEPALIVE not in [raw for raw, _, _ in sent]
    assert [raw for raw, _, _ in sent].count(PING) >= 4


def test_no_keepalive_after_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_session, "KEEPALIVE_SECONDS", 0.05)

    async def body() -> list:
        s, conn, bridge = session()
        stream_sent: list = []
        begin(s)
        s.on_reply(VIDEO_START)
        stream = bridge.streams[0]
        stream.auto_done = False  # the model takes its time to end
        s.steering.frame(s.owner, json.dumps({"type": "session.stop"}), False)
        await asyncio.sleep(0.3)
        stream_sent = list(stream.sent)
        s.on_reply(reply(START_TAG, {"type": "session.done", "request_id": "r", "chunks": 0, "stopped": True}))
        stream.close_requests()
        stream.cancel()
        await ended(s, conn)
        return stream_sent

    sent = run(body())
    assert KEEPALIVE not in [raw for raw, _, _ in sent], sent


# --- a refused start's sequence ends at once ---------------------------------------------------------
@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.SERVER_BUSY,
        ErrorCode.INVALID_START,
        ErrorCode.UNSUPPORTED_FORMAT,
        ErrorCode.MODEL_MISMATCH,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.GENERATION_FAILED,
        ErrorCode.BACKEND_UNAVAILABLE,
    ],
)
def test_every_refused_start_ends_its_sequence_at_once(code: ErrorCode) -> None:
    """The model's refusal (error, then session.done on the start request) reaches the client, and
    the sequence gets its `sequence_end` right away: the batcher's slot is not held for the idle
    timeout (docs/protocol.md §8)."""

    async def body() -> tuple[list, list]:
        s, conn, bridge = session()
        begin(s)
        stream = bridge.streams[0]
        s.on_reply(reply(START_TAG, {"type": "error", "code": code.value, "message": "refused"}))
        s.on_reply(
            reply(
                START_TAG,
                {
                    "type": "session.done",
                    "request_id": None,
                    "chunks": 0,
                    "stopped": False,
                    "unapplied_event_ids": [],
                    "unfinished_event_ids": [],
                },
            )
        )
        await ended(s, conn)
        return conn.frames, stream.sent

    frames, sent = run(body())
    assert kinds(frames) == [("error", code.value), ("session.done", None)]
    assert sent[0][1] is True and sent[-1] == (STOP, False, True), sent


# --- the heartbeat ------------------------------------------------------------------------------------
METRICS = """# HELP rtvideo_model_heartbeat_seconds Unix time
# TYPE rtvideo_model_heartbeat_seconds gauge
rtvideo_model_heartbeat_seconds{model="other"} 1900000000
rtvideo_model_heartbeat_seconds{instance="realtime_video_0",model="realtime_video"} 1733000000.25
rtvideo_model_heartbeat_seconds{instance="realtime_video_1",model="realtime_video"} 1.7330000015e+09
rtvideo_active_sessions{model="realtime_video"} 3
"""


def test_the_heartbeat_is_read_from_prometheus_text() -> None:
    assert heartbeat_in(METRICS, "realtime_video") == 1733000001.5
    assert heartbeat_in(METRICS, "other") == 1900000000
    assert heartbeat_in(METRICS, "realtime_video_paced") is None
    assert heartbeat_in("", "realtime_video") is None
    assert metrics_url("10.0.0.5:8001", 8002) == "http://10.0.0.5:8002/metrics"
    assert metrics_url("[::1]:8001", 9002) == "http://[::1]:9002/metrics"


class _MetricsServer:
    """A Triton metrics endpoint stand-in: serves `value` (None: no heartbeat; "error": HTTP 500)."""

    def __init__(self) -> None:
        self.value: Any = 1.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if outer.value == "error":
                    self.send_error(500)
                    return
                line = "" if outer.value is None else f'rtvideo_model_heartbeat_seconds{{model="m"}} {outer.value}\n'
                body = line.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None: ...

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_heartbeat_moves_only_when_its_value_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat_module, "POLL_SECONDS", 0.05)
    server = _MetricsServer()

    async def body() -> None:
        beat = Heartbeat(server.url, "m")
        assert await beat.read() == 1.0
        assert not await beat.moving(window=0.3)  # frozen (a killed stub's metrics freeze)

        async def tick() -> None:
            for n in range(2, 30):
                await asyncio.sleep(0.05)
                server.value = float(n)

        ticking = asyncio.ensure_future(tick())
        assert await beat.moving(window=1.0)
        ticking.cancel()
        server.value = None
        assert not await beat.moving(window=0.2)
        server.value = "error"
        assert await beat.read() is None and not await beat.moving(window=0.2)
        assert not await Heartbeat("http://127.0.0.1:9/metrics", "m").moving(window=0.2)  # unreachable

    try:
        asyncio.run(asyncio.wait_for(body(), 20))
    finally:
        server.close()


# --- the supervisor: busy is not down -----------------------------------------------------------------
class _Full:
    """A backend whose probes time out (`mode` "timeout") or are refused ("error"), or answered."""

    def __init__(self) -> None:
        self.mode = "timeout"
        self.restarts = 0

    async def probe(self, timeout: float) -> float:
        if self.mode == "timeout":
            raise ProbeTimeout(f"no answer to the health probe within {timeout:g} s")
        if self.mode == "error":
            raise BackendUnavailable("health probe refused: Stub process is not healthy")
        return 0.001

    async def restart(self) -> None:
        self.restarts += 1
        self.mode = "answer"

    async def reconnect(self) -> None: ...


class _Beat:
    """A model whose heartbeat moves (or not) and which reports every sequence slot held (`full`)."""

    def __init__(self) -> None:
        self.moves = True
        self.full: bool | None = True
        self.url = "http://triton:8002/metrics"
        self.reads = 0

    async def pulse(self) -> Pulse:
        self.reads += 1
        return Pulse(moving=self.moves, full=self.full if self.moves else None)


def test_a_probe_timeout_with_a_moving_heartbeat_is_busy_not_down() -> None:
    async def body() -> None:
        backend, beat, downs = _Full(), _Beat(), []
        sup = Supervisor(
            backend,  # type: ignore[arg-type]
            EndpointProbes(ProxyMetrics(), "triton", lambda: None),
            interval=0.01,
            timeout=1,
            failures=2,
            on_down=downs.append,
            restart=backend.restart,
            heartbeat=beat,  # type: ignore[arg-type]
        )
        for _ in range(5):  # a full batcher: every probe times out
            await sup.check()
        assert sup.state is BackendState.BUSY and downs == [] and sup.failures == 0 and beat.reads == 5
        assert sup.alive and not sup.ready and not sup.admitting
        assert sup.status()["backend"] == "busy"
        backend.mode = "answer"  # a slot freed
        await sup.check()
        assert sup.state is BackendState.UP and sup.ready and sup.admitting

        # A stale heartbeat: dead (down after `failures`, then the restart).
        backend.mode, beat.moves = "timeout", False
        sup.start()
        for _ in range(300):
            if backend.restarts:
                break
            await asyncio.sleep(0.01)
        await sup.stop()
        assert len(downs) == 1 and "heartbeat" in downs[0] and "does not move" in downs[0]
        assert backend.restarts == 1

    asyncio.run(asyncio.wait_for(body(), 20))


def test_an_error_answer_is_a_failure_whatever_the_heartbeat() -> None:
    async def body() -> None:
        backend, beat, downs = _Full(), _Beat(), []
        backend.mode = "error"
        sup = Supervisor(
            backend,  # type: ignore[arg-type]
            EndpointProbes(ProxyMetrics(), "triton", lambda: None),
            interval=0.01,
            timeout=1,
            failures=2,
            on_down=downs.append,
            heartbeat=beat,  # type: ignore[arg-type]
        )
        await sup.check()
        await sup.check()
        assert sup.state is BackendState.DOWN and len(downs) == 1 and beat.reads == 0
        # From down, a probe timeout with a moving heartbeat: alive again, just full.
        backend.mode = "timeout"
        await sup.check()
        assert sup.state is BackendState.BUSY and sup.alive

    asyncio.run(asyncio.wait_for(body(), 20))


def test_without_a_heartbeat_a_timeout_is_a_failure() -> None:
    async def body() -> None:
        backend, downs = _Full(), []
        sup = Supervisor(
            backend,  # type: ignore[arg-type]
            EndpointProbes(ProxyMetrics(), "triton", lambda: None),
            interval=0.01,
            timeout=1,
            failures=2,
            on_down=downs.append,
        )
        await sup.check()
        await sup.check()
        assert sup.state is BackendState.DOWN and len(downs) == 1

    asyncio.run(asyncio.wait_for(body(), 20))
