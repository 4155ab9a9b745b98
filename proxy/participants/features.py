"""What resume, watching and steering share across one proxy's sessions, and the seams by
which a participant other than the first attaches to a session (docs/protocol.md §9).

A `session.start` may ask for `"resumable": true` (a resume token: a later connection may
attach as the new owner) and `"watchable": true` (a watch token: read-only watchers may
attach) and `"steerable": true` (a steer token: guest steerers may attach). The proxy takes
these options out before forwarding the start (`take_options`); the model never sees them.
A token names a session through the Protocol of what may be done with it (`Resumable`,
`Watchable`, `Steerable`): each names the session's part a door reaches (its attachments, as
`OwnerProbe`, `WatchDoor` or `SteerDoor`; its steering, as `SteeringFrames`), so that the doors
(rtvideo.proxy.session.resume, rtvideo.proxy.edge.guest_doors, rtvideo.proxy.edge.whep) depend on
these seams, not on the session's class, and the session passes nothing through for them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rtvideo.core import server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.broadcasts.service import Broadcasts
from rtvideo.proxy.participants.links import Link, Owner, Steerer
from rtvideo.proxy.participants.steerers import GuestSteerer, SteerCensus
from rtvideo.proxy.participants.tokens import TokenBook
from rtvideo.proxy.participants.watchers import Watcher, WatcherCensus
from rtvideo.proxy.recordings.service import Recordings
from rtvideo.proxy.settings import ProxySettings

#: fields of `session.start` that the proxy takes out before forwarding (the model never sees them)
PROXY_START_OPTIONS = ("resumable", "watchable", "steerable", "record", "broadcast")


class OwnerProbe(Protocol):
    """The session's attachments, as a resume finds them: an owner that went silent is let go."""

    async def drop_if_silent(self, timeout: float) -> None:
        """Its attached owner, if it does not answer a ping within `timeout`, is taken for dropped."""
        ...


class WatchDoor(Protocol):
    """The session's attachments, as a watch token opens them."""

    def watch_refusal(self) -> str | None:
        """Why no watcher may attach now (None: one may)."""
        ...

    def attach_watcher(self, conn: Link) -> Watcher | None:
        """A watcher on `conn`, attached; None when the session has ended."""
        ...


class SteerDoor(Protocol):
    """The session's attachments, as a steer token opens them."""

    def steer_refusal(self) -> str | None:
        """Why no steerer may attach now (None: one may)."""
        ...

    def attach_steerer(self, conn: Link, peer: str) -> GuestSteerer | None:
        """A steerer on `conn`, attached; None when the session has ended or its steering was revoked."""
        ...


class SteeringFrames(Protocol):
    """The session's steering, where a steering participant's frames go."""

    def frame(self, steerer: Steerer, raw: str | bytes, binary: bool) -> Awaitable[None] | None:
        """One frame of `steerer` (an awaitable: read its next frame only once it is done)."""
        ...


class Resumable(Protocol):
    """A session a resume token opens: a new owner attaches to it."""

    @property
    def attachments(self) -> OwnerProbe: ...

    def attach_owner(self, owner: Owner, last: int, token: str) -> None:
        """`owner` takes the session over from the pair `last` on (`token`: the resume token it
        used); ResumeRefused (rtvideo.proxy.participants.tokens) when it cannot."""
        ...


class Watchable(Protocol):
    """A session a watch token opens: read-only watchers attach to it."""

    @property
    def attachments(self) -> WatchDoor: ...


class Steerable(Protocol):
    """A session a steer token opens: guest steerers attach to it and steer it."""

    @property
    def attachments(self) -> SteerDoor: ...

    @property
    def steering(self) -> SteeringFrames: ...


@dataclass
class Features:
    """What resume, watching and steering share across one proxy's sessions."""

    settings: ProxySettings
    resume_tokens: TokenBook[Resumable] = field(default_factory=lambda: TokenBook[Resumable]("rv1"))
    watch_tokens: TokenBook[Watchable] = field(default_factory=lambda: TokenBook[Watchable]("wv1"))
    watchers: WatcherCensus = field(default_factory=WatcherCensus)
    steer_tokens: TokenBook[Steerable] = field(default_factory=lambda: TokenBook[Steerable]("sv1"))
    steerers: SteerCensus = field(default_factory=SteerCensus)
    recordings: Recordings | None = None  # --recordings (rtvideo.proxy.recordings); set by the application
    broadcasts: Broadcasts | None = None  # --broadcast-store (rtvideo.proxy.broadcasts); set by the application
    #: a shared session store (--session-store redis://…): every session is resumable unless its
    #: start says `"resumable": false`, so that a deploy loses none (docs/operations.md)
    shared: bool = False

    def __post_init__(self) -> None:
        self.watch_tokens.instance = self.resume_tokens.instance  # one identity per proxy
        self.steer_tokens.instance = self.resume_tokens.instance

    @property
    def resume_grace(self) -> float:
        return self.settings.resume_grace_seconds


def take_options(first: dict[str, Any], raw: bytes) -> tuple[dict[str, bool], bytes]:
    """The proxy's own options of a `session.start` (`PROXY_START_OPTIONS`, booleans), and the
    start to forward without them (unchanged bytes when it had none)."""
    if not any(name in first for name in PROXY_START_OPTIONS):
        return {}, raw
    options: dict[str, bool] = {}
    for name in PROXY_START_OPTIONS:
        if name in first:
            value = first.pop(name)
            if not isinstance(value, bool):
                raise ProtocolError(ErrorCode.INVALID_START, f"{name} must be a boolean")
            options[name] = value
    return options, server_messages.encode(first).encode("utf-8", "surrogatepass")
