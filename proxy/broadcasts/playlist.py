"""A broadcast's HLS media playlist (RFC 8216bis, CMAF): written and read back, pure.

The playlist names the init segment once (`EXT-X-MAP`) and one fMP4 segment (`moof`+`mdat`) per
chunk, each `EXTINF` the chunk's frames over its fps. Segments are named by their media sequence
number (`segment_name`), so a name is never reused within a broadcast and a CDN may cache a
segment for ever. `EXT-X-MEDIA-SEQUENCE` is the number of the first segment listed: it
advances as old segments leave the window (docs/decisions.md "Broadcasts: a live window").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

PLAYLIST = "index.m3u8"
INIT = "init.mp4"
#: the broadcast's own record on the store (its times, not served): written by
#: rtvideo.proxy.broadcasts.writer (`marker`), read by the sweep in rtvideo.proxy.broadcasts.service
MARKER = "broadcast.json"
#: what the proxy serves of a broadcast's folder: the playlist, the init segment, the segments
SERVED = re.compile(r"index\.m3u8|init\.mp4|[0-9]{1,18}\.m4s")
PLAYLIST_TYPE = "application/vnd.apple.mpegurl"


def segment_name(sequence: int) -> str:
    return f"{sequence}.m4s"


@dataclass(frozen=True)
class Segment:
    """One listed segment: its media sequence number, seconds and bytes."""

    sequence: int
    duration: float
    size: int = 0


@dataclass(frozen=True)
class Listing:
    """A playlist as read back: its segments in order, and whether it had ended."""

    segments: tuple[Segment, ...]
    ended: bool
    target: int


def target_duration(segments: Sequence[Segment], at_least: int = 1) -> int:
    """`EXT-X-TARGETDURATION`: every segment's duration, rounded to the nearest integer, is at
    most it (RFC 8216bis §4.4.3.1); it never shrinks during a broadcast (`at_least`)."""
    longest = max((s.duration for s in segments), default=0.0)
    return max(at_least, 1, math.ceil(longest))


def render(segments: Sequence[Segment], ended: bool, target: int) -> str:
    """The playlist text. `segments` are consecutive in media sequence (the window)."""
    first = segments[0].sequence if segments else 0
    lines = [
        "#EXTM3U",
        "#EXT-X-VERSION:7",
        f"#EXT-X-TARGETDURATION:{target}",
        f"#EXT-X-MEDIA-SEQUENCE:{first}",
        "#EXT-X-INDEPENDENT-SEGMENTS",  # an IDR opens every chunk
        f'#EXT-X-MAP:URI="{INIT}"',
    ]
    for segment in segments:
        lines.append(f"#EXTINF:{segment.duration:.5f},")
        lines.append(segment_name(segment.sequence))
    if ended:
        lines.append("#EXT-X-ENDLIST")
    return "\n".join(lines) + "\n"


def parse(text: str) -> Listing:
    """A playlist `render` wrote (a takeover goes on from it); ValueError when it is not one."""
    if not text.startswith("#EXTM3U"):
        raise ValueError("not an HLS playlist")
    sequence, target, ended = 0, 1, False
    duration: float | None = None
    segments: list[Segment] = []
    for line in text.splitlines():
        if line.startswith("#EXT-X-MEDIA-SEQUENCE:"):
            sequence = int(line.split(":", 1)[1])
        elif line.startswith("#EXT-X-TARGETDURATION:"):
            target = int(line.split(":", 1)[1])
        elif line.startswith("#EXTINF:"):
            duration = float(line.split(":", 1)[1].split(",", 1)[0])
        elif line == "#EXT-X-ENDLIST":
            ended = True
        elif line and not line.startswith("#"):
            if duration is None or line != segment_name(sequence + len(segments)):
                raise ValueError(f"unexpected playlist line {line[:40]!r}")
            segments.append(Segment(sequence + len(segments), duration))
            duration = None
    return Listing(tuple(segments), ended, target)
