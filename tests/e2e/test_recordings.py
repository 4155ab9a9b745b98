"""Server-side recordings through real Triton and the real proxy (docs/recordings.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.http_calls import fetch, finished, http_base, recording_url
from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import decode

pytestmark = pytest.mark.triton

PROMPT = "boats in a harbour at noon"
TOKEN = "recordings-test-token"
ADMIN = "recordings-test-operator"


def test_a_recorded_session_is_its_stream_and_its_event_log(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    url = proxies.url(recordings=str(tmp_path / "rec"), token=TOKEN, admin_token=ADMIN)
    base = http_base(url)

    async def body() -> tuple[Leg, Leg]:
        owner = await Leg.open(url + "?token=" + TOKEN)
        start = await owner.start(PROMPT, seed=5, num_frames=9 * 6, record=True, steerable=True)
        assert start["type"] == "video.start", start
        steer = await Leg.open(
            url + "/steer?steer_token=" + urllib.parse.quote(start["steer_token"]) + "&token=" + TOKEN
        )
        await steer.read()  # its video.start
        await owner.interact("a stormy sea", "owner-1", 1)
        await steer.interact("a quiet dawn", "guest-1", 1)
        await owner.until("session.done")
        await steer.until("session.done")
        return owner, steer

    owner, _steer = run(body())
    start = owner.messages[0]
    rid, key = start["recording_id"], start["recording_token"]
    assert len(rid) == 32 and int(rid, 16) >= 0
    manifest = finished(base, rid, TOKEN, recording_token=key)
    assert "recording_token_sha256" not in manifest  # the digest is never served
    assert manifest["status"] == "complete" and manifest["request_id"] == start["request_id"]
    assert manifest["config"]["seed"] == 5 and manifest["chunks"] == len(
        [m for m, _ in owner.pairs if m["kind"] == "media"]
    )
    assert manifest["frames"] == 9 * 6 and manifest["ended"]["stopped"] is False

    video_url = recording_url(base, rid, key, "video.mp4")
    status, video, headers = fetch(video_url, token=TOKEN)
    assert status == 200 and headers["Content-Type"] == "video/mp4"
    assert video == b"".join(data for _, data in owner.pairs)  # the stream exactly as sent
    status, part, headers = fetch(video_url, token=TOKEN, headers={"Range": "bytes=10-19"})
    assert status == 206 and part == video[10:20] and headers["Content-Range"] == f"bytes 10-19/{len(video)}"
    assert fetch(video_url, token=TOKEN, headers={"Range": "bytes=" + "9" * 5000 + "-"})[0] == 416

    status, log, _ = fetch(recording_url(base, rid, key, "events.jsonl"), token=TOKEN)
    lines = [json.loads(line) for line in log.decode().splitlines()]
    out = [e["message"] for e in lines if e["dir"] == "out" and "participant" not in e]
    assert [m["type"] for m in out] == [m["type"] for m in owner.messages]  # every message the owner got
    assert out[0]["recording_id"] == rid and "steer_token" not in out[0]  # a token is never recorded
    assert "steer_token" not in log.decode() and start["steer_token"] not in log.decode()
    assert key not in log.decode() and key not in (tmp_path / "rec" / rid / "manifest.json").read_text()
    inbound = [(e["participant"], e["message"]["type"]) for e in lines if e["dir"] == "in"]
    assert inbound[0] == ("owner", "session.start")
    assert ("owner", "session.interaction") in inbound and ("steerer-1", "session.interaction") in inbound
    told = [e["message"] for e in lines if e.get("participant") == "steerer-1" and e["dir"] == "out"]
    assert any(m["type"] == "session.interaction.queued" and m["event_id"] == "guest-1" for m in told)
    assert [e["t"] for e in lines] == sorted(e["t"] for e in lines)

    assert fetch(f"{base}/v1/recordings", token=TOKEN)[0] == 403  # the full listing is the operator's
    status, listed, _ = fetch(f"{base}/v1/recordings", token=ADMIN)
    assert status == 200 and rid in [m["recording_id"] for m in json.loads(listed)["data"]]
    assert "recording_token_sha256" not in listed.decode()
    # the client's token first, then the id, then the recording's token, then the store
    assert fetch(recording_url(base, rid, key))[0] == 401
    assert fetch(f"{base}/v1/recordings/..%2F..%2Fetc", token=TOKEN)[0] == 400
    assert fetch(f"{base}/v1/recordings/{rid.upper()}/video.mp4", token=TOKEN)[0] == 400
    assert fetch(f"{base}/v1/recordings/{rid}", token=TOKEN)[0] == 404  # without its token: as unknown
    assert fetch(recording_url(base, "0" * 32, key), token=TOKEN)[0] == 404
    assert fetch(recording_url(base, rid, key, "manifest.json"), token=TOKEN)[0] == 404  # not a download
    assert fetch(recording_url(base, rid, key), token=TOKEN, method="DELETE")[0] == 204
    assert fetch(recording_url(base, rid, key), token=TOKEN)[0] == 404  # deleted: its token opens nothing
    assert not (tmp_path / "rec" / rid).exists()


def test_record_without_recordings_is_invalid_start_and_without_asking_nothing_is_recorded(
    proxies, triton, tmp_path: Path
) -> None:
    wait_idle(triton)

    async def body() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        off = await Leg.open(proxies.url())
        refused = await off.start(PROMPT, record=True)
        bad = await (await Leg.open(proxies.url(recordings=str(tmp_path / "rec")))).start(PROMPT, record="yes")
        plain = await Leg.open(proxies.url(recordings=str(tmp_path / "rec")))
        started = await plain.start(PROMPT, num_frames=9)
        await plain.until("session.done")
        return refused, bad, started

    refused, bad, started = run(body())
    assert refused["code"] == "invalid_start" and "recordings are off" in refused["message"]
    assert bad["code"] == "invalid_start" and "record" in bad["message"]
    assert "recording_id" not in started and "recording_token" not in started
    assert fetch(http_base(proxies.url()) + "/v1/recordings/" + "0" * 32)[0] == 404  # off: said so


def test_a_start_refused_before_video_start_records_nothing(proxies, triton, tmp_path: Path) -> None:
    """The model refuses the start (an image it cannot decode): no folder, no manifest, nothing
    listed; the next start that is answered with video.start is recorded as ever."""
    wait_idle(triton)
    store = tmp_path / "rec"
    url = proxies.url(recordings=str(store), admin_token=ADMIN)

    async def body() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        refused = await Leg.open(url)
        answer = await refused.start(PROMPT, record=True, image_reference="data:image/png;base64,AAAA")
        rest = [answer]
        while rest[-1]["type"] != "session.done":
            rest.append(await refused.read())
        recorded = await Leg.open(url)
        started = await recorded.start(PROMPT, record=True, num_frames=9)
        await recorded.until("session.done")
        return rest, started

    refused, started = run(body())
    assert refused[0]["type"] == "error" and refused[0]["code"] == "invalid_start", refused
    assert not any(m["type"] == "video.start" for m in refused)
    manifest = finished(http_base(url), started["recording_id"], recording_token=started["recording_token"])
    assert manifest["status"] == "complete"
    assert [p.name for p in store.iterdir()] == [started["recording_id"]]  # the refused start left nothing
    status, listed, _ = fetch(f"{http_base(url)}/v1/recordings", token=ADMIN)
    assert status == 200 and [m["recording_id"] for m in json.loads(listed)["data"]] == [started["recording_id"]]


def test_a_full_store_truncates_the_recording_never_the_session(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    # each payload is about 12 kB: a cap of 30 kB holds two chunks of the four
    url = proxies.url(
        recordings=str(tmp_path / "small"), recordings_max_bytes=120_000, recording_max_bytes=30_000, record_all=True
    )

    async def body() -> Leg:
        owner = await Leg.open(url)
        await owner.start(PROMPT, num_frames=9 * 4)
        await owner.until("session.done")
        return owner

    owner = run(body())
    assert owner.messages[-1]["type"] == "session.done" and not any(m["type"] == "error" for m in owner.messages)
    rid, key = owner.messages[0]["recording_id"], owner.messages[0]["recording_token"]  # --record-all: every session
    manifest = finished(http_base(url), rid, key)
    assert manifest["status"] == "truncated" and "its cap" in manifest["reason"], manifest
    status, video, _ = fetch(recording_url(http_base(url), rid, key, "video.mp4"))
    sent = b"".join(d for _, d in owner.pairs)
    assert status == 200 and manifest["bytes"] <= 30_000 and len(sent) > len(video) > 0
    assert video == sent[: len(video)]  # what it holds is the stream as sent, up to a whole chunk


# --- branching (docs/recordings.md "Branching") ------------------------------------------------
CAMERA = {"multi_modal_data": {"camera": {"mode": "target", "data": {"translation": [0.5, 0.1, 0.3]}}}}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def media(leg: Leg) -> list[tuple[dict[str, Any], bytes]]:
    return [(m, d) for m, d in leg.pairs if m["kind"] == "media"]


def test_a_branch_at_chunk_n_is_the_recording_from_n_on(proxies, triton, tmp_path: Path) -> None:
    """Branches before, during and after a transition (and a camera move in progress) give the
    recorded frames from chunk N on (each chunk re-encoded by a fresh encoder: within its noise);
    a new interaction steers the branch elsewhere; bad branches are invalid_start."""
    wait_idle(triton)
    url = proxies.url(recordings=str(tmp_path / "rec"), max_sessions_per_client=16)  # legs left unclosed
    base = http_base(url)

    async def record() -> Leg:
        owner = await Leg.open(url)
        await owner.start(PROMPT, num_frames=9 * 16, record=True)
        while not media(owner):
            await owner.read()
        await owner.interact("a stormy sea at night", "storm", 3)
        await owner.send({"type": "session.interaction", "interaction": {"event_id": "cam", "event": CAMERA}})
        await owner.until("session.done")
        return owner

    recorded = run(record())
    rid, key = recorded.messages[0]["recording_id"], recorded.messages[0]["recording_token"]
    assert finished(base, rid, key)["status"] == "complete"
    started = {e: m["generation_chunk_index"] for m, _ in media(recorded) for e in m["started_event_ids"]}
    storm = started["storm"]  # a 3-chunk transition: storm..storm+2, the camera move beside it
    assert 1 <= storm <= 11, started  # an unpaced model runs ahead of the client: room for a late one
    frames = decode(b"".join(d for _, d in recorded.pairs))
    counts = [m["num_frames"] for m, _ in media(recorded)]

    async def branch(n: int, update: bool = False, token: str = key, **fields: Any) -> Leg:
        leg = await Leg.open(url)
        spec = {"recording_id": rid, "generation_chunk_index": n, "recording_token": token}
        await leg.send({"type": "session.start", "from_recording": spec, **fields})
        first = await leg.read()
        if first["type"] != "video.start":
            return leg
        if update:
            await leg.interact("a desert at noon", "desert", 1)
        await leg.until("session.done")
        return leg

    for n in (storm - 1, storm + 1, storm + 4):  # before, during and after the transition
        leg = run(branch(n) if n != storm + 1 else branch(float(n)))  # type: ignore[arg-type]  # 3.0 is 3
        start = leg.messages[0]
        assert start["branched_from"] == {"recording_id": rid, "generation_chunk_index": n}, start
        assert start["branch_exact"] is True and start["config"]["seed"] == recorded.messages[0]["config"]["seed"]
        chunks = media(leg)
        assert [m["generation_chunk_index"] for m, _ in chunks] == list(range(n, len(counts)))
        assert [m["transport_chunk_index"] for m, _ in chunks] == list(range(len(counts) - n))
        assert all(m["started_event_ids"] == [] for m, _ in chunks)  # the recorded events are history
        got = decode(b"".join(d for _, d in leg.pairs))
        assert got.shape == frames[sum(counts[:n]) :].shape
        # the recording's frames until its next interaction took effect (a later one is not replayed:
        # the branch is its own participants' to steer); only the encoder's first-chunk state differs
        upto = min([c for c in started.values() if c > n], default=len(counts))
        want = frames[sum(counts[:n]) : sum(counts[:upto])]
        worst = min(psnr(g, w) for g, w in zip(got[: len(want)], want, strict=True))
        assert worst >= 35.0, (n, upto, worst)
    steered = run(branch(2, update=True))
    got = decode(b"".join(d for _, d in steered.pairs))
    assert psnr(got[-1], frames[-1]) < 30.0  # a new interaction takes the branch elsewhere

    refusals = {
        "past the end": run(branch(len(counts))),
        "another prompt": run(branch(2, prompt="a different prompt")),
        "malformed id": run(branch(2, **{"from_recording": {"recording_id": "../x", "generation_chunk_index": 1}})),
        "without its token": run(branch(2, token="rk1.not-the-recordings-token")),
    }
    for why, leg in refusals.items():
        assert leg.messages[0]["code"] == "invalid_start", (why, leg.messages[0])
    said = refusals["another prompt"].messages[0]["message"]
    assert "prompt" in said and PROMPT not in said  # named, never quoted
    assert refusals["without its token"].messages[0]["message"] == f"from_recording: no recording {rid}"

    async def rebuild_from_client() -> dict[str, Any]:
        leg = await Leg.open(url)
        return await leg.start(PROMPT, rebuild={"generation_chunk_index": 0, "events": []})

    assert run(rebuild_from_client())["code"] == "invalid_start"
    assert fetch(f"{base}/v1/recordings/{rid}", method="DELETE")[0] == 404  # a stranger deletes nothing
    assert fetch(recording_url(base, rid, key), method="DELETE", headers={"Origin": "https://evil.example"})[0] == 403
    assert fetch(recording_url(base, rid, key), method="DELETE")[0] == 204
    gone = run(branch(1)).messages[0]
    assert gone["code"] == "invalid_start" and "no recording" in gone["message"], gone
