"""Replicas of one deployment in the test process: in-process `ProxyServer`s on a `ProxyHost`'s
loop, in front of its Triton, sharing what their settings share (a session store, a recordings
folder); and a handoff between two of them as the owner's client lives it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from rtvideo.proxy.app import ProxyServer
from rtvideo.proxy.settings import ProxySettings
from rtvideo.triton.access import key_from_env
from tests.support.proxy_host import ProxyHost
from tests.support.resume_client import Leg
from tests.support.streams import FAST_MODEL

STOP_SECONDS = 90  # a session still ending may take SHUTDOWN_SECONDS and more


@contextlib.contextmanager
def replica_servers(
    host: ProxyHost, count: int = 2, each: Sequence[dict[str, Any]] = (), **shared: Any
) -> Iterator[list[ProxyServer]]:
    """`count` started proxies (or one per entry of `each`, its own settings over `shared`), all
    stopped on the way out, an exception's included, those started before a failed start too."""
    own = list(each) or [{} for _ in range(count)]
    started: list[ProxyServer] = []

    async def start(settings: ProxySettings) -> ProxyServer:
        server = ProxyServer(settings)
        await server.start()
        return server

    try:
        for overrides in own:
            values = {"port": 0, "triton_url": host.triton_url, "model": FAST_MODEL, "triton_key": key_from_env()}
            started.append(host.call(start(ProxySettings(**{**values, **shared, **overrides}))))
        yield started
    finally:
        for server in started:
            host.call(server.stop(), timeout=STOP_SECONDS)


async def hand_over(
    host: ProxyHost, leg: Leg, token: str, source: ProxyServer, target: ProxyServer
) -> tuple[Leg, dict[str, Any]]:
    """`source` shuts down (a drain with no grace: it hands its sessions off) while `leg`, the
    owner's connection there, reads on until its close, which is the handoff's 1012 (the frames
    the proxy still wrote come first); then the owner resumes at `target` with `token`, from the
    last chunk it read whole. The new leg and the resumed `video.start`, checked as one."""
    handed = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(source.drain(0.0), host.loop))
    await leg.read_to_close()
    assert leg.conn.close_code == 1012, leg.conn.close_code
    await handed
    second, resumed = await Leg.resumed(target.url, token, leg.last_index)
    assert resumed["type"] == "video.start" and resumed["resumed"] is True, resumed
    return second, resumed


async def through_a_handoff(
    host: ProxyHost, first: Leg, token: str, source: ProxyServer, target: ProxyServer, interaction: dict[str, Any]
) -> tuple[Leg, dict[str, Any]]:
    """The owner's session lived through a handoff: three media chunks, `interaction` sent and
    acked, one more chunk, `source` hands the session off (`hand_over`), three chunks at `target`,
    then the owner stops it and reads to its `session.done`. The new leg and the resumed start."""
    await first.media(3)
    await first.send(interaction)
    await first.until("session.interaction.queued", event_id=interaction["interaction"]["event_id"])
    await first.media(1)
    second, resumed = await hand_over(host, first, token, source, target)
    await second.media(3)
    await second.send({"type": "session.stop"})
    await second.until("session.done", timeout=60)
    await second.conn.close()
    return second, resumed
