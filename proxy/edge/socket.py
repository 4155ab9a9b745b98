"""`/v1/realtime/video`: admission before the upgrade, then a connection until its first
message gives it a role.

A connection is not a session. It holds its owner participant (link, outbox, rate bucket,
bounds) and waits for its first message (`ConnectionPhase.WAITING`, bounded by the start
timeout and the waiting share): a `session.start` makes a new `ProxySession` with it as the
owner; a `session.resume` attaches it to the session its token names. Anything else is
refused with `invalid_start` and an empty `session.done`, and no session is made.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import secrets
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from tornado.web import Finish
from tornado.websocket import WebSocketClosedError, WebSocketHandler, WebSocketProtocol, WebSocketProtocol13

from rtvideo.core import resume, server_messages, start_request
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.resume import ResumeRefused
from rtvideo.proxy.continuity.takeover import take_over
from rtvideo.proxy.edge.access import client_of, origin_allowed, refused_without_token
from rtvideo.proxy.edge.slot_shares import SlotShares
from rtvideo.proxy.edge.waiting import WaitingShare
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.participants.features import Features
from rtvideo.proxy.participants.links import Owner
from rtvideo.proxy.placement.pool import EndpointPool
from rtvideo.proxy.placement.supervisor import BackendState
from rtvideo.proxy.session.ending import refuse_connection
from rtvideo.proxy.session.resume import attach, drop_silent_owner
from rtvideo.proxy.session.session import ProxySession
from rtvideo.proxy.session.steering import raw_bytes
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.base import SessionStore
from rtvideo.proxy.store.keeper import StoreKeeper
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.proxy.store.watch import StoreWatch
from rtvideo.proxy.tasks import TaskSet

log = logging.getLogger(__name__)


class ConnectionPhase(enum.Enum):
    """Where one connection is: it waits for its first message, then belongs to a session, or
    was refused (its last messages and close are on their way), or closed."""

    WAITING = enum.auto()  # upgraded; its first message decides
    ATTACHING = enum.auto()  # its session.resume is being answered
    STARTING = enum.auto()  # its session.start is counted against its client's share of the slots
    IN_SESSION = enum.auto()  # the owner of a session (made by its start, or attached by its resume)
    REFUSED = enum.auto()  # answered and closing: frames still buffered behind are ignored
    CLOSED = enum.auto()


def _unmeasured(call: str, seconds: float, ok: bool) -> None:
    """What the in-process store's calls report: nothing (no store to watch)."""


#: the phases in which a connection that does not become a session is answered (`refuse`)
_ANSWERABLE = (ConnectionPhase.WAITING, ConnectionPhase.ATTACHING, ConnectionPhase.STARTING)


@dataclass
class ProxyContext:
    """What every handler of one proxy application shares."""

    settings: ProxySettings
    metrics: ProxyMetrics
    pool: EndpointPool  # the Triton endpoints, their health, and where a new session goes
    sessions: set[ProxySession] = field(default_factory=set)
    #: connections waiting for their first message, by client (rtvideo.proxy.edge.waiting)
    waiting: WaitingShare[RealtimeVideoHandler] = field(init=False)
    #: where sessions are kept beyond this process (rtvideo.proxy.store), and this proxy's name there
    store: SessionStore = field(default_factory=MemoryStore)
    holder: str = field(default_factory=lambda: secrets.token_hex(8))
    draining: bool = False  # shutting down: no new session (ProxyServer.drain)
    features: Features = field(init=False)  # resume tokens and watchers (rtvideo.proxy.participants)
    #: each session counted against its client's share of the model's slots, on every replica
    shares: SlotShares = field(init=False)
    #: the store's state as last found, and the records still to drop (rtvideo.proxy.store.watch)
    store_watch: StoreWatch = field(init=False)

    def __post_init__(self) -> None:
        self.features = Features(self.settings, shared=self.store.shared)
        s = self.settings
        self.waiting = WaitingShare(s.awaiting_start_bound, s.awaiting_start_per_client, s.awaiting_start_grace_seconds)
        # the store's calls are measured where a store is shared (the in-process one answers at once)
        self.shares = SlotShares(self.store, self.metrics.store_call if self.store.shared else _unmeasured)
        keep = s.store_keep_seconds  # as long as the store keeps a session's keys
        self.store_watch = StoreWatch(self.store, self.metrics.store_found, self.metrics.store_call, keep)
        # one token identity for every replica of a shared store: any of them tells its tokens
        # from forged ones, and finds a session held elsewhere by the token's hash
        for book in (self.features.resume_tokens, self.features.watch_tokens, self.features.steer_tokens):
            book.instance = self.store.cluster

    def keeper(self, sid: str | None = None) -> StoreKeeper:
        """A session's place in the store: a new one's under an id of its own, or `sid`'s."""
        sid = sid or secrets.token_hex(16)
        return StoreKeeper(
            self.store,
            sid,
            self.holder,
            self.metrics.store_call,
            lease_seconds=self.settings.lease_seconds,
            payload_bytes=self.settings.replay_buffer_bytes,
            session_bytes=self.settings.session_store_bytes,
            on_bounded=self.metrics.store_session_bounded,
            drop_later=self.store_watch.later,
        )

    def session_closed(self, session: ProxySession) -> None:
        """A session ended here (or was handed to another replica): it no longer counts."""
        self.sessions.discard(session)
        self.shares.release(session)

    def connections(self) -> int:
        """What --max-connections bounds: connections waiting for their first message, and the
        sessions that hold one (a detached session, waiting for its resume, is bounded by the
        grace and the model's slots instead, so that its own resume fits)."""
        return len(self.waiting) + sum(1 for s in self.sessions if not s.detached)


class RealtimeVideoHandler(WebSocketHandler):
    """Thin: refuses what it must before the upgrade; then one connection, until its first
    message gives it a session (or refuses it)."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context
        self.phase = ConnectionPhase.WAITING
        self.session: ProxySession | None = None
        self.owner: Owner | None = None  # built at the upgrade
        self.client = str(self.request.remote_ip)  # the client address (a trusted proxy's report), set in prepare
        self.group = self.client  # the client every per-client bound counts it as (its network), set in prepare
        self._start_timer: asyncio.TimerHandle | None = None
        self._tasks = TaskSet()  # the refusal's flush and close
        self._pong: asyncio.Event | None = None  # set by the pong of the latest `responsive` ping

    def prepare(self) -> Awaitable[None] | None:
        ctx = self.context
        self.client = client_of(self.request, ctx.settings.trusted_proxies)
        self.group = ctx.settings.client_group(self.client)
        if refused_without_token(self, ctx.settings.token, lambda reason: ctx.metrics.rejected.labels(reason).inc()):
            return None
        if ctx.draining:
            ctx.metrics.rejected.labels("draining").inc()
            self.set_header("Retry-After", "1")
            self.send_error(503, reason="Server shutting down")
        elif ctx.connections() >= ctx.settings.max_connections:
            ctx.metrics.rejected.labels("capacity").inc()
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Too many connections")
        elif not ctx.pool.admitting:
            busy = ctx.pool.state is BackendState.BUSY  # alive, every sequence slot held
            ctx.metrics.rejected.labels("backend_busy" if busy else "backend_down").inc()
            self.set_header("Retry-After", "5")
            self.send_error(503, reason="Video backend busy" if busy else "Video backend unavailable")
        elif not ctx.waiting.place(self):
            return self._wait_for_place()
        return None

    async def _wait_for_place(self) -> None:
        """The waiting share (rtvideo.proxy.edge.waiting) has no place for this client now: the
        upgrade is held until one of its own starts (or waited past the grace), then goes on;
        503 `awaiting_start` when none frees within its `awaiting_place_seconds`."""
        ctx = self.context
        if not await ctx.waiting.enter(self, ctx.settings.awaiting_place_seconds):
            if self.phase is not ConnectionPhase.WAITING:  # its client closed the connection meanwhile
                raise Finish()  # no upgrade on it (Tornado would go on to `get`)
            ctx.metrics.rejected.labels("awaiting_start").inc()
            self.set_header("Retry-After", "1")
            self.send_error(503, reason="Too many connections waiting to start")
            return
        if ctx.draining or ctx.connections() > ctx.settings.max_connections:  # changed while it waited
            ctx.waiting.leave(self)
            ctx.metrics.rejected.labels("draining" if ctx.draining else "capacity").inc()
            self.set_header("Retry-After", "1" if ctx.draining else "5")
            self.send_error(503, reason="Server shutting down" if ctx.draining else "Too many connections")

    def on_finish(self) -> None:
        """A request answered without the upgrade (403, 400, 503...) leaves the waiting share."""
        if self.get_status() != 101:
            self.context.waiting.leave(self)

    def displace(self, held: float) -> None:
        """Its place in the waiting share goes to a newcomer: it held it `held` seconds, past the
        grace, without a first message (a real client starts at once)."""
        log.info("peer=%s displaced after %.1f s without session.start", self.client, held)
        if self.owner is None:  # placed, not upgraded yet: nothing to answer on
            self.context.waiting.leave(self)
            return
        self.refuse(ErrorCode.START_TIMEOUT, f"no session.start after {held:.1f} s while other clients wait to connect")

    def check_origin(self, origin: str) -> bool:
        allowed = origin_allowed(origin, self.context.settings.allowed_origins, self.request.host)
        if not allowed:
            self.context.metrics.rejected.labels("origin").inc()
            log.info("peer=%s origin %r refused", self.request.remote_ip, origin)
        return allowed

    def open(self, *args: Any, **kwargs: Any) -> None:
        ctx = self.context
        self.set_nodelay(True)  # small messages (acks) must not wait for Nagle
        self.owner = Owner(self, self.client, ctx.settings, ctx.metrics)  # placed in the waiting share by prepare
        timeout = ctx.settings.start_timeout
        self._start_timer = asyncio.get_running_loop().call_later(
            timeout, self.refuse, ErrorCode.START_TIMEOUT, f"no session.start within {timeout:g} s"
        )

    def get_websocket_protocol(self) -> WebSocketProtocol | None:
        """Tornado's own choice of protocol and parameters, built as `_StrictTextProtocol`."""
        built = super().get_websocket_protocol()
        if type(built) is not WebSocketProtocol13:  # no upgrade (unsupported version): Tornado answers
            return built
        return _StrictTextProtocol(self, mask_outgoing=False, params=built.params)

    # --- the first message --------------------------------------------------------------------
    def _stop_waiting(self, phase: ConnectionPhase) -> None:
        self.phase = phase
        self.context.waiting.leave(self)
        if self._start_timer is not None:
            self._start_timer.cancel()

    def refuse(self, code: ErrorCode, message: str, *, close_code: int = 1000, **fields: Any) -> None:
        """A waiting connection that does not become a session: the error, an empty
        `session.done` (not for `invalid_resume`: no session of this connection ended), close."""
        if self.phase not in _ANSWERABLE or self.owner is None:
            return
        self._stop_waiting(ConnectionPhase.REFUSED)
        answer = server_messages.error(code, message) | fields
        done = code is not ErrorCode.INVALID_RESUME
        refuse_connection(self.owner, self.context.metrics, self._tasks, answer, done=done, close_code=close_code)

    def on_invalid_text(self) -> None:
        """A text frame that is not UTF-8 (RFC 6455 §8.1): the session ends with close 1007."""
        if self.session is not None:
            self.session.on_invalid_text()
        elif self.phase is ConnectionPhase.WAITING:
            self.refuse(ErrorCode.INVALID_START, "a text frame was not valid UTF-8; closing (1007)", close_code=1007)
        else:
            self.close(1007, "text frames must be UTF-8")

    def on_message(self, message: str | bytes) -> Awaitable[None] | None:
        """Tornado reads the next frame only once an awaitable returned here is done."""
        binary = isinstance(message, bytes)
        if self.session is not None:
            return self.session.steering.frame(self.session.owner, message, binary)
        if self.phase is not ConnectionPhase.WAITING or self.owner is None:
            return None  # refused: what was sent behind the refused message is not read
        if resume.is_resume(message, binary=binary):
            self._stop_waiting(ConnectionPhase.ATTACHING)
            return self._resume(message)  # its session is counted already: no share is asked
        try:
            first = start_request.check_first_message(message, binary=binary)
            start_request.check_object_bounds(first)  # every field bounded, before it is recorded or forwarded
        except ProtocolError as exc:
            self.refuse(exc.code, exc.message)
            return None
        return self._admit(first, raw_bytes(message))

    async def _admit(self, first: dict[str, Any], raw: bytes) -> None:
        """A start leaves the waiting share at once (its place is another's), then counts against
        its client's share of the model's slots (`ProxySettings.sessions_per_client`) on every
        replica of a shared store (rtvideo.proxy.edge.slot_shares): beyond it, `server_busy`.
        Asked when a connection becomes a session, not at the upgrade: a connection that resumes
        a session of its own needs no new share."""
        ctx = self.context
        self._stop_waiting(ConnectionPhase.STARTING)
        keeper = ctx.keeper() if ctx.store.shared else None  # one proxy alone: nothing to continue elsewhere
        member = keeper.sid if keeper is not None else secrets.token_hex(16)  # the session's id in the store
        share = ctx.settings.sessions_per_client(ctx.pool.known_slots)
        held = await ctx.shares.claim(self.group, member, share)
        if held is not None:
            ctx.metrics.rejected.labels("per_client").inc()
            where = " on every replica" if ctx.store.shared else ""
            self.refuse(
                ErrorCode.SERVER_BUSY,
                f"this client address holds {held} session(s){where}, its share of the model's slots "
                f"({share}, --max-sessions-per-client); end one first",
            )
            return
        if self.phase is not ConnectionPhase.STARTING or self.owner is None:  # closed while it was counted
            await ctx.shares.release_claim(self.group, member)
            return
        self._stop_waiting(ConnectionPhase.IN_SESSION)
        self.session = ProxySession(
            self.owner, ctx.pool, ctx.settings, ctx.metrics, ctx.session_closed, ctx.features, keeper
        )
        ctx.sessions.add(self.session)
        ctx.shares.count(self.session, self.group, member)
        begun = self.session.begin(first, raw)
        if begun is not None:
            await begun  # the next frame is read once its sequence is open

    async def _resume(self, message: str | bytes) -> None:
        features = self.context.features
        await drop_silent_owner(features, message)
        if self.phase is not ConnectionPhase.ATTACHING or self.owner is None:
            return  # closed meanwhile
        try:
            try:
                self.session = await attach(features, self.owner, message)
            except ResumeRefused as exc:
                if not (exc.unknown and self.context.store.shared):
                    raise
                self.session = await self._take_over(message)  # held by another replica, or by none
        except ResumeRefused as exc:
            self.context.metrics.resumes.labels("refused").inc()
            log.info("peer=%s session.resume refused: %s", self.client, exc.message)
            extra = {} if exc.oldest is None else {"oldest_resumable_index": exc.oldest}
            self.refuse(ErrorCode.INVALID_RESUME, exc.message, **extra)
            return
        self.phase = ConnectionPhase.IN_SESSION
        self.context.metrics.resumes.labels("resumed").inc()
        if self.ws_connection is None or self.ws_connection.is_closing():
            self.session.on_disconnect(dropped=True)  # closed while it was taken over: detached again

    async def _take_over(self, message: str | bytes) -> ProxySession:
        """A resume of a session this replica does not hold (rtvideo.proxy.continuity.takeover)."""
        ctx, owner = self.context, self.owner
        assert owner is not None
        try:
            request = resume.parse_resume(message)
        except ProtocolError as exc:
            raise ResumeRefused(exc.message) from exc

        def open_session(keeper: StoreKeeper) -> ProxySession:
            session = ProxySession(owner, ctx.pool, ctx.settings, ctx.metrics, ctx.session_closed, ctx.features, keeper)
            ctx.sessions.add(session)
            ctx.shares.count(session, self.group, keeper.sid)  # the entry its first holder made, renewed here
            return session

        return await take_over(ctx.store, request, open_session, ctx.keeper, ctx.holder, ctx.settings, ctx.metrics)

    async def shutdown(self) -> None:
        """Server shutdown while waiting for the first message: `server_shutdown`, the empty
        `session.done`, close 1001."""
        self.refuse(ErrorCode.SERVER_SHUTDOWN, "the server is shutting down; reconnect to go on", close_code=1001)
        await self._tasks.wait(5.0)

    # --- the link -----------------------------------------------------------------------------
    async def responsive(self, timeout: float) -> bool:
        """A ping, and whether its pong comes within `timeout` (the session's connection check)."""
        pong = self._pong = asyncio.Event()
        try:
            self.ping(b"rtvideo")
            await asyncio.wait_for(pong.wait(), timeout)
        except (WebSocketClosedError, asyncio.TimeoutError):
            return False
        return True

    def on_pong(self, data: bytes) -> None:
        if self._pong is not None:
            self._pong.set()

    def abandon(self) -> None:
        """The TCP connection closed at once, no close frame (`on_close` follows, as for a drop)."""
        if self.ws_connection is not None and self.ws_connection.stream is not None:
            self.ws_connection.stream.close()

    def on_close(self) -> None:
        if self.session is not None:  # without a close frame, or not 1000: a resumable session detaches
            self.session.on_disconnect(dropped=self.close_code != 1000)
        else:
            if self.owner is not None:
                self.owner.close_outbox()
            self._stop_waiting(ConnectionPhase.CLOSED)


class _StrictTextProtocol(WebSocketProtocol13):
    """A text frame that is not UTF-8 goes to the handler, which answers and closes with 1007
    (RFC 6455 §8.1); Tornado itself aborts the TCP connection, with no close frame, so a client
    could not tell a bad frame from a network drop and would resume into the same error.

    Why a subclass: Tornado has no public hook for a frame's bytes before it decodes them. This
    class is the proxy's whole dependency on Tornado internals: it overrides
    `_handle_message(opcode, data)` and reads `client_terminated`, `_frame_compressed` and
    `handler`; it is built with the public constructor arguments Tornado's own
    `get_websocket_protocol` chose (`params`), so the message-size bound, ping interval and
    timeout set on the application apply unchanged. Every other frame, a compressed one
    included, takes Tornado's path. pyproject.toml pins tornado to the major version tested;
    tests/unit/proxy/edge/test_tornado_boundary.py reads each internal named here in the installed
    Tornado and drives a bad frame through this class, so a release that changes them fails
    there."""

    def _handle_message(self, opcode: int, data: bytes) -> Any:
        if opcode == 0x1 and not self.client_terminated and not self._frame_compressed:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                if isinstance(self.handler, RealtimeVideoHandler):  # built only there
                    self.handler.on_invalid_text()
                    return None
        return super()._handle_message(opcode, data)
