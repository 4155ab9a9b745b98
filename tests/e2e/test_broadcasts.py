"""HLS broadcasts through real Triton, the real proxy and ffmpeg's HLS demuxer (PyAV), a real
third-party client (docs/protocol.md "Broadcasts"): read live over HTTP while the session plays
and after its end, frame for frame the WebSocket's frames."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import av
import fsspec
import numpy as np
import pytest

from tests.support.http_calls import fetch, http_base
from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import decode

pytestmark = pytest.mark.triton

PROMPT = "lanterns over a night market"
#: long enough that it is still playing when the spectator has read it; ended by session.stop
LONG = 9 * 2000


class Spectator:
    """ffmpeg's HLS demuxer reading a playlist on its own thread, from its first segment."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.frames: list[np.ndarray] = []
        self.first = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            with av.open(self.url, options={"live_start_index": "0"}, timeout=60) as container:
                for frame in container.decode(video=0):
                    self.frames.append(frame.to_ndarray(format="rgb24"))
                    self.first.set()
        except Exception as exc:  # noqa: BLE001 - raised again on the test's thread (`result`)
            self.error = exc
        finally:
            self.first.set()

    def result(self, timeout: float = 120.0) -> np.ndarray:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the HLS reader did not reach EXT-X-ENDLIST"
        if self.error is not None:
            raise self.error
        return np.stack(self.frames)


def ws_frames(leg: Leg) -> np.ndarray:
    return decode(b"".join(data for meta, data in leg.pairs if meta["kind"] != "init"))


async def play_until(owner: Leg, done: threading.Event, timeout: float = 90.0) -> None:
    """The owner reads on (media and all) until `done`; then it stops the session."""
    deadline = time.monotonic() + timeout
    while not done.is_set():
        assert time.monotonic() < deadline, "the spectator saw nothing in time"
        message = await owner.read()
        assert message["type"] != "session.done", "the session ended before the spectator read it live"


def test_a_spectator_reads_the_broadcast_live_and_after_the_end(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    store = tmp_path / "broadcasts"
    url = proxies.url(broadcast_store=str(store), broadcast_window=10_000)
    base = http_base(url)
    seen: dict[str, Any] = {}

    async def body() -> Leg:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, seed=3, num_frames=LONG, broadcast=True)
        assert start["type"] == "video.start", start
        playlist_url = base + start["broadcast_url"]
        await owner.media(2)
        status, text, headers = await asyncio.to_thread(fetch, playlist_url)
        seen.update(live=(status, text.decode(), headers), url=playlist_url)
        spectator = Spectator(playlist_url)
        await play_until(owner, spectator.first)  # live: the session plays on while it is read
        seen["spectator"] = spectator
        await owner.send({"type": "session.stop"})
        await owner.until("session.done")
        return owner

    owner = run(body(), timeout=240)
    status, live, headers = seen["live"]
    assert status == 200 and headers["Content-Type"] == "application/vnd.apple.mpegurl"
    assert headers["Cache-Control"] == "no-cache" and headers["Access-Control-Allow-Origin"] == "*"
    assert "#EXT-X-ENDLIST" not in live and '#EXT-X-MAP:URI="init.mp4"' in live and "#EXT-X-VERSION:7" in live
    hls = seen["spectator"].result()
    sent = ws_frames(owner)
    assert hls.shape == sent.shape and np.array_equal(hls, sent)  # every frame, pixel for pixel

    playlist_url = seen["url"]
    status, ended, _ = fetch(playlist_url)
    text = ended.decode()
    media = [m for m, _ in owner.pairs if m["kind"] == "media"]
    assert status == 200 and text.rstrip().endswith("#EXT-X-ENDLIST")
    assert text.count("#EXTINF:") == len(media) and "#EXT-X-MEDIA-SEQUENCE:0" in text
    after = Spectator(playlist_url).result()  # after the end: the same, read as a finished playlist
    assert np.array_equal(after, sent)

    bid = urllib.parse.urlsplit(playlist_url).path.split("/")[3]
    assert len(bid) == 32 and int(bid, 16) >= 0  # 128 random bits: the capability
    status, segment, headers = fetch(playlist_url.replace("index.m3u8", "0.m4s"))
    assert status == 200 and headers["Cache-Control"] == "public, max-age=31536000, immutable"
    assert segment == (store / bid / "0.m4s").read_bytes()
    # files counted: the ended broadcast's folder, and in it its playlist, init segment, marker
    # and one segment per chunk (the window holds them all), nothing else (no temporary file)
    assert [p.name for p in store.iterdir()] == [bid]
    segments = {f"{index}.m4s" for index in range(len(media))}
    assert {p.name for p in (store / bid).iterdir()} == {"index.m3u8", "init.mp4", "broadcast.json", *segments}
    for wrong in ("0" * 32 + "/index.m3u8", bid + "/broadcast.json", bid + "/..%2Fx", bid.upper() + "/index.m3u8"):
        assert fetch(f"{base}/v1/broadcasts/{wrong}")[0] == 404, wrong


def test_the_owner_ends_the_broadcast_and_the_session_goes_on(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    url = proxies.url(broadcast_store=str(tmp_path / "broadcasts"), broadcast_window=10_000)
    base = http_base(url)

    async def body() -> tuple[Leg, dict[str, Any], dict[str, Any], str]:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, num_frames=LONG, broadcast=True)
        await owner.media(2)
        await owner.send({"type": "session.broadcast", "enabled": True})
        refused = await owner.until("error")
        await owner.send({"type": "session.broadcast", "enabled": False})
        ended = await owner.until("session.broadcast_ended")
        before = len([m for m, _ in owner.pairs if m["kind"] == "media"])
        await owner.media(3)  # the session goes on
        text = (await asyncio.to_thread(fetch, base + start["broadcast_url"]))[1].decode()
        assert len([m for m, _ in owner.pairs if m["kind"] == "media"]) >= before + 3
        await owner.send({"type": "session.stop"})
        done = await owner.until("session.done")
        assert done["type"] == "session.done"
        return owner, refused, ended, text

    owner, refused, ended, text = run(body(), timeout=180)
    start = owner.messages[0]
    assert refused["code"] == "invalid_message" and "session.start" in refused["message"]
    assert ended["broadcast_url"] == start["broadcast_url"] and ended["request_id"] == start["request_id"]
    assert text.rstrip().endswith("#EXT-X-ENDLIST")
    media = [m for m, _ in owner.pairs if m["kind"] == "media"]
    assert text.count("#EXTINF:") < len(media)  # the chunks after its end are not broadcast
    final = fetch(base + start["broadcast_url"])[1].decode()
    assert final == text  # and the session's end changed nothing more
    frames = Spectator(base + start["broadcast_url"]).result()
    assert frames.shape[0] == sum(m["num_frames"] for m in media[: text.count("#EXTINF:")])


def test_broadcasts_off_is_invalid_start_and_the_field_is_a_boolean(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)

    async def body() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        off = await (await Leg.open(proxies.url())).start(PROMPT, broadcast=True)
        on = proxies.url(broadcast_store=str(tmp_path / "broadcasts"))
        bad = await (await Leg.open(on)).start(PROMPT, broadcast="yes")
        plain = await Leg.open(on)
        started = await plain.start(PROMPT, num_frames=9)
        await plain.send({"type": "session.broadcast", "enabled": False})
        refused = await plain.until("error")
        await plain.until("session.done")
        return off, bad, {**started, "refused": refused}

    off, bad, started = run(body())
    assert off["code"] == "invalid_start" and "--broadcast-store" in off["message"]
    assert bad["code"] == "invalid_start" and "broadcast" in bad["message"]
    assert "broadcast_url" not in started and started["refused"]["code"] == "invalid_message"
    assert not list((tmp_path / "broadcasts").iterdir())  # no broadcast asked, none written
    assert fetch(http_base(proxies.url()) + "/v1/broadcasts/" + "0" * 32 + "/index.m3u8")[0] == 404


def test_an_object_store_gets_the_broadcast_and_the_proxy_serves_none(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    root = "memory://rtvideo-e2e-broadcasts"
    url = proxies.url(broadcast_store=root, broadcast_base_url="https://cdn.example/live", broadcast_window=10_000)

    async def body() -> Leg:
        owner = await Leg.open(url)
        start = await owner.start(PROMPT, num_frames=9 * 5, broadcast=True)
        assert start["type"] == "video.start", start
        await owner.until("session.done")
        return owner

    owner = run(body())
    broadcast_url = owner.messages[0]["broadcast_url"]
    assert broadcast_url.startswith("https://cdn.example/live/") and broadcast_url.endswith("/index.m3u8")
    bid = broadcast_url.split("/")[-2]
    fs = fsspec.filesystem("memory")
    folder = f"/rtvideo-e2e-broadcasts/{bid}"
    deadline = time.monotonic() + 30
    while "#EXT-X-ENDLIST" not in fs.cat_file(f"{folder}/index.m3u8").decode():
        assert time.monotonic() < deadline, "the ended playlist was not written"
        time.sleep(0.1)
    local = tmp_path / "copy"  # what a CDN would serve, read by ffmpeg from the copy
    local.mkdir()
    for path in fs.ls(folder, detail=False):
        (local / str(path).rsplit("/", 1)[-1]).write_bytes(fs.cat_file(path))
    frames = Spectator(str(local / "index.m3u8")).result()
    assert np.array_equal(frames, ws_frames(owner))
    assert fetch(http_base(url) + f"/v1/broadcasts/{bid}/index.m3u8")[0] == 404  # the CDN's to serve


def test_an_ended_broadcast_is_removed_after_its_retention(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    store = tmp_path / "broadcasts"
    url = proxies.url(broadcast_store=str(store), broadcast_retention_seconds=0.5)

    async def body() -> tuple[Leg, list[str]]:
        owner = await Leg.open(url)
        await owner.start(PROMPT, num_frames=9 * 3, broadcast=True)
        await owner.media(1)
        during = sorted(p.name for p in store.iterdir())  # live: never swept
        await owner.until("session.done")
        return owner, during

    owner, during = run(body())
    bid = owner.messages[0]["broadcast_url"].split("/")[-2]
    assert during == [bid]
    deadline = time.monotonic() + 60
    while list(store.iterdir()):
        assert time.monotonic() < deadline, f"left behind: {sorted(p.name for p in store.rglob('*'))}"
        time.sleep(0.1)
    assert fetch(http_base(url) + owner.messages[0]["broadcast_url"])[0] == 404
