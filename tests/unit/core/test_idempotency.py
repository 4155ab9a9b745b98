"""Idempotency registry: retries, conflicts, and a model-based property test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.idempotency import IdempotencyRegistry


def test_new_retry_conflict() -> None:
    reg = IdempotencyRegistry()
    assert reg.admit("a", "f1") is True
    assert reg.admit("a", "f1") is False
    with pytest.raises(ProtocolError) as info:
        reg.admit("a", "f2")
    assert info.value.code is ErrorCode.EVENT_ID_CONFLICT and info.value.event_id == "a"
    assert reg.admit("a", "f1") is False, "the original survives a conflict"
    assert len(reg) == 1


def test_limit() -> None:
    reg = IdempotencyRegistry(max_events=2)
    reg.admit("a", "x")
    reg.admit("b", "x")
    assert reg.admit("a", "x") is False, "retries still answer at the limit"
    with pytest.raises(ProtocolError) as info:
        reg.admit("c", "x")
    assert info.value.code is ErrorCode.INVALID_INTERACTION


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("xyz")), max_size=30))
def test_matches_first_payload_model(ops) -> None:
    reg, first = IdempotencyRegistry(), {}
    for event_id, fp in ops:
        expected = "new" if event_id not in first else ("retry" if first[event_id] == fp else "conflict")
        try:
            got = "new" if reg.admit(event_id, fp) else "retry"
        except ProtocolError:
            got = "conflict"
        first.setdefault(event_id, fp)
        assert got == expected
