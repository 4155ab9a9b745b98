"""A recorded session that another replica takes over goes on recording under the same id
(docs/recordings.md "Recordings across replicas"): two real proxies sharing a real Redis
(`--session-store`) and one `--recordings` folder, the session's real Triton, real WebSocket
clients, the recording fetched over HTTP with its token and decoded by PyAV."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rtvideo.proxy.app import ProxyServer
from tests.support.http_calls import fetch, finished, http_base, recording_url
from tests.support.proxy_host import ProxyHost, run, wait_idle
from tests.support.replica_servers import replica_servers, through_a_handoff
from tests.support.resume_client import Leg, continuous_stream, media_pairs
from tests.support.streams import decode

pytestmark = pytest.mark.triton

PROMPT = "a lighthouse on a cliff at dusk"
FRAMES = 4000  # more than the test reads: it stops the session
SIZE = {"width": 128, "height": 96}
STORM = {"type": "session.interaction", "interaction": {"event_id": "e1", "event": {"prompt": "a storm"}}}


@pytest.fixture
def replicas(proxies: ProxyHost, redis_url: str, tmp_path: Path) -> Iterator[list[ProxyServer]]:
    """Two proxies of one deployment: one Triton, one shared session store, one recordings folder."""
    with replica_servers(proxies, session_store=redis_url, drain_seconds=5.0, recordings=str(tmp_path)) as started:
        yield started


def test_a_recording_goes_on_under_its_id_at_the_replica_that_takes_the_session_over(
    proxies: ProxyHost, triton: Any, replicas: list[ProxyServer], tmp_path: Path
) -> None:
    wait_idle(triton)
    a, b = replicas

    async def body() -> tuple[Leg, Leg, dict[str, Any]]:
        first = await Leg.open(a.url)
        start = await first.start(PROMPT, num_frames=FRAMES, seed=41, record=True, **SIZE)
        assert start["type"] == "video.start" and start["recording_id"] and start["recording_token"], start
        second, _ = await through_a_handoff(proxies, first, start["resume_token"], a, b, STORM)
        return first, second, start

    first, second, start = run(body(), timeout=240)
    rid, key = start["recording_id"], start["recording_token"]
    base = http_base(b.url)
    manifest = finished(base, rid, token=key)  # its token opens it at the replica that took it over
    pairs = media_pairs([first, second])
    media = [m for m, _ in pairs if m["kind"] == "media"]
    assert manifest["status"] == "complete" and manifest["request_id"] == start["request_id"], manifest
    assert manifest["chunks"] == len(media) and manifest["frames"] == sum(m["num_frames"] for m in media)
    assert "recording_token_sha256" not in manifest and [p.name for p in tmp_path.iterdir()] == [rid]

    status, video, _ = fetch(recording_url(base, rid, file="video.mp4"), token=key)
    assert status == 200
    assert video == continuous_stream([first, second])  # what the client got across both legs, each once
    assert len(decode(video)) == sum(m["num_frames"] for m, _ in pairs)  # one stream, every frame

    status, body_bytes, _ = fetch(recording_url(base, rid, file="events.jsonl"), token=key)
    assert status == 200
    lines = [json.loads(line) for line in body_bytes.decode().splitlines()]
    said = [e for e in lines if e["dir"] == "in" and e["message"]["type"] == "session.interaction"]
    assert [e["message"]["interaction"]["event_id"] for e in said] == ["e1"]  # the interaction, once
    out = [e["message"] for e in lines if e["dir"] == "out" and "participant" not in e]
    indices = [m["transport_chunk_index"] for m in out if m["type"] == "video.chunk_metadata"]
    assert indices == list(range(len(pairs)))  # both holders' chunks, in order, none twice
    assert [m["event_id"] for m in out if m["type"] == "session.interaction.queued"] == ["e1"]
    assert out[-1]["type"] == "session.done"
    assert [e["t"] for e in lines] == sorted(e["t"] for e in lines)
    assert key not in body_bytes.decode()
