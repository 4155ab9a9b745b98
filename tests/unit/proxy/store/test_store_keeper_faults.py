"""The keeper's relation to a store that stalls, refuses writes, forgets everything or hands the
session to another holder (rtvideo.proxy.store.keeper, docs/decisions.md "The session store
under faults"), on a store that does what a test says, in front of the in-process store: an
event is kept or refused (never acked unkept), the keeper stops driving before its lease could
lapse, and what it kept meanwhile is written back whole, or it lets go."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rtvideo.core.resume import ResumeRefused, ResumeRequest
from rtvideo.proxy.continuity.takeover import take_over
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.settings import ProxySettings
from rtvideo.proxy.store.base import EVENT, FRAME, StoreRefusing
from rtvideo.proxy.store.keeper import StoreKeeper, StoreState
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import begin, reply
from tests.unit.proxy.continuity.test_takeover_restore import SID as HELD
from tests.unit.proxy.continuity.test_takeover_restore import held_session, replica, settle
from tests.unit.proxy.session.test_moves import CONFIG, interaction

T = TypeVar("T")
SID = "s-faults"
#: every wait here only bounds a hang: the machine may be slow
DEADLINE = 20.0
#: the writes a full Redis refuses (OOM): those that may grow it, a renewal's included
WRITES = frozenset({"put", "append", "restore", "acquire", "renew", "bind_token"})


class FaultyStore:
    """The in-process store behind faults a test turns on and off: `stalled` (no call answers
    until it is off: a SIGSTOP), `refusing` (writes refused: a full Redis), `forget` (restarted
    empty)."""

    shared = True
    cluster = "shared"

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self._answering = asyncio.Event()
        self._answering.set()
        self.refusing = False

    def stall(self) -> None:
        self._answering.clear()

    def unstall(self) -> None:
        self._answering.set()

    def forget(self) -> None:
        self.inner = MemoryStore()

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            await self._answering.wait()
            if self.refusing and name in WRITES:
                raise StoreRefusing(f"session store {name}: OOM command not allowed")
            return await getattr(self.inner, name)(*args, **kwargs)

        return call


def keeper_of(store: FaultyStore, lease: float = 0.6, margin: float | None = None) -> StoreKeeper:
    return StoreKeeper(store, SID, "a", lambda *_: None, lease_seconds=lease, call_seconds=0.1, margin=margin)  # type: ignore[arg-type]


async def until(check: Callable[[], Awaitable[bool]] | Callable[[], bool]) -> None:
    """Until `check` holds (a hang fails at DEADLINE)."""

    async def poll() -> None:
        while True:
            result = check()
            if result is True or (not isinstance(result, bool) and await result):
                return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), DEADLINE)


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(body(), 3 * DEADLINE))


def test_a_short_stall_refuses_the_event_it_cannot_keep_and_writes_the_rest_back() -> None:
    async def body() -> tuple[list[str], bool, bool, bool]:
        store = FaultyStore()
        keeper = keeper_of(store)
        assert await keeper.start()
        keeper.put({"request_id": "r"})
        assert await keeper.event('{"e": 1}')
        store.stall()
        during = await keeper.event('{"e": 2}')  # answered once its call is over: not kept
        away = keeper.state is StoreState.AWAY
        keeper.handed_out('{"chunk": 1}', 1, b"one")  # the video goes on: kept here meanwhile
        store.unstall()
        await until(lambda: keeper.kept)
        after = await keeper.event('{"e": 3}')
        stored = await store.inner.load(SID)
        await keeper.end(forget=False)
        assert stored is not None and stored.payloads == {1: b"one"} and stored.fields["request_id"] == "r"
        return list(stored.log), during, away, after

    log, during, away, after = run(body)
    assert not during and away and after
    assert log == [EVENT + '{"e": 1}', FRAME + '{"chunk": 1}', EVENT + '{"e": 3}']  # the refused one is not


def test_a_stall_longer_than_the_lease_stops_driving_before_the_lease_lapses_and_another_holder_wins() -> None:
    async def body() -> tuple[str | None, bool, list[str], bool]:
        store = FaultyStore()
        keeper = keeper_of(store, lease=2.0, margin=1.0)  # a wide margin: a slow machine stays within it
        assert await keeper.start()
        assert await keeper.event('{"e": 1}')
        store.stall()
        await until(lambda: keeper.state is StoreState.UNHELD)
        holding = await store.inner.holding(SID)  # the store (not stalled for the test) still says "a"
        rechecked = await keeper.recheck()  # a resume here now: refused, the store does not answer
        while await store.inner.acquire(SID, "b", 30.0) is None:  # a takeover elsewhere, once it lapsed
            await asyncio.sleep(0.05)
        taken = await store.inner.holding(SID)
        assert taken is not None and taken.holder == "b"
        store.unstall()
        await asyncio.wait_for(keeper.lost.wait(), DEADLINE)
        keeper.handed_out('{"late": 1}', None, None)  # nothing written any more
        await keeper.end(forget=True)  # nor dropped: b holds it
        stored = await store.inner.load(SID)
        assert stored is not None
        return None if holding is None else holding.holder, rechecked, list(stored.log), keeper.kept

    holder, rechecked, log, kept = run(body)
    assert holder == "a" and not rechecked and not kept
    assert log == [EVENT + '{"e": 1}']


def test_a_stall_longer_than_the_lease_nobody_used_is_recovered_under_the_next_epoch() -> None:
    async def body() -> tuple[int, int, list[str], bool]:
        store = FaultyStore()
        keeper = keeper_of(store)
        assert await keeper.start()
        first = keeper.lease
        assert first is not None and await keeper.event('{"e": 1}')
        store.stall()
        await until(lambda: keeper.state is StoreState.UNHELD)
        keeper.handed_out('{"chunk": 1}', None, None)
        await asyncio.sleep(0.7)  # past the lease: it lapses in the store
        store.unstall()
        rechecked = await keeper.recheck()  # a resume at this front: checked in the store, recovered
        await until(lambda: keeper.kept)
        stored = await store.inner.load(SID)
        assert stored is not None and keeper.lease is not None
        epoch = keeper.lease.epoch
        await keeper.end(forget=True)
        return first.epoch, epoch, list(stored.log), rechecked

    before, after, log, rechecked = run(body)
    assert after == before + 1 and rechecked
    assert log == [EVENT + '{"e": 1}', FRAME + '{"chunk": 1}']


def test_a_store_restarted_empty_gets_the_whole_record_and_the_tokens_back() -> None:
    async def body() -> None:
        store = FaultyStore()
        keeper = keeper_of(store)
        assert await keeper.start()
        keeper.bind({"resume": "r1", "watch": "w1"})
        keeper.put({"request_id": "r", "tokens": '{"resume": "r1"}'})
        keeper.handed_out('{"chunk": 0}', 0, b"zero")
        assert await keeper.event('{"e": 1}')
        store.forget()  # restarted empty: the next renewal finds nothing

        async def restored() -> bool:
            stored = await store.inner.load(SID)
            return keeper.kept and stored is not None and len(stored.log) == 2

        await until(restored)
        stored = await store.inner.load(SID)
        assert stored is not None and stored.fields["request_id"] == "r" and stored.payloads == {0: b"zero"}
        assert list(stored.log) == [FRAME + '{"chunk": 0}', EVENT + '{"e": 1}']
        assert await store.inner.find("resume", "r1") == SID and await store.inner.find("watch", "w1") == SID
        assert stored.holder == "a" and not stored.fields.get("restoring")
        assert await keeper.event('{"e": 2}')  # kept again
        await keeper.end(forget=True)
        assert await store.inner.load(SID) is None  # its end drops it

    run(body)


def test_a_store_refusing_writes_refuses_events_and_the_session_is_kept_once_it_takes_them() -> None:
    async def body() -> tuple[bool, list[str]]:
        store = FaultyStore()
        keeper = keeper_of(store)
        assert await keeper.start()
        store.refusing = True
        refused = await keeper.event('{"e": 1}')
        keeper.handed_out('{"chunk": 1}', None, None)
        assert await keeper.event(None) is True  # a retry of a stored event: nothing to write
        store.refusing = False
        await until(lambda: keeper.kept)
        assert await keeper.event('{"e": 2}')
        stored = await store.inner.load(SID)
        assert stored is not None
        await keeper.end(forget=True)
        return refused, list(stored.log)

    refused, log = run(body)
    assert not refused
    assert log == [FRAME + '{"chunk": 1}', EVENT + '{"e": 2}']


def test_a_session_answers_store_unavailable_forwards_nothing_and_takes_the_retry_once_kept() -> None:
    """Through a real session (a fake Triton): an interaction the store cannot keep is answered
    `store_unavailable`, never acked nor sent to the model; sent again once the store takes it,
    it is acked and sent once."""

    async def body() -> tuple[list[dict[str, Any]], list[str]]:
        store = FaultyStore()
        s, conn, bridge, keeper = replica(store, "a")  # type: ignore[arg-type]
        begin(s)
        s.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
        await until(lambda: keeper.kept)
        store.refusing = True
        s.steering.frame(s.owner, interaction("p1", "a storm"), False)
        await until(lambda: any(m.get("event_id") == "p1" for m in conn.texts()))
        store.refusing = False
        await until(lambda: keeper.kept)
        s.steering.frame(s.owner, interaction("p1", "a storm"), False)
        await until(lambda: any(m["type"] == "session.interaction.queued" for m in conn.texts()))
        await settle()
        sent = [json.loads(raw)["interaction"]["event_id"] for raw, start, _ in bridge.streams[0].sent if not start]
        s.on_disconnect()
        await settle()
        return conn.texts(), sent

    texts, sent = run(body)
    answers = [(m["type"], m.get("code")) for m in texts if m.get("event_id") == "p1"]
    assert answers == [("error", "store_unavailable"), ("session.interaction.queued", None)], texts
    assert sent == ["p1"]  # the refused one never reached the model


def test_a_handoff_asked_is_declined_while_the_owner_answers_and_else_handed_over_whole() -> None:
    async def body() -> tuple[bool, StoreState, bool, list[str], bool]:
        store = FaultyStore()
        keeper = keeper_of(store)
        answering = True

        async def keeps_owner() -> bool:
            return answering

        keeper.on_handoff(keeps_owner)
        assert await keeper.start()
        keeper.bind({"resume": "r1"})
        await keeper.event(None)
        await store.inner.ask_handoff(SID, "r1")  # a resume at another replica, with the live token
        await until(lambda: asyncio.ensure_future(store.inner.handoff_declined(SID, "r1")))
        declined, kept_state = True, keeper.state
        answering = False
        await store.inner.ask_handoff(SID, "r1")
        await asyncio.wait_for(keeper.lost.wait(), DEADLINE)
        handing = keeper.state is StoreState.HANDING_OVER
        keeper.handed_out('{"chunk": 1}', None, None)  # taken by the socket before the session stopped
        await keeper.end(forget=False)  # its writes finished, then its lease released
        taken = await store.inner.acquire(SID, "b", 5.0)
        stored = await store.inner.load(SID)
        assert stored is not None
        return declined, kept_state, handing, list(stored.log), taken is not None

    declined, kept_state, handing, log, taken = run(body)
    assert declined and kept_state is StoreState.KEPT and handing and taken
    assert log == [FRAME + '{"chunk": 1}']


def test_a_resume_the_record_cannot_serve_takes_no_lease_from_nobody() -> None:
    """A holder cut off from the store handed out chunks the store never got, and its lease
    lapsed: a resume elsewhere naming such a chunk is refused before the lease is taken, so the
    epoch is not bumped and the holder, back, still writes the session back (not a lost lease)."""

    async def body() -> tuple[str, int, int]:
        store = MemoryStore()
        _, conn, _ = await held_session(store)
        token = conn.texts()[0]["resume_token"]
        epoch = store._sessions[HELD].epoch  # the in-process store's own record
        store._sessions[HELD].expires = 0.0  # its lease lapsed (its holder cut off)
        request = ResumeRequest(token, 7)  # the client read chunks 2..7, which the store never got
        try:
            await take_over(store, request, lambda _: None, lambda _: None, "b", ProxySettings(), ProxyMetrics())  # type: ignore[arg-type, return-value]
        except ResumeRefused as exc:
            refused = exc.message
        else:
            refused = ""
        return refused, epoch, store._sessions[HELD].epoch

    refused, before, after = run(body)
    assert "never sent" in refused and after == before
