"""What a move's log keeps in the proxy's memory (rtvideo.proxy.placement.move_log, issue 46): only the
events the session's book admitted, as parsed (never a client's frame), none the model refused,
and no more than its bound, past which the session can no longer move but the proxy's memory
stays bounded."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.core.event_book import EventBook
from rtvideo.proxy.placement.move_log import MoveLog, Unmovable
from rtvideo.proxy.session.acks import ProxyAcks
from tests.support.probes import kept_bytes

START = {"type": "session.start", "prompt": "a harbour", "width": 64, "height": 48}
CONFIG = {"seed": 7, "fps": 16, "width": 64, "height": 48, "frames_per_chunk": 9}
PAD = "x" * 100_000


def message(event_id: str, prompt: str = "a lighthouse", **event: Any) -> dict[str, Any]:
    body = {"event_id": event_id, "event": {"prompt": prompt, **event}}
    return {"type": protocol.INTERACTION, "interaction": body, "pad": PAD}


def sent(acks: ProxyAcks, log: MoveLog, msg: dict[str, Any]) -> None:
    """As the session does it: the proxy decides, then what goes to the model is the log's."""
    raw = server_messages.encode(msg).encode()
    ack = acks.decide(msg, raw)
    log.forwarded(raw if ack is None else ack.raw)


def log_and_acks(max_bytes: int | None = None) -> tuple[MoveLog, ProxyAcks]:
    book = EventBook(max_events=3)
    log = MoveLog(START, book, max_bytes)
    log.arrived({"type": protocol.VIDEO_START, "config": CONFIG})
    return log, ProxyAcks(book)


def test_refused_events_are_not_kept_and_the_memory_stays_bounded_under_a_flood() -> None:
    log, acks = log_and_acks()
    for i in range(3):
        sent(acks, log, message(f"e{i}"))
    kept = kept_bytes(log)
    assert 0 < kept < 3 * 200  # as parsed: the 100 kB pad beside `interaction` is not kept
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(400):  # past the session's event bound: the model refuses each (40 MB sent)
            sent(acks, log, message(f"flood-{i}", negative_prompt="y" * 4000))
            sent(acks, log, message("e0", prompt="a conflict"))  # the same id, another payload
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert kept_bytes(log) == kept
    assert grown < 1_000_000  # not one refused event held (each is over 100 kB as sent)


def test_an_event_refused_after_its_ack_is_forgotten_unless_it_started() -> None:
    log, acks = log_and_acks()
    sent(acks, log, message("e0"))
    sent(acks, log, message("e1", negative_prompt="blurry"))  # acked; the model then refuses it
    sent(acks, log, message("e2"))
    failed = {"type": protocol.ERROR, "code": ErrorCode.INTERACTION_FAILED.value, "event_id": "e1"}
    before = kept_bytes(log)
    log.arrived(failed)
    assert kept_bytes(log) < before
    assert log.resend(["e0", "e1", "e2"]) == [log.resend(["e0"])[0], log.resend(["e2"])[0]]
    chunk = {"type": protocol.CHUNK_METADATA, "kind": "media", "generation_chunk_index": 0, "started_event_ids": ["e2"]}
    log.arrived(chunk)
    log.arrived({**failed, "event_id": "e2"})  # it started: a rebuild needs it still
    start = log.start_at(1)
    assert [e["interaction"]["event_id"] for e in start["rebuild"]["events"]] == ["e2"]


def test_past_its_bound_the_log_keeps_nothing_and_says_why_it_cannot_move() -> None:
    log, acks = log_and_acks(max_bytes=250)
    sent(acks, log, message("e0"))
    assert log.movable() is None and kept_bytes(log) > 0
    sent(acks, log, message("e1", prompt="p" * 300))
    assert kept_bytes(log) == 0
    assert "exceed the bound of 250 bytes" in (log.movable() or "")
    with pytest.raises(Unmovable, match="250 bytes"):
        log.start_at(1)
    sent(acks, log, message("e2"))
    assert kept_bytes(log) == 0 and log.resend(["e0", "e2"]) == []
    assert json.loads(json.dumps(START))  # the start itself is untouched
