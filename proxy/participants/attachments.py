"""How participants come and go on a live session (docs/protocol.md §9).

- The owner's link drops (`detach_on_drop`): a resumable session keeps its sequence, parks
  what the owner had not taken, pauses the generator, and waits out the grace.
- A resume attaches a new owner (`attach_owner`): it is given what it may have lost, and
  the session goes on (or, if the model ended it meanwhile, it is told and the session ends).
- An owner that no longer answers is taken for dropped when a resume names its session
  (`drop_if_silent`): one owner at a time, but a dead one does not hold the seat.
- A watcher attaches (`attach_watcher`) while the session is live and has room; so does a
  guest steerer (`attach_steerer`) while its steering was not revoked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from rtvideo.proxy.participants.invitations import Invitations, Joinable
from rtvideo.proxy.participants.links import Link, Owner
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.participants.steerers import GuestSteerer
from rtvideo.proxy.participants.tokens import ResumeRefused
from rtvideo.proxy.participants.watchers import Watcher
from rtvideo.proxy.session.handouts import Handouts
from rtvideo.proxy.session.lifecycle import Lifecycle, Phase
from rtvideo.proxy.session.upstream import Upstream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionEnds:
    """How the session ends, for the attachments that end it."""

    close: Callable[[], None]  # over now: the owner's link is gone (its on_disconnect)
    finish: Callable[[], None]  # its last messages go to the owner, then the close


class Attachments:
    """The coming and going of one session's participants."""

    def __init__(
        self,
        session: Joinable,
        life: Lifecycle,
        seat: OwnerSeat,
        invites: Invitations,
        handouts: Handouts,
        upstream: Upstream,
        ends: SessionEnds,
    ) -> None:
        self._session = session  # what its tokens name
        self._life = life
        self._seat = seat
        self._invites = invites
        self._handouts = handouts
        self._upstream = upstream
        self._ends = ends

    def detach_on_drop(self) -> bool:
        """The owner's link dropped: STREAMING → DETACHED when the session is resumable (True).
        What the owner had not taken is parked, the generator pauses, and the grace runs."""
        if self._life.phase is not Phase.STREAMING or not self._invites.resumable:
            return False
        self._seat.park()
        self._life.detach()
        self._upstream.pause(True)
        grace = self._invites.hold_open(self._grace_over)
        log.info(
            "request_id=%s peer=%s connection dropped: detached for %g s",
            self._life.request_id,
            self._seat.owner.peer,
            grace,
        )
        return True

    def _grace_over(self) -> None:
        if self._life.phase is Phase.DETACHED and self._invites.enabled:
            log.info("request_id=%s not resumed within the grace: ending", self._life.request_id)
            self._invites.expire()
            self._ends.close()

    def attach_owner(self, owner: Owner, last: int, token: str) -> None:
        """DETACHED → STREAMING with `owner`: video.start again (a new token), the init pair, every
        frame after the pair `last` as first sent, what was parked, then the live stream.
        ResumeRefused (nothing changes) when it cannot."""
        if self._life.attached:
            raise ResumeRefused("the session is attached to another connection (one controller at a time)")
        if self._life.phase is not Phase.DETACHED:
            raise ResumeRefused("the session has ended")
        frames = self._invites.replay_after(last)
        start = self._handouts.start_for(resumed=True, **self._invites.taken_up(self._session, token))
        assert start is not None  # a resume token is handed out with video.start
        self._life.reattach()
        parked = self._seat.hand_over(owner, start, self._handouts.init_frame(self._life.request_id), frames)
        if self._life.done_while_detached and self._life.claim_end():  # ended while detached: now told
            self._ends.finish()
            return
        self._upstream.pause(False)
        self._invites.uncount()
        log.info(
            "request_id=%s peer=%s resumed after index %d: %d frame(s) replayed, %d parked",
            self._life.request_id,
            owner.peer,
            last,
            len(frames),
            parked,
        )

    async def drop_if_silent(self, timeout: float) -> None:
        """Before a resume is answered for this attached session: a connection that went silent
        without a reset (a network change) is not seen by TCP for minutes, and by the WebSocket
        keep-alive only after --ping-interval + --ping-timeout; one that does not answer a ping
        within `timeout` is taken for dropped now (the session detaches), so that its resume is
        taken. A connection that answers keeps the session: one owner at a time."""
        if self._life.attached and self._invites.enabled and not self._seat.gone:
            await self._seat.drop_if_silent(timeout, self._life)

    def watch_refusal(self) -> str | None:
        """Why no watcher may attach now (None: one may)."""
        hub = self._invites.hub
        if hub is None or not self._life.live or self._handouts.start_for() is None:
            return "the session has ended"
        return hub.room()

    def attach_watcher(self, conn: Link) -> Watcher | None:
        """A watcher on `conn`: the owner's video.start (marked), the init pair, then every pair."""
        hub, start = self._invites.hub, self._handouts.start_for(watcher=True)
        if hub is None or not self._life.live or start is None:
            return None
        return hub.join(conn, start, self._handouts.init_frame(self._life.request_id))

    def steer_refusal(self) -> str | None:
        """Why no steerer may attach now (None: one may)."""
        hub = self._invites.steer_hub
        if hub is None or not self._life.live or self._handouts.start_for() is None:
            return "the session has ended"
        return hub.room()

    def attach_steerer(self, conn: Link, peer: str) -> GuestSteerer | None:
        """A steerer on `conn`: the owner's video.start (marked), the init pair, then every pair
        and the answers to its own messages."""
        hub, start = self._invites.steer_hub, self._handouts.start_for(steerer=True)
        if hub is None or not self._life.live or start is None or hub.room() is not None:
            return None
        return hub.join(conn, peer, start, self._handouts.init_frame(self._life.request_id))
