"""The pacing rule (rtvideo/core/pacing.py): today's due without reports, the rule's with them,
and every clamp of a report that lies (ahead of what was sent, backwards, frozen, stale)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.pacing import JITTER_FACTOR, MIN_SAMPLES, PacingPolicy, PlayheadPacer, ReportClamp

CHUNK = 9 / 16
POLICY = PacingPolicy(chunk_seconds=CHUNK, lead_chunks=1.0)
ZERO = 100.0  # playback_zero: when the first chunk went out


def fixed_due(chunks_sent: int, lead: float = 1.0) -> float:
    """Today's rule (rtvideo/backend/runtime/session.py)."""
    return ZERO + (chunks_sent - lead) * CHUNK


def pacer_with(times: list[float], policy: PacingPolicy = POLICY) -> PlayheadPacer:
    pacer = PlayheadPacer(policy)
    for seconds in times:
        pacer.observe_chunk(seconds)
    return pacer


def test_without_reports_the_due_is_todays() -> None:
    pacer = pacer_with([0.03] * 8)
    for n in range(1, 20):
        now = fixed_due(n) - 0.2
        assert not pacer.reporting(now)
        assert pacer.due(fixed_due(n), media_start=n * CHUNK, playback_zero=ZERO, now=now) == fixed_due(n)
    assert pacer.lead(ZERO + 5, 5.0) is None


def test_target_is_mean_plus_jitter_plus_headroom_within_floor_and_lead() -> None:
    assert pacer_with([]).target_buffer() == POLICY.fixed_buffer  # nothing measured: today's buffer
    assert pacer_with([0.01] * (MIN_SAMPLES - 1)).target_buffer() == POLICY.fixed_buffer
    times = [0.04, 0.05, 0.06, 0.05]
    mean = sum(times) / len(times)
    stdev = math.sqrt(sum((t - mean) ** 2 for t in times) / len(times))
    assert pacer_with(times).target_buffer() == pytest.approx(mean + JITTER_FACTOR * stdev + POLICY.headroom_seconds)
    assert pacer_with([0.001] * 8).target_buffer() == POLICY.floor_seconds  # never below the floor
    assert pacer_with([0.2, 0.9, 0.1, 0.6]).target_buffer() == POLICY.fixed_buffer  # never above the lead
    # only the last `window` chunks count: a slow start is forgotten
    assert pacer_with([0.5] * 8 + [0.02] * 8).target_buffer() == POLICY.floor_seconds


def test_the_target_keeps_room_for_the_unmeasured_delivery() -> None:
    """The measured chunk time ends where the model hands the chunk to Triton; the delivery to
    the page (and the report's trip) is covered by the headroom: even instant chunks leave at
    least the headroom, and the floor is no lower than it."""
    assert POLICY.floor_seconds >= POLICY.headroom_seconds > 0
    for times in ([0.0] * 8, [0.01] * 8, [0.03, 0.05, 0.04]):
        assert pacer_with(times).target_buffer() >= max(times) + POLICY.headroom_seconds


def test_before_chunks_are_measured_a_report_changes_nothing() -> None:
    """A session's first chunks: a report saying the player is behind (at a busy start its
    trip makes it read so) does not hold the stream; today's due until MIN_SAMPLES times."""
    pacer = pacer_with([0.05] * (MIN_SAMPLES - 1))
    now = ZERO + 0.6
    pacer.report(0.0, now=now, sent_seconds=2 * CHUNK, playback_zero=ZERO)  # 0.6 s behind
    assert pacer.due(fixed_due(2), media_start=2 * CHUNK, playback_zero=ZERO, now=now) == fixed_due(2)
    pacer.observe_chunk(0.05)
    assert pacer.due(fixed_due(2), media_start=2 * CHUNK, playback_zero=ZERO, now=now) > fixed_due(2)


def test_an_honest_report_paces_to_the_target() -> None:
    pacer = pacer_with([0.05] * 8)
    target = pacer.target_buffer()
    assert target < POLICY.fixed_buffer
    # 6 chunks sent; the player started 0.15 s after the first chunk went out and plays at real time
    now = ZERO + 3.0
    assert pacer.report(3.0 - 0.15, now=now, sent_seconds=6 * CHUNK, playback_zero=ZERO) is ReportClamp.NONE
    assert pacer.behind(ZERO) == pytest.approx(0.15)
    due = pacer.due(fixed_due(6), media_start=6 * CHUNK, playback_zero=ZERO, now=now)
    assert due == pytest.approx(ZERO + 0.15 + 6 * CHUNK - target)
    assert due > fixed_due(6)  # later than today's, so an update waits less in the player's buffer
    assert pacer.lead(now, 6 * CHUNK) == pytest.approx(6 * CHUNK - (3.0 - 0.15))


def test_a_position_ahead_of_what_was_sent_is_the_sent_end() -> None:
    pacer = pacer_with([0.05] * 8)
    now = ZERO + 1.0
    assert pacer.report(500.0, now=now, sent_seconds=2 * CHUNK, playback_zero=ZERO) is ReportClamp.AHEAD_OF_SENT
    due = pacer.due(fixed_due(2), media_start=2 * CHUNK, playback_zero=ZERO, now=now)
    assert due >= fixed_due(2)  # never faster than real time plus the lead
    assert pacer.lead(now, 2 * CHUNK) == 0.0


def test_a_position_ahead_of_the_clock_paces_as_today_never_faster() -> None:
    pacer = pacer_with([0.05] * 8)
    now = ZERO + 0.5
    clamp = pacer.report(1.0, now=now, sent_seconds=2 * CHUNK, playback_zero=ZERO)
    assert clamp is ReportClamp.AHEAD_OF_CLOCK
    assert pacer.behind(ZERO) == 0.0
    due = pacer.due(fixed_due(2), media_start=2 * CHUNK, playback_zero=ZERO, now=now)
    assert fixed_due(2) <= due == pytest.approx(ZERO + 2 * CHUNK - pacer.target_buffer())


def test_a_position_going_backwards_keeps_the_previous_one() -> None:
    pacer = pacer_with([0.05] * 8)
    pacer.report(2.0, now=ZERO + 2.1, sent_seconds=5 * CHUNK, playback_zero=ZERO)
    assert pacer.report(0.5, now=ZERO + 2.3, sent_seconds=5 * CHUNK, playback_zero=ZERO) is ReportClamp.BACKWARDS
    assert pacer.behind(ZERO) == pytest.approx(0.3)  # 2.0 shown at 2.3 s, not 0.5


def test_a_frozen_player_delays_the_stream_by_at_most_max_behind() -> None:
    """A client that keeps reporting position 0 cannot stall its session: it counts as at most
    `max_behind_seconds` behind, so chunks keep coming at real time, that much later."""
    pacer = pacer_with([0.05] * 8)
    clamps = []
    for n in range(2, 30):
        now = ZERO + n * CHUNK
        clamps.append(pacer.report(0.0, now=now, sent_seconds=n * CHUNK, playback_zero=ZERO))
        due = pacer.due(fixed_due(n), media_start=n * CHUNK, playback_zero=ZERO, now=now)
        assert due <= ZERO + POLICY.max_behind_seconds + n * CHUNK - pacer.target_buffer() + 1e-9
    assert ReportClamp.BEHIND_LIMIT in clamps
    assert pacer.behind(ZERO) == POLICY.max_behind_seconds


def test_a_client_that_stops_reporting_gets_todays_pacing_back() -> None:
    pacer = pacer_with([0.05] * 8)
    pacer.report(1.0, now=ZERO + 1.2, sent_seconds=3 * CHUNK, playback_zero=ZERO)
    assert pacer.reporting(ZERO + 1.2 + POLICY.stale_seconds)
    later = ZERO + 1.2 + POLICY.stale_seconds + 0.01
    assert not pacer.reporting(later)
    assert pacer.due(fixed_due(4), media_start=4 * CHUNK, playback_zero=ZERO, now=later) == fixed_due(4)
    assert pacer.lead(later, 4 * CHUNK) is None


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.floats(0, 5), min_size=0, max_size=12),
    st.lists(
        st.tuples(st.floats(-1, 1e7, allow_nan=False), st.floats(0, 3), st.integers(1, 40)), min_size=1, max_size=12
    ),
    st.floats(0, 3),
)
def test_no_report_makes_the_stream_faster_than_today_or_stalls_it(
    times: list[float], reports: list[tuple[float, float, int]], lead: float
) -> None:
    """Whatever a client reports: never earlier than today's due, never later than today's due
    plus the fixed buffer and max_behind (a bounded delay, not a stall)."""
    policy = PacingPolicy(chunk_seconds=CHUNK, lead_chunks=lead)
    pacer = pacer_with(times, policy)
    now = ZERO
    for position, step, sent in reports:
        now += step
        pacer.report(position, now=now, sent_seconds=sent * CHUNK, playback_zero=ZERO)
        fixed = ZERO + (sent - lead) * CHUNK
        due = pacer.due(fixed, media_start=sent * CHUNK, playback_zero=ZERO, now=now)
        assert fixed <= due <= fixed + policy.fixed_buffer + policy.max_behind_seconds + 1e-9
        assert policy.floor_seconds <= pacer.target_buffer() or pacer.target_buffer() == policy.fixed_buffer
        assert pacer.target_buffer() <= policy.fixed_buffer


def test_policy_refuses_nonsense() -> None:
    for bad in ({"chunk_seconds": 0}, {"lead_chunks": -1}, {"floor_seconds": math.nan}, {"window": 2}):
        with pytest.raises(ValueError):
            PacingPolicy(**{"chunk_seconds": CHUNK, "lead_chunks": 1.0, **bad})


# --- the message -------------------------------------------------------------------------
def test_session_playback_parses() -> None:
    report = protocol.parse_message(json.dumps({"type": "session.playback", "position_seconds": 3}))
    assert report == protocol.PlaybackReport(3.0, None)
    report = protocol.parse_message(
        json.dumps({"type": "session.playback", "position_seconds": 1.5, "buffered_seconds": 0.25, "later": 1})
    )
    assert report == protocol.PlaybackReport(1.5, 0.25)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"position_seconds": "1"},
        {"position_seconds": True},
        {"position_seconds": -0.1},
        {"position_seconds": 1e8},
        {"position_seconds": 1, "buffered_seconds": -1},
        {"position_seconds": 1, "buffered_seconds": "0"},
    ],
)
def test_a_malformed_session_playback_is_invalid_message(fields: dict[str, object]) -> None:
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_message(json.dumps({"type": "session.playback", **fields}))
    assert caught.value.code is ErrorCode.INVALID_MESSAGE
    assert "session.playback" in caught.value.message
