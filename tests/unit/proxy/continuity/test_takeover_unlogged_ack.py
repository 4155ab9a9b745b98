"""An interaction acked by a holder whose ack's own frame never reached the store (the holder was
cut off from the store, or died, right after the ack: the frame is written after it, and no
frame waits for the store) is still acked for the replica that takes the session over: the
event is in the record, written before its ack left (docs/decisions.md "The session store under
faults"). The taking-over session's move sends it again, so the new model knows it (a retry is
applied once, another payload under its id is `event_id_conflict`), and every `session.done`
accounts for it. (The e2e symptom: tests/e2e/test_store_faults.py, a resume at the other front
after a long stall, where the conflicting payload was answered `queued`.)"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rtvideo.backend.media.encoder import FragmentedMp4Encoder
from rtvideo.proxy.continuity.record import SavedEvent, SavedFrame, SavedSession
from rtvideo.proxy.store.memory import MemoryStore
from rtvideo.triton.wire import START_TAG
from tests.support.fake_bridge import begin, build, reply, run
from tests.unit.proxy.session.test_moves import CONFIG, frames, interaction, media

SID = "s-unlogged-ack"
QUEUED = "session.interaction.queued"


class AckFrameLost(MemoryStore):
    """A store whose write of an ack's frame never completes once `lag` is set: the holder hands
    the ack to its client, then is cut off before the ack's frame lands (the event's own write,
    before the ack, does)."""

    lag = False

    async def append(self, sid: str, lease: Any, entries: Any, payload: Any) -> bool:
        if self.lag and any(QUEUED in entry for entry in entries):
            await asyncio.Event().wait()
        return await super().append(sid, lease, entries, payload)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_an_event_stored_without_its_acks_frame_is_acked_and_sent_again_after_a_takeover() -> None:
    async def body() -> tuple[list[str], SavedSession, list[str], list[str]]:
        store = AckFrameLost()
        a, conn_a, _, _, _ = build(store=store, sid=SID, holder="a")
        begin(a)
        a.on_reply(reply(START_TAG, {"type": "video.start", "request_id": "r", "config": CONFIG}))
        encoder = FragmentedMp4Encoder(64, 48, 16)
        a.steering.frame(a.owner, interaction("p1", "a storm"), False)
        await settle()
        a.on_reply(media("r", 0, 0, encoder.encode_chunk(frames(0)), ("p1",)))
        a.on_reply(media("r", 1, 1, encoder.encode_chunk(frames(1))))
        await settle()
        store.lag = True
        a.steering.frame(a.owner, interaction("before", "a desert"), False)
        await settle()
        acked_by_a = [t["event_id"] for t in conn_a.texts() if t["type"] == QUEUED]
        token = conn_a.texts()[0]["resume_token"]
        stored = await store.load(SID)
        assert stored is not None
        saved = SavedSession.read(stored)
        await store.release(SID, store._sessions[SID].lease)  # a is gone: its lease too
        b, _, bridge_b, _, keeper = build(store=store, sid=SID, holder="b")
        assert keeper is not None
        lease = await store.acquire(SID, "b")
        assert lease is not None
        keeper.start(lease)  # as takeover.py does
        b.take_over(saved, 1, token)
        await settle()
        again = [json.loads(raw)["interaction"]["event_id"] for raw, _, _ in bridge_b.streams[0].sent[1:]]
        unapplied = list(b.ledger.book.outcome(acked_only=True).unapplied)
        return acked_by_a, saved, again, unapplied

    acked_by_a, saved, again, unapplied = run(body())
    assert acked_by_a == ["p1", "before"]  # the client holds both acks
    events = [json.loads(e.raw)["interaction"]["event_id"] for e in saved.log if isinstance(e, SavedEvent)]
    assert events == ["p1", "before"] and saved.acked() == ["p1"]  # the store has the event, not its ack
    assert not any(isinstance(e, SavedFrame) and e.message.get("event_id") == "before" for e in saved.log)
    assert again == ["before"], again  # acked, no chunk started it: the new model gets it again
    assert unapplied == ["before"], unapplied  # a session.done names it
