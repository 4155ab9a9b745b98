"""Who may see and do what (docs/security.md "Credentials"), tried as a hostile user would,
through real Triton and the real proxy: another client's recording, the operator's levers,
the store's bound under padded messages, a start that would cost everyone, and one address
holding every slot."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rtvideo.backend.replay.regenerate import ReplayError, load_recording
from tests.support.http_calls import fetch, finished, http_base, recording_url
from tests.support.proxy_client import ws
from tests.support.proxy_host import run, wait_idle
from tests.support.resume_client import Leg
from tests.support.streams import PACED_MODEL

pytestmark = pytest.mark.triton

ADMIN = "tenancy-operator-credential"
PROMPT = "lanterns over a canal"


async def recorded(url: str, prompt: str) -> Leg:
    leg = await Leg.open(url)
    start = await leg.start(prompt, num_frames=9 * 3, record=True)
    assert start["type"] == "video.start", start
    await leg.until("session.done")
    return leg


async def branch(url: str, rid: str, token: str) -> dict[str, Any]:
    leg = await Leg.open(url)
    spec = {"recording_id": rid, "generation_chunk_index": 1, "recording_token": token}
    await leg.send({"type": "session.start", "from_recording": spec})
    first = await leg.read()
    await leg.conn.close()
    return first


def test_a_recording_opens_with_its_own_token_or_the_operators_and_no_other(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton)
    url = proxies.url(recordings=str(tmp_path / "rec"), admin_token=ADMIN)
    base = http_base(url)

    async def two() -> tuple[Leg, Leg]:
        return await recorded(url, PROMPT), await recorded(url, "a private prompt of bob's")

    alice, bob = run(two())
    a_rid, a_key = alice.messages[0]["recording_id"], alice.messages[0]["recording_token"]
    b_rid, b_key = bob.messages[0]["recording_id"], bob.messages[0]["recording_token"]
    assert a_key != b_key and finished(base, a_rid, a_key)["status"] == "complete"
    assert finished(base, b_rid, b_key)["status"] == "complete"

    # Bob, holding a token of his own, learns nothing of Alice's recording
    assert fetch(f"{base}/v1/recordings", token=b_key)[0] == 403
    assert fetch(f"{base}/v1/recordings")[0] == 403
    for file in ("", "video.mp4", "events.jsonl"):
        assert fetch(recording_url(base, a_rid, b_key, file))[0] == 404
        assert fetch(recording_url(base, a_rid, None, file), token=b_key)[0] == 404
        assert fetch(recording_url(base, a_rid, None, file))[0] == 404
    assert fetch(recording_url(base, a_rid, b_key), method="DELETE")[0] == 404
    refused = run(branch(url, a_rid, b_key))
    assert refused["code"] == "invalid_start" and refused["message"] == f"from_recording: no recording {a_rid}"
    assert PROMPT not in json.dumps(refused)

    # Alice reads and branches hers; the operator lists and reads both, and deletes hers
    assert json.loads(fetch(recording_url(base, a_rid, a_key))[1])["recording_id"] == a_rid
    started = run(branch(url, a_rid, a_key))
    assert started["type"] == "video.start" and started["branched_from"]["recording_id"] == a_rid
    status, listed, _ = fetch(f"{base}/v1/recordings", token=ADMIN)
    assert status == 200 and {a_rid, b_rid} <= {m["recording_id"] for m in json.loads(listed)["data"]}
    assert fetch(recording_url(base, b_rid, None, "events.jsonl"), token=ADMIN)[0] == 200
    assert fetch(recording_url(base, a_rid, None), token=ADMIN, method="DELETE")[0] == 204
    assert fetch(recording_url(base, a_rid, a_key))[0] == 404  # its token died with it
    assert run(branch(url, a_rid, a_key))["code"] == "invalid_start"

    # `rtvideo replay` of a recording URL reads it with the recording's token, and only so
    manifest, log = load_recording(f"{base}/v1/recordings/{b_rid}", recording_token=b_key)
    assert manifest is not None and manifest["recording_id"] == b_rid and log.chunks == 3
    with pytest.raises(ReplayError, match="404") as refused:
        load_recording(f"{base}/v1/recordings/{b_rid}", recording_token="rk1.not-bobs")
    assert "rk1" not in str(refused.value)


def test_draining_is_the_operators_lever_alone(proxies, triton) -> None:
    endpoint = triton.grpc_url
    guarded = proxies.server(token="tenancy-client", admin_token=ADMIN)
    drain = f"http://127.0.0.1:{guarded.port}/v1/endpoints/{endpoint}/drain"
    assert fetch(drain, method="POST")[0] == 401  # a caller on this machine, without a credential
    assert fetch(drain, method="POST", token="tenancy-client")[0] == 401  # every client has that one
    assert fetch(f"{drain}?token={ADMIN}", method="POST")[0] == 401  # never from a link
    page = {"Origin": "https://elsewhere.example"}
    assert fetch(drain, method="POST", token=ADMIN, headers=page)[0] == 403  # a foreign page
    simple = {"Content-Type": "text/plain"}
    assert fetch(drain, method="POST", token=ADMIN, headers=simple, data=b"x")[0] == 415  # no preflight body
    assert not guarded.pool.endpoints[endpoint].draining
    unguarded = proxies.server()
    status, body, _ = fetch(f"http://127.0.0.1:{unguarded.port}/v1/endpoints/{endpoint}/drain", method="POST")
    assert status == 403 and "--admin-token" in json.loads(body)["error"]
    assert not unguarded.pool.endpoints[endpoint].draining


def folder_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_the_store_stays_within_its_bound_under_padded_pings(proxies, triton, tmp_path: Path) -> None:
    """Four recorded sessions whose owners pad pings to the message limit: nothing of the padding
    is written, each recording stops at its cap, the folder never passes the bound (sampled
    while they run) by more than one chunk, and what is written is the proxy user's alone."""
    wait_idle(triton)
    root = tmp_path / "rec"
    limit, cap, chunk = 240_000, 50_000, 20_000  # a chunk of the fast model is about 12 kB
    url = proxies.url(
        recordings=str(root), recordings_max_bytes=limit, recording_max_bytes=cap, max_sessions_per_client=8
    )
    padding = "p" * 120_000
    biggest = [0]
    running = threading.Event()
    running.set()

    def watch() -> None:
        while running.is_set():
            if root.exists():
                biggest[0] = max(biggest[0], folder_bytes(root))
            time.sleep(0.02)

    async def one(i: int) -> Leg:
        leg = await Leg.open(url)
        start = await leg.start(f"{PROMPT} {i}", num_frames=9 * 12, record=True)
        assert start["type"] == "video.start", start
        for _ in range(8):
            await leg.send({"type": "session.ping", "padding": padding})
            await asyncio.sleep(0.05)
        await leg.until("session.done")
        return leg

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:

        async def four() -> list[Leg]:
            return list(await asyncio.gather(*(one(i) for i in range(4))))

        legs = run(four())
    finally:
        running.clear()
        watcher.join(5)
    manifests = [
        finished(http_base(url), leg.messages[0]["recording_id"], leg.messages[0]["recording_token"]) for leg in legs
    ]
    assert all(not any(m["type"] == "error" for m in leg.messages) for leg in legs)  # the sessions went on
    assert {m["status"] for m in manifests} <= {"complete", "truncated"} and all(m["bytes"] <= cap for m in manifests)
    assert biggest[0] <= limit + chunk and folder_bytes(root) <= limit, (biggest[0], folder_bytes(root))
    for folder in root.iterdir():
        assert folder.stat().st_mode & 0o777 == 0o700
        assert "padding" not in (folder / "events.jsonl").read_text()
        assert {f.stat().st_mode & 0o777 for f in folder.iterdir()} == {0o600}
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_start_with_260000_extra_params_keys_is_refused_and_the_service_goes_on(
    proxies, triton, tmp_path: Path
) -> None:
    wait_idle(triton)
    root = tmp_path / "rec"
    url = proxies.url(recordings=str(root))
    huge = {
        "type": "session.start",
        "prompt": PROMPT,
        "record": True,
        "extra_params": {f"k{i}": 0 for i in range(260_000)},
    }
    text = json.dumps(huge)
    assert 3_000_000 < len(text) < 4 * 1024 * 1024  # within the start's own limit: the key bound refuses it

    async def body() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with ws(url) as conn:
            await conn.send(text)
            answers = [json.loads(await asyncio.wait_for(conn.recv(), 30)) for _ in range(2)]
        after = await Leg.open(url)
        start = await after.start(PROMPT, num_frames=9)
        await after.until("session.done")
        return answers, start

    (error, done), start = run(body())
    assert error["code"] == "invalid_start" and "extra_params has more than 256 keys" in error["message"]
    assert done["type"] == "session.done" and len(json.dumps(error)) < 1000
    assert start["type"] == "video.start"
    assert not root.exists() or not any(root.iterdir())  # refused before anything was recorded


async def opened(url: str, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """A session started on `url` and kept open (its first answer). A model slot an earlier
    session left is freed a moment after its end is counted: the model's server_busy is tried
    again; the proxy's (an address over its share) is the answer."""
    for _ in range(100):
        conn = await ws(url, **kwargs)
        await conn.send(json.dumps({"type": "session.start", "prompt": PROMPT, "num_frames": 9 * 100}))
        first = json.loads(await asyncio.wait_for(conn.recv(), 30))
        if first.get("code") != "server_busy" or "its share" in first.get("message", ""):
            return conn, first
        await conn.close()
        await asyncio.sleep(0.2)
    return conn, first


async def refused(url: str, **kwargs: Any) -> str:
    """The proxy's answer to one more start from this address: its error's code."""
    conn, first = await opened(url, **kwargs)
    await conn.close()
    return str(first.get("code") or first["type"])


def test_one_address_holds_only_its_share_of_the_slots(proxies, triton) -> None:
    """The paced model has two slots: one address holds one (half, by default), a second address
    gets the other: by its socket (127.0.0.2) and, behind a trusted proxy, by X-Forwarded-For,
    which is believed only from a trusted proxy."""
    wait_idle(triton, PACED_MODEL)
    direct = proxies.server(model=PACED_MODEL)
    behind = proxies.server(model=PACED_MODEL, trusted_proxies=("127.0.0.1",))
    for server in (direct, behind):
        deadline = time.monotonic() + 30
        while server.pool.known_slots is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.pool.known_slots == 2

    def forwarded(address: str) -> dict[str, Any]:
        return {"additional_headers": {"X-Forwarded-For": f"198.51.100.7, {address}"}}

    async def body() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        first, seen["first"] = await opened(direct.url)
        seen["again"] = await refused(direct.url)
        seen["spoofed"] = await refused(direct.url, **forwarded("203.0.113.9"))  # not believed
        second, seen["second address"] = await opened(direct.url, local_addr=("127.0.0.2", 0))
        await first.close()
        await second.close()
        a, seen["behind: first"] = await opened(behind.url, **forwarded("203.0.113.1"))
        seen["behind: again"] = await refused(behind.url, **forwarded("203.0.113.1"))
        b, seen["behind: second"] = await opened(behind.url, **forwarded("203.0.113.2"))
        await a.close()
        await b.close()
        return seen

    seen = run(body())
    assert seen["first"]["type"] == "video.start" and seen["second address"]["type"] == "video.start", seen
    assert seen["again"] == "server_busy" and seen["spoofed"] == "server_busy", seen
    assert seen["behind: first"]["type"] == "video.start", seen["behind: first"]
    assert seen["behind: second"]["type"] == "video.start", seen["behind: second"]
    assert seen["behind: again"] == "server_busy", seen
    wait_idle(triton, PACED_MODEL)


def test_a_resumed_owner_is_given_its_recording_token_again_and_no_one_else_is(proxies, triton, tmp_path: Path) -> None:
    wait_idle(triton, PACED_MODEL)
    url = proxies.url(model=PACED_MODEL, recordings=str(tmp_path / "rec"))

    async def body() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        for _ in range(100):  # a slot the previous test's sessions held is freed a moment after their end
            first = await Leg.open(url)
            start = await first.start(PROMPT, num_frames=9 * 6, record=True, resumable=True, watchable=True)
            if start.get("code") != "server_busy":
                break
            await first.conn.close()
            await asyncio.sleep(0.2)
        watcher = await Leg.open(url + "/watch?watch_token=" + start["watch_token"])
        watched = await watcher.read()
        while len(first.pairs) < 1:
            await first.read()
        first.drop()
        second, resumed = await Leg.resumed(url, start["resume_token"], first.last_index)
        await second.until("session.done")
        await watcher.conn.close()
        return start, resumed, watched

    start, resumed, watched = run(body())
    assert resumed["resumed"] is True and resumed["recording_token"] == start["recording_token"]
    assert "recording_token" not in watched and "recording_id" not in watched  # the owner's alone
