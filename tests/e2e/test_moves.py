"""Live sessions that survive the loss of their Triton (docs/recordings.md "Moves"), end to end:
two real tritonservers (tests/support/triton_pair.py), a real proxy, real WebSocket clients,
real PyAV decoding, and the frames compared with the same sessions re-generated undisturbed in
this process (rtvideo.backend.replay.regenerate) from what each client sent and received."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rtvideo.backend.builtin.generator import BuiltinGenerator
from tests.support.http_calls import drain, fetch, metric_values
from tests.support.streams import check_stream_rules, decode
from tests.support.triton_pair import (
    ROOMY_MODEL,
    Host,
    LiveClient,
    Pair,
    restart,
    run_beside_main,
    wait_endpoints,
)
from tests.support.undisturbed import regenerate, worst_psnr

SESSIONS = 8
SIZE = {"width": 128, "height": 96}
CAMERA = {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [0.4, 0.1, 0.3]}}}}


class Steered(LiveClient):
    """A live client that also keeps what it sent, as a recording's event log would."""

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self.sent: list[dict[str, Any]] = []  # the start too: `open` sends it through `send`

    @classmethod
    async def begin(cls, url: str, index: int) -> Steered:
        start = {"seed": 100 + index, **SIZE, "prompt": f"a harbour at dawn, view {index}"}
        client = await cls.live(url, **start)
        assert isinstance(client, Steered) and client.request_id, client.t.messages
        assert [m["type"] for m in client.sent] == ["session.start"]
        return client

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        await self.conn.send(json.dumps(message))

    def log_lines(self) -> list[dict[str, Any]]:
        return [{"dir": "in", "message": m} for m in self.sent] + [
            {"dir": "out", "message": m} for m in self.t.messages
        ]


def test_sessions_survive_a_kill_and_a_drain_with_the_frames_of_undisturbed_ones(
    pair: Pair, host: Host, generator: BuiltinGenerator
) -> None:
    """8 sessions over two servers (two of them steered: a prompt transition and a camera move);
    kill -9 of one: its sessions go on on the other; it is restarted; the other is drained: every
    session goes on on the first. No client sees an error, a second video.start, a gap or a
    repeat; each stream decodes as one, its frames those of the same session undisturbed."""
    server = host.proxy(f"{pair.a},{pair.b}", model=ROOMY_MODEL, admin_token="moves-operator")
    wait_endpoints(server, {pair.a: "up", pair.b: "up"}, capacity=8)
    a = pair.servers["127.0.0.1"]
    figures: dict[str, float] = {}

    async def body(in_main: Callable[[Callable[[], Any]], Awaitable[Any]]) -> list[Steered]:
        clients = [await Steered.begin(server.url, i) for i in range(SESSIONS)]
        placed = host.placements(server)
        assert sorted(set(placed.values())) == [pair.a, pair.b]
        await asyncio.gather(*(c.media() for c in clients))
        await clients[0].send(
            {"type": "session.interaction", "interaction": {"event_id": "storm", "event": {"prompt": "a storm"}}}
        )
        await clients[1].send({"type": "session.interaction", "interaction": {"event_id": "cam", "event": CAMERA}})
        await asyncio.gather(*(c.media(2) for c in clients))

        os.killpg(a.pid, signal.SIGKILL)  # tritonserver and its stub
        t0 = time.monotonic()
        await asyncio.gather(*(c.media(1) for c in clients))
        figures["every session's next chunk after the kill"] = time.monotonic() - t0
        assert set(host.placements(server).values()) == {pair.b}, "the killed server's sessions moved"

        await in_main(lambda: restart(a))
        await asyncio.to_thread(wait_endpoints, server, {pair.a: "up", pair.b: "up"}, 120.0, 8)
        status, drained = await asyncio.to_thread(drain, server, pair.b)
        assert status == 200 and drained["sessions"] == drained["moving"] == SESSIONS, drained
        t1 = time.monotonic()
        await asyncio.gather(*(c.media(1) for c in clients))
        figures["every session's next chunk after the drain"] = time.monotonic() - t1
        assert set(host.placements(server).values()) == {pair.a}, "the drained server's sessions moved"
        await asyncio.gather(*(c.media(2) for c in clients))
        await asyncio.gather(*(c.send({"type": "session.stop"}) for c in clients))
        await asyncio.gather(*(c.done() for c in clients))
        assert (await asyncio.to_thread(drain, server, pair.b, "DELETE"))[0] == 200
        return clients

    try:
        clients = run_beside_main(body, timeout=600)
    finally:
        if not a.is_alive():
            restart(a)
    values = metric_values(server.port)
    assert values['rtvideo_proxy_sessions_moved_total{reason="drain"}'] >= 1
    assert values['rtvideo_proxy_sessions_moved_total{reason="loss"}'] >= 1
    worst = float("inf")
    for c in clients:
        assert not c.t.of_type("error") and len(c.t.of_type("video.start")) == 1
        check_stream_rules(c.t)
        frames = decode(c.t.video)
        # the same session undisturbed: its events where they took effect, its encoder never replaced
        want = regenerate(c.log_lines(), generator, SIZE["width"], SIZE["height"])
        assert frames.shape == want.shape and frames.shape[1:] == (SIZE["height"], SIZE["width"], 3)
        worst = min(worst, worst_psnr(frames, want))
    started = {e for m in clients[0].t.media for e in m["started_event_ids"]}
    assert "storm" in started and "cam" in {e for m in clients[1].t.media for e in m["started_event_ids"]}
    assert worst >= 33.0, worst  # the encoder's noise: a chunk encoded after a move, by a fresh encoder
    figures["longest wait between two chunks"] = max(c.longest_wait for c in clients)
    print("moves:", ", ".join(f"{k} {v:.2f} s" for k, v in figures.items()), f"; worst frame PSNR {worst:.1f} dB")


def test_a_drain_is_an_operators_and_names_an_endpoint(pair: Pair, host: Host) -> None:
    server = host.proxy(f"{pair.a},{pair.b}", model=ROOMY_MODEL, token="drain-client", admin_token="drain-operator")
    url = f"http://127.0.0.1:{server.port}/v1/endpoints/{pair.a}/drain"
    assert fetch(url, method="POST")[0] == 401  # from this machine, without a credential
    assert fetch(url, method="POST", token="drain-client")[0] == 401  # a client's token is not the operator's
    assert fetch(url, method="POST", token="drain-operator", headers={"Origin": "https://evil.example"})[0] == 403
    assert (
        fetch(url, method="POST", token="drain-operator", data=b"{}", headers={"Content-Type": "text/plain"})[0] == 415
    )
    assert not server.pool.endpoints[pair.a].draining  # none of those drained anything
    status, body = drain(server, "10.9.9.9:1")
    assert status == 404 and "no Triton endpoint" in body["error"]
    no_operator = host.proxy(f"{pair.a},{pair.b}", model=ROOMY_MODEL)
    status, body = drain(no_operator, pair.a)
    assert status == 403 and "--admin-token" in body["error"]
