"""The proxy's doors, without Triton: the waiting share of --max-connections, the health
listener's settings, and a supervisor that a failed session makes unready until a probe answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rtvideo.proxy.observability.metrics import ProxyMetrics, by_label
from rtvideo.proxy.placement.bridge import BackendUnavailable
from rtvideo.proxy.placement.pool import EndpointProbes
from rtvideo.proxy.placement.supervisor import BackendState, Supervisor
from rtvideo.proxy.settings import ProxySettings
from tests.support.fake_bridge import VIDEO_START, begin, ended, kinds, run, session, settle


@pytest.mark.parametrize(
    "max_connections,explicit,bound",
    [(64, 0, 16), (16, 0, 4), (8, 0, 4), (2, 0, 2), (64, 10, 10), (4, 10, 4)],
)
def test_the_waiting_share_of_the_connections(max_connections: int, explicit: int, bound: int) -> None:
    settings = ProxySettings(max_connections=max_connections, max_sessions_per_client=1, max_awaiting_start=explicit)
    assert settings.awaiting_start_bound == bound


def test_health_listener_settings() -> None:
    assert ProxySettings().health_port is None  # off unless asked for (the image and manifests ask)
    assert ProxySettings(health_port=0).health_port == 0
    for bad in ({"health_port": 70000}, {"health_port": 8080}, {"health_max_open_connections": 0}):
        with pytest.raises(ValueError):
            ProxySettings(**bad)  # type: ignore[arg-type]


class _Backend:
    """Answers probes while `alive`; `gate`, when set, holds each probe until it is released."""

    def __init__(self) -> None:
        self.alive = True
        self.probes = 0
        self.gate: asyncio.Event | None = None

    async def probe(self, timeout: float) -> float:
        self.probes += 1
        if self.gate is not None:
            await self.gate.wait()
        if not self.alive:
            raise BackendUnavailable("stub gone")
        return 0.001

    async def reconnect(self) -> None:
        pass


def _supervisor(backend: _Backend, metrics: ProxyMetrics, interval: float = 0.01) -> Supervisor:
    return Supervisor(
        backend,  # type: ignore[arg-type]
        EndpointProbes(metrics, "stub", lambda: None),
        interval=interval,
        timeout=1,
        failures=2,
        on_down=lambda reason: None,
    )


def test_a_failed_session_makes_the_backend_unready_until_a_probe_answers() -> None:
    async def body() -> None:
        backend, metrics = _Backend(), ProxyMetrics()
        sup = _supervisor(backend, metrics)
        await sup.check()
        assert sup.ready and by_label(metrics.endpoint_up, "endpoint")["stub"] == 1
        sup.suspect("a session start failed: Stub process is not healthy")
        assert not sup.ready and sup.admitting and sup.state is BackendState.UP  # not down: nothing ended
        assert by_label(metrics.endpoint_up, "endpoint")["stub"] == 0
        status = sup.status()
        assert status["session_failed"] is True and "not healthy" in str(status["last_error"])
        await sup.check()
        assert (
            sup.ready and by_label(metrics.endpoint_up, "endpoint")["stub"] == 1 and sup.status()["last_error"] is None
        )

        # A probe that fails leaves its error; the next answered one clears it.
        backend.alive = False
        await sup.check()
        assert sup.status()["last_error"] == "stub gone"
        backend.alive = True
        await sup.check()
        assert sup.status()["last_error"] is None

        # A session failing while a probe is in flight: that probe began before, so it does not clear it.
        backend.gate = asyncio.Event()
        probing = asyncio.ensure_future(sup.check())
        await asyncio.sleep(0.01)
        sup.suspect("a session's stream failed")
        backend.gate.set()
        assert await probing
        assert not sup.ready
        backend.gate = None
        await sup.check()
        assert sup.ready

    asyncio.run(body())


def test_a_failed_session_asks_for_a_probe_at_once() -> None:
    async def body() -> None:
        backend, metrics = _Backend(), ProxyMetrics()
        sup = _supervisor(backend, metrics, interval=60)  # the next probe on its own: in a minute
        sup.start()
        try:
            while not sup.ready:
                await asyncio.sleep(0.01)
            probes = backend.probes
            sup.suspect("a session start failed")
            for _ in range(200):
                if sup.ready:
                    break
                await asyncio.sleep(0.01)
            assert sup.ready and backend.probes == probes + 1
        finally:
            await sup.stop()

    asyncio.run(asyncio.wait_for(body(), 10))


def test_after_a_stop_bad_json_is_invalid_json_and_a_message_invalid_message() -> None:
    """docs/protocol.md §2.3: after session.stop the proxy still parses what comes (§2.5), so
    bad JSON gets `invalid_json`; a valid message other than ping or stop gets `invalid_message`."""

    async def body() -> list[Any]:
        s, conn, bridge = session()
        begin(s)
        s.on_reply(VIDEO_START)
        bridge.streams[0].auto_done = False  # the model has not answered the stop yet
        s.steering.frame(s.owner, '{"type": "session.stop"}', False)
        s.steering.frame(s.owner, "{", False)
        s.steering.frame(
            s.owner, '{"type": "session.interaction", "interaction": {"event": {"prompt": "late"}}}', False
        )
        s.steering.frame(s.owner, '{"type": "session.stop"}', False)  # a repeated stop: ignored
        await settle()
        frames = kinds(conn.frames)
        conn.close(1000)
        await ended(s, conn)
        return frames

    assert run(body()) == [("video.start", None), ("error", "invalid_json"), ("error", "invalid_message")]
