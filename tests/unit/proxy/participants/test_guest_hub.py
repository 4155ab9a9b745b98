"""The guest hub (rtvideo.proxy.participants.guest_hub) through its two kinds, driven by hand (no
Triton, no sockets): the census bounds every hub of a kind together and counts each guest once,
a slow guest is dropped alone, session.done closes the hub, a share skips its sender."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.guest_hub import GuestCensus
from rtvideo.proxy.participants.steerers import SteerHub
from rtvideo.proxy.participants.watchers import WatchHub
from rtvideo.proxy.settings import ProxySettings
from tests.support.fake_bridge import FakeConnection, run, settle

START: dict[str, Any] = {"type": protocol.VIDEO_START, "request_id": "r", "watcher": True}


def _chunk(index: int, size: int) -> Frame:
    message = {"type": protocol.CHUNK_METADATA, "request_id": "r", "index": index, "bytes": size}
    return Frame(server_messages.encode(message), message, b"\x00" * size)


def _sample(metrics: ProxyMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_the_census_bounds_every_hub_of_a_kind_and_counts_each_guest_once() -> None:
    async def body() -> None:
        settings, metrics, census = ProxySettings(max_watchers=2), ProxyMetrics(), GuestCensus()
        a, b = WatchHub(settings, census, metrics), WatchHub(settings, census, metrics)
        first = a.join(FakeConnection(), START, None)
        b.join(FakeConnection(), START, None)
        assert a.room() == "this server has 2 watchers (--max-watchers)" == b.room()
        assert census.count == 2 and _sample(metrics, "rtvideo_proxy_watchers") == 2
        first.leave()
        first.leave()  # a second close of its link is not a second departure
        a.close()  # nor is the session's close of a hub it left
        assert census.count == 1 and _sample(metrics, "rtvideo_proxy_watchers") == 1
        assert b.room() is None and a.room() == "the session has ended"
        assert first.put(_chunk(0, 10)) is True  # over: taken and ignored

    run(body())


def test_the_per_session_bound_names_its_flag() -> None:
    settings, census = ProxySettings(max_steerers_per_session=1), GuestCensus()

    async def body() -> None:
        hub = SteerHub(settings, census, ProxyMetrics())
        hub.join(FakeConnection(), "guest", START, None)
        assert hub.room() == "the session has 1 steerers (--max-steerers-per-session)"

    run(body())


@pytest.mark.parametrize("kind", ["watcher", "steerer"])
def test_a_slow_guest_is_dropped_alone(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        settings, metrics = ProxySettings(watcher_buffer_bytes=1000), ProxyMetrics()
        slow, quick = FakeConnection(), FakeConnection()
        if kind == "watcher":
            hub: WatchHub | SteerHub = WatchHub(settings, GuestCensus(), metrics)
            hub.join(slow, START, None)
            hub.join(quick, START, None)
        else:
            hub = SteerHub(settings, GuestCensus(), metrics)
            hub.join(slow, "slow", START, None)
            hub.join(quick, "quick", START, None)
        await settle()
        slow.paused = True
        for index in range(5):
            hub.publish(_chunk(index, 400))
            await settle()
        assert len(hub) == 1
        errors = [m for m in slow.texts() if m["type"] == protocol.ERROR]
        assert [m["code"] for m in errors] == ["slow_consumer"]
        assert f"the {kind} reads too slowly: more than 1000 bytes are waiting" == errors[0]["message"]
        slow.resume()
        await settle()
        assert slow.closed == 1000 and quick.closed is None
        assert len([m for m in quick.texts() if m["type"] == protocol.CHUNK_METADATA]) == 5
        if kind == "watcher":
            assert _sample(metrics, "rtvideo_proxy_watchers_dropped_total") == 1
        else:
            dropped = {"reason": "slow_consumer"}
            assert _sample(metrics, "rtvideo_proxy_steerers_dropped_total", dropped) == 1
        assert f"a {kind} was dropped: slow consumer" in caplog.text

    caplog.set_level(logging.INFO, logger="rtvideo.proxy.participants")
    run(body())


def test_session_done_reaches_every_guest_and_closes_the_hub() -> None:
    async def body() -> None:
        hub = WatchHub(ProxySettings(), GuestCensus(), ProxyMetrics())
        links = [FakeConnection(), FakeConnection()]
        for link in links:
            hub.join(link, START, None)
        done = server_messages.done("r", chunks=0, stopped=False, unapplied_event_ids=[], unfinished_event_ids=[])
        hub.publish(Frame(server_messages.encode(done), done))
        await settle()
        for link in links:
            assert [m["type"] for m in link.texts()] == [protocol.VIDEO_START, protocol.DONE]
            assert link.closed == 1000
        assert len(hub) == 0 and hub.room() == "the session has ended"

    run(body())


def test_a_share_skips_its_sender_and_goes_ahead_of_queued_video() -> None:
    async def body() -> None:
        hub = SteerHub(ProxySettings(), GuestCensus(), ProxyMetrics())
        sender_link, other_link = FakeConnection(), FakeConnection()
        sender = hub.join(sender_link, "sender", START, None)
        hub.join(other_link, "other", START, None)
        await settle()
        hub.publish(_chunk(0, 10))
        hub.publish(_chunk(1, 10))
        notice = {"type": protocol.INTERACTION_SHARED, "interaction": {"event_id": "e1"}}
        hub.share(Frame(server_messages.encode(notice), notice), sender)
        await settle()
        assert protocol.INTERACTION_SHARED not in [m["type"] for m in sender_link.texts()]
        # both chunks were still queued when the share came (no turn of the loop between)
        shared, chunk = protocol.INTERACTION_SHARED, protocol.CHUNK_METADATA
        assert [m["type"] for m in other_link.texts()] == [protocol.VIDEO_START, shared, chunk, chunk]

    run(body())


@pytest.mark.parametrize("kind", ["watcher", "steerer"])
def test_a_share_right_after_a_join_never_precedes_the_guests_video_start(kind: str) -> None:
    """video.start is every client's first message: a share queued before the guest's first
    frames were written (no turn of the loop between) comes after them."""

    async def body() -> None:
        settings, metrics = ProxySettings(), ProxyMetrics()
        link = FakeConnection()
        if kind == "watcher":
            hub: WatchHub | SteerHub = WatchHub(settings, GuestCensus(), metrics)
            hub.join(link, START, None)
        else:
            hub = SteerHub(settings, GuestCensus(), metrics)
            hub.join(link, "guest", START, None)
        hub.publish(_chunk(0, 10))
        notice = {"type": protocol.INTERACTION_SHARED, "interaction": {"event_id": "e1"}}
        hub.share(Frame(server_messages.encode(notice), notice), None)
        await settle()
        shared, chunk = protocol.INTERACTION_SHARED, protocol.CHUNK_METADATA
        assert [m["type"] for m in link.texts()] == [protocol.VIDEO_START, shared, chunk]

    run(body())
