"""The owner's seat of a session (`OwnerSeat`): which `Owner` participant holds it, how it
changes hands, and what is written to it.

The seat outlives its holders. When the holder's link drops, the seat keeps it, parked:
frames wait for the next holder (rtvideo.proxy.participants.links `Parked`). A resume seats a
new owner (`hand_over`): it is given the session's video.start again, the init pair, what the
old link may have lost (from the replay buffer) and what was parked, in that order, before
anything live. Every frame a holder's socket takes passes the session's hand-out hook.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rtvideo.core import protocol, server_messages
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.phase import Phase, SessionPhase

log = logging.getLogger(__name__)


class OwnerSeat:
    """The participant that owns one session now, and the writing of messages to it."""

    def __init__(self, owner: Owner, metrics: ProxyMetrics, hand_out: Callable[[Frame], Frame | None]) -> None:
        self._owner = owner
        self._metrics = metrics
        self._hand_out = hand_out  # sees every frame a holder's socket takes; returns what is written
        owner.bind(hand_out)

    @property
    def owner(self) -> Owner:
        return self._owner

    @property
    def gone(self) -> bool:
        """The holder's link dropped: nothing will report its close."""
        return self._owner.gone

    def emit(
        self,
        message: Mapping[str, Any],
        *,
        text: str | None = None,
        data: bytes | None = None,
        urgent: bool = False,
        force: bool = False,
        now: bool = False,
    ) -> bool:
        """Queue one message (a pair with `data`) for the holder; False when it reads too slowly.
        `now`: handed to the socket at once (the last messages to a reader that does not read)."""
        if message.get("type") == protocol.ERROR:
            self._metrics.errors.labels(str(message.get("code"))).inc()
        frame = Frame(text if text is not None else server_messages.encode(message), message, data)
        if now:
            self._owner.write_now(frame)
            return True
        return self._owner.put(frame, urgent=urgent, force=force)

    def park(self) -> None:
        """The holder's link dropped: what it had not taken, and whatever comes, waits."""
        self._owner.park()

    def hand_over(self, owner: Owner, start: dict[str, Any], init: Frame | None, replayed: list[Frame]) -> int:
        """`owner` takes the seat: `start`, the init pair, `replayed` (sent again: the ledger saw
        them the first time), then what was parked. Returns how many frames were parked."""
        parked = self._owner.take_unsent()
        owner.inherit_rate(self._owner)
        owner.bind(self._hand_out)
        self._owner = owner
        owner.put(Frame(server_messages.encode(start), start, replay=True), force=True)
        if init is not None:
            owner.put(init, force=True)
        for frame in replayed:
            owner.put(Frame(frame.text, frame.message, frame.data, replay=True), force=True)
        for frame in parked:
            owner.put(frame, force=True)
        return len(parked)

    async def drop_if_silent(self, timeout: float, life: SessionPhase) -> None:
        """A holder whose connection does not answer a ping within `timeout` is taken for dropped:
        its TCP connection is closed, and this waits (briefly) until the close has reached the
        session (no longer attached)."""
        owner = self._owner
        if await owner.responsive(timeout) or owner is not self._owner or life.phase is Phase.DETACHED:
            return
        log.info(
            "request_id=%s peer=%s connection silent for %.1f s: taken for dropped",
            life.request_id,
            owner.peer,
            timeout,
        )
        owner.abandon()
        for _ in range(100):  # the close reaches the session's on_disconnect through the IOLoop
            if not life.attached:
                return
            await asyncio.sleep(0.01)

    async def close_after_flush(self, flush_seconds: float, code: int = 1000) -> None:
        await self._owner.flush(flush_seconds)
        self._owner.close(code)
