"""`OutboundOrder` alone: what a proxy session may write when (docs/protocol.md §7). Pure, no I/O."""

from __future__ import annotations

from typing import Any

from rtvideo.proxy.session.ordering import OutboundOrder, Send

VIDEO_START = {"type": "video.start", "request_id": "r"}


def chunk(*started: str) -> dict[str, Any]:
    return {"type": "video.chunk_metadata", "started_event_ids": list(started)}


def items(sends: list[Send[str]]) -> list[str]:
    return [s.item for s in sends]


def started(wait: float = 1.0) -> OutboundOrder[str]:
    order: OutboundOrder[str] = OutboundOrder(ack_wait=wait)
    assert items(order.stream("video.start", VIDEO_START, 0.0)) == ["video.start"]
    return order


def test_mentions_wait_for_their_ack() -> None:
    order = started()
    assert order.stream("chunk names e1", chunk("e1"), 0.0) == []
    assert order.stream("next chunk", chunk(), 0.0) == []  # order is kept behind the held one
    assert order.answer("ack e0", 10, ack="e0") == [Send("ack e0")] and order.deadline is not None
    assert items(order.answer("ack e1", 10, ack="e1")) == ["ack e1", "chunk names e1", "next chunk"]
    assert order.deadline is None
    assert items(order.stream("chunk names e1 again", chunk("e1"), 0.5)) == ["chunk names e1 again"]
    assert order.stream("names e2", chunk("e2"), 0.5) == [] and order.deadline == 1.5
    assert items(order.expire(1.5)) == ["names e2"] and order.deadline is None


def test_the_ack_wait_counts_from_each_messages_own_arrival() -> None:
    """A message held later waits its full time, even after an ack released the ones before it."""
    order = started(wait=1.0)
    assert order.stream("names e1", chunk("e1"), 0.0) == []
    assert order.stream("names e2", chunk("e2"), 0.6) == []
    assert order.deadline == 1.0
    assert items(order.expire(1.0)) == ["names e1"]  # only what is due: "names e2" waited 0.4 s
    assert order.deadline == 1.6
    assert order.stream("names e3", chunk("e3"), 0.9) == []
    assert items(order.answer("ack e2", 10, ack="e2")) == ["ack e2", "names e2"]  # "names e3" still waits
    assert order.deadline == 1.9  # from its own arrival, not from the ack
    assert order.expire(1.8) == []
    assert items(order.expire(1.9)) == ["names e3"]


def test_expiry_releases_what_is_ahead_and_what_was_only_behind() -> None:
    order = started(wait=1.0)
    order.stream("names e1", chunk("e1"), 0.0)
    order.stream("free", chunk(), 0.2)  # held only to keep the order
    order.stream("names e2", chunk("e2"), 0.3)
    assert items(order.expire(1.0)) == ["names e1", "free"]
    assert order.deadline == 1.3


def test_answers_wait_for_video_start_and_overtake_video_only_after_it_is_written() -> None:
    order: OutboundOrder[str] = OutboundOrder(ack_wait=1.0)
    assert order.answer("ack e1", 30, ack="e1") == []
    assert order.answer("pong", 20) == []
    assert order.early_bytes == 50  # bounded by the session like its outbound buffer
    sends = order.stream("video.start", VIDEO_START, 0.0)
    assert sends == [Send("video.start"), Send("ack e1"), Send("pong")]  # behind it, not urgent
    assert order.early_bytes == 0
    assert order.stream("chunk names e1", chunk("e1"), 0.0) == [Send("chunk names e1")]  # acked while held
    assert order.answer("pong", 20) == [Send("pong")]  # video.start is not written yet: not urgent
    order.handed_out(VIDEO_START)
    assert order.stream("names e2", chunk("e2"), 0.1) == []
    assert order.answer("ack e2", 10, ack="e2") == [Send("ack e2", urgent=True), Send("names e2")]


def test_answers_stay_behind_a_start_stream_that_has_no_video_start() -> None:
    """A refused session.start: the model's error and done go out; answers never precede video.start."""
    order: OutboundOrder[str] = OutboundOrder(ack_wait=1.0)
    assert order.answer("pong", 20) == []
    assert items(order.stream("error", {"type": "error", "code": "invalid_start"}, 0.0)) == ["error"]
    assert order.answer("pong", 20) == [] and order.early_bytes == 40
