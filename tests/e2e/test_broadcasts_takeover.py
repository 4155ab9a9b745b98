"""A broadcast goes on when another replica takes its session over (docs/protocol.md §9.6
"Across replicas"): two real proxies sharing a real Redis (`--session-store`) and one broadcast
folder, the session's real Triton, real WebSocket clients, and ffmpeg's HLS demuxer (PyAV)
reading the one playlist over HTTP from the replica that took it over."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvideo.proxy.app import ProxyServer
from tests.e2e.test_broadcasts import Spectator
from tests.support.http_calls import fetch, http_base
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers, through_a_handoff
from tests.support.resume_client import Leg, continuous_stream, media_pairs
from tests.support.streams import decode

pytestmark = pytest.mark.triton

PROMPT = "a tram crossing a bridge in the rain"
FRAMES = 4000  # more than the test reads: it stops the session
SIZE = {"width": 128, "height": 96}
STORM = {"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "a storm"}}}


@pytest.fixture
def replicas(proxies: ProxyHost, redis_url: str, tmp_path: Path) -> Iterator[list[ProxyServer]]:
    """Two proxies of one deployment: one Triton, one shared session store, one broadcast folder."""
    with replica_servers(
        proxies,
        session_store=redis_url,
        drain_seconds=5.0,
        broadcast_store=str(tmp_path / "broadcasts"),
        broadcast_window=10_000,
    ) as started:
        yield started


def test_a_broadcast_goes_on_with_its_url_and_media_sequence_at_the_replica_that_takes_over(
    proxies: ProxyHost, triton: Any, replicas: list[ProxyServer], tmp_path: Path
) -> None:
    wait_idle(triton)
    a, b = replicas

    async def body() -> tuple[Leg, Leg, dict[str, Any], dict[str, Any]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=41, broadcast=True, **SIZE)
        assert start["type"] == "video.start" and start["broadcast_url"], start
        second, resumed = await through_a_handoff(proxies, first, start["resume_token"], a, b, STORM)
        return first, second, start, resumed

    first, second, start, resumed = run(body(), timeout=240)
    assert resumed["broadcast_url"] == start["broadcast_url"]  # the same URL
    playlist_url = http_base(b.url) + start["broadcast_url"]
    deadline = time.monotonic() + 60  # the ended playlist is written off the loop, after session.done
    while not (text := fetch(playlist_url)[1]).decode().rstrip().endswith("#EXT-X-ENDLIST"):
        assert time.monotonic() < deadline, text.decode()[-300:]
        time.sleep(0.1)
    pairs = media_pairs([first, second])
    media = [m for m, _ in pairs if m["kind"] == "media"]
    titles = [line.split(",", 1)[1] for line in text.decode().splitlines() if line.startswith("#EXTINF:")]
    # both holders' chunks, in order, none twice, none lost; the media sequence went on from 0
    assert titles == [f"chunk={m['transport_chunk_index']}" for m in media] and len({*titles}) == len(titles)
    assert "#EXT-X-MEDIA-SEQUENCE:0" in text.decode()
    assert [p.name for p in (tmp_path / "broadcasts").iterdir()] == [start["broadcast_url"].split("/")[-2]]
    frames = Spectator(playlist_url).result()
    sent = decode(continuous_stream([first, second]))
    # what the owner saw, frame for frame (the chunks that differ, when some do)
    bounds = np.cumsum([m["num_frames"] for m in media])
    differ = sorted(
        {
            int(np.searchsorted(bounds, i, side="right"))
            for i in range(min(len(frames), len(sent)))
            if not np.array_equal(frames[i], sent[i])
        }
    )
    assert frames.shape == sent.shape and not differ, (
        differ,
        [m["transport_chunk_index"] for m, _ in second.pairs][:6],
    )
