"""How a session taken over is read back into its parts (docs/operations.md "When a proxy dies").

`restore_log` feeds a saved session's log (rtvideo.proxy.continuity.record) into the parts of the
session that takes it over, in the order it happened: the move log and the event book see every
interaction and every frame, the ledger the position; every interaction in the log counts as
acked (it was stored before its ack left, whose own frame the store may lack); the frames after
the last pair whose payload the store no longer keeps are returned, for the replay buffer.

It restores the session's own parts (its ledger, mover and acks), so it is the session's; what
the session writes for a takeover, and the format, are the continuity room's
(rtvideo.proxy.continuity).
"""

from __future__ import annotations

import json

from rtvideo.proxy.continuity.record import SavedFrame, SavedSession
from rtvideo.proxy.frames import Frame
from rtvideo.proxy.session.acks import ProxyAcks
from rtvideo.proxy.session.ledger import Ledger
from rtvideo.proxy.session.mover import Mover


def restore_log(saved: SavedSession, ledger: Ledger, mover: Mover, acks: ProxyAcks) -> tuple[int, list[Frame]]:
    """`saved`'s log into the parts of the session taking it over (module docstring). Returns the
    transport index of the last pair whose payload is not kept (-1: none), and the frames after
    it (what a resume can be given again)."""
    mover.opened(saved.start)
    mover.restored_init(saved.init)
    mover.restored(saved.handed_start, None)  # the config and its seed
    ledger.taken(Frame(json.dumps(saved.handed_start), saved.handed_start))
    cut, recent = -1, list[Frame]()
    for entry in saved.log:
        if not isinstance(entry, SavedFrame):
            # admitted first (the move log keeps what the book admitted), and acked: its ack may
            # have left though the store never got the ack's frame (Ledger.stored)
            if (event_id := acks.restored(entry.raw)) is not None:
                ledger.stored(event_id)
            mover.forwarded(entry.raw)
            continue
        mover.restored(entry.message, entry.data)
        if entry.index is not None and entry.data is None:
            cut, recent = entry.index, []
            ledger.taken(Frame(entry.text, entry.message, b""))
            continue
        frame = Frame(entry.text, entry.message, entry.data)
        ledger.taken(frame)
        recent.append(frame)
    return cut, recent
