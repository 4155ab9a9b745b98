"""One session's place in the session store: its lease, renewed, and its writes, in order.

Every write of a session goes through one queue, so the store sees them in the order the
session made them; `event` returns once the interaction is in the store (its ack waits for
that: write before ack), `handed_out` and `put` do not wait (a chunk is not held back by the
store). The payloads of the last chunks handed out are kept within `payload_bytes` (the
replay buffer's bound): the keeper forgets the oldest as it writes a new one. A lease that is lost (expired and taken, or a handoff asked) sets `lost`: the session
stops driving. With the store unreachable the keeper gives up its writes (the session goes
on, without continuation on another replica: docs/operations.md "When a proxy dies"), counts
the error, and never holds an ack longer than one call's timeout.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from rtvideo.proxy.store.base import EVENT, FRAME, LEASE_SECONDS, Lease, Payload, SessionStore, StoreUnavailable

log = logging.getLogger(__name__)

Write = Callable[[Lease], Awaitable[bool]]


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
    ) -> None:
        self._store = store
        self.sid = sid
        self._holder = holder
        self._observe = observe  # (call, seconds, ok): the store's latency and errors
        self._ttl = lease_seconds
        self.lease: Lease | None = None
        self.lost = asyncio.Event()  # another holder drives the session now: stop
        self.unkept = False  # the store failed: writes are given up, the session goes on
        self._queue: asyncio.Queue[tuple[Write, asyncio.Future[bool] | None] | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._payload_bytes = payload_bytes
        self._payloads: collections.deque[tuple[int, int]] = collections.deque()  # (index, size) kept
        self._kept_bytes = 0
        self._ended = False
        self._resume_hash = ""  # the live resume token's, as its renewals name it

    def start(self, lease: Lease | None = None) -> asyncio.Future[bool]:
        """Hold the session (a lease already acquired, or a new one), then write what was and is
        submitted, in order, and renew; the future says whether the session is held."""
        held = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.ensure_future(self._write_all(lease, held))]
        return held

    def put(self, fields: Mapping[str, str]) -> None:
        self._submit(lambda lease: self._store.put(self.sid, lease, fields))

    def handed_out(self, text: str, index: int | None, data: bytes | None) -> None:
        """A frame the owner's socket took (its metadata text, and a chunk's payload and index)."""
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
        self._submit(lambda lease: self._store.append(self.sid, lease, [FRAME + text], payload))

    def payloads_kept(self, kept: Iterable[tuple[int, int]]) -> None:
        """A session taken over: the payloads (index, size) the store keeps of it already."""
        for index, size in kept:
            self._payloads.append((index, size))
            self._kept_bytes += size

    def bind(self, tokens: Mapping[str, str]) -> None:
        """The session's live tokens, by kind, as hashes: any replica finds the session by them;
        its renewals name the live resume token's (a handoff asked with an older one is dropped)."""
        self._resume_hash = tokens.get("resume", self._resume_hash)
        for kind, token_hash in tokens.items():
            self._submit(functools.partial(self._bound, kind, token_hash))

    def unbind(self, kind: str, token_hash: str) -> None:
        """A token that no longer opens the session (a revoked steer token): no replica finds it."""
        self._submit(functools.partial(self._unbound, kind, token_hash))

    async def _unbound(self, kind: str, token_hash: str, _: Lease) -> bool:
        await self._store.unbind_token(kind, token_hash)
        return True

    async def _bound(self, kind: str, token_hash: str, _: Lease) -> bool:
        await self._store.bind_token(kind, token_hash, self.sid)
        return True

    async def event(self, payload: str | None) -> None:
        """Returns once the interaction (as forwarded) is in the store, or the store is given up
        on; None (a retry, stored already) waits for the writes before it, so acks keep order."""
        entries = [] if payload is None else [EVENT + payload]
        done = self._submit(lambda lease: self._store.append(self.sid, lease, entries, None), wait=True)
        if done is not None:
            await done

    def _submit(self, write: Callable[[Lease], Awaitable[bool]], wait: bool = False) -> asyncio.Future[bool] | None:
        if not self._tasks or self._ended or self.unkept or self.lost.is_set():
            return None
        future = asyncio.get_running_loop().create_future() if wait else None
        self._queue.put_nowait((write, future))
        return future

    async def _write_all(self, lease: Lease | None, held: asyncio.Future[bool]) -> None:
        got = lease or await self._call("acquire", lambda: self._store.acquire(self.sid, self._holder, self._ttl))
        if isinstance(got, Lease):
            self.lease = got
            if not self._ended:  # ended before it began: nothing to renew
                self._tasks.append(asyncio.ensure_future(self._renew_all()))
        elif not self.unkept:
            self.lost.set()  # another replica holds it
        held.set_result(self.lease is not None)
        while (item := await self._queue.get()) is not None:
            write, future = item
            ok: object = False
            if self.lease is not None and not (self.unkept or self.lost.is_set()):
                held_lease = self.lease
                ok = await self._call("write", functools.partial(write, held_lease))
                if ok is False and not self.unkept:
                    self.lost.set()  # the lease is not ours any more: stop driving
            if future is not None and not future.done():
                future.set_result(bool(ok))

    async def _renew_all(self) -> None:
        lease = self.lease
        assert lease is not None
        while not (self.lost.is_set() or self.unkept or self._ended):
            await asyncio.sleep(self._ttl / 3)
            ok = await self._call("renew", lambda: self._store.renew(self.sid, lease, self._ttl, self._resume_hash))
            if ok is False:
                log.warning("session=%s lease lost (taken over, or a handoff asked)", self.sid)
                self.lost.set()

    async def _call(self, what: str, call: Callable[[], Awaitable[object]]) -> object:
        began = time.perf_counter()
        try:
            result = await call()
        except StoreUnavailable as exc:
            self._observe(what, time.perf_counter() - began, False)
            if not self.unkept:
                log.error("session=%s the session store failed (%s): the session goes on without it", self.sid, exc)
            self.unkept = True
            return None
        self._observe(what, time.perf_counter() - began, True)
        return result

    async def end(self, *, forget: bool) -> None:
        """The session ends here (`forget`: and nobody is to continue it) or is handed off (its
        writes done, its lease released, its record kept for the replica that goes on). Once."""
        if self._ended:
            return
        self._ended = True
        self._queue.put_nowait(None)
        if self._tasks:  # the writes first, to the last (the lease renewed meanwhile), then the renewals
            await asyncio.gather(self._tasks[0], return_exceptions=True)
        for task in self._tasks[1:]:
            task.cancel()
        await asyncio.gather(*self._tasks[1:], return_exceptions=True)
        lease = self.lease
        if lease is not None and not self.unkept:  # a lease taken by another is not released: fenced
            await self._call("release", lambda: self._store.release(self.sid, lease))
            if forget and not self.lost.is_set():
                await self._call("drop", lambda: self._store.drop(self.sid))
