"""One session's place in the session store: its lease, renewed, and its writes, in order; and
what it does when the store goes away and comes back (docs/decisions.md "The session store
under faults").

Every write of a session goes through one queue, so the store sees them in the order the
session made them; `event` resolves once the interaction is in the store (True: its ack may go,
write before ack) or the store could not take it (False: the interaction is refused with
`store_unavailable`, never acked); `handed_out` and `put` do not wait (a chunk is not held back by
the store). The payloads of the last chunks handed out are kept within `payload_bytes` (the
replay buffer's bound): the keeper forgets the oldest as it writes a new one.

The keeper also keeps, in memory, the record it wrote (`_Record`: fields, log, kept payloads,
token hashes; the log's texts and the payloads are the objects the session holds anyway). So when
the store was away (a call failed or outlasted `CALL_SECONDS`), or lost the session (restarted
empty), the whole record is written again (`SessionStore.restore`) under the lease, never half
of it: the keeper's relation to the store is a `StoreState`, moved by the keeper alone:

- KEPT: the lease is held and renewed, every write is taken;
- AWAY: a call failed; the session goes on, its writes are kept here, its interactions refused;
  each renewal period the keeper tries to recover: renew its lease or, if it lapsed and nobody
  held it since (the epoch it gets is the next one, or the store forgot the session), take it
  again, then restore the record → KEPT;
- UNHELD: no renewal for the lease less `margin`: another replica could be given the lease
  soon, so this one does not drive (no writes, no resume taken without a check in the store)
  until it recovers as from AWAY;
- LOST: another holder has the lease, or held it meanwhile: the session stops driving here;
- HANDING_OVER: a resume at another replica asked for the session (`Renewal.ASKED`) and its
  owner here is not attached and answering (`on_handoff`; one that is keeps it, and the resume is
  refused: `decline_handoff`): the session stops driving, its queued writes are finished under
  the lease, renewed meanwhile, and the lease is released at its end: handed over whole;
- BOUNDED: what the session wrote reached `session_bytes` (--session-store-bytes: its fields,
  each counted as last written, and its log; its payloads are bounded beside it): its keeping
  ended for good. The write past the bound is not made, its record and token bindings are
  dropped from the store (no replica may take over a record that stops short) and its lease let
  go; the session goes on here, unkept (its interactions acked without the store), logged with
  its request id and counted (`on_bounded`); no other session's keeping is touched;
- ENDED: the session ended here or was handed off.

A record that is to go (the session ended, or was bounded) but could not be dropped (the store
was away or refused it) is handed to `drop_later` (rtvideo.proxy.store.watch.StoreWatch), which
drops it, fenced by its lease, once the store takes writes again.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from rtvideo.proxy.store.base import (
    CALL_SECONDS,
    EVENT,
    FRAME,
    LEASE_SECONDS,
    STORE_FIELDS,
    Lease,
    Payload,
    Renewal,
    SessionGone,
    SessionStore,
    StoredSession,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

Write = Callable[[Lease], Awaitable[bool]]


class StoreState(enum.Enum):
    """The keeper's relation to the store (module docstring)."""

    KEPT = "kept"
    AWAY = "away"
    UNHELD = "unheld"
    LOST = "lost"
    HANDING_OVER = "handing_over"
    BOUNDED = "bounded"
    ENDED = "ended"


#: states in which the keeper may still recover the session (its lease is not known lost)
RECOVERABLE = frozenset({StoreState.AWAY, StoreState.UNHELD})
#: states in which the keeper writes and renews under its lease
_WRITING = frozenset({StoreState.KEPT, StoreState.HANDING_OVER})


@dataclass
class _Record:
    """What the keeper wrote of its session, to write it all again (`SessionStore.restore`)."""

    fields: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    payloads: dict[int, bytes] = field(default_factory=dict)
    tokens: dict[tuple[str, str], None] = field(default_factory=dict)  # (kind, hash) bound, in order


@dataclass(frozen=True)
class _Op:
    """One write in the queue: how it changes the record, and how it is written."""

    mirror: Callable[[_Record], None]
    write: Write | None  # None: nothing to write (a retry's ack waits for the writes before it)
    done: asyncio.Future[bool] | None = None  # resolved with whether it is in the store
    event: bool = False  # an interaction: in the record only once the store took it


class _Recover:
    """The queue's marker: try to recover the store (the writer does it, between writes)."""


_RECOVER = _Recover()
#: restores of one recovery while the record changes under it (a resume's recheck meets the writer)
_RESTORE_TRIES = 3
_FAILED = object()  # a store call that failed (the keeper went AWAY)
_GONE = object()  # a renewal that found the session gone from the store (the keeper went AWAY)


class StoreKeeper:
    """The store's side of one live session: its lease and its writes."""

    def __init__(
        self,
        store: SessionStore,
        sid: str,
        holder: str,
        observe: Callable[[str, float, bool], None],
        lease_seconds: float = LEASE_SECONDS,
        payload_bytes: int = 8 << 20,
        call_seconds: float = CALL_SECONDS,
        margin: float | None = None,
        *,
        session_bytes: int | None = None,
        on_bounded: Callable[[], None] = lambda: None,
        drop_later: Callable[[str, Lease], None] | None = None,
    ) -> None:
        self._store = store
        self.sid = sid
        self._holder = holder
        self._observe = observe  # (call, seconds, ok): the store's latency and errors
        self._ttl = lease_seconds
        self._call_seconds = min(call_seconds, lease_seconds / 2)
        #: stop driving this long before the lease could lapse: clocks, pauses, a late timer
        self._margin = lease_seconds / 4 if margin is None else margin
        self.lease: Lease | None = None
        self.state = StoreState.KEPT
        self.lost = asyncio.Event()  # set with LOST: another holder drives the session now, stop
        self._queue: asyncio.Queue[_Op | _Recover | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._record = _Record()
        self._payload_bytes = payload_bytes
        self._payloads: collections.deque[tuple[int, int]] = collections.deque()  # (index, size) kept
        self._kept_bytes = 0
        self._resume_hash = ""  # the live resume token's, as its renewals name it
        self._safe_until = 0.0  # monotonic: until then the lease is surely this keeper's
        self._unheld_timer: asyncio.TimerHandle | None = None
        self._recovering = False  # a recovery is queued
        self._recovery = asyncio.Lock()
        self._mirrored = 0  # writes mirrored into the record: a restore sees whether it changed meanwhile
        self._keeps_owner: Callable[[], Awaitable[bool]] | None = None  # asked at a handoff request
        self._asking: asyncio.Future[None] | None = None  # a handoff request being answered
        self._session_bytes = session_bytes  # the bound on its fields and log (None: none)
        self._field_bytes: dict[str, int] = {}  # field → its size as last written
        self._log_bytes = 0  # the log entries written
        self._on_bounded = on_bounded  # counts it (rtvideo_proxy_store_sessions_bounded_total)
        self._drop_later = drop_later  # a record this keeper could not drop, dropped once the store answers
        self._letting_go: asyncio.Future[None] | None = None  # BOUNDED: its record being dropped
        self._dropped = False  # its record was dropped (bounded): not again at its end
        self.request_id = ""  # the session's, once its fields name it (for the logs)

    # --- what the session submits ------------------------------------------------------------
    def start(self, lease: Lease | None = None, stored: StoredSession | None = None) -> asyncio.Future[bool]:
        """Hold the session (a lease already acquired, with the session as `stored` when taken
        over; or a new one), then write what was and is submitted, in order, and renew; the
        future says whether the session is held."""
        if stored is not None:
            self._adopt(stored)
        held = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.ensure_future(self._write_all(lease, held))]
        return held

    def _adopt(self, stored: StoredSession) -> None:
        """A session taken over: its record is what the store holds of it."""
        record = self._record
        record.fields = {k: v for k, v in stored.fields.items() if k not in STORE_FIELDS}
        record.log = list(stored.log)
        record.payloads = dict(stored.payloads)
        self.request_id = record.fields.get("request_id", "")
        self._field_bytes = {name: len(name) + _size(value) for name, value in record.fields.items()}
        self._log_bytes = sum(_size(entry) for entry in record.log)
        for index in sorted(stored.payloads):
            self._payloads.append((index, len(stored.payloads[index])))
            self._kept_bytes += len(stored.payloads[index])

    def on_handoff(self, keeps_owner: Callable[[], Awaitable[bool]]) -> None:
        """When a resume at another replica asks for the session, `keeps_owner` says whether its
        owner here is attached and answering: then the request is declined, as one proxy refuses
        a resume while its owner is attached (docs/protocol.md §9.1)."""
        self._keeps_owner = keeps_owner

    def put(self, fields: Mapping[str, str]) -> None:
        given = dict(fields)
        self.request_id = given.get("request_id", self.request_id)
        sizes = {name: len(name) + _size(value) for name, value in given.items()}
        if not self._within(sum(sizes.values()) - sum(self._field_bytes.get(name, 0) for name in sizes)):
            return
        self._field_bytes.update(sizes)
        self._submit(lambda r: r.fields.update(given), lambda lease: self._store.put(self.sid, lease, given))

    def handed_out(self, text: str, index: int | None, data: bytes | None) -> None:
        """A frame the owner's socket took (its metadata text, and a chunk's payload and index)."""
        if not self._within(_size(text) + 1):
            return
        self._log_bytes += _size(text) + 1
        payload = None
        if data is not None and index is not None:
            self._payloads.append((index, len(data)))
            self._kept_bytes += len(data)
            forget = []
            while self._kept_bytes > self._payload_bytes and len(self._payloads) > 1:
                old, size = self._payloads.popleft()
                self._kept_bytes -= size
                forget.append(old)
            payload = Payload(index, data, tuple(forget))
        entry = FRAME + text
        self._submit(
            functools.partial(_logged, entry, payload),
            lambda lease: self._store.append(self.sid, lease, [entry], payload),
        )

    def bind(self, tokens: Mapping[str, str]) -> None:
        """The session's live tokens, by kind, as hashes: any replica finds the session by them;
        its renewals name the live resume token's (a handoff asked with an older one is dropped)."""
        self._resume_hash = tokens.get("resume", self._resume_hash)
        for kind, token_hash in tokens.items():
            self._submit(
                functools.partial(_token_bound, (kind, token_hash)), functools.partial(self._bound, kind, token_hash)
            )

    def unbind(self, kind: str, token_hash: str) -> None:
        """A token that no longer opens the session (a revoked steer token): no replica finds it."""
        self._submit(
            lambda r: r.tokens.pop((kind, token_hash), None), functools.partial(self._unbound, kind, token_hash)
        )

    def event(self, payload: str | None) -> Awaitable[bool]:
        """Resolves True once the interaction (as forwarded) is in the store, False when the store
        cannot take it now (it is not kept: refuse it); None (a retry, stored already) resolves
        True after the writes before it, so acks keep their order."""
        done = asyncio.get_running_loop().create_future()
        if not self._tasks or self.state in (StoreState.LOST, StoreState.HANDING_OVER, StoreState.ENDED):
            done.set_result(False)
            return done
        if payload is not None and self.state in RECOVERABLE:  # refused at once: never behind a recovery
            done.set_result(False)
            return done
        if payload is None or not self._within(_size(payload) + 1):  # BOUNDED: acked without the store
            self._queue.put_nowait(_Op(_nothing, None, done))
        else:
            self._log_bytes += _size(payload) + 1
            entry = EVENT + payload
            write: Write = lambda lease: self._store.append(self.sid, lease, [entry], None)  # noqa: E731
            self._queue.put_nowait(_Op(functools.partial(_logged, entry, None), write, done, event=True))
        return done

    def _within(self, more: int) -> bool:
        """Whether `more` bytes fit the session's bound; the first time they do not: BOUNDED."""
        if self.state is StoreState.BOUNDED:
            return False
        if self._session_bytes is None or not self._tasks or self.state not in (*RECOVERABLE, StoreState.KEPT):
            return True  # LOST, ENDED: nothing is written; HANDING_OVER: its last writes, then the other's
        if sum(self._field_bytes.values()) + self._log_bytes + more <= self._session_bytes:
            return True
        self.state = StoreState.BOUNDED
        self._record = _Record()  # nothing is restored any more: its memory goes
        self._on_bounded()
        log.error(
            "session=%s request_id=%s the session store keeps at most %d bytes of a session: this one's keeping "
            "ends (it goes on here, no longer resumable at another replica; its record is dropped)",
            self.sid,
            self.request_id,
            self._session_bytes,
        )
        self._letting_go = asyncio.ensure_future(self._let_go())
        return False

    async def _let_go(self) -> None:
        """BOUNDED: the lease released and the record dropped, now or once the store answers."""
        lease = self.lease
        dropped = lease is None or await self._call("drop", functools.partial(self._drop, lease, True)) is True
        if not dropped and self._drop_later is not None:
            assert lease is not None
            self._drop_later(self.sid, lease)

    async def _drop(self, lease: Lease, release: bool = False) -> bool:
        """Its record and token bindings, unless another holder acquired it since (fenced)."""
        if release:
            await self._store.release(self.sid, lease)
        await self._store.drop(self.sid, lease)
        self._dropped = True
        return True

    def _submit(self, mirror: Callable[[_Record], None], write: Write) -> None:
        if self._tasks and self.state not in (StoreState.LOST, StoreState.BOUNDED, StoreState.ENDED):
            self._queue.put_nowait(_Op(mirror, write))

    async def _unbound(self, kind: str, token_hash: str, _: Lease) -> bool:
        await self._store.unbind_token(kind, token_hash)
        return True

    async def _bound(self, kind: str, token_hash: str, _: Lease) -> bool:
        await self._store.bind_token(kind, token_hash, self.sid)
        return True

    # --- what the session asks ---------------------------------------------------------------
    @property
    def kept(self) -> bool:
        """Whether the store holds the session as it is (another replica could go on with it)."""
        return self.state is StoreState.KEPT

    async def recheck(self) -> bool:
        """Before a resume is taken here: whether this keeper still drives the session, checked in
        the store (its lease and epoch renewed, or the session recovered into the store). Within
        the lease's safe time a store that does not answer still leaves it this keeper's, and a
        session never held (the store was away from its start) is found by no other replica."""
        if self.state in RECOVERABLE:
            await self._recover()
        elif self.state is StoreState.KEPT and (lease := self.lease) is not None:
            began = time.monotonic()
            renewed = await self._call("renew", self._renewal(lease))
            if renewed in (Renewal.RENEWED, Renewal.ASKED) and self.state is StoreState.KEPT:
                self._renewed(began)  # asked: its renewals answer the request
            elif renewed is not _FAILED:  # refused (lapsed, taken) or gone
                self._away("a renewal was refused")
                await self._recover()
        return (
            self.state is StoreState.KEPT
            or (self.state is StoreState.AWAY and time.monotonic() < self._safe_until)
            or (self.state in RECOVERABLE and self.lease is None)  # never held: no replica can find it
            or (self.state is StoreState.BOUNDED and self._dropped)  # unkept, and nobody else can find it
        )

    # --- the writer and the renewals ---------------------------------------------------------
    async def _write_all(self, lease: Lease | None, held: asyncio.Future[bool]) -> None:
        began = time.monotonic()
        got = lease or await self._call("acquire", lambda: self._store.acquire(self.sid, self._holder, self._ttl))
        if isinstance(got, Lease):
            self.lease = got
            self._renewed(began)
        elif got is None:
            self._lose("another replica holds it")
        if self.state is not StoreState.ENDED:  # ended before it began: nothing to renew
            self._tasks.append(asyncio.ensure_future(self._renew_all()))  # AWAY: it recovers
        held.set_result(self.lease is not None)
        while (item := await self._queue.get()) is not None:
            if isinstance(item, _Recover):
                await self._recover()
                continue
            ok = item.write is None or self.state is StoreState.BOUNDED  # unkept for good: acked without it
            if item.write is not None and self.state in _WRITING and (held_lease := self.lease) is not None:
                written = await self._call("write", functools.partial(item.write, held_lease))
                ok = written is True
                if written is False:
                    self._away("a write was refused (the lease lapsed, was taken, or the store lost the session)")
            if ok or not item.event:
                item.mirror(self._record)
                self._mirrored += 1
            if item.done is not None and not item.done.done():
                item.done.set_result(ok and self.state is not StoreState.LOST)

    async def _renew_all(self) -> None:
        while self.state not in (StoreState.LOST, StoreState.ENDED):
            await asyncio.sleep(self._ttl / 3)
            lease = self.lease
            if self.state in _WRITING and lease is not None:
                began = time.monotonic()
                ok = await self._call("renew", self._renewal(lease))
                if ok in (Renewal.RENEWED, Renewal.ASKED) and self.state in _WRITING:
                    self._renewed(began)
                if ok is Renewal.ASKED and self.state is StoreState.KEPT:
                    if self._asking is None or self._asking.done():  # its owner probed aside: renewals go on
                        self._asking = asyncio.ensure_future(self._asked(lease))
                        self._tasks.append(self._asking)
                elif ok is Renewal.LOST and self.state is StoreState.HANDING_OVER:
                    self._lose("the lease lapsed while the session was handed over")
                elif ok is Renewal.LOST:
                    self._away("a renewal was refused (taken over, or the lease lapsed)")
            if self.state in RECOVERABLE and not self._recovering:
                self._recovering = True
                self._queue.put_nowait(_RECOVER)

    async def _asked(self, lease: Lease) -> None:
        """A resume at another replica asked for the session with its live resume token: kept
        while its owner here is attached and answering (the request declined), else handed over."""
        asked_with = self._resume_hash
        if self._keeps_owner is not None and await self._keeps_owner():
            if self.state is StoreState.KEPT:
                decline = functools.partial(self._store.decline_handoff, self.sid, lease, asked_with)
                await self._call("decline_handoff", decline)
                log.info(
                    "session=%s a resume at another proxy asked for the session; its owner here answers: kept", self.sid
                )
            return
        if self.state is StoreState.KEPT:
            self.state = StoreState.HANDING_OVER
            log.info("session=%s a resume at another proxy asked for the session: handing it over", self.sid)
            self.lost.set()

    async def _recover(self) -> None:
        """AWAY or UNHELD → KEPT when the lease is still this keeper's, or lapsed and nobody held it
        since (the store's epoch is the next one, or the store forgot the session): the whole
        record written again. LOST when another holds it or held it meanwhile. Else unchanged."""
        self._recovering = False
        async with self._recovery:  # one at a time: a resume's recheck and the writer's may meet
            if self.state in RECOVERABLE:
                await self._recover_once()

    async def _recover_once(self) -> None:
        began = time.monotonic()
        lease = await self._regain()
        if lease is None:
            return
        record = self._record
        for _ in range(_RESTORE_TRIES):
            # What the record holds now: a resume's `recheck` restores while the writer goes on
            # mirroring what the session hands out (unwritten: not KEPT yet), and a restore
            # reads its record over several calls. Written again until nothing changed meanwhile,
            # so the store never misses what this keeper holds once it is KEPT.
            seen = self._mirrored
            restore = functools.partial(
                self._store.restore, self.sid, lease, dict(record.fields), list(record.log), dict(record.payloads)
            )
            restored = await self._call("restore", restore)
            if restored is not True:
                return  # the store went away again, or the lease lapsed meanwhile: the next period tries again
            if self._mirrored == seen:
                break
        else:
            return  # it changed during every try: the next period tries again (the writer's, between writes)
        for kind, token_hash in list(record.tokens):
            if await self._call("bind", functools.partial(self._bound, kind, token_hash, lease)) is _FAILED:
                return
        if self.state in RECOVERABLE:
            self.state = StoreState.KEPT
            self._renewed(began)
            log.warning(
                "session=%s the session store is back: the session is kept again (epoch %d, %d log entries written)",
                self.sid,
                lease.epoch,
                len(record.log),
            )

    async def _regain(self) -> Lease | None:
        """The lease renewed, or taken again when it lapsed and nobody held it since; None when
        the store did not answer (unchanged) or another holds or held it (LOST)."""
        lease = self.lease
        if lease is not None:  # else never held (its first acquisition failed): acquired now
            renewed = await self._call("renew", self._renewal(lease))
            if renewed in (Renewal.RENEWED, Renewal.ASKED):
                return lease  # asked: the renewals answer the request once it is kept again
            if renewed is _FAILED:
                return None
            # False (lapsed, taken, or a handoff asked) or _GONE (the store lost it): take it again
        got = await self._call("acquire", lambda: self._store.acquire(self.sid, self._holder, self._ttl))
        if got is _FAILED:
            return None
        if not isinstance(got, Lease):
            self._lose("another proxy holds the session now")
            return None
        if lease is not None and got.epoch > lease.epoch + 1:  # another holder came and went
            await self._call("release", lambda: self._store.release(self.sid, got))
            self._lose("another proxy held the session while the store was away")
            return None
        self.lease = got  # the next epoch, or 1: the store forgot the session
        return got

    def _renewal(self, lease: Lease) -> Callable[[], Awaitable[Renewal]]:
        return functools.partial(self._store.renew, self.sid, lease, self._ttl, self._resume_hash)

    async def _call(self, what: str, call: Callable[[], Awaitable[object]]) -> object:
        """One store call, bounded by `call_seconds`; `_FAILED` (and AWAY) when it failed."""
        began = time.perf_counter()
        try:
            result = await asyncio.wait_for(call(), self._call_seconds)
        except SessionGone as exc:  # nobody holds it: the keeper may write it all again
            self._observe(what, time.perf_counter() - began, False)
            self._away(str(exc))
            return _GONE
        except (StoreUnavailable, TimeoutError) as exc:
            self._observe(what, time.perf_counter() - began, False)
            self._away(f"{what}: {exc or 'no answer in time'}")
            return _FAILED
        self._observe(what, time.perf_counter() - began, True)
        return result

    # --- the state, moved here alone -----------------------------------------------------------
    def _renewed(self, began: float) -> None:
        """A renewal (or acquisition) that began at `began` (monotonic) succeeded: the lease is
        this keeper's until `began` + the lease, so it drives until that less the margin."""
        self._safe_until = began + self._ttl - self._margin
        if self._unheld_timer is not None:
            self._unheld_timer.cancel()
        delay = max(0.0, self._safe_until - time.monotonic())
        self._unheld_timer = asyncio.get_running_loop().call_later(delay, self._check_held)

    def _check_held(self) -> None:
        self._unheld_timer = None
        if self.state in (StoreState.KEPT, StoreState.AWAY) and time.monotonic() >= self._safe_until:
            self.state = StoreState.UNHELD
            log.warning(
                "session=%s no lease renewal for %.1f s: not driving the session until the store answers",
                self.sid,
                self._ttl - self._margin,
            )

    def _away(self, why: str) -> None:
        if self.state is StoreState.KEPT:
            self.state = StoreState.AWAY
            log.error(
                "session=%s the session store is away (%s): the session goes on here, its interactions "
                "are refused with store_unavailable until the store is back",
                self.sid,
                why,
            )

    def _lose(self, why: str) -> None:
        if self.state is not StoreState.ENDED:
            self.state = StoreState.LOST
            log.warning("session=%s lease lost (%s): letting go", self.sid, why)
            self.lost.set()

    async def end(self, *, forget: bool) -> None:
        """The session ends here (`forget`: and nobody is to continue it) or is handed off (its
        writes done, its lease released, its record kept for the replica that goes on). Once."""
        if self.state is StoreState.ENDED:
            return
        if self._tasks:  # the writes first, to the last (the lease renewed meanwhile), then the renewals
            self._queue.put_nowait(None)
            await asyncio.gather(self._tasks[0], return_exceptions=True)
        if self.state in RECOVERABLE:  # the store may be back: the lease checked before it is released
            await self._recover()
        was = self.state
        self.state = StoreState.ENDED
        if self._unheld_timer is not None:
            self._unheld_timer.cancel()
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        if self._letting_go is not None:
            await asyncio.gather(self._letting_go, return_exceptions=True)
        lease = self.lease
        if lease is not None and was in _WRITING:  # a lease taken by another is not released: fenced
            await self._call("release", lambda: self._store.release(self.sid, lease))
        if lease is not None and forget and was is not StoreState.LOST and not self._dropped:
            # nobody is to continue it: its record and token bindings go, now or once the store answers
            dropped = was is StoreState.KEPT and await self._call("drop", functools.partial(self._drop, lease)) is True
            if not dropped and self._drop_later is not None:
                self._drop_later(self.sid, lease)


def _logged(entry: str, payload: Payload | None, record: _Record) -> None:
    """A log entry (and a chunk's payload, the older ones forgotten) in the record."""
    record.log.append(entry)
    if payload is not None:
        record.payloads[payload.index] = payload.data
        for index in payload.forget:
            record.payloads.pop(index, None)


def _token_bound(key: tuple[str, str], record: _Record) -> None:
    record.tokens[key] = None


def _nothing(_: _Record) -> None:
    return None


def _size(text: str) -> int:
    """What a string takes in the store: its UTF-8 bytes."""
    return len(text.encode("utf-8", "surrogatepass"))
