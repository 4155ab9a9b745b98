"""Resume: a session outlives its socket (docs/protocol.md §9).

A session that asked for it (`"resumable": true` in `session.start`) gets a resume token in
`video.start`. When its connection drops without `session.stop` (no close frame, or a close
other than 1000), the session is *detached*, not ended: its Triton sequence stays open, the
model pauses it at the next chunk boundary (`PAUSE`, docs/triton-model.md), and what the
old socket had not taken is parked. A new connection whose first message is
`session.resume` with that token takes it over within `--resume-grace-seconds`; after that
the session ends as a dropped session always did.

Tokens: 256 random bits from `secrets`, prefixed with this proxy's instance id (random per
process, so a token of another replica, or of this proxy before a restart, is told apart
from a forged one); only their SHA-256 is held, and never logged. Each is bound to one
session (its `request_id`) and used once: a resume hands out a fresh one. A token stops
working when it is used, when the grace is over, or when the session ends; the last few
thousand such ends are remembered so that the refusal can say which.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.proxy.outbox import Frame
from rtvideo.proxy.settings import ProxySettings

if TYPE_CHECKING:
    from rtvideo.proxy.session import Connection, ProxySession

log = logging.getLogger(__name__)

#: random bytes in a token (256 bits; the issue asks for at least 128)
TOKEN_BYTES = 32
#: how many used, expired or ended tokens are remembered, to say why one is refused
REMEMBERED_TOKENS = 4096
#: the proxy's own pings that pause and resume a detached session's generator (docs/triton-model.md)
PAUSE = protocol.encode({"type": protocol.PING, "keepalive": True, "pause": True}).encode()
UNPAUSE = protocol.encode({"type": protocol.PING, "keepalive": True, "pause": False}).encode()
#: fields of `session.start` that the proxy takes out before forwarding (the model never sees them)
PROXY_START_OPTIONS = ("resumable", "watchable")


class ResumeRefused(Exception):
    """Why a `session.resume` is refused (`invalid_resume`); `oldest`: the smallest
    `last_transport_chunk_index` the session can resume from, when that is the reason."""

    def __init__(self, message: str, oldest: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.oldest = oldest


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


@dataclass
class TokenBook:
    """Tokens of one kind (`prefix`) issued by this proxy: digest → the session it opens."""

    prefix: str
    instance: str = field(default_factory=lambda: secrets.token_hex(8))
    _live: dict[bytes, ProxySession] = field(default_factory=dict)
    _ended: OrderedDict[bytes, str] = field(default_factory=OrderedDict)

    def issue(self, session: ProxySession) -> str:
        token = f"{self.prefix}.{self.instance}.{secrets.token_urlsafe(TOKEN_BYTES)}"
        self._live[_digest(token)] = session
        return token

    def retire(self, token: str | None, why: str) -> None:
        """The token no longer opens anything; `why` is what a later use is told."""
        if token is None:
            return
        digest = _digest(token)
        self._live.pop(digest, None)
        self._ended.setdefault(digest, why)  # the first end is the one a later use is told
        while len(self._ended) > REMEMBERED_TOKENS:
            self._ended.popitem(last=False)

    def find(self, token: str) -> ProxySession:
        """The session `token` opens, or ResumeRefused saying why not."""
        parts = token.split(".")
        if len(parts) != 3 or parts[0] != self.prefix:
            raise ResumeRefused("not a token of this server")
        if not hmac.compare_digest(parts[1], self.instance):
            raise ResumeRefused(
                "this token was issued by another proxy replica, or by this one before it restarted: "
                "a resume must reach the replica that holds the session (docs/operations.md)"
            )
        digest = _digest(token)
        session = self._live.get(digest)
        if session is not None:
            return session
        raise ResumeRefused(self._ended.get(digest, "unknown token"))

    def __len__(self) -> int:
        return len(self._live)


@dataclass
class Features:
    """What resume and watching share across one proxy's sessions."""

    settings: ProxySettings
    resume_tokens: TokenBook = field(default_factory=lambda: TokenBook("rv1"))
    watch_tokens: TokenBook = field(default_factory=lambda: TokenBook("wv1"))
    watchers: int = 0  # watchers on this proxy now (bounded by --max-watchers)

    def __post_init__(self) -> None:
        self.watch_tokens.instance = self.resume_tokens.instance  # one identity per proxy

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
    return options, protocol.encode(first).encode("utf-8", "surrogatepass")


#: how long the connection of an attached session has to answer a ping when a resume names it
#: (`ProxySession.drop_if_silent`) before it is taken for dropped
RESUME_PROBE_SECONDS = 2.0


async def drop_silent_owner(features: Features, raw: str | bytes) -> None:
    """Before `take_over`: the session a resume names, if attached to a connection that no longer
    answers, detaches (what is wrong with the resume itself, `take_over` answers)."""
    try:
        request = protocol.parse_resume(raw)
        session = features.resume_tokens.find(request.resume_token)
    except (ProtocolError, ResumeRefused):
        return
    await session.drop_if_silent(RESUME_PROBE_SECONDS)


def take_over(features: Features, placeholder: ProxySession, conn: Connection, raw: str | bytes) -> ProxySession:
    """A connection whose first message is `session.resume`: the session it names takes this
    connection over (and the placeholder session of the connection retires), or the
    placeholder answers `invalid_resume` and closes. Returns the connection's session."""
    try:
        request = protocol.parse_resume(raw)
        if features.resume_grace <= 0:
            raise ResumeRefused("resume is off on this server (--resume-grace-seconds 0)")
        session = features.resume_tokens.find(request.resume_token)
        session.attach(conn, request.last_transport_chunk_index, request.resume_token, placeholder.peer)
    except ProtocolError as exc:
        return _refuse(placeholder, exc.message, None)
    except ResumeRefused as exc:
        return _refuse(placeholder, exc.message, exc.oldest)
    placeholder.retire()
    placeholder.metrics.resume_answered("resumed")
    return session


def _refuse(placeholder: ProxySession, message: str, oldest: int | None) -> ProxySession:
    placeholder.metrics.resume_answered("refused")
    log.info("peer=%s session.resume refused: %s", placeholder.peer, message)
    placeholder.refuse_resume(message, oldest)
    return placeholder


class Parked:
    """A detached session's outbox: frames wait here, never written, until a connection
    takes the session over (bounded like an outbox: a refused frame ends the session with
    `slow_consumer`, as a reader that never reads would)."""

    def __init__(self, frames: list[Frame], limit: int) -> None:
        self.frames = list(frames)
        self._limit = limit
        self._bytes = sum(f.size for f in self.frames)

    def put(self, frame: Frame, *, urgent: bool = False, force: bool = False) -> bool:
        if not force and self.frames and self._bytes + frame.size > self._limit:
            return False
        self.frames.append(frame)
        self._bytes += frame.size
        return True

    def take_unsent(self) -> list[Frame]:
        frames, self.frames, self._bytes = self.frames, [], 0
        return frames

    def discard(self) -> None:
        self.take_unsent()

    def write_now(self, frame: Frame) -> None:
        self.put(frame, force=True)

    async def flush(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        self.discard()
