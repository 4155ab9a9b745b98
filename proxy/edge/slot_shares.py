"""The share of the model's slots each client holds (`ProxySettings.sessions_per_client`),
counted by every replica of a shared session store.

Each session is an entry under its client's group (`ProxySettings.client_group`) in the store
(`SessionStore.claim_share`), made in one atomic step when the session is admitted, renewed
by this proxy while the session lives here (every `SHARE_SECONDS` / 3), and released when it
ends here; a replica that dies stops counting within `SHARE_SECONDS`. A session a replica takes
over keeps its entry (the same member, the session's id in the store), so it is never counted
twice. With the in-process store (one proxy) the same calls count this proxy's sessions.

When the store does not answer, admission falls back to this proxy's own count (the client's
sessions here and the admissions in flight): the bound then holds per replica only, as it did
before it was shared, and sessions go on being admitted (docs/operations.md "Per proxy or per service").
This class is the one writer of what it counts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar

from rtvideo.proxy.store.base import SessionStore, StoreUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

#: how long a session's entry in its client's share lives unless renewed: a dead replica's
#: sessions stop counting this long after its last renewal
SHARE_SECONDS = 10.0


class SlotShares:
    """This proxy's sessions, each counted against its client's share of the model's slots."""

    def __init__(self, store: SessionStore, observe: Callable[[str, float, bool], None]) -> None:
        self._store = store
        self._observe = observe  # (call, seconds, ok): as the store's other calls are counted
        self._counted: dict[Hashable, tuple[str, str]] = {}  # session → (group, member)
        self._pending: collections.Counter[str] = collections.Counter()  # admissions in flight, by group
        self._renewals: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()  # set by `close`: the renewals stop (a cancel alone may be swallowed by a call)
        self._failing = False

    def held_here(self, group: str) -> int:
        """The client's sessions on this proxy (and its admissions in flight)."""
        return sum(1 for counted, _ in self._counted.values() if counted == group) + self._pending[group]

    async def claim(self, group: str, member: str, share: int) -> int | None:
        """Counts the session `member` against `group` when the client holds fewer than `share`
        sessions on every replica: None; else how many it holds (the start is refused). The
        caller hands the session to `count` once made, or `release`s the claim."""
        self._pending[group] += 1
        try:
            try:
                counted, held = await self._call(
                    "claim_share", self._store.claim_share(group, member, share, SHARE_SECONDS)
                )
            except StoreUnavailable:  # this proxy's own count, as before the store was shared
                held = self.held_here(group) - 1
                counted = held < share
        finally:
            self._pending[group] -= 1
            if not self._pending[group]:
                del self._pending[group]
        return None if counted else held

    def count(self, session: Hashable, group: str, member: str) -> None:
        """`session` (admitted by `claim`, or taken over from another replica) counts against
        `group` while it lives here (renewed with the others)."""
        self._counted[session] = (group, member)
        if (self._renewals is None or self._renewals.done()) and not self._closed.is_set():
            self._renewals = asyncio.ensure_future(self._renew_all())

    def release(self, session: Hashable) -> Awaitable[None] | None:
        """`session` ended here: its entry goes (a failed call leaves it to expire)."""
        entry = self._counted.pop(session, None)
        if entry is None:
            return None
        return asyncio.ensure_future(self.release_claim(*entry))

    async def release_claim(self, group: str, member: str) -> None:
        """A claim whose session was never made (its connection went meanwhile), or one ended."""
        with contextlib.suppress(StoreUnavailable):  # else it expires within SHARE_SECONDS
            await self._call("release_share", self._store.release_share(group, member))

    async def close(self) -> None:
        self._closed.set()
        task, self._renewals = self._renewals, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _renew_all(self) -> None:
        """While this proxy counts sessions: each one's entry renewed every SHARE_SECONDS / 3
        (one call for all), so that it never expires while its session lives here."""
        while self._counted and not self._closed.is_set():
            try:
                await self._call("renew_shares", self._store.renew_shares(list(self._counted.values()), SHARE_SECONDS))
                if self._failing:
                    log.info("the session store counts the clients' shares of the slots again")
                self._failing = False
            except StoreUnavailable as exc:
                if not self._failing:
                    log.warning("the clients' shares of the slots are counted per replica: %s", exc)
                self._failing = True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closed.wait(), SHARE_SECONDS / 3)

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        began = time.perf_counter()
        try:
            result = await call
        except StoreUnavailable:
            self._observe(what, time.perf_counter() - began, False)
            raise
        self._observe(what, time.perf_counter() - began, True)
        return result
