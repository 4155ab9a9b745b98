"""WebRTC viewers (WHEP, RFC 9725; docs/protocol.md §9.5) through real Triton and the real proxy,
watched by aiortc as a third-party WHEP client: the frames it decodes are the WebSocket's frames
of the same session; every refusal; nothing left behind (the proxy's peer connections counted).

The sessions here are the paced model's (real time, as a viewer watches): unpaced, chunks come
faster than a loaded machine's owner client and aiortc's decoder both take them."""

from __future__ import annotations

import asyncio
import io
import urllib.parse
from typing import Any

import av
import numpy as np
import pytest
from aiortc import RTCSessionDescription

from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.participants import whep_viewer
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.access import key_from_env
from tests.support.leaks import assert_nothing_left, pending_webrtc_tasks, udp_sockets
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL
from tests.support.whep_client import Viewer, delete, offer, post, psnr

PROMPT = "a lighthouse on a cliff at dusk"
SDP = {"Content-Type": "application/sdp"}


def _base(server: ProxyServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def _yuv_frames(video: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(video), format="mp4") as container:
        return [frame.to_ndarray(format="yuv420p") for frame in container.decode(video=0)]


@pytest.fixture(autouse=True)
def udp_before(proxies: ProxyHost) -> int:
    """This process's UDP sockets before the test (the proxies' ICE sockets are counted after),
    once the earlier tests' sessions have closed (each counts against the one client's share)."""
    proxies.wait_sessions_closed()
    return udp_sockets()


def _no_viewers_left(proxies: ProxyHost, udp_before: int | None, *servers: ProxyServer) -> None:
    """Every viewer's peer connection is closed and forgotten, and nothing of it is left: no
    aiortc/aioice task pending on the proxies' loop, the viewer gauge at 0, no UDP socket more."""
    assert_nothing_left(proxies, list(servers), udp_before)


async def _read_on(leg: Leg) -> None:
    while (await leg.read(60))["type"] != "session.done":
        pass


def test_a_whep_viewer_decodes_the_websockets_frames_and_ends_with_the_session(proxies, triton, udp_before) -> None:
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=31, num_frames=9 * 120, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        viewer = await Viewer.open(_base(server), start["watch_token"])
        assert viewer.location.startswith("/v1/realtime/video/whep/")
        await viewer.until_frames(20)
        await owner.send({"type": "session.stop"})
        await reading
        await asyncio.wait_for(viewer.ended.wait(), 60)  # the session's end ended the track
        await viewer.until_closed()  # ... and the peer connection
        sent = _yuv_frames(b"".join(d for _, d in owner.pairs))
        # the first frame received is one of the session's, exactly (passed through, not re-encoded)
        first = max(range(len(sent)), key=lambda i: psnr(sent[i], viewer.frames[0]))
        assert psnr(sent[first], viewer.frames[0]) == float("inf")
        for frame, rtp_time in zip(viewer.frames, viewer.times, strict=True):
            index = first + round((rtp_time - viewer.times[0]) * 16 / 90_000)  # timed as the chunks say
            assert psnr(sent[index], frame) == float("inf"), index  # the same decoded pixels
        await viewer.close()

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


def test_delete_ends_the_viewer_and_the_session_goes_on(proxies, triton, udp_before) -> None:
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=32, num_frames=9 * 120, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        viewer = await Viewer.open(_base(server), start["watch_token"])
        await viewer.until_frames(2)
        assert len(server.whep_viewers) == 1
        gone = await delete(_base(server), viewer.location)
        assert gone.code == 200
        assert len(server.whep_viewers) == 0  # closed before the answer
        await viewer.until_closed()
        assert (await delete(_base(server), viewer.location)).code == 404
        assert not reading.done()  # the session did not notice
        await owner.send({"type": "session.stop"})
        await reading
        await viewer.close()

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


def test_refusals(proxies, triton, udp_before) -> None:
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL, max_watchers_per_session=1)
    base = _base(server)

    async def body() -> None:
        pc, sdp = await offer()
        vp8, vp8_sdp = await offer("video/VP8")
        try:
            owner = await Leg.open(server.url)
            start = await owner.start(PROMPT, seed=33, num_frames=9 * 120, watchable=True, steerable=True)
            reading = asyncio.ensure_future(_read_on(owner))
            token = start["watch_token"]
            bearer = {"Authorization": f"Bearer {token}", **SDP}
            for headers, status in (
                (SDP, 401),  # no credential
                ({"Authorization": "Bearer nonsense", **SDP}, 401),  # not a watch or steer token
                ({"Authorization": "Basic dXNlcjpwYXNz", **SDP}, 401),
                ({"Authorization": "Bearer wv1.0000000000000000.AAAA", **SDP}, 403),  # forged
                ({"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}, 415),
            ):
                answer = await post(base, sdp.encode(), headers)
                assert answer.code == status, (headers, answer.code, answer.body)
            answer = await post(base, b"v=0\r\nthis is not sdp\r\n", bearer)
            assert answer.code == 400
            answer = await post(base, vp8_sdp.encode(), bearer)
            assert answer.code == 406, answer.body
            assert len(server.whep_viewers) == 0  # no peer connection made for a refused offer
            first = await Viewer.open(base, token)  # --max-watchers-per-session 1: it takes the place
            full = await post(base, sdp.encode(), bearer)
            assert full.code == 503 and full.headers["Retry-After"]
            assert len(server.whep_viewers) == 1
            # a steer token's viewer counts as a steerer; revoked steering ends it, and its token
            steerer = await Viewer.open(base, start["steer_token"])
            await steerer.until_frames(1)
            await owner.send({"type": "session.revoke_steering"})
            await steerer.until_closed()
            again = await post(base, sdp.encode(), {"Authorization": f"Bearer {start['steer_token']}", **SDP})
            assert again.code == 403
            await owner.send({"type": "session.stop"})
            await reading
            await first.until_closed()
            ended = await post(base, sdp.encode(), bearer)  # an ended session
            assert ended.code in (403, 404)
            await first.close()
            await steerer.close()
        finally:
            await pc.close()
            await vp8.close()

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


def test_cors_preflight_and_a_foreign_origin(proxies, triton, udp_before) -> None:
    server = proxies.server(allowed_origins=("https://player.example",))
    base = _base(server)

    async def body() -> None:
        from tornado.httpclient import AsyncHTTPClient, HTTPRequest

        client = AsyncHTTPClient()
        pre = await client.fetch(
            HTTPRequest(
                base + "/v1/realtime/video/whep",
                method="OPTIONS",
                headers={
                    "Origin": "https://player.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            ),
            raise_error=False,
        )
        assert pre.code == 204
        assert pre.headers["Access-Control-Allow-Origin"] == "https://player.example"
        assert "POST" in pre.headers["Access-Control-Allow-Methods"]
        assert "authorization" in pre.headers["Access-Control-Allow-Headers"].lower()
        assert "Location" in pre.headers["Access-Control-Expose-Headers"]
        pc, sdp = await offer()
        try:
            foreign = await post(base, sdp.encode(), {"Origin": "https://elsewhere.example", **SDP})
            assert foreign.code == 403 and "Access-Control-Allow-Origin" not in foreign.headers
            listed = await post(base, sdp.encode(), {"Origin": "https://player.example", **SDP})
            assert listed.code == 401 and listed.headers["Access-Control-Allow-Origin"] == "https://player.example"
        finally:
            await pc.close()

    run(body())
    _no_viewers_left(proxies, udp_before, server)


def test_without_aiortc_the_door_answers_501(proxies, triton, monkeypatch: pytest.MonkeyPatch) -> None:
    server = proxies.server()
    monkeypatch.setattr(whep_viewer, "available", lambda: False)

    async def body() -> None:
        answer = await post(_base(server), b"v=0\r\n", {"Authorization": "Bearer wv1.x.y", **SDP})
        assert answer.code == 501

    run(body())


def test_the_deployment_token_comes_in_the_query(proxies, triton, udp_before) -> None:
    server = proxies.server(token="deployment-secret")
    base = _base(server)

    async def body() -> None:
        pc, sdp = await offer()
        try:
            headers = {"Authorization": "Bearer wv1.0000000000000000.AAAA", **SDP}
            assert (await post(base, sdp.encode(), headers)).code == 401  # without ?token=
            query = "?" + urllib.parse.urlencode({"token": "deployment-secret"})
            forged = await post(base, sdp.encode(), headers, query)
            assert forged.code == 403  # past the --token rule: the forged watch token is refused
        finally:
            await pc.close()

    run(body())
    _no_viewers_left(proxies, udp_before, server)


def test_a_viewer_at_the_replica_that_does_not_hold_the_session_reaches_it(
    proxies, triton, redis_url, udp_before
) -> None:
    """Two replicas sharing a real Redis: the POST at B is forwarded to A, which holds the
    session and sends the media; the DELETE at B reaches A too (the resource id names A)."""
    wait_idle(triton, PACED_MODEL)
    with replica_servers(proxies, session_store=redis_url, model=PACED_MODEL) as (a, b):

        async def body() -> None:
            owner = await Leg.open(a.url)
            start = await owner.start(PROMPT, seed=34, num_frames=9 * 120, watchable=True)
            reading = asyncio.ensure_future(_read_on(owner))
            viewer = await Viewer.open(_base(b), start["watch_token"])
            await viewer.until_frames(5)
            assert len(a.whep_viewers) == 1 and len(b.whep_viewers) == 0  # the media comes from A
            assert (await delete(_base(b), viewer.location)).code == 200
            assert len(a.whep_viewers) == 0
            await viewer.until_closed()
            pc, sdp = await offer()
            forged = await post(_base(b), sdp.encode(), {"Authorization": "Bearer wv1.0000000000000000.AAAA", **SDP})
            await pc.close()
            assert forged.code == 403
            await owner.send({"type": "session.stop"})
            await reading
            await viewer.close()

        run(body(), timeout=240)
        _no_viewers_left(proxies, udp_before, a, b)


def test_an_offer_never_followed_up_frees_its_place(proxies, triton, udp_before) -> None:
    """A client that posts its offer and goes (never sets the answer, never connects): the viewer
    is ended once ICE has not connected in time, and its watcher's place is free again."""
    wait_idle(triton, PACED_MODEL)
    # a short wait for ICE: the figure is not what is checked, that the place comes back is
    server = proxies.server(model=PACED_MODEL, max_watchers_per_session=1, whep_connect_seconds=3.0)
    base = _base(server)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=35, num_frames=9 * 400, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        bearer = {"Authorization": f"Bearer {start['watch_token']}", **SDP}
        pc, sdp = await offer()
        gone = await post(base, sdp.encode(), bearer)
        await pc.close()  # the answer is never taken
        assert gone.code == 201
        pc, sdp = await offer()
        try:
            assert (await post(base, sdp.encode(), bearer)).code == 503  # the place is taken meanwhile
        finally:
            await pc.close()
        deadline = asyncio.get_running_loop().time() + server.context.settings.whep_connect_seconds + 60
        while len(server.whep_viewers) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert len(server.whep_viewers) == 0
        viewer = await Viewer.open(base, start["watch_token"])  # the place is free again
        await viewer.until_frames(1)
        await owner.send({"type": "session.stop"})
        await reading
        await viewer.until_closed()
        await viewer.close()

    run(body(), timeout=300)
    _no_viewers_left(proxies, udp_before, server)


def test_offers_at_once_for_one_place_admit_one(proxies, triton, udp_before) -> None:
    """Several offers at once for a session with room for one watcher: each is answered while the
    others are (ICE gathering awaits), yet exactly one joins; the rest get 503 with Retry-After
    and no peer connection of theirs is left."""
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL, max_watchers_per_session=1)
    base = _base(server)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=36, num_frames=9 * 400, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        bearer = {"Authorization": f"Bearer {start['watch_token']}", **SDP}
        offers = [await offer() for _ in range(4)]
        try:
            answers = await asyncio.gather(*(post(base, sdp.encode(), bearer) for _, sdp in offers))
            codes = sorted(a.code for a in answers)
            assert codes == [201, 503, 503, 503], codes
            assert all(a.headers.get("Retry-After") for a in answers if a.code == 503)
            assert len(server.whep_viewers) == 1
            joined = next(a for a in answers if a.code == 201)
            assert (await delete(base, joined.headers["Location"])).code == 200
            assert len(server.whep_viewers) == 0
        finally:
            for pc, _ in offers:
                await pc.close()
        await owner.send({"type": "session.stop"})
        await reading

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


# --- peer connections that end before their ICE connects: nothing left on the proxy's loop ------


async def _answered(base: str, token: str, do_ice: bool) -> tuple[Any, str]:
    """A client that POSTs an offer and, when `do_ice`, takes the answer (its ICE checks start
    against the proxy's candidates) and no more; its peer connection and the resource's location."""
    pc, sdp = await offer()
    answer = await post(base, sdp.encode(), {"Authorization": f"Bearer {token}", **SDP})
    assert answer.code == 201, answer.body
    if do_ice:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.body.decode(), type="answer"))
    return pc, answer.headers["Location"]


@pytest.mark.parametrize("do_ice", [True, False], ids=["ice-under-way", "never-ice"])
def test_a_delete_right_after_the_answer_leaves_nothing(proxies, triton, udp_before, do_ice: bool) -> None:
    """The viewer is DELETEd before its ICE connects (checks under way, or never begun by the
    client): once the DELETE is answered, its peer connection's connect task is gone too."""
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL)
    base = _base(server)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=37, num_frames=9 * 120, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        pc, location = await _answered(base, start["watch_token"], do_ice)
        try:
            assert (await delete(base, location)).code == 200
            _no_viewers_left(proxies, None, server)  # the tasks at once (the client still holds its sockets)
        finally:
            await pc.close()
        await owner.send({"type": "session.stop"})
        await reading

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


@pytest.mark.parametrize("do_ice", [True, False], ids=["ice-under-way", "never-ice"])
def test_a_session_ending_right_after_the_answer_leaves_nothing(proxies, triton, udp_before, do_ice: bool) -> None:
    """The session ends while its viewer's ICE has not connected: the viewer ends with it, and
    its peer connection leaves no task and no socket behind."""
    wait_idle(triton, PACED_MODEL)
    server = proxies.server(model=PACED_MODEL)
    base = _base(server)

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=38, num_frames=9 * 120, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        pc, _ = await _answered(base, start["watch_token"], do_ice)
        try:
            await owner.send({"type": "session.stop"})
            await reading
            _no_viewers_left(proxies, None, server)
        finally:
            await pc.close()

    run(body(), timeout=240)
    _no_viewers_left(proxies, udp_before, server)


def test_the_proxys_stop_with_viewers_in_every_state_leaves_nothing(proxies, triton, udp_before) -> None:
    """A proxy of its own stops while it has a viewer playing, one whose ICE is under way, one
    whose client never did ICE and an offer being answered: when `stop` returns, no WebRTC task
    is pending on its loop (none to be "destroyed but pending" when a loop closes), no viewer is
    left, and once the clients are closed no UDP socket either."""
    wait_idle(triton, PACED_MODEL)
    settings = ProxySettings(port=0, triton_url=proxies.triton_url, model=PACED_MODEL, triton_key=key_from_env())

    async def start() -> ProxyServer:
        server = ProxyServer(settings)
        await server.start()
        return server

    server = proxies.call(start())
    base = _base(server)

    async def stop() -> tuple[int, list[str]]:
        await server.stop()
        return len(server.whep_viewers), await pending_webrtc_tasks()

    async def body() -> None:
        owner = await Leg.open(server.url)
        start = await owner.start(PROMPT, seed=39, num_frames=9 * 400, watchable=True)
        reading = asyncio.ensure_future(_read_on(owner))
        token = start["watch_token"]
        playing = await Viewer.open(base, token)
        pcs = []
        try:
            await playing.until_frames(2)
            for do_ice in (True, False):
                pcs.append((await _answered(base, token, do_ice))[0])
            pc, sdp = await offer()
            pcs.append(pc)
            answering = asyncio.ensure_future(post(base, sdp.encode(), {"Authorization": f"Bearer {token}", **SDP}))
            await asyncio.sleep(0)  # the request is on its way (or answered): either way, then the stop
            viewers, tasks = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stop(), proxies.loop))
            assert viewers == 0
            assert tasks == [], f"WebRTC tasks left pending on the stopped proxy's loop: {tasks}"
            await asyncio.gather(answering, reading, return_exceptions=True)
        finally:
            await playing.close()
            for pc in pcs:
                await pc.close()

    run(body(), timeout=300)
    _no_viewers_left(proxies, udp_before)  # the stopped proxy answers no /metrics: tasks and sockets
