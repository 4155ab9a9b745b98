"""Where one proxy session is: its `Phase`, moved only by the named transitions here.

Invariant: the phase moves forward only, AWAITING_START → STREAMING → STOP_SENT, then one
end (REFUSED before a session.start was forwarded, ENDING after), then CLOSED. The one way
back is a resumable session's STREAMING → DETACHED → STREAMING (rtvideo.proxy.participants.resume). An
end is claimed at once (`claim_end`), so nothing else is forwarded or accepted, not even
later in the same synchronous burst.

Pure state (no I/O). One writer: `ProxySession` alone moves it and names it; its parts hold
it as a `SessionPhase` (read-only) and tell the session what happened through their return
values, so no part can move the phase behind the session's back.
"""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Protocol


class Phase(enum.Enum):
    """Where a session is."""

    AWAITING_START = enum.auto()  # connected; the first message decides
    STREAMING = enum.auto()  # the sequence is open: client messages go to Triton
    STOP_SENT = enum.auto()  # sequence_end went to Triton: pings are answered, model replies still go out
    REFUSED = enum.auto()  # the first message was refused or never came: error, done, close; no sequence
    ENDING = enum.auto()  # the end is claimed: nothing more forwarded or accepted; end sequence, flush, close
    # the owner's connection dropped; the session waits for a session.resume, its generator
    # paused; back to STREAMING on a resume, ENDING/CLOSED when the grace is over
    DETACHED = enum.auto()
    CLOSED = enum.auto()  # the session is over and its owner's connection closed


#: phases in which replies (Triton's and the proxy's own) still go to the owner
LIVE = frozenset({Phase.AWAITING_START, Phase.STREAMING, Phase.STOP_SENT, Phase.DETACHED})
#: phases in which the owner's connection is attached to an open sequence
ATTACHED = frozenset({Phase.STREAMING, Phase.STOP_SENT})


class SessionPhase(Protocol):
    """What a session's parts may read of its `Lifecycle` (they never write it)."""

    @property
    def phase(self) -> Phase: ...
    @property
    def live(self) -> bool: ...
    @property
    def attached(self) -> bool: ...
    @property
    def request_id(self) -> str | None: ...
    @property
    def done_while_detached(self) -> bool: ...
    @property
    def closed(self) -> asyncio.Event: ...


class Lifecycle:
    """One session's phase, the model's name for it (`request_id`), and its end."""

    def __init__(self) -> None:
        self._phase = Phase.AWAITING_START
        self._request_id: str | None = None  # from the model's video.start, once forwarded
        self.opened = time.monotonic()
        self._closed = asyncio.Event()  # set once CLOSED (awaited by shutdown)
        #: the model's session.done arrived while DETACHED: the end waits for a resume or the grace
        self._done_while_detached = False

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def request_id(self) -> str | None:
        return self._request_id

    @property
    def done_while_detached(self) -> bool:
        return self._done_while_detached

    @property
    def closed(self) -> asyncio.Event:
        return self._closed

    def named(self, request_id: str | None) -> None:
        """The model's video.start named the session."""
        self._request_id = request_id

    def done_arrived_detached(self) -> None:
        """DETACHED, and the model's session.done is queued: the end waits for the owner."""
        assert self._phase is Phase.DETACHED
        self._done_while_detached = True

    @property
    def live(self) -> bool:
        return self._phase in LIVE

    @property
    def attached(self) -> bool:
        """STREAMING or STOP_SENT: an open sequence with its owner's connection."""
        return self._phase in ATTACHED

    @property
    def waited(self) -> float:
        """Seconds since the connection was opened."""
        return time.monotonic() - self.opened

    def open_sequence(self) -> None:
        """AWAITING_START → STREAMING: session.start went to Triton on its own stream."""
        assert self._phase is Phase.AWAITING_START
        self._phase = Phase.STREAMING

    def stop_sent(self) -> None:
        """STREAMING → STOP_SENT: the client's session.stop carried sequence_end."""
        assert self._phase is Phase.STREAMING
        self._phase = Phase.STOP_SENT

    def claim_end(self) -> bool:
        """A live session → REFUSED or ENDING, at once. False if the end was already claimed."""
        if self._phase not in LIVE:
            return False
        self._phase = Phase.REFUSED if self._phase is Phase.AWAITING_START else Phase.ENDING
        return True

    def detach(self) -> None:
        """STREAMING → DETACHED: the owner's connection dropped; the session waits for a resume."""
        assert self._phase is Phase.STREAMING
        self._phase = Phase.DETACHED

    def reattach(self) -> None:
        """DETACHED → STREAMING: a resume attached a new owner."""
        assert self._phase is Phase.DETACHED
        self._phase = Phase.STREAMING

    def mark_closed(self) -> Phase:
        """Any phase → CLOSED; returns the phase it left."""
        left, self._phase = self._phase, Phase.CLOSED
        self._closed.set()
        return left
