"""One session's life beyond this proxy (docs/operations.md "When a proxy dies"): what it writes
to a shared session store as it happens (the write side of a takeover).

`Continuity` is the session's side of its `StoreKeeper` (rtvideo.proxy.store.keeper): the start
as sent, the fields once `video.start` is out, the tokens' hashes, each interaction before its
ack, each frame the owner's socket took that a takeover reads, whether the owner is away. With
no shared store (one proxy alone) it holds no keeper and every call does nothing: the session
has one code path.

It keeps only what a takeover reads, so that what a client sends does not grow the store: an
interaction as parsed (the canonical frame the model got, `rebuild.interaction_message`, never
the client's frame), the acks, the chunks' metadata and `interaction_failed` (the event book and
the ledger read them), and no other error: an answer about one refused message (`rate_limited`,
a conflict, an invalid one) changes nothing a takeover rebuilds, and a flood of them would fill
the store. The keeper bounds what is left per session (`--session-store-bytes`).

The session reads a taken-over session back into its parts with
rtvideo.proxy.session.restore; the format both sides share is rtvideo.proxy.continuity.record.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable, Mapping

from rtvideo.core import protocol
from rtvideo.core.errors import ErrorCode
from rtvideo.core.fmp4 import init_segment
from rtvideo.proxy.continuity.record import SavedSession
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.store.keeper import StoreKeeper

#: frames the store does not log: kept as a field, an answer to one link, the end
_NOT_LOGGED = frozenset({protocol.VIDEO_START, protocol.PONG, protocol.DONE})


def _read_by_takeover(message: Mapping[str, object]) -> bool:
    """Whether a frame the owner took is one a takeover reads (module docstring;
    rtvideo.proxy.session.restore `restore_log`)."""
    kind = message.get("type")
    if kind in _NOT_LOGGED:
        return False
    if kind == protocol.ERROR:  # only a refusal after the ack moves an event (EventBook.observe)
        return message.get("code") == ErrorCode.INTERACTION_FAILED.value and isinstance(message.get("event_id"), str)
    return True


class Continuity:
    """What one session writes to a shared store (nothing without one)."""

    def __init__(self, keeper: StoreKeeper | None, keeps_owner: Callable[[], Awaitable[bool]] | None = None) -> None:
        """`keeps_owner`: whether the session's owner is attached and answering, asked when a
        resume at another replica asks for the session (it is refused then, as on one proxy;
        None: the session is always handed over)."""
        self._keeper = keeper
        if keeper is not None and keeps_owner is not None:
            keeper.on_handoff(keeps_owner)
        self._init: bytes | None = None  # the init segment, once put
        self.handed_off = False  # left in the store for another replica: its record is kept
        self._bound: dict[str, str] = {}  # kind → the token hash last bound
        #: whether its acked interactions must be in the store first (`opened`): only a session
        #: that can be resumed promises a takeover that knows them
        self._durable = True

    @property
    def shared(self) -> bool:
        return self._keeper is not None

    @property
    def continuable(self) -> bool:
        """Whether another replica could go on with it: a shared store that holds it as it is."""
        return self._keeper is not None and self._keeper.kept

    async def held_here(self) -> bool:
        """Before a resume is taken here: whether this replica still drives the session, checked
        in the store (rtvideo.proxy.store.keeper `recheck`); True without a shared store."""
        return self._keeper is None or await self._keeper.recheck()

    @property
    def lost(self) -> asyncio.Event | None:
        """Set when another replica holds the session now (None without a shared store)."""
        return None if self._keeper is None else self._keeper.lost

    def opened(self, start: bytes, *, durable: bool = True) -> None:
        """The session's start goes to the model: its lease is claimed, the start kept.
        `durable` False (its start says `"resumable": false`): it is continued nowhere else, so
        its interactions are acked without the store (`event`); the store still keeps its token
        bindings, for its guests at other replicas."""
        self._durable = durable
        if self._keeper is not None:
            self._keeper.start()
            self._keeper.put({"start": start.decode("utf-8", "surrogatepass")})

    def adopted(self, saved: SavedSession) -> None:
        """The session is `saved`, taken over with the keeper's lease: what the store holds of it."""
        assert self._keeper is not None
        self._init = saved.init
        self._bound.update(saved.token_hashes)
        self._keeper.put({"detached_at": ""})

    def started(self, fields: Mapping[str, str], tokens: Mapping[str, str]) -> None:
        """The model's video.start is out: what a replica needs to go on (`fields`), its tokens."""
        if self._keeper is not None:
            self._keeper.put(fields)
            self.tokens(tokens)

    def tokens(self, hashes: Mapping[str, str], gone: tuple[str, ...] = ()) -> None:
        """The session's live tokens, hashed: any replica finds it by them (`gone`: kinds that
        no longer open it, forgotten by every replica)."""
        if self._keeper is not None:
            for kind in gone:
                if (old := self._bound.pop(kind, None)) is not None:
                    self._keeper.unbind(kind, old)
            self._bound.update(hashes)
            self._keeper.put({"tokens": json.dumps(dict(hashes))})
            self._keeper.bind(hashes)

    def away(self, away: bool) -> None:
        """The owner's link dropped (a replica taking over counts the grace from then) or is back."""
        if self._keeper is not None:
            self._keeper.put({"detached_at": f"{time.time():.3f}" if away else ""})

    def event(self, raw: bytes | None) -> Awaitable[bool] | None:
        """An admitted interaction, its canonical frame (None: a retry, stored already, or an
        interaction the model answers): it is forwarded and acked once the returned awaitable says
        True (write before ack; the writes, so the forwards and acks, keep their order); False: the
        store cannot take it now (refused with store_unavailable). None: acked at once, without
        the store: there is no shared store, or the session is not resumable (no takeover ever
        reads its interactions, so none waits for, or is refused by, the store: docs/decisions.md
        "The session store under faults"). This is the one place that decides it."""
        if self._keeper is None or not self._durable:
            return None
        return self._keeper.event(None if raw is None else raw.decode("utf-8", "surrogatepass"))

    def taken(self, frame: Frame) -> None:
        """A frame the owner's socket took: its text, a chunk's payload, the init segment."""
        if self._keeper is None or not _read_by_takeover(frame.message):
            return
        index = frame.message.get("transport_chunk_index") if frame.data is not None else None
        if self._init is None and frame.data and (init := init_segment(frame.data)):
            self._init = init
            self._keeper.put({"init": base64.b64encode(init).decode("ascii")})
        self._keeper.handed_out(frame.text, index if isinstance(index, int) else None, frame.data)

    def keep_record(self) -> None:
        """Another replica goes on with the session: its record stays when it ends here."""
        self.handed_off = True

    async def hand_off(self) -> None:
        """Shutdown: the writes finished, the lease released, the record kept for another replica."""
        self.keep_record()
        if self._keeper is not None:
            await self._keeper.end(forget=False)

    async def end(self) -> None:
        """The session is over here: its record goes, unless it was handed off."""
        if self._keeper is not None:
            await self._keeper.end(forget=not self.handed_off)
