"""What this proxy finds of its session store, and the records it still has to drop.

`StoreWatch` looks at a shared store every `WATCH_SECONDS`: whether it answers, and whether it
takes a write (`SessionStore.ping`: a store that answers but refuses writes, full at its
`maxmemory` or a read-only replica, raises `StoreRefusing`). The last look is its `state`
(`/readyz`, the `rtvideo_proxy_store_state` gauge, the alert `RtvideoSessionStoreRefusingWrites`);
`/healthz` looks afresh (`look`), the watch's rounds every `WATCH_SECONDS` (`tend`).

It also holds the records that a session's keeper could not drop at the session's end (the store
was away or refused it): each is dropped at the first look that finds the store taking writes,
fenced by the lease it was held under (`SessionStore.drop`: a session another replica acquired
since is not touched). Their number is bounded (`MAX_PENDING`, the oldest forgotten first), and
each is forgotten once its keys have expired anyway (`keep_seconds` after its last write), so a
store away for long costs this proxy a bounded set and nothing else.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from rtvideo.proxy.store.base import Lease, SessionStore, StoreRefusing, StoreUnavailable

log = logging.getLogger(__name__)

#: how often a shared store is looked at (and pending drops retried)
WATCH_SECONDS = 5.0
#: how long one look may take before the store is taken for unreachable
LOOK_SECONDS = 1.0
#: the most records waiting for their drop (beyond, the oldest is left to its keys' expiry)
MAX_PENDING = 10_000

SHARED, REFUSING_WRITES, UNREACHABLE, MEMORY = "shared", "refusing_writes", "unreachable", "memory"


class StoreWatch:
    """The session store's state as this proxy last found it, and the drops it still owes."""

    def __init__(
        self,
        store: SessionStore,
        found: Callable[[str], None],
        observe: Callable[[str, float, bool], None],
        keep_seconds: float,
        every: float = WATCH_SECONDS,
    ) -> None:
        self._store = store
        self._found = found  # the state gauge (ProxyMetrics.store_found)
        self._observe = observe  # (call, seconds, ok): the store's latency and errors
        self._keep = keep_seconds
        self._every = every
        self.state = SHARED if store.shared else MEMORY
        self._pending: collections.OrderedDict[str, tuple[Lease, float]] = collections.OrderedDict()
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Records still to drop."""
        return len(self._pending)

    def start(self) -> None:
        """Look now and every `every` seconds (a shared store only)."""
        if self._store.shared and self._task is None:
            self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def later(self, sid: str, lease: Lease) -> None:
        """`sid`'s record (held under `lease`) is to be dropped once the store takes writes."""
        self._pending.pop(sid, None)
        self._pending[sid] = (lease, time.monotonic() + self._keep)
        while len(self._pending) > MAX_PENDING:
            self._pending.popitem(last=False)
        log.warning("session=%s its record could not be dropped from the session store: dropped once it answers", sid)

    async def look(self) -> str:
        """The store's state now (`memory` without a shared store): one ping and one probe write,
        each bounded (what `/healthz` waits for)."""
        if not self._store.shared:
            return MEMORY
        try:
            await asyncio.wait_for(self._store.ping(), LOOK_SECONDS)
        except StoreRefusing:
            state = REFUSING_WRITES
        except (StoreUnavailable, asyncio.TimeoutError):
            state = UNREACHABLE
        else:
            state = SHARED
        if state != self.state:
            log.log(logging.INFO if state == SHARED else logging.ERROR, "the session store is %s now", state)
        self.state = state
        self._found(state)
        return state

    async def tend(self) -> str:
        """One round of the watch: a look, and the pending drops made when the store takes writes."""
        state = await self.look()
        if state == SHARED and self._pending:
            await self._drop_pending()
        return state

    async def _drop_pending(self) -> None:
        now = time.monotonic()
        for sid, (lease, until) in list(self._pending.items()):
            if until < now:  # its keys expired meanwhile: nothing is left to drop
                self._pending.pop(sid, None)
                continue
            began = time.perf_counter()
            try:
                await self._store.drop(sid, lease)
            except StoreUnavailable:
                self._observe("drop", time.perf_counter() - began, False)
                return  # away again: the next look tries the rest
            self._observe("drop", time.perf_counter() - began, True)
            self._pending.pop(sid, None)
            log.info("session=%s its record was dropped from the session store after its end", sid)

    async def _watch(self) -> None:
        while True:
            try:
                await self.tend()
            except Exception:  # a look must never end the watch
                log.exception("looking at the session store failed")
            await asyncio.sleep(self._every)
