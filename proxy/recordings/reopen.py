"""A recording taken over with its session (docs/recordings.md "Recordings across replicas"):
what it durably holds, and what the session store kept that it lacks.

- `recover`: the recording's files read back to whole records. A killed proxy's last write
  may be torn: a line without its newline, a payload shorter than its line's `byte_length`,
  or a payload written without its line. So the entries kept end at a whole line, and
  `video.mp4` is cut to exactly the payloads they name, in order (`cut`).
- `plan`: every frame the owner's socket took is both an owner `out` line of the recording
  and a frame of the store's log (`handed`: but the `video.start`, pongs and the
  `session.done`, which the store keeps elsewhere or not at all), in the same order. So the
  store's frames past the recording's count are what the old holder handed out and had not
  written; their payloads come from the store, which keeps the last chunks' (the replay
  buffer's bound). An interaction the store kept past that point whose `in` line the
  recording lacks is written too, its sender unknown (`participant` "unknown"). A pair
  whose payload the store no longer keeps ends the recording there (`lost_at`): it cannot
  go on without a gap. Lines a killed holder wrote past what the store kept are cut: the
  session goes on from the store's point, and its next chunks replace them.

`prepare` does it all for the recorder (on its writer thread: blocking I/O): the recording
found, cut back, live in the store, and the lines and payloads it is given.
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtvideo.core import protocol
from rtvideo.proxy.continuity.record import SavedEvent, SavedFrame
from rtvideo.proxy.recordings.backing import EVENTS, VIDEO
from rtvideo.proxy.recordings.lines import encode, loggable
from rtvideo.proxy.recordings.store import TOKEN_DIGEST, RecordingStore

#: owner lines the store keeps no frame of (its video.start is a field; a pong, nothing; the end)
NOT_IN_STORE = frozenset({protocol.VIDEO_START, protocol.PONG, protocol.DONE})
#: what a restored inbound line names as its sender: the store keeps no sender
UNKNOWN_SENDER = "unknown"


@dataclass
class Durable:
    """The whole records of a recording, in order (`recover`)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    line_ends: list[int] = field(default_factory=list)  # bytes of events.jsonl through each entry
    video_ends: list[int] = field(default_factory=list)  # bytes of video.mp4 through each entry
    size: int = 0  # both files' bytes as found


@dataclass(frozen=True)
class Restored:
    """A line (and a pair's payload) the recording lacks, from the session store."""

    inbound: bool
    message: dict[str, Any]
    data: bytes | None = None


@dataclass(frozen=True)
class Plan:
    keep: int  # the recording's first `keep` entries stay
    writes: tuple[Restored, ...]  # then these, in order
    lost_at: int | None = None  # the transport index of a pair the store no longer has: it ends there


def owner_out(entry: dict[str, Any]) -> bool:
    return entry.get("dir") == "out" and "participant" not in entry


def handed(entry: dict[str, Any]) -> bool:
    """An owner `out` line the store keeps a frame of."""
    return owner_out(entry) and entry["message"].get("type") not in NOT_IN_STORE


def _payload_size(entry: dict[str, Any]) -> int | None:
    """The bytes of video.mp4 an entry stands for (None: a pair that does not say)."""
    message = entry["message"]
    if not owner_out(entry) or message.get("type") != protocol.CHUNK_METADATA:
        return 0
    size = message.get("byte_length")
    return size if isinstance(size, int) and size >= 0 else None


def _entry(line: bytes) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("message"), dict) else None


def recover(spool: Path) -> Durable:
    """The whole records of the recording in `spool` (its files are not changed: `cut`)."""
    events = (spool / EVENTS).read_bytes() if (spool / EVENTS).exists() else b""
    video_size = (spool / VIDEO).stat().st_size if (spool / VIDEO).exists() else 0
    found = Durable(size=len(events) + video_size)
    offset = paid = 0
    sized = True  # every pair so far said its size: the video is checked against the lines
    for line in events.split(b"\n")[:-1]:  # the last piece is empty, or a torn line
        entry = _entry(line)
        if entry is None:
            break
        size = _payload_size(entry)
        if size is None:
            sized = False
        elif sized and paid + size > video_size:
            break  # its payload was not written whole
        offset += len(line) + 1
        paid += size or 0
        found.entries.append(entry)
        found.line_ends.append(offset)
        found.video_ends.append(paid if sized else video_size)
    return found


def cut(spool: Path, durable: Durable, keep: int) -> int:
    """The files cut back to the first `keep` entries; the bytes they hold then."""
    events_end = durable.line_ends[keep - 1] if keep else 0
    video_end = durable.video_ends[keep - 1] if keep else 0
    for path, end in ((spool / EVENTS, events_end), (spool / VIDEO, video_end)):
        if path.exists() and path.stat().st_size > end:
            os.truncate(path, end)
    return events_end + video_end


def _same_frame(line: dict[str, Any], saved: dict[str, Any]) -> bool:
    return all(line.get(key) == saved.get(key) for key in ("type", "transport_chunk_index", "event_id"))


def _said(message: dict[str, Any]) -> tuple[str | None, str]:
    """An interaction line's event id (None: the client gave none) and its body without it."""
    interaction = message.get("interaction")
    if not isinstance(interaction, dict):
        return None, ""
    event_id = interaction.get("event_id")
    body = {k: v for k, v in interaction.items() if k != "event_id"}
    return (event_id if isinstance(event_id, str) else None), json.dumps(body, sort_keys=True)


def plan(durable: Durable, log: Sequence[SavedEvent | SavedFrame]) -> Plan | str:
    """What the recording keeps and what it is given from the store's `log`; why not, when
    the recording is not this session's (its frames are not the store's)."""
    frames = [i for i, e in enumerate(log) if isinstance(e, SavedFrame)]
    lines = [i for i, e in enumerate(durable.entries) if handed(e)]
    count = min(len(frames), len(lines))
    if count:
        saved = log[frames[count - 1]]
        assert isinstance(saved, SavedFrame)
        if not _same_frame(durable.entries[lines[count - 1]]["message"], saved.message):
            return "its event log does not match the session's"
    keep = lines[count] if count < len(lines) else len(durable.entries)
    after = lines[count - 1] + 1 if count else 0
    ids: set[str] = set()
    bodies: collections.Counter[str] = collections.Counter()
    for entry in durable.entries[after:keep]:  # the interactions it holds past its last frame
        if entry.get("dir") == "in" and entry["message"].get("type") == protocol.INTERACTION:
            event_id, body = _said(entry["message"])
            if event_id is not None:
                ids.add(event_id)
            else:
                bodies[body] += 1
    writes: list[Restored] = []
    for item in log[frames[count - 1] + 1 if count else 0 :]:
        if isinstance(item, SavedFrame):
            if item.index is not None and item.data is None:
                return Plan(keep, tuple(writes), lost_at=item.index)
            writes.append(Restored(False, item.message, item.data))
            continue
        try:
            message = json.loads(item.raw)
        except ValueError:
            continue
        if not isinstance(message, dict) or message.get("type") != protocol.INTERACTION:
            continue
        event_id, body = _said(message)
        if event_id in ids:
            continue
        if bodies[body] > 0:
            bodies[body] -= 1
            continue
        writes.append(Restored(True, {"type": protocol.INTERACTION, "interaction": message.get("interaction")}))
    return Plan(keep, tuple(writes))


@dataclass(frozen=True)
class Reopening:
    """A recording live here again (`prepare`)."""

    spool: Path
    size: int  # the bytes it holds, cut back (the writes below not included)
    started_at: float  # when it began (unix seconds)
    token_digest: str | None
    handed: tuple[dict[str, Any], ...]  # every owner `out` message it holds and is given: its counts
    last_t: float  # its last line's time: the restored lines', and the floor of every later one
    writes: tuple[tuple[str, bytes], ...]  # the lines and payloads it lacks, from the session store
    lost_at: int | None  # the pair it ends before (`Plan.lost_at`)


def prepare(
    store: RecordingStore, rid: str, log: Sequence[SavedEvent | SavedFrame], token_digest: str | None
) -> Reopening | str:
    """The recording `rid` of a session taken over (its `log` as the session store kept it, its
    token's digest as the store kept it): found, cut back to whole records that the session
    store agrees with, and live in `store`; or why it cannot go on (it stays as it was)."""
    found = store.reopen(rid)
    if isinstance(found, str):
        return found
    durable = recover(found.spool)
    planned = plan(durable, log)
    recorded = found.known.get(TOKEN_DIGEST)
    if isinstance(planned, str) or (token_digest and recorded and recorded != token_digest):
        store.let_go(found)
        return planned if isinstance(planned, str) else "its token is not the session's"
    size = cut(found.spool, durable, planned.keep)
    started = float(found.known.get("started_at") or 0.0) or time.time()
    digest = token_digest or recorded
    store.resume_live(rid, found.spool, size, {"recording_id": rid, "started_at": started, TOKEN_DIGEST: digest})
    kept = durable.entries[: planned.keep]
    t = max((float(e.get("t") or 0.0) for e in kept[-64:]), default=0.0)
    handed = [e["message"] for e in kept if owner_out(e)]
    writes: list[tuple[str, bytes]] = []
    for restored in planned.writes:
        message = loggable(restored.message, inbound=restored.inbound)
        if message is None:
            continue
        line: dict[str, Any] = {"t": t, "dir": "in" if restored.inbound else "out", "message": message}
        if restored.inbound:
            line["participant"] = UNKNOWN_SENDER
        else:
            handed.append(message)
        writes.append((EVENTS, encode(line)))
        if restored.data:
            writes.append((VIDEO, restored.data))
    return Reopening(found.spool, size, started, digest, tuple(handed), t, tuple(writes), planned.lost_at)
