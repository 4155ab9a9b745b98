"""Where one proxy session is: its `Phase` (rtvideo.proxy.phase), moved only by the named
transitions here (`Lifecycle`, the one writer).

Invariant: the phase moves forward only, AWAITING_START → STREAMING → STOP_SENT, then one
end (REFUSED before a session.start was forwarded, ENDING after), then CLOSED. The one way
back is a resumable session's STREAMING → DETACHED → STREAMING (rtvideo.proxy.session.resume). An
end is claimed at once (`claim_end`), so nothing else is forwarded or accepted, not even
later in the same synchronous burst.

Pure state (no I/O). One writer: `ProxySession` alone moves it and names it; its parts hold
it as a `SessionPhase` (read-only) and tell the session what happened through their return
values, so no part can move the phase behind the session's back.
"""

from __future__ import annotations

import asyncio
import time

from rtvideo.proxy.phase import ATTACHED, LIVE, Phase


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
