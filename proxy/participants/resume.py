"""Resume: a session outlives its owner's socket (docs/protocol.md §9).

A session that asked for it (`"resumable": true` in `session.start`) gets a resume token in
`video.start`. When its owner's connection drops without `session.stop` (no close frame, or
a close other than 1000), the session is *detached*, not ended: its Triton sequence stays
open, the model pauses it at the next chunk boundary (`PAUSE`, docs/triton-model.md), and
what the old socket had not taken is parked. A new connection whose first message is
`session.resume` with that token attaches as the session's new owner within
`--resume-grace-seconds`; after that the session ends as a dropped session always did.

Every connection starts with a session of its own, waiting for its first message; when
that is a `session.resume`, the connection's owner participant is attached to the session
the token names, and its own session retires (`take_over`).
"""

from __future__ import annotations

import logging

from rtvideo.core import resume
from rtvideo.core.errors import ProtocolError
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.links import Connection
from rtvideo.proxy.participants.tokens import ResumeRefused
from rtvideo.proxy.session.session import ProxySession

log = logging.getLogger(__name__)

#: how long the connection of an attached session has to answer a ping when a resume names it
#: (`ProxySession.drop_if_silent`) before it is taken for dropped
RESUME_PROBE_SECONDS = 2.0


async def drop_silent_owner(features: Features, raw: str | bytes) -> None:
    """Before `take_over`: the session a resume names, if attached to a connection that no longer
    answers, detaches (what is wrong with the resume itself, `take_over` answers)."""
    try:
        request = resume.parse_resume(raw)
        session = features.resume_tokens.find(request.resume_token)
    except (ProtocolError, ResumeRefused):
        return
    await session.drop_if_silent(RESUME_PROBE_SECONDS)


def take_over(features: Features, placeholder: ProxySession, conn: Connection, raw: str | bytes) -> ProxySession:
    """A connection whose first message is `session.resume`: its owner is attached to the session
    the token names (and the placeholder session of the connection retires), or the placeholder
    answers `invalid_resume` and closes. Returns the session the connection now belongs to.
    `conn` is the placeholder owner's link."""
    assert placeholder.owner.link is conn
    try:
        request = resume.parse_resume(raw)
        if features.resume_grace <= 0:
            raise ResumeRefused("resume is off on this server (--resume-grace-seconds 0)")
        session = features.resume_tokens.find(request.resume_token)
        session.attach_owner(placeholder.owner, request.last_transport_chunk_index, request.resume_token)
    except ProtocolError as exc:
        return _refuse(placeholder, exc.message, None)
    except ResumeRefused as exc:
        return _refuse(placeholder, exc.message, exc.oldest)
    placeholder.retire()
    placeholder.metrics.resume_answered("resumed")
    assert isinstance(session, ProxySession)  # the only kind that issues resume tokens
    return session


def _refuse(placeholder: ProxySession, message: str, oldest: int | None) -> ProxySession:
    placeholder.metrics.resume_answered("refused")
    log.info("peer=%s session.resume refused: %s", placeholder.peer, message)
    placeholder.refuse_resume(message, oldest)
    return placeholder
