"""The slots of Triton's sequence batcher as the model sees them: how many its sequences hold.

A new sequence (a session's start, the proxy's health probe) needs a free slot of the model
instance's batcher (`max_candidate_sequences` of the `oldest` strategy); with none free it waits
in Triton's backlog, silently. Triton exports no gauge of that occupancy, so the model keeps
its own: every request reaches it through `execute()`, with the sequence's START and END
controls. A sequence holds a slot from its first request until a request with END, or until
Triton's idle timeout (`max_sequence_idle_microseconds`) after its last request frees it; a
one-request sequence (START and END, the health probe) holds none afterwards.

The count is what the model says of its slots on Triton's `/metrics` (`rtvideo_sequence_slots`
and `rtvideo_sequence_slots_held`, one series per model instance): the proxy's supervisor reads
it to tell "every slot is held" (busy) from a probe answered late by a loaded host, whose slots
are free (docs/operations.md "Busy, late and down"). Invariants: `held() <= slots` is not
assumed (the model may see a sequence Triton already dropped, at most for one idle timeout);
entries are bounded by `MAX_TRACKED` whatever clients send.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

#: Triton's own default `max_sequence_idle_microseconds` (1 s), when the config sets none
TRITON_DEFAULT_IDLE_SECONDS = 1.0
#: sequences tracked at most (the oldest forgotten first): far above any batcher's slots
MAX_TRACKED = 65536


class SequenceSlots:
    """Sequences open in one model instance's batcher (thread-safe: `execute()` records, the
    metrics flush reads)."""

    def __init__(
        self, slots: int | None, idle_seconds: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.slots = slots  # None: the batcher's slot count is unknown (not the `oldest` strategy)
        self._idle = idle_seconds if idle_seconds is not None else TRITON_DEFAULT_IDLE_SECONDS
        self._clock = clock
        self._lock = threading.Lock()
        self._last: OrderedDict[int, float] = OrderedDict()  # correlation id -> its last request, oldest first

    def request(self, corrid: int, *, end: bool) -> None:
        """A request of sequence `corrid` reached the model (Triton gave it a slot)."""
        with self._lock:
            if end:
                self._last.pop(corrid, None)  # its slot is free once this request is done
                return
            self._last[corrid] = self._clock()
            self._last.move_to_end(corrid)
            while len(self._last) > MAX_TRACKED:
                self._last.popitem(last=False)

    def held(self) -> int:
        """Slots held now: sequences with a request within the idle timeout and no END yet."""
        with self._lock:
            cutoff = self._clock() - self._idle
            while self._last and next(iter(self._last.values())) < cutoff:
                self._last.popitem(last=False)
            return len(self._last)
