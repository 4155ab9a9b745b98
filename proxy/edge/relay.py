"""Watchers and steerers across replicas (docs/decisions.md "Watchers and steerers across
replicas"): a watch or steer link that reaches a replica which does not hold its session is
forwarded to the replica that does.

With a shared session store each proxy advertises where the other replicas reach it
(`Advertisement`: its `--advertise-url` under its holder id, with the lease's expiry, renewed
every third of it). A guest door whose token this replica does not know asks the store where
the session is (`locate`): nowhere (refused as an unknown token), here (this replica's own
answer stands), moving (no live holder: its proxy went and its owner has not resumed yet; 503,
retry), or held by another live replica, whose address it names: then a `Relay` opens the
same door there and pipes frames both ways until either side closes.

The relay is thin and bounded: frames go through untouched, in order, text and binary alike;
what waits toward a slow guest is bounded by `--watcher-buffer-bytes`, past which the guest is
dropped with `slow_consumer` as the holder drops its own watchers (the relay goes on reading
the hop meanwhile, so the holder never waits for it); a guest's frames toward the holder are
read one at a time, each once the hop took the one before. Close codes pass through both ways;
a hop that drops without one (the holder died, the network between replicas went) closes the
guest with 1012, so that its client comes back through any replica. A forwarded request is
marked (`RELAYED_HEADER`) and never forwarded again: two replicas that disagree for a moment
about the holder answer 503 instead of passing a guest back and forth.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClientConnection, WebSocketClosedError, websocket_connect

from rtvideo.core import server_messages
from rtvideo.core.errors import ErrorCode
from rtvideo.proxy.continuity.record import token_hash
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.links import Link
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.base import LEASE_SECONDS, SessionStore, StoreUnavailable

log = logging.getLogger(__name__)

#: marks a request one replica forwarded to another: it is never forwarded again
RELAYED_HEADER = "X-Rtvideo-Relayed"
#: how long opening the hop to the holder may take before the guest is told to retry
HOP_CONNECT_SECONDS = 5.0
#: the largest frame the hop takes from the holder (a chunk's payload; as the Python client reads)
HOP_MAX_MESSAGE_BYTES = 1 << 26
#: the close a guest gets when its hop dropped without a close code: the service restarts there
HOP_LOST_CODE = 1012
HOP_LOST_REASON = "the session's proxy went away; reconnect"
#: close codes that only describe a connection's end and are never sent in a close frame
_UNSENDABLE = frozenset({1005, 1006, 1015})


class Where(enum.Enum):
    """Where the store says a session is, for a guest door whose token this replica does not know."""

    NOWHERE = enum.auto()  # not stored (never, or ended), or past its grace: an unknown token
    HERE = enum.auto()  # this replica holds it: its own answer stands
    MOVING = enum.auto()  # no live holder that can be reached yet: retry in a moment
    ELSEWHERE = enum.auto()  # another live replica holds it, at `url`: forwarded there


@dataclass(frozen=True)
class Whereabouts:
    where: Where
    url: str | None = None  # the holder's advertised address (ELSEWHERE)


#: how long a token no session is bound to is looked for again before it counts as unknown: its
#: holder binds a session's tokens in the store just after its video.start went out, so a guest
#: that came straight to another replica may ask a moment before the binding lands (looked up
#: again after 0.1 s, then after twice the wait each time)
UNBOUND_SETTLE_SECONDS = 2.0
_SETTLE_STEP_SECONDS = 0.1


async def locate(
    store: SessionStore,
    kind: str,
    token: str,
    here: str,
    grace: float,
    lease: float = LEASE_SECONDS,
    settle: float = UNBOUND_SETTLE_SECONDS,
) -> Whereabouts:
    """Where the session the `kind` token opens is (`here`: this replica's holder id; `grace`:
    how long a session without a holder waits for its owner's resume, once the `lease` its
    holder had ran out; `settle`: how long an unbound token is looked for again).
    StoreUnavailable passes."""
    loop = asyncio.get_running_loop()
    deadline, step = loop.time() + settle, _SETTLE_STEP_SECONDS
    while (sid := await store.find(kind, token_hash(token))) is None and loop.time() < deadline:
        # doubling: a flood of unknown tokens costs the store a handful of lookups each, not 20
        await asyncio.sleep(min(step, max(0.0, deadline - loop.time())))
        step *= 2
    holding = None if sid is None else await store.holding(sid)
    if holding is None:
        return Whereabouts(Where.NOWHERE)
    if holding.holder is None:  # handed off, or its holder's lease ran out: its owner resumes it
        return Whereabouts(Where.MOVING if holding.age <= grace + lease else Where.NOWHERE)
    if holding.holder == here:
        return Whereabouts(Where.HERE)
    url = await store.address(holding.holder)
    return Whereabouts(Where.ELSEWHERE, url) if url else Whereabouts(Where.MOVING)


class Advertisement:
    """This proxy's address in a shared store, under its holder id, while it runs."""

    def __init__(
        self,
        store: SessionStore,
        holder: str,
        url: str,
        observe: Callable[[str, float, bool], None],
        lease: float = LEASE_SECONDS,
    ) -> None:
        self._store, self._holder, self.url = store, holder, url
        self._observe = observe  # (call, seconds, ok): as the store's other calls are counted
        self._lease = lease  # the address lasts a lease unless renewed (every third of it), as a session's
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._store.shared and self._task is None:
            self._task = asyncio.ensure_future(self._renew())

    async def stop(self) -> None:
        """No longer advertised: a replica that still finds this holder in a live lease answers 503."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await self._call(0)

    async def _renew(self) -> None:
        failing = False
        while True:
            ok = await self._call(self._lease)
            if not ok and not failing:
                log.error("the session store did not take this proxy's address: guests are not forwarded here")
            failing = not ok
            await asyncio.sleep(self._lease / 3)

    async def _call(self, ttl: float) -> bool:
        began = asyncio.get_running_loop().time()
        try:
            await self._store.advertise(self._holder, self.url, ttl)
        except StoreUnavailable:
            self._observe("advertise", asyncio.get_running_loop().time() - began, False)
            return False
        self._observe("advertise", asyncio.get_running_loop().time() - began, True)
        return True


class HopRefused(Exception):
    """The holder answered the forwarded upgrade with an HTTP status: the guest gets the same."""

    def __init__(self, status: int, reason: str, retry_after: str | None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.retry_after = status, reason, retry_after


class HopUnreachable(Exception):
    """The holder could not be reached: the guest retries (the session is moving)."""


def hop_url(advertised: str, path: str, query: str) -> str:
    """`ws://host:port{path}?{query}` for an advertised `http://host:port` (https: wss)."""
    parts = urllib.parse.urlsplit(advertised)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, query, ""))


class Relays:
    """The relays of one proxy: how many of each kind (bounded as its own guests are, by
    --max-watchers and --max-steerers), and what is cut when it stops."""

    def __init__(self, settings: ProxySettings, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._live: dict[str, set[Relay]] = {"watch": set(), "steer": set()}
        #: the most bytes that ever waited toward one relayed guest (its bound: --watcher-buffer-bytes)
        self.peak_pending = 0

    def count(self, kind: str) -> int:
        return len(self._live[kind])

    def room(self, kind: str) -> str | None:
        """Why no more guests of `kind` may be relayed now (None: one may)."""
        bound = self._settings.max_watchers if kind == "watch" else self._settings.max_steerers
        if len(self._live[kind]) >= bound:
            return f"this server relays {bound} {kind}ers (--max-{kind}ers)"
        return None

    async def open(self, kind: str, url: str, headers: dict[str, str]) -> Relay:
        """The hop to the holder's door at `url`, as a relay not attached to its guest yet.
        HopRefused: the holder's own refusal; HopUnreachable: no answer."""
        s = self._settings
        request = HTTPRequest(
            url, headers=headers, connect_timeout=HOP_CONNECT_SECONDS, request_timeout=HOP_CONNECT_SECONDS
        )
        try:
            hop = await websocket_connect(
                request,
                ping_interval=s.ping_interval or None,
                ping_timeout=s.ping_timeout,
                max_message_size=HOP_MAX_MESSAGE_BYTES,
            )
        except HTTPClientError as exc:
            if exc.code == 599 or exc.response is None:  # a timeout or a connection that went: no answer
                raise HopUnreachable(str(exc)) from None
            response = exc.response
            raise HopRefused(exc.code, response.reason, response.headers.get("Retry-After")) from None
        except (OSError, StreamClosedError, asyncio.TimeoutError) as exc:
            raise HopUnreachable(str(exc) or type(exc).__name__) from None
        relay = Relay(self, kind, hop, s.watcher_buffer_bytes)
        self._live[kind].add(relay)
        # a guest that went while its hop was opened never completes its upgrade: not held open
        asyncio.get_running_loop().call_later(HOP_CONNECT_SECONDS, relay.abandon)
        return relay

    def ended(self, relay: Relay, kind: str) -> None:
        self._live[kind].discard(relay)

    def dropped(self, kind: str) -> None:
        """A relayed guest that read too slowly, counted as the proxy's own are."""
        if kind == "watch":
            self._metrics.watchers_dropped.inc()
        else:
            self._metrics.steerers_dropped.labels("slow_consumer").inc()

    def waiting(self, pending: int) -> None:
        self.peak_pending = max(self.peak_pending, pending)

    def close_all(self) -> None:
        """The proxy stops: every relayed guest is closed with 1012 and comes back elsewhere."""
        for relay in [r for live in self._live.values() for r in live]:
            relay.cut(HOP_LOST_CODE, "the server restarts; reconnect")


class RelayPhase(enum.Enum):
    OPENED = enum.auto()  # the hop is open; the guest's upgrade is not done yet
    PIPING = enum.auto()  # frames flow both ways
    CLOSED = enum.auto()  # either side closed, or the guest was dropped


class Relay:
    """One guest's link, forwarded to the replica that holds its session: its hop, and the bytes
    waiting toward the guest."""

    def __init__(self, relays: Relays, kind: str, hop: WebSocketClientConnection, limit: int) -> None:
        self._relays = relays
        self._kind = kind
        self._hop = hop
        self._limit = limit
        self._guest: Link | None = None
        self._pending = 0  # bytes handed to the guest's socket and not written out yet
        self.phase = RelayPhase.OPENED
        self._task: asyncio.Task[None] | None = None

    def attach(self, guest: Link) -> None:
        """The guest's upgrade is done: frames flow."""
        if self.phase is not RelayPhase.OPENED:
            guest.close(HOP_LOST_CODE, HOP_LOST_REASON)
            return
        self._guest = guest
        self.phase = RelayPhase.PIPING
        self._task = asyncio.ensure_future(self._pipe())

    def from_guest(self, message: str | bytes) -> Awaitable[None] | None:
        """A guest's frame, to the holder; the guest's next frame is read once the hop took it."""
        if self.phase is not RelayPhase.PIPING:
            return None
        try:
            return self._hop.write_message(message, binary=isinstance(message, bytes))
        except WebSocketClosedError:
            return None

    def guest_closed(self, code: int | None, reason: str | None) -> None:
        """The guest went (its close code, if it sent one, goes on to the holder)."""
        if self.phase is RelayPhase.CLOSED:
            return
        self._end()
        self._hop.close(code if code is not None and code not in _UNSENDABLE else 1000, reason)

    def abandon(self) -> None:
        """The guest's upgrade never completed: the hop is closed."""
        if self.phase is RelayPhase.OPENED:
            self._end()
            self._hop.close(1000)

    def cut(self, code: int, reason: str) -> None:
        """Both sides closed now (this proxy stops)."""
        if self.phase is RelayPhase.CLOSED:
            return
        guest = self._guest
        self._end()
        self._hop.close(1001)
        if guest is not None:
            guest.close(code, reason)

    def _end(self) -> None:
        self.phase = RelayPhase.CLOSED
        self._relays.ended(self, self._kind)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()

    async def _pipe(self) -> None:
        """The holder's frames to the guest, then the holder's close (or 1012 for none)."""
        try:
            while (message := await self._hop.read_message()) is not None:
                if self.phase is not RelayPhase.PIPING or not self._to_guest(message):
                    return
        except Exception:  # a relay that breaks closes its two sides, and nothing else
            log.exception("a relayed %ser's pipe failed", self._kind)
            self.cut(HOP_LOST_CODE, HOP_LOST_REASON)
            return
        if self.phase is not RelayPhase.PIPING:
            return
        code, reason = self._hop.close_code, self._hop.close_reason
        if code is None or code in _UNSENDABLE:
            code, reason = HOP_LOST_CODE, HOP_LOST_REASON
            log.info("a relayed %ser's hop to its session's proxy dropped: closed with %d", self._kind, code)
        self._end()
        assert self._guest is not None
        self._guest.close(code, reason)

    def _to_guest(self, message: str | bytes) -> bool:
        """Hand one frame to the guest's socket; False when the guest is gone or was dropped."""
        assert self._guest is not None
        size = len(message)
        if self._pending and self._pending + size > self._limit:
            self._drop()
            return False
        try:
            written = self._guest.write_message(message, binary=isinstance(message, bytes))
        except (WebSocketClosedError, StreamClosedError):
            return False
        self._pending += size
        self._relays.waiting(self._pending)
        asyncio.ensure_future(written).add_done_callback(lambda done: self._written(size, done))
        return True

    def _written(self, size: int, done: asyncio.Future[None]) -> None:
        self._pending -= size
        _consume(done)

    def _drop(self) -> None:
        """The guest reads too slowly: told at once (behind what its socket holds), closed, and
        its hop closed, so the holder lets go of it as of any guest that leaves."""
        assert self._guest is not None
        self._relays.dropped(self._kind)
        message = server_messages.error(
            ErrorCode.SLOW_CONSUMER,
            f"the {self._kind}er reads too slowly: more than {self._limit} bytes are waiting",
        )
        log.info("a relayed %ser was dropped: slow consumer", self._kind)
        try:
            written = self._guest.write_message(server_messages.encode(message))
            asyncio.ensure_future(written).add_done_callback(_consume)
        except (WebSocketClosedError, StreamClosedError):
            pass
        self._end()
        self._hop.close(1000)
        self._guest.close(1000)


def _consume(done: asyncio.Future[None]) -> None:
    """A write awaited by no one: a guest gone meanwhile is no error."""
    if not done.cancelled():
        done.exception()
