"""Where one proxy session is (`Phase`), and the read-only view of it the session's parts hold
(`SessionPhase`).

Invariant: the phase moves forward only, AWAITING_START → STREAMING → STOP_SENT, then one
end (REFUSED before a session.start was forwarded, ENDING after), then CLOSED. The one way
back is a resumable session's STREAMING → DETACHED → STREAMING (rtvideo.proxy.session.resume).

A base module of the proxy: it names the phases and the seam through which they are read;
the one writer, `Lifecycle`, is the session's (rtvideo.proxy.session.lifecycle). Its readers
(the owner's seat, the mover, the upstream, the attachments) depend on this seam, never on
the writer. Pure (no I/O).
"""

from __future__ import annotations

import asyncio
import enum
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
