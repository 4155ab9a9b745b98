"""A proxy tier restarted under live sessions loses none (docs/operations.md "Rolling updates",
"When a proxy dies"): the issue's acceptance test, every part real. Two proxy processes in front
of two tritonservers (the built-in generator) and two in front of the vLLM-Omni stand-in's own
Triton, all four sharing one Redis, each pair behind a TCP load balancer
(tests/support/replicas.py). Eight sessions of the real Python client through the balancers:
two watched, two steered by guests, two recorded, one plain, one on vLLM-Omni. Then kill -9 of
one proxy of each pair; once it is back, SIGTERM of the other. No client sees an error; each
stream goes on under its request id, its indices once each, and decodes as one; the built-in
sessions' frames are those of the same sessions re-generated undisturbed (within the encoder's
noise after a move, as tests/e2e/test_moves.py holds them), the vLLM-Omni one continues; the
watchers and steerers are attached again by themselves and the steerers steer; the recordings
go on under their ids."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rtvideo.backend.builtin.generator import BuiltinGenerator
from rtvideo.client.session import Chunk, RealtimeVideoClient
from rtvideo.client.steer import SteerClient
from rtvideo.client.watch import GuestLink
from tests.support.omni_triton import FPC
from tests.support.omni_triton import MODEL as OMNI_MODEL
from tests.support.proxy_host import run
from tests.support.replicas import Replicas
from tests.support.streams import decode
from tests.support.triton_pair import ROOMY_MODEL, Pair
from tests.support.undisturbed import regenerate, worst_psnr

SIZE = {"width": 128, "height": 96}
FRAMES = 4000  # more than the test lasts: it stops every session
WATCHED, STEERED, RECORDED, PLAIN = (0, 1), (2, 3), (4, 5), (6,)
BUILTIN = 7
FLAGS = ("--max-sessions-per-client", "16")  # every client is 127.0.0.1 behind the balancer


@pytest.fixture
def tier(pair: Pair, omni: Any, redis_url: str, tmp_path: Path) -> Iterator[tuple[Replicas, Replicas, Path]]:
    """The built-in pair and the vLLM-Omni pair of proxies, one store, one recordings folder."""
    proxies, _ = omni
    recordings = tmp_path / "recordings"
    builtin = Replicas(
        tmp_path / "builtin",
        f"{pair.a},{pair.b}",
        redis_url,
        model=ROOMY_MODEL,
        flags=(*FLAGS, "--recordings", str(recordings)),
        keyed=False,
    )
    engine = Replicas(tmp_path / "omni", proxies.triton_url, redis_url, model=OMNI_MODEL, flags=FLAGS, keyed=False)
    with builtin, engine:
        yield builtin, engine, recordings


class Owner:
    """One session's owner: the real client through a balancer, what it sent and what it got."""

    def __init__(self, client: RealtimeVideoClient, start: dict[str, Any]) -> None:
        self.client = client
        self.sent: list[dict[str, Any]] = [{"type": "session.start", **start}]
        self.got: list[Chunk] = []
        self.video_start: dict[str, Any] = {}
        self.acks: list[dict[str, Any]] = []  # the acks of its own interactions
        self._reader: asyncio.Task[None] | None = None

    async def begin(self) -> None:
        start = {k: v for k, v in self.sent[0].items() if k != "type"}
        prompt = start.pop("prompt")
        self.video_start = await self.client.start(prompt, **start)
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for chunk in self.client.chunks():
            self.got.append(chunk)

    @property
    def media(self) -> int:
        return sum(c.metadata["kind"] == "media" for c in self.got)

    async def interact(self, prompt: str, event_id: str) -> dict[str, Any]:
        self.sent.append(
            {"type": "session.interaction", "interaction": {"event_id": event_id, "event": {"prompt": prompt}}}
        )
        ack = await self.client.interact(prompt, event_id=event_id, timeout=10)
        self.acks.append(ack)
        return ack

    async def finish(self) -> None:
        await self.client.stop()
        assert self._reader is not None
        await asyncio.wait_for(self._reader, 60)


class Guest:
    """A watcher or a steerer through a balancer, reading in the background."""

    def __init__(self, link: GuestLink) -> None:
        self.link = link
        self.messages: list[dict[str, Any]] = []
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message, _ in self.link.messages():
            self.messages.append(message)

    @property
    def media(self) -> int:
        return sum(m.get("type") == "video.chunk_metadata" and m.get("kind") == "media" for m in self.messages)

    def acked(self, event_id: str) -> bool:
        return any(
            m.get("type") == "session.interaction.queued" and m.get("event_id") == event_id for m in self.messages
        )


async def until(what: Callable[[], bool], why: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {why}"
        await asyncio.sleep(0.05)


def undisturbed(
    owner: Owner, guest: Guest | None, guest_sent: list[dict[str, Any]], generator: BuiltinGenerator
) -> np.ndarray:
    """The session re-generated in this process from what was sent (by its owner and its steerer)
    and what the owner got (and the acks its steerer got)."""
    lines = [{"dir": "in", "message": m} for m in [*owner.sent, *guest_sent]]
    lines += [{"dir": "out", "message": owner.video_start}]
    acks = [m for m in (guest.messages if guest is not None else []) if m.get("type") == "session.interaction.queued"]
    lines += [{"dir": "out", "message": m} for m in [*owner.acks, *acks]]
    lines += [{"dir": "out", "message": c.metadata} for c in owner.got]
    return regenerate(lines, generator, SIZE["width"], SIZE["height"])


def recording(base: str, rid: str, key: str, file: str) -> bytes:
    url = f"{base}/v1/recordings/{rid}/{file}?recording_token={key}"
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def test_a_kill_9_and_a_rolling_restart_of_the_proxies_lose_no_session(
    tier: tuple[Replicas, Replicas, Path], generator: BuiltinGenerator
) -> None:
    builtin, engine, _ = tier
    deployments = (builtin, engine)
    exits: list[Any] = []

    async def body() -> tuple[list[Owner], list[Guest], list[Guest], dict[int, list[dict[str, Any]]]]:
        async with AsyncExitStack() as stack:
            owners: list[Owner] = []
            for i in range(BUILTIN + 1):
                url = builtin.url if i < BUILTIN else engine.url
                client = await stack.enter_async_context(RealtimeVideoClient(url, resume_attempts=6))
                start: dict[str, Any] = {"prompt": f"a harbour at dawn, view {i}", "seed": 300 + i}
                if i < BUILTIN:
                    start |= {"num_frames": FRAMES, **SIZE}
                    start |= {"watchable": True} if i in WATCHED else {}
                    start |= {"steerable": True} if i in STEERED else {}
                    start |= {"record": True} if i in RECORDED else {}
                else:
                    start |= {"num_frames": 400 * FPC}
                owner = Owner(client, start)
                await owner.begin()
                owners.append(owner)
            await until(lambda: all(o.media >= 2 for o in owners), "every session's first chunks")
            watchers = [
                Guest(await stack.enter_async_context(GuestLink(builtin.url, owners[i].video_start["watch_token"])))
                for i in WATCHED
            ]
            steer_links = [
                await stack.enter_async_context(SteerClient(builtin.url, owners[i].video_start["steer_token"]))
                for i in STEERED
            ]
            steerers = [Guest(link) for link in steer_links]
            guest_sent: dict[int, list[dict[str, Any]]] = {i: [] for i in STEERED}

            async def steer(round_: str) -> None:
                for i, link, guest in zip(STEERED, steer_links, steerers, strict=True):
                    interaction = {"event_id": f"steer-{i}-{round_}", "event": {"prompt": f"a storm, {round_}"}}
                    guest_sent[i].append({"type": "session.interaction", "interaction": interaction})
                    await link.interaction(interaction)
                    await until(lambda g=guest, e=interaction["event_id"]: g.acked(e), f"ack of {interaction}")

            await steer("before")
            await owners[PLAIN[0]].interact("a calm sea", "owner-before")
            await until(lambda: all(g.media >= 1 for g in watchers + steerers), "the guests' first chunks")

            async def went_on(what: str) -> None:
                marks = [o.media for o in owners], [g.media for g in watchers + steerers]
                await until(
                    lambda: all(o.media >= m + 2 for o, m in zip(owners, marks[0], strict=True)),
                    f"every session after the {what}",
                )
                await until(
                    lambda: all(g.media >= m + 1 for g, m in zip(watchers + steerers, marks[1], strict=True)),
                    f"every watcher and steerer after the {what}",
                )

            for d in deployments:
                await asyncio.to_thread(d.kill9, 0)
            await went_on("kill -9")
            await steer("after-kill")
            for d in deployments:
                await asyncio.to_thread(d.restart, 0)
            exits.extend(await asyncio.gather(*(asyncio.to_thread(d.sigterm, 1) for d in deployments)))
            await went_on("SIGTERM")
            await steer("after-sigterm")
            await owners[PLAIN[0]].interact("a calm night", "owner-after")
            await asyncio.gather(*(o.finish() for o in owners))
            return owners, watchers, steerers, guest_sent

    owners, watchers, steerers, guest_sent = run(body(), timeout=420)
    assert [e.code for e in exits] == [0, 0], [d[1].tail() for d in deployments]
    for d in deployments:
        assert d[0].metric("rtvideo_proxy_sessions_taken_over_total") >= 1  # it took sessions over
    worst = float("inf")
    for i, owner in enumerate(owners):
        client = owner.client
        assert client.failure is None and client.errors.empty(), (i, client.failure)
        assert client.done is not None and client.done["request_id"] == owner.video_start["request_id"]
        assert {c.metadata["request_id"] for c in owner.got} == {owner.video_start["request_id"]}
        indices = [c.metadata["transport_chunk_index"] for c in owner.got]
        assert indices == list(range(len(indices))), (i, indices)  # every chunk once, in order
        frames = decode(b"".join(c.data for c in owner.got))
        media = [c for c in owner.got if c.metadata["kind"] == "media"]
        assert len(frames) == sum(c.metadata["num_frames"] for c in media)
        assert client.resumes >= 1, (i, client.resumes)  # once or twice: where it was at each stop
        if i < BUILTIN:
            steerer = steerers[STEERED.index(i)] if i in STEERED else None
            want = undisturbed(owner, steerer, guest_sent.get(i, []), generator)
            assert frames.shape == want.shape, (i, frames.shape, want.shape)
            worst = min(worst, worst_psnr(frames, want))
    assert worst >= 33.0, worst
    for guest in watchers + steerers:
        assert guest.link.rejoins >= 1 and guest.media >= 3
    for i, guest in zip(STEERED, steerers, strict=True):
        started = {e for c in owners[i].got for e in c.metadata.get("started_event_ids", ())}
        assert {f"steer-{i}-before", f"steer-{i}-after-kill"} <= started, started
        assert guest.acked(f"steer-{i}-after-sigterm")
    base = builtin[0].url.replace("ws://", "http://").rsplit("/v1/", 1)[0]
    for i in RECORDED:
        start = owners[i].video_start
        video = decode(recording(base, start["recording_id"], start["recording_token"], "video.mp4"))
        got = decode(b"".join(c.data for c in owners[i].got))
        assert video.shape == got.shape, (i, video.shape, got.shape)  # it went on under its id
        events = [
            json.loads(line)
            for line in recording(base, start["recording_id"], start["recording_token"], "events.jsonl").splitlines()
        ]
        assert events and events[0]["message"]["type"] == "session.start"
    print(f"rolling restart: worst frame PSNR {worst:.1f} dB; resumes {[o.client.resumes for o in owners]}")
