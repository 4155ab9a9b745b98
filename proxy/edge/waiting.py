"""The waiting share: upgraded connections that have not sent their first message yet, held to a
share of --max-connections, and each client (`ProxySettings.client_group`) to its part of it.

Why a part per client: with one share for all, one address opening a dozen upgrades a second
and never starting took every place, and another address's upgrades were refused (503). Why a
queue instead of a refusal: a burst of honest clients (40 connecting at once, each sending its
start at once) is more upgrades than a part, but each leaves the share as soon as its start is
read; an upgrade over its client's part is held, unanswered, until a place of that client's
frees, for at most `patience` seconds, and only then refused (503 `awaiting_start`).

Invariants (this class is the one writer of the share):
- a client never holds more than `part` places, and all clients together never more than `bound`;
- a connection is displaced (its `displace`) only by a newcomer of its own client, or by any
  newcomer while the whole share is full, and only once it has held its place for `grace`
  seconds: a start that arrives promptly never loses its place;
- queued upgrades of one client get places in the order they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

#: a queued upgrade looks again at least this often (a place may free by a waiter's grace ending)
RECHECK_SECONDS = 0.25


class Waiter(Protocol):
    """A connection in the share: the client it counts against, and its way out when displaced."""

    @property
    def group(self) -> str: ...

    def displace(self, held: float) -> None:
        """It held its place `held` seconds without a first message: it is refused (and leaves)."""
        ...


W = TypeVar("W", bound=Waiter)


class WaitingShare(Generic[W]):
    """Connections waiting for their first message, by client: at most `bound` in all (the
    settings' `awaiting_start_bound`), `part` of one client (`awaiting_start_per_client`); one
    that held its place `grace` seconds may be displaced (AWAITING_START_GRACE_SECONDS)."""

    def __init__(self, bound: int, part: int, grace: float) -> None:
        self.bound, self.part, self.grace = bound, min(part, bound), grace
        self._placed: dict[str, dict[W, float]] = {}  # client → its waiters, oldest first, and when placed
        self._queued: dict[str, list[W]] = {}  # client → upgrades held for a place, in order
        self._changed: asyncio.Event | None = None  # set (and replaced) whenever a place frees

    # --- what the handler and the server read -------------------------------------------------
    def __len__(self) -> int:
        return sum(len(placed) for placed in self._placed.values())

    def __iter__(self) -> Iterator[W]:
        return iter([w for placed in self._placed.values() for w in placed])

    def __contains__(self, waiter: object) -> bool:
        return any(waiter in placed for placed in self._placed.values())

    def held(self, group: str) -> int:
        """How many places the client `group` holds."""
        return len(self._placed.get(group, {}))

    def queued(self, group: str) -> int:
        """How many upgrades of the client `group` are held for a place."""
        return len(self._queued.get(group, ()))

    # --- admission ------------------------------------------------------------------------------
    def place(self, waiter: W) -> bool:
        """A place for `waiter` now, if there is one and no earlier upgrade of its client is
        queued (displacing one that waited past the grace where needed); False: queue it (`enter`)."""
        return not self._queued.get(waiter.group) and self._take(waiter)

    async def enter(self, waiter: W, patience: float) -> bool:
        """A place for `waiter`, waiting for one up to `patience` seconds behind the earlier
        upgrades of its client; False when none freed (or `leave` was called meanwhile)."""
        if self.place(waiter):
            return True
        queue = self._queued.setdefault(waiter.group, [])
        queue.append(waiter)
        deadline = time.monotonic() + patience
        try:
            while waiter in queue:
                if queue[0] is waiter and self._take(waiter):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                changed = self._changed = self._changed or asyncio.Event()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, RECHECK_SECONDS))
            return False
        finally:
            if waiter in queue:
                queue.remove(waiter)
            if not queue:
                self._queued.pop(waiter.group, None)
            self._notify()  # the next in line looks now

    def leave(self, waiter: W) -> None:
        """`waiter` started, was refused, or closed: its place (or its place in the queue) frees."""
        placed = self._placed.get(waiter.group)
        if placed is not None and placed.pop(waiter, None) is not None:
            if not placed:
                del self._placed[waiter.group]
            self._notify()
        queue = self._queued.get(waiter.group)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self._notify()

    def _take(self, waiter: W) -> bool:
        group, now = waiter.group, time.monotonic()
        mine = self._placed.get(group, {})
        if len(mine) >= self.part:
            candidates = [next(iter(mine.items()))]  # the client's own oldest
        elif len(self) >= self.bound:
            candidates = [next(iter(placed.items())) for placed in self._placed.values()]  # anyone's oldest
        else:
            candidates = []
        if candidates:
            oldest, since = min(candidates, key=lambda item: item[1])
            if now - since < self.grace:
                return False
            self.leave(oldest)
            oldest.displace(now - since)
        self._placed.setdefault(group, {})[waiter] = now
        return True

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
