"""A lock whose urgent waiters go ahead of the others."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class PriorityLock:
    """Mutual exclusion where a waiter that asks for an urgent turn is served before every
    waiter that did not (among themselves, either kind is served in no particular order).

    The model serializes its calls into Triton with it: answers to requests (acks a client
    is timing) are urgent, video chunk sends and polls are not."""

    def __init__(self) -> None:
        self._turn = threading.Condition(threading.Lock())
        self._held = False
        self._urgent_waiting = 0
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """The threads waiting for a turn now."""
        with self._turn:
            return self._waiting

    @contextlib.contextmanager
    def hold(self, urgent: bool = False) -> Iterator[None]:
        with self._turn:
            self._urgent_waiting += urgent
            self._waiting += 1
            try:
                while self._held or (not urgent and self._urgent_waiting):
                    self._turn.wait()
            finally:
                self._urgent_waiting -= urgent
                self._waiting -= 1
            self._held = True
        try:
            yield
        finally:
            with self._turn:
                self._held = False
                self._turn.notify_all()
