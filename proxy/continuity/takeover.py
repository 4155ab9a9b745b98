"""A resume that reaches a replica which does not hold its session (docs/operations.md "When a
proxy dies"): with a shared session store, any replica serves any session.

The token is found in the store by its hash; the session's lease is taken: at once when its
holder released it (a shutdown) or its lease ran out (the holder went), else the live holder
is asked to let go (it sees that at its next renewal, within a third of the lease) and the
lease is taken as soon as it is free, within `ProxySettings.takeover_wait_seconds`; a holder whose owner is
attached and answers a ping declines, and the resume is refused as one proxy refuses it. Then the session is read
back (rtvideo.proxy.continuity.record) and rebuilt here: its owner is given what a resume gives,
and its stream goes on on a Triton with room at the next chunk (a move). Two replicas never
both drive it: the lease has one holder, and every write names it.

A resume the store cannot serve is refused with `invalid_resume` as on one proxy: an unknown
or used token, a session past its grace, an index the store no longer keeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from rtvideo.core.resume import ResumeRefused, ResumeRequest
from rtvideo.proxy.continuity.record import SavedFrame, SavedSession, token_hash
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.base import Lease, SessionStore, StoredSession, StoreUnavailable
from rtvideo.proxy.store.keeper import StoreKeeper

log = logging.getLogger(__name__)
T = TypeVar("T")


class Takeable(Protocol):
    """What a takeover needs of the session it opens (rtvideo.proxy.session.session `ProxySession`)."""

    def take_over(self, saved: SavedSession, last: int, token: str) -> None:
        """Become `saved`, its owner back with `token` from the pair `last`; ResumeRefused if not."""
        ...

    def untaken(self) -> None:
        """The takeover could not be completed: closed here, the record kept."""
        ...


S = TypeVar("S", bound=Takeable)

#: a resume refused because the session's owner is attached and answering (as on one proxy)
ATTACHED = "the session is attached to another connection (one controller at a time)"
#: how far a resume's index may be ahead of the last pair the store kept. A chunk goes to the
#: client before its write to the store (no chunk waits for the store), so a holder that dies
#: leaves the client up to the pairs in flight ahead of its record: those are made again from
#: the store's position (the events in them are all kept: an ack follows its write) and not sent
#: again (ProxySession.take_over). The keeper writes in order, one call at a time, taking a few
#: milliseconds while the store answers: at most the pair being written and one behind it are in
#: flight. A client further ahead was handed what the store never got while it was away; the
#: holder may still be writing it back, so the session is never taken half: refused.
UNKEPT_TAIL_CHUNKS = 2
#: how often the lease is asked for while a resume waits for a live holder to let go (or its
#: lease to run out: `ProxySettings.takeover_wait_seconds`)
_POLL_SECONDS = 0.1
#: a holder whose last renewal is older than this part of a lease missed one (it renews every
#: third of a lease): presumed gone, its lease waited out (`expired`) rather than handed off
_SILENT_LEASES = 2 / 3


async def take_over(
    store: SessionStore,
    request: ResumeRequest,
    open_session: Callable[[StoreKeeper], S],
    new_keeper: Callable[[str], StoreKeeper],
    holder: str,
    settings: ProxySettings,
    metrics: ProxyMetrics,
) -> S:
    """The session `request` resumes, taken over from the store and attached to the owner
    `open_session` is made with; ResumeRefused when it cannot be (nothing is held then).
    `settings`: its lease and how long a resume waits for it (`takeover_wait_seconds`)."""
    began = time.monotonic()
    hashed = token_hash(request.resume_token)
    calls = _Calls(store, metrics)
    try:
        sid = await calls.run("find", store.find("resume", hashed))
        if sid is None:
            raise ResumeRefused("unknown token")
        last = request.last_transport_chunk_index

        def servable(found: StoredSession) -> None:  # before the lease is taken: a refusal bumps no epoch
            _check(found, found, hashed, last, settings)

        lease, reason, before = await _lease(calls, sid, holder, hashed, servable, settings)
        try:
            stored = await calls.run("load", store.load(sid))
        except BaseException:
            await store.release(sid, lease)
            raise
    except StoreUnavailable as exc:
        log.error("a resume could not reach the session store: %s", exc)
        raise ResumeRefused("the session store is unreachable: the session cannot be continued here") from None
    keeper = new_keeper(sid)
    keeper.start(lease, stored)
    try:
        saved = _check(stored, before, hashed, request.last_transport_chunk_index, settings)
        session = open_session(keeper)
    except BaseException:
        await keeper.end(forget=False)
        raise
    try:
        session.take_over(saved, request.last_transport_chunk_index, request.resume_token)
    except ResumeRefused:
        session.untaken()
        raise
    metrics.taken_over(reason, time.monotonic() - began)
    log.info("request_id=%s taken over (%s) in %.3f s", saved.request_id, reason, time.monotonic() - began)
    return session


class _Calls:
    """The takeover's store calls, timed and counted as the keepers' are."""

    def __init__(self, store: SessionStore, metrics: ProxyMetrics) -> None:
        self.store = store
        self._metrics = metrics

    async def run(self, call: str, coro: Awaitable[T]) -> T:
        began = time.perf_counter()
        try:
            result = await coro
        except StoreUnavailable:
            self._metrics.store_call(call, time.perf_counter() - began, False)
            raise
        self._metrics.store_call(call, time.perf_counter() - began, True)
        return result


async def _lease(
    calls: _Calls,
    sid: str,
    holder: str,
    hashed: str,
    servable: Callable[[StoredSession], None],
    settings: ProxySettings,
) -> tuple[Lease, str, StoredSession]:
    """The session's lease, why it was to be had, and the session as it was before: `free` (its
    holder released it: a shutdown), `expired` (its holder stopped renewing: it died), `handoff`
    (a live holder let go when asked)."""
    store = calls.store
    found = await calls.run("load", store.load(sid))
    if found is None:
        raise ResumeRefused("the session has ended")
    if found.holder is None:
        # Nobody holds it, so its lease is taken at once: a resume the record cannot serve (a used
        # token, an index it never kept: a holder cut off from the store handed out more than it
        # holds) is refused first, since taking the lease bumps the epoch, and that holder, back,
        # would take it for another replica having driven the session, and let it go. (A live
        # holder finishes its writes before it lets go: the record is checked after.)
        servable(found)
    ttl = settings.lease_seconds
    silent = found.holder is None or found.age > ttl * _SILENT_LEASES
    why = "free" if found.fields.get("released") else "expired"
    lease = await calls.run("acquire", store.acquire(sid, holder, ttl))
    if lease is not None:
        return lease, why if found.holder is None else "expired", found
    if json.loads(found.fields.get("tokens") or "{}").get("resume") != hashed:
        raise ResumeRefused("this token was used already: each resume hands out a new one")
    await calls.run("ask_handoff", store.ask_handoff(sid, hashed))  # a holder resumed with it keeps the session
    deadline = time.monotonic() + settings.takeover_wait_seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
        lease = await calls.run("acquire", store.acquire(sid, holder, ttl))
        if lease is not None:
            return lease, "expired" if silent else "handoff", found
        if await calls.run("handoff_declined", store.handoff_declined(sid, hashed)):
            raise ResumeRefused(ATTACHED)  # its owner there answers: as one proxy refuses it
    raise ResumeRefused("the session is held by another proxy that did not let go; try again")


def _check(
    stored: StoredSession | None, before: StoredSession, hashed: str, last: int, settings: ProxySettings
) -> SavedSession:
    """The session as stored, if this resume may continue it; ResumeRefused saying why not.
    `before`: as it was before this replica took its lease (how long its holder was silent)."""
    if stored is None:
        raise ResumeRefused("the session has ended")
    if stored.fields.get("restoring"):  # its holder is writing it again after a store fault: never half
        raise ResumeRefused("the session is being written back to the store by its proxy; resume again")
    try:
        saved = dataclasses.replace(SavedSession.read(stored), age=before.age)
    except (ValueError, KeyError) as exc:
        raise ResumeRefused(f"the session cannot be continued: {exc}") from None
    if saved.token_hashes.get("resume") != hashed:
        raise ResumeRefused("this token was used already: each resume hands out a new one")
    away = time.time() - saved.detached_at if saved.detached_at is not None else saved.age
    grace = settings.resume_grace_seconds
    if away > grace + settings.lease_seconds:
        raise ResumeRefused(f"expired: the session was not resumed within {grace:g} s")
    newest = oldest = -1  # the last pair handed out; the last whose payload is not kept
    for entry in saved.log:
        if isinstance(entry, SavedFrame) and entry.index is not None:
            newest = entry.index
            oldest = entry.index if entry.data is None else oldest
    if last > newest + UNKEPT_TAIL_CHUNKS:
        raise ResumeRefused(f"last_transport_chunk_index {last} was never sent (the last payload kept is {newest})")
    if last < oldest:
        raise ResumeRefused(
            f"last_transport_chunk_index {last} is older than what is kept; the oldest resumable index is {oldest}",
            oldest,
        )
    return saved
