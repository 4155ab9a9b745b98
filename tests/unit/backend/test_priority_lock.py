"""The model's IPC lock: one holder at a time, and answers to requests go before chunk sends."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from rtvideo.backend.runtime.priority_lock import PriorityLock


def _queue_up(lock: PriorityLock, kinds: list[bool]) -> list[bool]:
    """Hold the lock, let threads of the given kinds (True: urgent) queue up, release; return
    the kinds in the order they got their turn."""
    order: list[bool] = []
    inside = 0
    overlap = False
    guard = threading.Lock()

    def take(urgent: bool) -> None:
        nonlocal inside, overlap
        with lock.hold(urgent):
            with guard:
                inside += 1
                overlap |= inside > 1
            time.sleep(0.001)
            order.append(urgent)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=take, args=(urgent,)) for urgent in kinds]
    with lock.hold():
        for thread in threads:
            thread.start()
        # Every thread is waiting now: counted by the lock, not assumed after a fixed sleep, which
        # a loaded machine can outlast.
        deadline = time.monotonic() + 60
        while lock.waiting < len(threads):
            assert time.monotonic() < deadline, f"{lock.waiting} of {len(threads)} threads waiting"
            time.sleep(0.001)
    for thread in threads:
        thread.join(60)
    assert not overlap, "two holders at once"
    return order


@settings(max_examples=15, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=6))
def test_waiting_urgent_turns_all_come_before_waiting_normal_ones(kinds: list[bool]) -> None:
    order = _queue_up(PriorityLock(), kinds)
    assert sorted(order) == sorted(kinds), "everyone got a turn"
    assert order == sorted(order, reverse=True), f"an urgent waiter was passed over: {order}"
