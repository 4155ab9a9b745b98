"""Sequences that cannot be abandoned, and a supervisor that tells full from dead, with real parts
(docs/protocol.md §8, docs/security.md "Sequences, idle timeout and the health probe").

Every slot of the model's sequence batcher held by sequences that are never ended (started and
left silent, started and cancelled, refused with server_busy): Triton's idle timeout frees them,
the model ends a silent one with `idle_timeout`, a new session streams within the documented
bound, a live session kept alive by the proxy plays on throughout, and the proxy's supervisor
calls the full model busy (its heartbeat moves), not dead: no session of it is failed, and under
`rtvideo serve` Triton is not restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from rtvideo.client.triton_stream import TritonStreamSession
from rtvideo.proxy.session import session as proxy_session
from rtvideo.triton.access import generate_key, key_from_env
from rtvideo.triton.model_repo import derive_model
from rtvideo.triton.server import TritonServer
from tests.support.http_calls import metric_values
from tests.support.processes import stop_serve
from tests.support.proxy_client import Ws, ws
from tests.support.proxy_host import ProxyHost
from tests.support.serve_session import Served, serve, triton_pids
from tests.support.streams import IDLE_MODEL, IDLE_MODEL_SECONDS, SLOTS_MODEL_SLOTS, metric, wait_for_metric

MODEL = "realtime_video"
#: the batcher's slots in these tests' models (the shipped model has 64)
SLOTS = SLOTS_MODEL_SLOTS
#: the idle timeout of the first test's model, served by the session's Triton (the shipped one is 120 s)
IDLE_SECONDS = IDLE_MODEL_SECONDS
#: the model's watch loop period (SessionManager's watchdog_interval)
WATCH_SECONDS = 0.5
#: room for a loaded machine on top of the documented bound
MARGIN_SECONDS = 3.0
#: small, cheap, paced sessions: many of them stream at once on two cores
SMALL = {"width": "64", "height": "64", "render_workers": "0"}


def _model_repo(root: Path, max_sessions: int, idle_seconds: float | None) -> Path:
    fields = {"max_candidate_sequences": SLOTS}
    if idle_seconds is not None:
        fields["max_sequence_idle_microseconds"] = int(idle_seconds * 1e6)
    derive_model(root, MODEL, {**SMALL, "max_sessions": str(max_sessions)}, sequence_batching=fields)
    return root


def _direct(url: str, key: str, prompt: str, model: str = MODEL) -> TritonStreamSession:
    session = TritonStreamSession(url, model, key=key)
    session.start(prompt, seed=7)
    return session


def _first(session: TritonStreamSession, timeout: float = 20.0) -> dict[str, Any]:
    message = session.next(timeout).message
    assert message is not None
    return message


def _fill(
    url: str, key: str, accepted: int, refused: int, model: str = MODEL
) -> tuple[list[TritonStreamSession], list[str]]:
    """`accepted` starts that get their video.start, then `refused` ones answered server_busy (the
    model full), none of them ever ended; returns the sessions and the codes of the refusals (a
    refusal that never came means the start waits in Triton's backlog: the batcher is full)."""
    sessions = []
    for n in range(accepted):
        sessions.append(_direct(url, key, f"held {n}", model))
        assert _first(sessions[-1])["type"] == "video.start"
    codes = []
    for n in range(refused):
        sessions.append(_direct(url, key, f"refused {n}", model))
        try:
            error = _first(sessions[-1], timeout=3.0)
        except Exception:  # noqa: BLE001 - no answer: waiting for a slot, so every slot is held
            codes.append("waiting")
            continue
        codes.append(error.get("code", error["type"]))
        assert _first(sessions[-1])["type"] == "session.done"
    return sessions, codes


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class _Live:
    """A WebSocket session through a proxy that sends nothing after its start, read in a task:
    the times its media chunks arrived, and every message."""

    def __init__(self, conn: Any) -> None:
        self.s = Ws(conn)
        self.media: list[float] = []
        self.messages: list[dict[str, Any]] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.s.start("a lighthouse in fog", seed=1)
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            message = await self.s.next(60)
            self.messages.append(message)
            if message["type"] == "video.chunk_metadata" and message["kind"] == "media":
                self.media.append(time.monotonic())
            if message["type"] == "session.done":
                return

    async def stop(self) -> dict[str, Any]:
        await self.s.send({"type": "session.stop"})
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)
        return self.messages[-1]

    def errors(self) -> list[str]:
        return [m["code"] for m in self.messages if m["type"] == "error"]

    def longest_gap(self, since: float) -> float:
        times = [since, *[t for t in self.media if t >= since], time.monotonic()]
        return max(b - a for a, b in itertools.pairwise(times))


# --- Triton's idle timeout, the model's idle_timeout, the proxy's keep-alives ------------------------
@pytest.fixture(scope="module")
def short_idle(triton: TritonServer) -> Iterator[tuple[TritonServer, ProxyHost, str]]:
    """The session's Triton (with its key), whose IDLE_MODEL has SLOTS slots, an IDLE_SECONDS idle
    timeout and 4 sessions (tests/conftest.py); an in-process proxy host whose keep-alive is scaled
    to that timeout (2 s for 8 s, as the shipped 30 s is for 120 s)."""
    key = key_from_env()
    assert key, "the session's Triton is keyed"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(proxy_session, "KEEPALIVE_SECONDS", 2.0)
        host = ProxyHost(triton.grpc_url)
        try:
            yield triton, host, key
        finally:
            host.close()


def test_abandoned_sequences_free_their_slots_and_a_live_session_plays_on(short_idle) -> None:
    server, host, key = short_idle
    proxy = host.server(
        model=IDLE_MODEL,
        triton_key=key,
        triton_metrics_port=server.config.metrics_port,
        probe_interval=1.0,
        probe_timeout=1.5,
        probe_failures=2,
    )
    url = server.grpc_url
    found: dict[str, Any] = {}

    async def watch_health(stop: asyncio.Event) -> list[tuple[float, int, str]]:
        """/healthz every 0.25 s; the first time it says busy, a new WebSocket upgrade is tried."""
        seen = []
        while not stop.is_set():
            status, body = await asyncio.to_thread(_get, proxy.port, "/healthz")
            seen.append((time.monotonic(), status, body.get("backend", "")))
            if body.get("backend") == "busy" and "upgrade" not in found:
                try:
                    async with ws(proxy.url):
                        found["upgrade"] = 101
                except InvalidStatus as exc:
                    found["upgrade"] = exc.response.status_code
            await asyncio.sleep(0.25)
        return seen

    async def body() -> list[tuple[float, int, str]]:
        async with ws(proxy.url) as conn:
            live = _Live(conn)
            await live.start()  # slot 1 of SLOTS; kept alive by the proxy alone
            live_since = time.monotonic()
            stop_watching = asyncio.Event()
            health = asyncio.ensure_future(watch_health(stop_watching))
            # Slots 2-8: one session left silent, two cancelled (the model frees them, Triton's
            # slots stay held), and four starts refused with server_busy, none ever ended.
            silent_since = time.perf_counter()  # the clock of Reply.received
            held, codes = await asyncio.to_thread(_fill, url, key, 3, 4, IDLE_MODEL)
            filled = time.monotonic()
            found["refusals"] = codes
            silent, cancelled, refused = held[0], held[1:3], held[3:]
            for session in (*cancelled, *refused):
                await asyncio.to_thread(session.cancel)
            assert "server_busy" in codes and set(codes) <= {"server_busy", "waiting"}, codes

            # A new session waits in Triton's backlog until the idle timeout frees a slot.
            newcomer = TritonStreamSession(url, IDLE_MODEL, key=key)
            asked = time.monotonic()
            newcomer.start("a newcomer", seed=3)
            first = await asyncio.to_thread(_first, newcomer, IDLE_SECONDS + WATCH_SECONDS + MARGIN_SECONDS + 5)
            found["newcomer waited"] = time.monotonic() - asked
            found["newcomer after the fill"] = time.monotonic() - filled
            assert first["type"] == "video.start", first
            media = await asyncio.to_thread(
                lambda: next(
                    r.message for r in newcomer.until("video.chunk_metadata", 20) if r.message["type"] != "video.start"
                )
            )
            assert media["type"] == "video.chunk_metadata"

            # The silent session: idle_timeout, then session.done, and its slot in the model freed.
            replies = await asyncio.to_thread(lambda: list(silent.until("session.done", 30)))
            found["silent ended after"] = replies[-1].received - silent_since
            kinds = [r.message["type"] for r in replies if r.message and r.message["type"] != "video.chunk_metadata"]
            error = next(r.message for r in replies if r.message and r.message["type"] == "error")
            assert kinds[-2:] == ["error", "session.done"] and error["code"] == "idle_timeout", kinds
            await asyncio.to_thread(
                wait_for_metric, server, "rtvideo_active_sessions", IDLE_MODEL, 2, 10
            )  # live + newcomer
            await asyncio.to_thread(newcomer.close)  # (left silent, it too would end with idle_timeout)

            # The live session plays on past the idle timeout (twice over) on keep-alives alone.
            while time.monotonic() - live_since < 2 * IDLE_SECONDS + 1:
                await asyncio.sleep(0.5)
            stop_watching.set()
            seen = await health
            found["live longest gap"] = live.longest_gap(live_since)
            assert live.errors() == [], live.messages[-3:]
            done = await live.stop()
            assert done["type"] == "session.done" and done["stopped"] is True, done
            for session in held:
                await asyncio.to_thread(session.cancel)
            return seen

    seen = asyncio.run(asyncio.wait_for(body(), 180))
    print("timings:", {k: round(v, 2) if isinstance(v, float) else v for k, v in found.items()})
    # Documented bound (docs/protocol.md §8): a held slot is free at most the idle timeout after its
    # sequence's last request, and the model ends a silent session within one watch period more.
    assert found["newcomer after the fill"] <= IDLE_SECONDS + WATCH_SECONDS + MARGIN_SECONDS, found
    assert found["newcomer waited"] >= 2.0, "the new start did not wait: the batcher was not full"
    assert IDLE_SECONDS - 0.5 <= found["silent ended after"] <= IDLE_SECONDS + WATCH_SECONDS + MARGIN_SECONDS, found
    assert found["live longest gap"] < 3.0, found  # a chunk every 0.56 s; no pause while the batcher was full
    # The supervisor: busy while full (200, new upgrades refused with 503), never down; up again after.
    states = [backend for _, _, backend in seen]
    assert "busy" in states and "down" not in states and "restarting" not in states, states
    assert all(status == 200 for _, status, backend in seen if backend == "busy"), seen
    assert found.get("upgrade") == 503, found
    assert states[-1] == "up", states
    wait_for_metric(server, "rtvideo_active_sessions", IDLE_MODEL, 0, 15)
    ends = metric(server, "rtvideo_session_ends_total", IDLE_MODEL, 'reason="idle_timeout"')
    assert ends == 1, ends


# --- rtvideo serve: a full batcher is not a dead model --------------------------------------------------
def test_a_full_batcher_under_rtvideo_serve_is_busy_and_nothing_is_restarted(tmp_path: Path) -> None:
    """Every slot held by a direct client with the key, never ended: the supervisor's probes time
    out (at least 3 of them), the heartbeat says the model is alive, so it is busy: no restart, the
    live session plays on; once the slots are freed it is up again. (Before the heartbeat, two
    timed-out probes made it down: the live session got backend_unavailable, Triton restarted.)"""
    key = generate_key()
    served: Served = serve(
        tmp_path,
        "--model-repository",
        str(_model_repo(tmp_path / "repo", max_sessions=2, idle_seconds=None)),
        f"--triton-key={key}",
        "--probe-interval",
        "1",
        "--probe-timeout",
        "1.5",
    )
    try:
        server_pid, stubs = triton_pids(served.proc.pid)
        # Up and ready: the first probe answered and Triton's own readiness (asked afresh by each
        # /healthz, within its timeout, which a loaded 2-core CI machine can miss once) says so.
        deadline = time.monotonic() + 30
        while (health := served.get("/healthz")) and not (health[0] == 200 and health[1]["backend"] == "up"):
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        status, health = health
        url = health["endpoints"][0]["endpoint"]
        found: dict[str, Any] = {}

        async def body() -> list[tuple[int, dict]]:
            async with ws(served.url) as conn:
                live = _Live(conn)
                await live.start()  # slot 1 of SLOTS, session 1 of 2
                held, codes = await asyncio.to_thread(_fill, url, key, 1, SLOTS - 2)
                assert "server_busy" in codes, codes
                filled = time.monotonic()
                seen = []
                busy_probes = 0
                while time.monotonic() - filled < 40 and busy_probes < 4:
                    seen.append(await asyncio.to_thread(served.get, "/healthz"))
                    metrics = await asyncio.to_thread(metric_values, served.port)
                    busy_probes = int(metrics.get("rtvideo_proxy_probe_busy_total", 0))
                    await asyncio.sleep(0.5)
                found["busy probes"] = busy_probes
                found["full for"] = time.monotonic() - filled
                found["live longest gap"] = live.longest_gap(filled)
                assert live.errors() == [], live.messages[-3:]
                # Free the slots: end every held sequence (session.stop with sequence_end).
                for session in held:
                    await asyncio.to_thread(_end_sequence, session)
                deadline = time.monotonic() + 30
                while served.get("/healthz")[1]["backend"] != "up":
                    assert time.monotonic() < deadline, served.get("/healthz")
                    await asyncio.sleep(0.25)
                done = await live.stop()
                assert done["type"] == "session.done" and done["stopped"] is True, done
                return seen

        seen = asyncio.run(asyncio.wait_for(body(), 180))
        print("timings:", found)
        assert found["busy probes"] >= 3, (found, served.tail())
        backends = [h["backend"] for _, h in seen]
        assert "busy" in backends and not {"down", "restarting"} & set(backends), (backends, served.tail())
        assert all(status == 200 for status, h in seen if h["backend"] == "busy"), seen
        assert found["live longest gap"] < 3.0, found
        status, health = served.get("/healthz")
        assert status == 200 and health["restarts"] == 0, health
        assert triton_pids(served.proc.pid) == (server_pid, stubs), "Triton was restarted"
    finally:
        stop_serve(served.proc)


def _end_sequence(held: TritonStreamSession) -> None:
    """End a held sequence (docs/protocol.md §8): `session.stop` with `sequence_end`, then the
    stream. A live session's stop is confirmed by its session.done; a refused start's completes
    flags-only, which this client does not see, so it gets a moment."""
    held.stop()
    with contextlib.suppress(Exception):
        list(held.until("session.done", 5))
    held.cancel()
