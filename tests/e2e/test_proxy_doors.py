"""The proxy's own doors (docs/security.md "The proxy's own doors"): health and metrics on a
listener of their own while the main port's connections are all taken; connections that never
send session.start held to a share of the sessions; /readyz 503 while no endpoint has a free
slot; /healthz unhealthy as soon as a session fails with backend_unavailable, and terse without
the token; the Python backend's shared memory readable by its owner only. Real proxies, the
session's real Triton (and `rtvideo serve` with its own for a stub's death), real clients."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import select
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.process.shm import stub_region
from rtvideo.proxy.observability.metrics import by_label
from rtvideo.triton.server import free_port
from tests.support.processes import RTVIDEO, descendants, stop_serve
from tests.support.proxy_client import Ws, first_message_answers, ws
from tests.support.proxy_host import run, wait_idle
from tests.support.streams import FAST_MODEL, PACED_MODEL


def get(port: int, path: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, Any]:
    """A GET on 127.0.0.1:`port`: its status and its body (JSON when it is JSON)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        body = response.read()
        try:
            return response.status, json.loads(body)
        except ValueError:
            return response.status, body.decode(errors="replace")
    finally:
        conn.close()


def eventually(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def closed_unanswered(port: int) -> bool:
    """Whether a new connection to `port` is closed without an answer to its GET /livez."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        try:
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return sock.recv(1024) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True


# --- A: health and metrics on a listener of their own ------------------------------------------
def test_the_health_listener_answers_while_the_main_port_is_full(proxies) -> None:
    """Idle sockets fill the main port's open-connection bound (a small one here; 1,024 by
    default kept /livez and /healthz unanswered for 30 s): the health listener answers /livez,
    /healthz, /readyz and /metrics at once. The main port's health routes still work."""
    server = proxies.server(
        health_port=0,
        max_open_connections=4,
        max_connections=2,
        max_open_connections_per_client=4,
        max_sessions_per_client=2,
    )
    assert server.health_port and server.health_port != server.port
    eventually(lambda: get(server.health_port, "/healthz")[0] == 200, 30, "the backend never came up")
    assert get(server.port, "/healthz")[0] == 200 and get(server.port, "/livez")[0] == 200  # still there
    assert get(server.health_port, "/v1/realtime/video")[0] == 404  # no session on this listener
    assert get(server.health_port, "/")[0] == 404  # and no page

    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
    try:
        time.sleep(0.2)  # every one accepted
        assert closed_unanswered(server.port), "the main port is not full: the test proves nothing"
        t0 = time.monotonic()
        for path in ("/livez", "/healthz", "/readyz", "/metrics"):
            status, body = get(server.health_port, path, timeout=2)
            assert status == 200, (path, status, body)
        assert time.monotonic() - t0 < 2.0
        assert "rtvideo_proxy_rejected_total" in body  # /metrics: the same registry as the main port's
    finally:
        for sock in idle:
            sock.close()


def test_the_health_listener_has_its_own_bound(proxies) -> None:
    server = proxies.server(health_port=0, health_max_open_connections=4)
    held = socket.create_connection(("127.0.0.1", server.health_port))  # a quarter of 4 from one client: 1
    try:
        time.sleep(0.2)
        before = by_label(server.context.metrics.rejected, "reason")["health_client_connections"]
        assert closed_unanswered(server.health_port)
        assert by_label(server.context.metrics.rejected, "reason")["health_client_connections"] == before + 1
        assert get(server.port, "/livez")[0] == 200  # the main port is not concerned
    finally:
        held.close()


# --- B: connections that never send session.start ----------------------------------------------
def test_connections_that_never_start_cannot_lock_the_others_out(proxies, monkeypatch) -> None:
    """Upgrades that never send session.start take at most a share of the slots (a quarter of
    --max-connections, at least 4: here 4 of 8), and one client at most its part of it (a
    quarter of the share, at least 2): its next upgrade waits for a place of its own and is
    refused (503, `awaiting_start`) when none frees, while other clients are upgraded at once; a
    live session streams on; a waiting connection that starts leaves the share at once; with the
    share full, one that waited past the grace gives its place to a new client (before: one
    address's upgrades held every place, and every other client got 503)."""
    # awaiting_place_seconds: how long an upgrade over its part is held
    server = proxies.server(max_connections=8, max_sessions_per_client=8, awaiting_place_seconds=1.0)
    share = server.context.waiting
    assert (share.bound, share.part) == (server.settings.awaiting_start_bound, 2) == (4, 2)
    monkeypatch.setattr(share, "grace", 3600.0)  # nobody is displaced until the test says so

    def refused() -> int:
        return by_label(server.context.metrics.rejected, "reason")["awaiting_start"]

    async def status(address: str, held: list[Any]) -> int:
        try:
            held.append(await ws(server.url, local_addr=(address, 0)))
        except InvalidStatus as exc:
            return exc.response.status_code
        return 101

    async def body() -> None:
        async with ws(server.url, local_addr=("127.0.0.9", 0)) as live_conn:
            live = Ws(live_conn)
            await live.start("a lighthouse", seed=3)
            before = refused()
            waiting: list[Any] = []
            try:
                # one client: its part (2) at once, its next upgrade held, then refused
                assert [await status("127.0.0.1", waiting) for _ in range(2)] == [101, 101]
                assert await status("127.0.0.1", waiting) == 503 and refused() == before + 1
                # other clients: each its own part, until the share (4) is full
                statuses = [await status(f"127.0.0.{i}", waiting) for i in (2, 3, 4)]
                assert statuses == [101, 101, 503], statuses
                assert refused() == before + 2 and len(server.context.waiting) == 4
                # One of them starts: it is no longer waiting, so a new client has room at once.
                starter = Ws(waiting.pop(0))
                await starter.start("a harbour at dawn", seed=4)
                assert await status("127.0.0.4", waiting) == 101
                # Past the grace the oldest waiting one makes way for a new client, which streams.
                share.grace = 0.2
                await asyncio.sleep(0.3)
                async with ws(server.url, local_addr=("127.0.0.6", 0)) as late_conn:
                    late = Ws(late_conn)
                    await late.start("a late client", seed=5)
                    assert (await late.next_media())["kind"] == "media"
                    oldest = Ws(waiting.pop(0))
                    error = await oldest.next(10)
                    assert error["type"] == "error" and error["code"] == "start_timeout", error
                    assert (await oldest.next(10))["type"] == "session.done"
                    with pytest.raises(ConnectionClosed):
                        await asyncio.wait_for(oldest.conn.recv(), 10)
                    await late.send({"type": "session.stop"})
                    await late.finish()
                assert (await live.next_media())["kind"] == "media"  # the live session played on
                assert (await starter.next_media())["kind"] == "media"
                await starter.send({"type": "session.stop"})
                await starter.finish()
            finally:
                for conn in waiting:
                    await conn.close()
            await live.send({"type": "session.stop"})
            await live.finish()

    run(body(), 90)


# --- C: /readyz when every slot is taken -------------------------------------------------------
def test_readyz_is_503_while_no_endpoint_has_a_free_slot(proxies, triton) -> None:
    """The paced model takes 2 sessions (max_sessions 2): with both this proxy's, /readyz is 503
    (free_slot false) while /healthz stays 200; one ends and it is 200 again. A slot taken by
    another client (a direct gRPC session) shows when the model answers server_busy: 503 until a
    session starts there again."""
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL, max_sessions_per_client=2)  # both slots, one address
    (endpoint,) = server.pool.endpoints.values()
    eventually(lambda: endpoint.capacity == 2 and get(server.port, "/readyz")[0] == 200, 30, "no capacity read")

    async def body() -> None:
        async with ws(server.url) as c1, ws(server.url) as c2:
            s1, s2 = Ws(c1), Ws(c2)
            await s1.start("one", seed=1)
            await s2.start("two", seed=2)
            status, ready = await asyncio.to_thread(get, server.port, "/readyz")
            assert status == 503 and ready["free_slot"] is False and ready["room"] is True, ready
            assert (await asyncio.to_thread(get, server.port, "/healthz"))[0] == 200  # full is not unhealthy
            await s2.send({"type": "session.stop"})
            await s2.finish()
            status, ready = await asyncio.to_thread(get, server.port, "/readyz")
            assert status == 200 and ready["free_slot"] is True, ready

            # Another client takes the free slot behind the proxy's back.
            direct = TritonStreamSession(triton.grpc_url, PACED_MODEL)
            try:
                direct.start("a direct client", seed=7)
                replies = await asyncio.to_thread(lambda: list(direct.until("video.start", 30)))
                assert replies[-1].message is not None and replies[-1].message["type"] == "video.start"
                async with ws(server.url) as c3:
                    s3 = Ws(c3)
                    await s3.send({"type": "session.start", "prompt": "three", "seed": 3})
                    busy = await s3.next()
                    assert busy["type"] == "error" and busy["code"] == "server_busy", busy
                status, ready = await asyncio.to_thread(get, server.port, "/readyz")
                assert status == 503 and ready["free_slot"] is False, ready
            finally:
                await asyncio.to_thread(direct.close)
            async with ws(server.url) as c4:  # the slot is free again: a session starts, and /readyz says so
                s4 = Ws(c4)
                await s4.start("four", seed=4)
                await s4.send({"type": "session.stop"})
                await s4.finish()
            status, ready = await asyncio.to_thread(get, server.port, "/readyz")
            assert status == 200, ready
            await s1.send({"type": "session.stop"})
            await s1.finish()

    run(body(), 120)
    wait_idle(triton, PACED_MODEL)


# --- D: /healthz without the token, and at a session's failure -----------------------------------
def test_healthz_without_the_token_says_only_the_status(proxies, triton) -> None:
    """No Triton address, no gRPC error for a client without the token; the details with it."""
    token = "doors-token-0123456789"
    server = proxies.server(token=token, health_port=0)
    eventually(lambda: get(server.port, "/healthz")[0] == 200, 30, "the backend never came up")
    for port in (server.port, server.health_port):
        status, body = get(port, "/healthz")
        assert status == 200 and body == {"status": "ok"}, body
        status, body = get(port, "/healthz", token)
        assert status == 200 and body["status"] == "ok" and body["ready"] is True, body
        assert body["endpoints"][0]["endpoint"] == triton.grpc_url, body
        assert get(port, "/metrics")[0] == 401 and get(port, "/metrics", token)[0] == 200
        status, body = get(port, "/readyz")
        assert status == 200 and triton.grpc_url not in json.dumps(body), body


def _serve(tmp: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """`rtvideo serve` with its own Triton; returns the process and the proxy's port."""
    port, grpc, metrics = free_port(), free_port(), free_port()
    stderr = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [
            str(RTVIDEO),
            "serve",
            "--port",
            str(port),
            "--triton-grpc-port",
            str(grpc),
            "--triton-metrics-port",
            str(metrics),
            "--triton-log",
            str(tmp / "triton.log"),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    stderr.close()
    assert proc.stdout is not None
    line = proc.stdout.readline() if select.select([proc.stdout], [], [], 300)[0] else ""
    if not line.startswith("rtvideo ready:"):
        stop_serve(proc)
        pytest.fail("rtvideo serve did not get ready:\n" + (tmp / "serve.log").read_text()[-4000:])
    return proc, port


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
def served_slowly_probed(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int]]:
    """Probes 5 s apart and 3 failures to be down: the probes alone would take 10-15 s."""
    proc, port = _serve(tmp_path, "--probe-interval", "5", "--probe-failures", "3")
    try:
        yield proc, port
    finally:
        stop_serve(proc)


def test_healthz_turns_unhealthy_at_a_failed_start_and_clears_on_recovery(served_slowly_probed) -> None:
    """kill -9 of the model's stub: the next session's start fails with backend_unavailable, and
    /healthz is 503 from then on (before: 200 until the probes had failed often enough, ~4.5 s by
    default); once Triton is back (restarted), 200 with no `last_error` left."""
    proc, port = served_slowly_probed
    url = f"ws://127.0.0.1:{port}/v1/realtime/video"
    eventually(lambda: get(port, "/healthz")[0] == 200, 60, "never healthy")
    stubs = [p for p in descendants(proc.pid) if b"triton_python_backend_stub" in _cmdline(p)]
    assert stubs, "no Python-backend stub"
    os.kill(stubs[0], signal.SIGKILL)
    killed = time.monotonic()

    async def failed_start() -> dict[str, Any]:
        async with ws(url) as conn:
            s = Ws(conn)
            await s.send({"type": "session.start", "prompt": "after the stub's death"})
            return await s.next(30)

    first = run(failed_start(), 60)
    failed = time.monotonic()
    assert first["type"] == "error" and first["code"] == "backend_unavailable", first
    status, health = get(port, "/healthz")
    print(f"backend_unavailable {failed - killed:.2f} s after the kill; /healthz {status}: {health}")
    assert status == 503 and health["ready"] is False, health
    assert health["last_error"], health
    assert failed - killed < 8, "the start did not fail before the probes would have noticed"

    deadline = time.monotonic() + 120
    while (answer := get(port, "/healthz"))[0] != 200:
        assert time.monotonic() < deadline, f"not healthy again: {answer}"
        time.sleep(0.25)
    health = answer[1]
    assert health["backend"] == "up" and health["last_error"] is None, health
    assert health["endpoints"][0]["last_error"] is None and health["endpoints"][0]["session_failed"] is False


# --- E: the Python backend's shared memory --------------------------------------------------------
def test_the_backends_shared_memory_is_readable_by_its_owner_only(triton) -> None:
    """After a session ran, every /dev/shm file of this server (its stubs' regions: prompts,
    video) has no group or other permission (Boost creates them 0644 whatever the umask)."""
    with TritonStreamSession(triton.grpc_url, FAST_MODEL) as session:
        session.start("a secret prompt", num_frames=6, seed=2)
        kinds = [r.message["type"] for r in session.until("session.done") if r.message is not None]
        assert kinds[0] == "video.start" and kinds[-1] == "session.done", kinds
    names = [n for n in os.listdir("/dev/shm") if n.startswith(triton.shm_prefix)]
    assert names, f"no shared memory with the prefix {triton.shm_prefix}"
    modes = {n: stat.S_IMODE(os.stat(f"/dev/shm/{n}").st_mode) for n in names}
    assert all(mode & 0o077 == 0 for mode in modes.values()), {n: oct(m) for n, m in modes.items()}
    # The stub sets its own region too (a stub Triton starts again later): it finds its name.
    regions = {stub_region(_cmdline(p)) for p in descendants(triton.pid) if b"python_backend_stub" in _cmdline(p)}
    assert regions and regions <= set(names), (regions, names)


# --- C: a connection is not a session ----------------------------------------------------------
def test_only_a_start_makes_a_session(proxies) -> None:
    """Connections that wait, are refused before a start, or resume an existing session make no
    session: the sessions counter and gauge count starts alone (before, every connection built
    one, and a resume's was thrown away)."""
    server = proxies.server(max_sessions_per_client=4, resume_grace_seconds=10)
    made = server.context.metrics.registry

    def sessions() -> tuple[float, float]:
        total = made.get_sample_value("rtvideo_proxy_sessions_total") or 0.0
        return total, made.get_sample_value("rtvideo_proxy_sessions_active") or 0.0

    async def body() -> None:
        before = sessions()
        async with ws(server.url) as idle:  # waits, says nothing
            answers = await first_message_answers(server.url, b"binary first")
            assert [(a["type"], a.get("code")) for a in answers] == [("error", "invalid_start"), ("session.done", None)]
            async with ws(server.url) as forger_conn:
                forger = Ws(forger_conn)
                await forger.send({"type": "session.resume", "resume_token": "rt1." + "A" * 43})
                assert (await forger.next(10))["code"] == "invalid_resume"
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(forger_conn.recv(), 10)
            assert sessions() == before and not server.context.sessions
            assert len(server.context.waiting) == 1 and idle.close_code is None
        owner_conn = await ws(server.url)
        owner = Ws(owner_conn)
        started = await owner.start("a harbour", seed=3, resumable=True)
        assert sessions() == (before[0] + 1, before[1] + 1)
        await owner.next_media()
        owner_conn.transport.abort()  # dropped: the session detaches
        async with ws(server.url) as back_conn:
            back = Ws(back_conn)
            await back.send(
                {"type": "session.resume", "resume_token": started["resume_token"], "last_transport_chunk_index": 0}
            )
            assert (await back.until("video.start"))["request_id"] == started["request_id"]
            assert sessions() == (before[0] + 1, before[1] + 1), "a resume made a session"
            await back.send({"type": "session.stop"})
            await back.finish()
        deadline = time.monotonic() + 10
        while server.context.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert sessions() == (before[0] + 1, before[1])

    run(body())
