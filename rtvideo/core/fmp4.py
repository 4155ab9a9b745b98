"""Fragmented-MP4 box arithmetic: the stream's fragment index, and one stream continued by another.

Every stream here is the encoder's (rtvideo.backend.media.encoder): the first payload is the init
segment (`ftyp`+`moov`) and one fragment, every later media payload exactly one fragment
(`moof`+`mdat`, its first frame an IDR), the trailer an `mfra` indexing every fragment.

A session that moves to another Triton (docs/recordings.md "Moves") goes on with a new
stream: a new encoder from the same configuration, so the same init segment, but its own
fragment numbers from 1, its decode times from 0, its byte offsets from its own start.
`Continuation` rewrites it so that the client's decoder sees one stream: the init segment
dropped (it must equal the first), each `mfhd` sequence number and `tfdt` decode time moved on
past the old stream's, and the trailer replaced by an `mfra` of every fragment of both.
`FragmentCursor` is what it continues from: fed every payload the client is sent.
`init_segment` and `strip_init` find and drop the init segment at the head of a first payload
(the init pair a resume is given, a broadcast's first segment).

Pure: bytes in, bytes out; every failure is a `ContinuationError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


class ContinuationError(ValueError):
    """The payloads cannot be continued as one stream; the message says why."""


@dataclass(frozen=True)
class Box:
    type: bytes
    start: int
    end: int


def boxes(data: bytes | bytearray, start: int = 0, end: int | None = None) -> list[Box]:
    """The ISO-BMFF boxes laid end to end in data[start:end] (32-bit sizes only, as movenc writes)."""
    end = len(data) if end is None else end
    out = []
    while start < end:
        if start + 8 > end:
            raise ContinuationError(f"truncated box header at {start}")
        size, kind = struct.unpack_from(">I4s", data, start)
        if size < 8 or start + size > end:
            raise ContinuationError(f"malformed box {kind!r} at {start}")
        out.append(Box(kind, start, start + size))
        start += size
    return out


def child(data: bytes | bytearray, parent: Box, kind: bytes) -> Box:
    for box in boxes(data, parent.start + 8, parent.end):
        if box.type == kind:
            return box
    raise ContinuationError(f"no {kind!r} in {parent.type!r}")


def split_init(payload: bytes) -> tuple[bytes, bytes]:
    """(everything before the first `moof`: the init segment or b"", the rest)."""
    for box in boxes(payload):
        if box.type == b"moof":
            return payload[: box.start], payload[box.start :]
    raise ContinuationError("the payload holds no fragment")


def timescale(init: bytes) -> int:
    """The video track's timescale (`moov`/`trak`/`mdia`/`mdhd`)."""
    moov = next((box for box in boxes(init) if box.type == b"moov"), None)
    if moov is None:
        raise ContinuationError("the init segment has no moov")
    mdhd = child(init, child(init, child(init, moov, b"trak"), b"mdia"), b"mdhd")
    version = init[mdhd.start + 8]
    (value,) = struct.unpack_from(">I", init, mdhd.start + (28 if version == 1 else 20))
    return int(value)


@dataclass(frozen=True)
class FragmentHeader:
    """Where a fragment's renumbered fields are, and their values."""

    sequence_at: int  # offset of the mfhd sequence number
    sequence: int
    time_at: int  # offset of the tfdt decode time
    time_64: bool  # tfdt version 1
    decode_time: int
    track_id: int


def fragment_header(fragment: bytes | bytearray) -> FragmentHeader:
    """The header fields of the one `moof` that `fragment` starts with."""
    moof = boxes(fragment)[0]
    if moof.type != b"moof":
        raise ContinuationError(f"a fragment starts with {moof.type!r}, not moof")
    mfhd = child(fragment, moof, b"mfhd")
    traf = child(fragment, moof, b"traf")
    tfhd = child(fragment, traf, b"tfhd")
    tfdt = child(fragment, traf, b"tfdt")
    (sequence,) = struct.unpack_from(">I", fragment, mfhd.start + 12)
    (track_id,) = struct.unpack_from(">I", fragment, tfhd.start + 12)
    time_64 = fragment[tfdt.start + 8] == 1
    (decode_time,) = struct.unpack_from(">Q" if time_64 else ">I", fragment, tfdt.start + 12)
    return FragmentHeader(mfhd.start + 12, int(sequence), tfdt.start + 12, time_64, int(decode_time), int(track_id))


@dataclass
class FragmentIndex:
    """What the closing `mfra` needs: where each fragment starts and at what time."""

    track_id: int = 0
    entries: list[tuple[int, int]] = field(default_factory=list)  # (decode time, moof offset)

    def to_mfra(self) -> bytes:
        """`mfra` = `tfra` (one entry per fragment; each starts with an IDR) + `mfro`."""
        body = b"".join(struct.pack(">QQBBB", t, offset, 1, 1, 1) for t, offset in self.entries)
        # tfra version 1 (64-bit time and offset); traf/trun/sample numbers stored in 1 byte each.
        tfra_payload = struct.pack(">I I I I", 1 << 24, self.track_id, 0, len(self.entries)) + body
        tfra = struct.pack(">I4s", 8 + len(tfra_payload), b"tfra") + tfra_payload
        mfra_size = 8 + len(tfra) + 16
        mfro = struct.pack(">I4sII", 16, b"mfro", 0, mfra_size)
        return struct.pack(">I4s", mfra_size, b"mfra") + tfra + mfro


class FragmentCursor:
    """Where a stream stands: its init segment, its bytes and frames so far, and every fragment's
    decode time and offset. Fed every media payload in order (`media`), and the bytes of any
    other (`other`)."""

    def __init__(self) -> None:
        self.init = b""
        self.bytes = 0
        self.frames = 0
        self.index = FragmentIndex()

    def media(self, payload: bytes, num_frames: int) -> None:
        head, fragment = split_init(payload) if not self.bytes else (b"", payload)  # the first holds the init
        if head:
            self.init = head
        header = fragment_header(fragment)
        self.index.track_id = header.track_id
        self.index.entries.append((header.decode_time, self.bytes + len(head)))
        self.bytes += len(payload)
        self.frames += num_frames

    def other(self, payload: bytes) -> None:
        self.bytes += len(payload)

    def passed(self, size: int, num_frames: int, fps: int) -> None:
        """A media payload known by its size and frames alone (a takeover restores a cursor
        from what the store kept: the init segment and each chunk's metadata): its fragment
        is indexed where `media` would have put it, its decode time the frames before it."""
        if not self.init or fps <= 0:
            raise ContinuationError("a payload passed without its bytes needs the init segment and the fps")
        scale = timescale(self.init)
        self.index.entries.append((self.frames * scale // fps, self.bytes + (len(self.init) if not self.bytes else 0)))
        self.bytes += size
        self.frames += num_frames


class Continuation:
    """Rewrites a new stream, whose first frame is frame `cursor.frames` of the session, so that
    its payloads continue the stream `cursor` followed (module docstring). The cursor goes on
    following what this returns, so a later move continues from there."""

    def __init__(self, cursor: FragmentCursor, fps: int) -> None:
        if not cursor.init:
            raise ContinuationError("the stream to continue has no init segment yet")
        scale = timescale(cursor.init)
        if (cursor.frames * scale) % fps:
            raise ContinuationError(f"{cursor.frames} frames at {fps} fps is no whole number of ticks of {scale}")
        self._cursor = cursor
        self._time_offset = cursor.frames * scale // fps
        self._sequence_offset = len(cursor.index.entries)
        self._first = True

    def media(self, payload: bytes, num_frames: int) -> bytes:
        head, fragment = split_init(payload)
        if self._first:
            if head != self._cursor.init:
                raise ContinuationError("the new stream's init segment differs from the stream's")
            self._first = False
        elif head:
            raise ContinuationError("an init segment after the new stream's first payload")
        out = bytearray(fragment)
        header = fragment_header(out)
        struct.pack_into(">I", out, header.sequence_at, header.sequence + self._sequence_offset)
        struct.pack_into(">Q" if header.time_64 else ">I", out, header.time_at, header.decode_time + self._time_offset)
        rewritten = bytes(out)
        self._cursor.media(rewritten, num_frames)
        return rewritten

    def trailer(self, payload: bytes) -> bytes:
        """The new stream's `mfra` indexes its own fragments only: one of the whole stream instead."""
        if not payload:
            return payload
        rewritten = self._cursor.index.to_mfra()
        self._cursor.other(rewritten)
        return rewritten


#: top-level boxes of an fMP4 initialisation segment
_INIT_BOXES = (b"ftyp", b"moov")


def init_segment(payload: bytes) -> bytes | None:
    """The initialisation segment (`ftyp` + `moov`) at the head of a stream's first media
    payload; None when the payload does not start with one."""
    position, end = 0, len(payload)
    while position + 8 <= end:
        size, kind = struct.unpack_from(">I4s", payload, position)
        if kind not in _INIT_BOXES or size < 8 or position + size > end:
            break
        position += size
    return payload[:position] if position else None


def strip_init(payload: bytes) -> bytes:
    """A payload without a leading initialisation segment (a replayed first payload after an
    init pair: a decoder that reads one continuous file wants one `moov`)."""
    init = init_segment(payload)
    return payload[len(init) :] if init else payload
