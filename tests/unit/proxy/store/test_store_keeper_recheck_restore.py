"""A recovery a resume's `recheck` drives (rtvideo.proxy.store.keeper) runs beside the keeper's
writer, which goes on mirroring what the session hands out while the keeper is not KEPT. A
restore reads its record over several store calls (the Redis store writes the log in batches,
then the payloads): what was mirrored meanwhile is written too before the keeper is KEPT, or
the store would miss frames this keeper holds, with later writes appended after the gap."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from rtvideo.proxy.store.base import FRAME, Lease
from rtvideo.proxy.store.keeper import StoreKeeper, StoreState
from tests.unit.proxy.store.test_store_keeper_faults import SID, FaultyStore, run, until


class SlowRestore(FaultyStore):
    """A restore that read its record, then takes until `go` is set to be written."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.go.set()
        self.restoring = asyncio.Event()

    async def restore(
        self, sid: str, lease: Lease, fields: Mapping[str, str], log: Sequence[str], payloads: Mapping[int, bytes]
    ) -> bool:
        fields, log, payloads = dict(fields), list(log), dict(payloads)  # read as a batched restore reads it
        self.restoring.set()
        await self.go.wait()
        return await self.inner.restore(sid, lease, fields, log, payloads)


def test_what_is_handed_out_during_a_rechecks_restore_is_in_the_store_once_kept() -> None:
    async def body() -> tuple[Any, StoreState]:
        store = SlowRestore()
        keeper = StoreKeeper(store, SID, "a", lambda *_: None, lease_seconds=6.0, call_seconds=0.5)  # type: ignore[arg-type]
        assert await keeper.start()
        keeper.put({"request_id": "r"})
        keeper.handed_out('{"chunk": 0}', 0, b"zero")
        await until(lambda: bool(store.inner._sessions.get(SID) and store.inner._sessions[SID].log))
        store.stall()
        keeper.handed_out('{"chunk": 1}', 1, b"one")  # its write fails: AWAY, kept here
        await until(lambda: keeper.state is StoreState.AWAY)
        store.go.clear()
        store.unstall()
        rechecked = asyncio.ensure_future(keeper.recheck())  # a resume at this replica
        await store.restoring.wait()
        keeper.handed_out('{"chunk": 2}', 2, b"two")  # mirrored by the writer, after the restore read
        for _ in range(20):
            await asyncio.sleep(0)
        store.go.set()
        assert await rechecked
        stored = await store.inner.load(SID)
        state = keeper.state
        await keeper.end(forget=False)
        return stored, state

    stored, state = run(body)
    assert state is StoreState.KEPT
    assert stored is not None
    assert list(stored.log) == [FRAME + '{"chunk": 0}', FRAME + '{"chunk": 1}', FRAME + '{"chunk": 2}'], stored.log
    assert stored.payloads == {0: b"zero", 1: b"one", 2: b"two"}
