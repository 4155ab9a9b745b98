"""The doors a token opens for a participant besides the owner (docs/protocol.md §9.2-9.3):
`/v1/realtime/video/watch` for a read-only watcher, `/v1/realtime/video/steer` for a guest
steerer.

Both admit alike, before the upgrade: the `--token` rules first, then a live session named by
the query's token (403 otherwise), then room for one more participant there (503 with
`Retry-After` otherwise). Once open, the session attaches the participant; what its frames do
is the door's own: a watcher may send `session.ping` (answered) and `session.playback`
(checked, dropped), anything else is `invalid_message`; a steerer's frames go to the
session's steering (rtvideo.proxy.session.steering).

With a shared session store a token this replica does not know may open a session another
replica holds (rtvideo.proxy.edge.relay): the store says where it is. Held by another live
replica, the link is forwarded there (a relay, bounded as this proxy's own guests are); held by
nobody yet (its proxy went, its owner has not resumed), 503 with `Retry-After: 1`; not stored,
the refusal of an unknown token, word for word.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable
from typing import Any, Generic, TypeVar

from tornado.websocket import WebSocketHandler

from rtvideo.core import protocol, server_messages
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.edge.access import origin_allowed, query_value, refused_without_token
from rtvideo.proxy.edge.relay import (
    RELAYED_HEADER,
    HopRefused,
    HopUnreachable,
    Relay,
    Relays,
    Where,
    hop_url,
    locate,
)
from rtvideo.proxy.edge.socket import ProxyContext
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.participants.features import Steerable, Watchable
from rtvideo.proxy.participants.steerers import GuestSteerer
from rtvideo.proxy.participants.tokens import TokenBook
from rtvideo.proxy.participants.watchers import Watcher
from rtvideo.proxy.store.base import StoreUnavailable

log = logging.getLogger(__name__)

WATCH_PATH = "/v1/realtime/video/watch"
STEER_PATH = "/v1/realtime/video/steer"
#: the refusal of a guest whose session has no live holder now: its owner resumes it elsewhere
MOVING_REASON = "the session is moving to another proxy; retry"

S = TypeVar("S", Watchable, Steerable)


class _GuestDoor(WebSocketHandler, Generic[S]):
    """`?{kind}_token=...`: the admission both doors share; subclasses name their book, ask
    their session for room, and attach. A guest is either attached here (`session`) or relayed
    to the replica that holds its session (`relay`), never both."""

    kind = ""
    path = ""

    def initialize(self, context: ProxyContext, relays: Relays) -> None:
        self.context = context
        self.relays = relays
        self.session: S | None = None
        self.relay: Relay | None = None

    def book(self) -> TokenBook[S]:
        raise NotImplementedError

    def refusal(self, session: S) -> str | None:
        """Why `session` takes no participant of this kind now (None: it has room)."""
        raise NotImplementedError

    def join(self) -> None:
        """The upgrade is done: attach to `session`."""
        raise NotImplementedError

    def take(self, message: str | bytes) -> Awaitable[None] | None:
        """A frame of an attached guest."""
        raise NotImplementedError

    def leave(self) -> None:
        """An attached guest's link closed."""
        raise NotImplementedError

    async def prepare(self) -> None:
        ctx = self.context
        if refused_without_token(self, ctx.settings.token, lambda reason: ctx.metrics.rejected.labels(reason).inc()):
            return
        token = query_value(self.request, f"{self.kind}_token") or ""
        try:
            session = self.book().find(token)
        except ResumeRefused as exc:
            if not await self._elsewhere(token, exc):
                log.info("peer=%s %s refused: %s", self.request.remote_ip, self.kind, exc.message)
                self.send_error(403, reason=f"Unknown or ended {self.kind} token")
            return
        why = self.refusal(session)
        if why is not None:
            log.info("peer=%s %s refused: %s", self.request.remote_ip, self.kind, why)
            self._refuse(503, f"No room for a {self.kind}er: {why}", "5")
            return
        self.session = session

    async def _elsewhere(self, token: str, refused: ResumeRefused) -> bool:
        """A token this replica does not know, or knows as ended here: with a shared store, the
        session may be held by another replica (forwarded there) or be on its way to one (503).
        False when the refusal here stands."""
        ctx = self.context
        book = self.book()
        if not ctx.store.shared or token.split(".")[:2] != [book.prefix, book.instance]:
            return False  # not a token of this deployment: refused as on one proxy
        try:
            s = ctx.settings
            found = await locate(ctx.store, self.kind, token, ctx.holder, s.resume_grace_seconds, s.lease_seconds)
        except StoreUnavailable as exc:
            log.error("a %s link could not be looked up in the session store: %s", self.kind, exc)
            self._refuse(503, "the session store is unreachable; retry", "1")
            return True
        if found.where is Where.NOWHERE or (found.where is Where.HERE and not refused.unknown):
            return False
        if found.where is Where.ELSEWHERE and found.url is not None:
            return await self._forward(token, found.url)
        # HERE and unknown: this replica is taking the session over and has not adopted its tokens yet
        self._refuse(503, MOVING_REASON, "1")
        return True

    async def _forward(self, token: str, holder_url: str) -> bool:
        """Relay this link to the holder's same door (True: answered, or the relay is ready)."""
        ctx = self.context
        if self.request.headers.get(RELAYED_HEADER) or ctx.draining:
            self._refuse(503, MOVING_REASON, "1")  # forwarded once already, or this proxy is going
            return True
        if (room := self.relays.room(self.kind)) is not None:
            self._refuse(503, f"No room for a {self.kind}er: {room}", "5")
            return True
        headers = {RELAYED_HEADER: "1", "Host": self.request.host}
        if ctx.settings.token is not None:  # every replica of a deployment shares it
            headers["Authorization"] = f"Bearer {ctx.settings.token}"
        url = hop_url(holder_url, self.path, urllib.parse.urlencode({f"{self.kind}_token": token}))
        try:
            self.relay = await self.relays.open(self.kind, url, headers)
        except HopRefused as exc:  # the holder's own answer, passed on
            self._refuse(exc.status, exc.reason, exc.retry_after)
            return True
        except HopUnreachable as exc:
            log.info("peer=%s %s: the session's proxy did not answer (%s)", self.request.remote_ip, self.kind, exc)
            self._refuse(503, MOVING_REASON, "1")
            return True
        log.info("peer=%s %s forwarded to the replica that holds the session", self.request.remote_ip, self.kind)
        return True

    def _refuse(self, status: int, reason: str, retry_after: str | None) -> None:
        """An HTTP refusal of the upgrade (`send_error` would drop the `Retry-After` header)."""
        self.set_status(status, reason=reason)
        if retry_after is not None:
            self.set_header("Retry-After", retry_after)
        self.set_header("Content-Type", "text/plain; charset=UTF-8")
        self.finish(f"{status}: {reason}\n")

    def check_origin(self, origin: str) -> bool:
        return origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)  # acks and pongs must not wait for Nagle
        if self.relay is not None:
            self.relay.attach(self)
        else:
            self.join()

    def on_message(self, message: str | bytes) -> Awaitable[None] | None:
        """Tornado reads the next frame only once an awaitable returned here is done."""
        if self.relay is not None:
            return self.relay.from_guest(message)
        return self.take(message)

    def on_close(self) -> None:
        if self.relay is not None:
            self.relay.guest_closed(self.close_code, self.close_reason)
        else:
            self.leave()

    def on_finish(self) -> None:
        """A request that ended without an upgrade (refused after its hop was opened: a bad
        handshake, a foreign Origin) closes its hop; the upgrade's own 101 finishes here too."""
        if self.relay is not None and self.get_status() != 101:
            self.relay.abandon()


class WatchHandler(_GuestDoor[Watchable]):
    """`/v1/realtime/video/watch?watch_token=...`: a read-only watcher (rtvideo.proxy.participants.watchers)."""

    kind = "watch"
    path = WATCH_PATH

    def initialize(self, context: ProxyContext, relays: Relays) -> None:
        super().initialize(context, relays)
        self.watcher: Watcher | None = None

    def book(self) -> TokenBook[Watchable]:
        return self.context.features.watch_tokens

    def refusal(self, session: Watchable) -> str | None:
        return session.attachments.watch_refusal()

    def join(self) -> None:
        assert self.session is not None
        self.watcher = self.session.attachments.attach_watcher(self)
        if self.watcher is None:  # the session ended since the upgrade was granted
            self.close(1000)

    def take(self, message: str | bytes) -> None:
        """A watcher cannot steer: ping is answered, a well-formed playhead report is taken and
        dropped (only the owner's paces the stream), anything else is an error (the watch goes on)."""
        if self.watcher is None:
            return
        try:
            decoded = protocol.decode_later(message, binary=isinstance(message, bytes))
            if decoded["type"] == protocol.PLAYBACK:
                protocol.validate_playback(decoded)
                return  # never answered, as an owner's report is not (docs/protocol.md §2.6)
        except ProtocolError as exc:
            answer = server_messages.error(exc.code, exc.message)
        else:
            if decoded["type"] == protocol.PING:
                answer = server_messages.pong()
            else:
                answer = server_messages.error(
                    ErrorCode.INVALID_MESSAGE,
                    "a watcher cannot send messages other than session.ping and session.playback",
                )
        if answer.get("type") == protocol.ERROR:
            self.context.metrics.errors.labels(str(answer["code"])).inc()  # counted as every other refusal is
        self.watcher.put(Frame(server_messages.encode(answer), answer), urgent=True, force=True)

    def leave(self) -> None:
        if self.watcher is not None:
            self.watcher.leave()


class SteerHandler(_GuestDoor[Steerable]):
    """`/v1/realtime/video/steer?steer_token=...`: a guest steerer (rtvideo.proxy.participants.steerers)."""

    kind = "steer"
    path = STEER_PATH

    def initialize(self, context: ProxyContext, relays: Relays) -> None:
        super().initialize(context, relays)
        self.steerer: GuestSteerer | None = None

    def book(self) -> TokenBook[Steerable]:
        return self.context.features.steer_tokens

    def refusal(self, session: Steerable) -> str | None:
        return session.attachments.steer_refusal()

    def join(self) -> None:
        assert self.session is not None
        self.steerer = self.session.attachments.attach_steerer(self, str(self.request.remote_ip))
        if self.steerer is None:  # the session ended (or filled up) since the upgrade was granted
            self.close(1000, "the session has ended or has no room for a steerer")

    def take(self, message: str | bytes) -> Awaitable[None] | None:
        if self.steerer is None or self.steerer.over or self.session is None:
            return None
        # counted by the steering, which knows a playhead report from a steer
        return self.session.steering.frame(self.steerer, message, isinstance(message, bytes))

    def leave(self) -> None:
        if self.steerer is not None:
            self.steerer.leave()
