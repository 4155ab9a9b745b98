"""Resume: a session outlives its owner's socket (docs/protocol.md §9).

A session that asked for it (`"resumable": true` in `session.start`) gets a resume token in
`video.start`. When its owner's connection drops without `session.stop` (no close frame, or
a close other than 1000), the session is *detached*, not ended: its Triton sequence stays
open, the model pauses it at the next chunk boundary (`PAUSE`, docs/triton-model.md), and
what the old socket had not taken is parked. A new connection whose first message is
`session.resume` with that token attaches as the session's new owner within
`--resume-grace-seconds`; after that the session ends as a dropped session always did.

A connection is not a session: when its first message is a `session.resume`, its owner
participant is attached to the session the token names (`attach`), or it is refused with
`invalid_resume`; no session is made for it either way.
"""

from __future__ import annotations

import logging

from rtvideo.core import resume
from rtvideo.core.errors import ProtocolError
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.session.session import ProxySession

log = logging.getLogger(__name__)


async def drop_silent_owner(features: Features, raw: str | bytes) -> None:
    """Before `attach`: the session a resume names, if attached to a connection that no longer
    answers, detaches (what is wrong with the resume itself, `attach` answers)."""
    try:
        request = resume.parse_resume(raw)
        session = features.resume_tokens.find(request.resume_token)
    except (ProtocolError, ResumeRefused):
        return
    await session.attachments.drop_if_silent(features.settings.resume_probe_seconds)


async def attach(features: Features, owner: Owner, raw: str | bytes) -> ProxySession:
    """A connection whose first message is `session.resume`: `owner` (its participant) is attached
    to the session the token names, which is returned. ResumeRefused (with the oldest index
    still kept, where that is why) when it cannot; `owner` is then attached to nothing. With a
    shared store the session's lease is checked there first (`ProxySession.check_held`): a
    replica that may have lost it while the store was away takes no resume."""
    try:
        request = resume.parse_resume(raw)
    except ProtocolError as exc:
        raise ResumeRefused(exc.message) from exc
    if features.resume_grace <= 0:
        raise ResumeRefused("resume is off on this server (--resume-grace-seconds 0)")
    session = features.resume_tokens.find(request.resume_token)
    assert isinstance(session, ProxySession)  # the only kind that issues resume tokens
    await session.check_held()
    if features.resume_tokens.find(request.resume_token) is not session:
        raise ResumeRefused("this token was used already: each resume hands out a new one")
    session.attach_owner(owner, request.last_transport_chunk_index, request.resume_token)
    return session
