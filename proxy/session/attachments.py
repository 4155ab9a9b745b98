"""How participants come and go on a live session (docs/protocol.md §9).

- The owner's link drops (`may_detach`, `detached`): a resumable session keeps its sequence,
  parks what the owner had not taken, pauses the generator, and waits out the grace.
- A resume seats a new owner (`check_resume`, `reseat`, `resumed`): it is given what it may
  have lost, and the session goes on (or, if the model ended it meanwhile, it is told and
  the session ends).
- An owner that no longer answers is taken for dropped when a resume names its session
  (`drop_if_silent`): one owner at a time, but a dead one does not hold the seat.
- A watcher attaches (`attach_watcher`) while the session is live and has room; so does a
  guest steerer (`attach_steerer`) while its steering was not revoked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.participants.features import Resumable
from rtvideo.proxy.participants.handouts import Handouts
from rtvideo.proxy.participants.invitations import Invitations
from rtvideo.proxy.participants.links import Link, Owner
from rtvideo.proxy.participants.seat import OwnerSeat
from rtvideo.proxy.participants.steerers import GuestSteerer
from rtvideo.proxy.participants.watchers import Watcher
from rtvideo.proxy.phase import Phase, SessionPhase
from rtvideo.proxy.session.upstream import Upstream

log = logging.getLogger(__name__)


class Attachments:
    """The coming and going of one session's participants. It reads the session's phase and
    never moves it: the session does, around these calls (one writer)."""

    def __init__(
        self,
        session: Resumable,
        life: SessionPhase,
        seat: OwnerSeat,
        invites: Invitations,
        handouts: Handouts,
        upstream: Upstream,
    ) -> None:
        self._session = session  # what a fresh resume token names
        self._life = life
        self._seat = seat
        self._invites = invites
        self._handouts = handouts
        self._upstream = upstream

    def may_detach(self) -> bool:
        """The owner's link dropped: whether the session detaches (STREAMING and resumable)."""
        return self._life.phase is Phase.STREAMING and self._invites.resumable

    def detached(self, grace_over: Callable[[], None]) -> None:
        """Just DETACHED: what the owner had not taken is parked, the generator pauses, and the
        grace runs (`grace_over` when it is over)."""
        self._seat.park()
        self._upstream.pause(True)
        grace = self._invites.hold_open(grace_over)
        log.info(
            "request_id=%s peer=%s connection dropped: detached for %g s",
            self._life.request_id,
            self._seat.owner.peer,
            grace,
        )

    def check_resume(self) -> None:
        """ResumeRefused unless the session waits for a new owner (DETACHED)."""
        if self._life.attached:
            raise ResumeRefused("the session is attached to another connection (one controller at a time)")
        if self._life.phase is not Phase.DETACHED:
            raise ResumeRefused("the session has ended")

    def reseat(self, owner: Owner, last: int, token: str) -> None:
        """`owner` takes the seat: video.start again (a new token), the init pair, every frame after
        the pair `last` as first sent, what was parked; ResumeRefused (nothing changes) when the
        frames after `last` are no longer kept."""
        frames = self._invites.replay_after(last)
        start = self._handouts.start_for(resumed=True, **self._invites.taken_up(self._session, token))
        assert start is not None  # a resume token is handed out with video.start
        parked = self._seat.hand_over(owner, start, self._handouts.init_frame(self._life.request_id), frames)
        log.info(
            "request_id=%s peer=%s resumed after index %d: %d frame(s) replayed, %d parked",
            self._life.request_id,
            owner.peer,
            last,
            len(frames),
            parked,
        )

    def resumed(self) -> None:
        """Back to STREAMING with a new owner: the generator goes on."""
        self._upstream.pause(False)
        self._invites.uncount()

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
