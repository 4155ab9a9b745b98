"""WebRTC viewers of a live session (WHEP, RFC 9725; docs/protocol.md §9.5).

A viewer joins its session as a watcher does (a watch token) or as a guest steerer does (a
steer token): the session hands it the very pairs it hands every participant, through the
participant's own bounded outbox. The viewer's link (`_ViewerLink`) is not a socket: it
takes those frames and demuxes each payload's fragment (`moof`+`mdat`) into H.264 access
units, passed through as the session's encoder made them, never decoded or encoded again:
AVCC (length-prefixed NAL units) becomes Annex-B (start codes, as aiortc's H.264 packetizer
splits), each fragment's first access unit (an IDR: every chunk starts with one) preceded by
the init segment's SPS and PPS. Each access unit is timed by its fragment (`tfdt` plus the
`trun` sample durations, in the track's timescale) and carries that time on the 90 kHz RTP
clock; `PassthroughTrack` releases it at that time relative to the first one, so that the
receiver's jitter buffer sees frames at the pace they were made, not in chunk-sized bursts.

Bounds and ends: the queue of access units waiting to be sent holds at most
`MAX_QUEUED_SECONDS` of video; past that the oldest chunk's units go (from IDR to IDR,
so the picture never refers to a dropped frame). The peer connection ends when the session
hands out `session.done` or closes its participants (the link's close), when the viewer's
DELETE comes, when ICE fails, or when it stays disconnected for `DISCONNECTED_SECONDS`.
Each viewer is counted by `WhepViewers` (per proxy), which closes them all at the stop.

aiortc is optional (the `webrtc` extra): `available()` says whether it can be imported;
nothing here imports it at module load.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fractions
import json
import logging
import secrets
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from rtvideo.core import fmp4, protocol
from rtvideo.core.fmp4 import Box, ContinuationError, boxes, child

log = logging.getLogger(__name__)

#: the RTP clock of video (RFC 6184)
RTP_CLOCK = 90_000
#: access units waiting to be sent, in seconds of video, before the oldest chunk is dropped
MAX_QUEUED_SECONDS = 3.0
#: a connection that stays `disconnected` this long is ended (a `failed` one at once)
DISCONNECTED_SECONDS = 10.0
#: an access unit more than this late re-anchors the clock instead of bursting to catch up
LATE_SECONDS = 1.0

_START_CODE = b"\x00\x00\x00\x01"


def available() -> bool:
    """Whether the WebRTC stack (aiortc) is installed."""
    try:
        import aiortc  # noqa: F401
    except ImportError:
        return False
    return True


class OfferError(ValueError):
    """An offer the proxy cannot answer; `status` is the HTTP answer (400 malformed, 406 no H.264)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_offer(sdp: str) -> None:
    """Refuse an offer that is not an SDP with a video section offering H.264 (OfferError).
    aiortc's own parser is lenient; this is the proxy's contract, checked first."""
    lines = [line.strip() for line in sdp.replace("\r\n", "\n").split("\n") if line.strip()]
    if not lines or lines[0] != "v=0" or not any(line.startswith("o=") for line in lines):
        raise OfferError(400, "the body is not an SDP offer (v=0, o=...)")
    video = False
    h264 = False
    section = ""
    for line in lines:
        if len(line) < 2 or line[1] != "=":
            raise OfferError(400, f"malformed SDP line {line[:40]!r}")
        if line.startswith("m="):
            section = line[2:].split(" ", 1)[0]
            video = video or section == "video"
        elif section == "video" and line.lower().startswith("a=rtpmap:") and "h264/90000" in line.lower():
            h264 = True
    if not video:
        raise OfferError(400, "the offer has no video section")
    if not h264:
        raise OfferError(406, "the offer has no H.264 (the session's video is H.264, passed through)")


# --- fragmented MP4 → Annex-B access units ----------------------------------------------------


@dataclass(frozen=True)
class AccessUnit:
    """One frame: Annex-B bytes and its time on the 90 kHz clock."""

    data: bytes
    pts: int
    keyframe: bool


@dataclass(frozen=True)
class Track:
    """What the init segment says about the video track."""

    timescale: int
    length_size: int  # bytes of each NAL unit's length prefix
    parameter_sets: bytes  # SPS and PPS, Annex-B


def read_init(init: bytes) -> Track:
    """The timescale and the `avcC` of the init segment's one video track (ContinuationError)."""
    moov = next((box for box in boxes(init) if box.type == b"moov"), None)
    if moov is None:
        raise ContinuationError("the init segment has no moov")
    mdia = child(init, child(init, moov, b"trak"), b"mdia")
    stbl = child(init, child(init, mdia, b"minf"), b"stbl")
    stsd = child(init, stbl, b"stsd")
    avc1 = next((box for box in boxes(init, stsd.start + 16, stsd.end) if box.type == b"avc1"), None)
    if avc1 is None:
        raise ContinuationError("the init segment's track is not H.264 (no avc1)")
    avcc = next((box for box in boxes(init, avc1.start + 8 + 78, avc1.end) if box.type == b"avcC"), None)
    if avcc is None:
        raise ContinuationError("the avc1 entry has no avcC")
    body = init[avcc.start + 8 : avcc.end]
    length_size = (body[4] & 0x03) + 1
    sets = []
    at = 5
    for count_mask in (0x1F, 0xFF):  # SPS count (5 bits), then PPS count
        count = body[at] & count_mask
        at += 1
        for _ in range(count):
            (size,) = struct.unpack_from(">H", body, at)
            sets.append(_START_CODE + bytes(body[at + 2 : at + 2 + size]))
            at += 2 + size
    return Track(fmp4.timescale(init), length_size, b"".join(sets))


def _full_box(data: bytes, box: Box) -> tuple[int, int]:
    """(version, flags) of a full box."""
    (word,) = struct.unpack_from(">I", data, box.start + 8)
    return word >> 24, word & 0xFFFFFF


def read_fragment(track: Track, fragment: bytes, start: int, end: int) -> list[AccessUnit]:
    """The access units of the `moof` at data[start:end] and the `mdat` it points into."""
    moof = Box(b"moof", start, end)
    traf = child(fragment, moof, b"traf")
    tfhd = child(fragment, traf, b"tfhd")
    _, flags = _full_box(fragment, tfhd)
    at = tfhd.start + 16
    base = start  # default-base-is-moof, as movenc writes with default_base_moof
    if flags & 0x01:
        (base,) = struct.unpack_from(">Q", fragment, at)
        at += 8
    if flags & 0x02:
        at += 4
    default_duration = default_size = 0
    if flags & 0x08:
        (default_duration,) = struct.unpack_from(">I", fragment, at)
        at += 4
    if flags & 0x10:
        (default_size,) = struct.unpack_from(">I", fragment, at)
        at += 4
    tfdt = child(fragment, traf, b"tfdt")
    version, _ = _full_box(fragment, tfdt)
    (decode_time,) = struct.unpack_from(">Q" if version == 1 else ">I", fragment, tfdt.start + 12)
    trun = child(fragment, traf, b"trun")
    version, tflags = _full_box(fragment, trun)
    (count,) = struct.unpack_from(">I", fragment, trun.start + 12)
    at = trun.start + 16
    offset = 0
    if tflags & 0x001:
        (offset,) = struct.unpack_from(">i", fragment, at)
        at += 4
    if tflags & 0x004:
        at += 4  # first-sample-flags
    units = []
    position = base + offset
    time = decode_time
    for index in range(count):
        duration, size, cto = default_duration, default_size, 0
        if tflags & 0x100:
            (duration,) = struct.unpack_from(">I", fragment, at)
            at += 4
        if tflags & 0x200:
            (size,) = struct.unpack_from(">I", fragment, at)
            at += 4
        if tflags & 0x400:
            at += 4
        if tflags & 0x800:
            (cto,) = struct.unpack_from(">i" if version == 1 else ">I", fragment, at)
            at += 4
        sample = fragment[position : position + size]
        if len(sample) != size:
            raise ContinuationError("a sample runs past the payload")
        annexb = _annexb(sample, track.length_size)
        keyframe = index == 0  # every fragment starts with an IDR (docs/protocol.md §6)
        if keyframe:
            annexb = track.parameter_sets + annexb
        pts = (time + cto) * RTP_CLOCK // track.timescale
        units.append(AccessUnit(annexb, pts, keyframe))
        position += size
        time += duration
    return units


def _annexb(sample: bytes, length_size: int) -> bytes:
    out = bytearray()
    at = 0
    while at < len(sample):
        if at + length_size > len(sample):
            raise ContinuationError("a NAL unit's length runs past its sample")
        size = int.from_bytes(sample[at : at + length_size], "big")
        at += length_size
        out += _START_CODE + sample[at : at + size]
        at += size
    return bytes(out)


class Demuxer:
    """Payloads of one session's stream in, access units out. The init segment comes first (an
    init pair, or at the head of the first media payload); a fragment before it is skipped."""

    def __init__(self) -> None:
        self.track: Track | None = None

    def payload(self, data: bytes) -> list[AccessUnit]:
        units: list[AccessUnit] = []
        top = boxes(data)
        if any(box.type == b"moov" for box in top):
            end = next((box.start for box in top if box.type == b"moof"), len(data))
            self.track = read_init(data[:end])
        if self.track is None:
            return units
        for box in top:
            if box.type == b"moof":
                units.extend(read_fragment(self.track, data, box.start, box.end))
        return units


# --- the viewer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class IceServers:
    """`--ice-server` URLs and the TURN servers' credentials (`--ice-username`, `--ice-credential`)."""

    urls: tuple[str, ...] = ()
    username: str | None = None
    credential: str | None = field(default=None, repr=False)


class ViewerPhase(enum.Enum):
    NEGOTIATING = enum.auto()  # the answer is out, ICE not connected yet
    PLAYING = enum.auto()  # ICE connected
    ENDED = enum.auto()  # closed, for whichever reason (`ended_because`)


def passthrough_track() -> Any:
    """The viewer's one video track: access units, paced at their own times. Built on aiortc's
    `MediaStreamTrack` (imported lazily); `recv` returns `av.Packet`s, which aiortc's sender
    packetizes with `H264Encoder.pack`, never encoding."""
    return _track_class()()


def _track_class() -> type:
    import av
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    class _PassthroughTrack(MediaStreamTrack):
        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self._units: deque[AccessUnit] = deque()
            self._wake = asyncio.Event()
            self._anchor: tuple[float, int] | None = None  # (loop time, pts) of the clock's origin
            self._ended = False
            self.drained = asyncio.Event()  # ended, and every queued unit handed to the sender
            self.sent = 0  # access units handed to the sender
            self.dropped = 0  # access units dropped because the sender fell behind

        def push(self, units: list[AccessUnit]) -> None:
            self._units.extend(units)
            while len(self._units) > 1 and (self._units[-1].pts - self._units[0].pts) > MAX_QUEUED_SECONDS * RTP_CLOCK:
                self._units.popleft()  # the oldest chunk goes, up to the next IDR
                self.dropped += 1
                while self._units and not self._units[0].keyframe:
                    self._units.popleft()
                    self.dropped += 1
            self._wake.set()

        def finish(self) -> None:
            self._ended = True
            self._wake.set()

        async def recv(self) -> Any:
            while not self._units:
                if self._ended or self.readyState != "live":
                    self.drained.set()
                    raise MediaStreamError
                self._wake.clear()
                await self._wake.wait()
            unit = self._units[0]
            loop = asyncio.get_running_loop()
            if self._anchor is None:
                self._anchor = (loop.time(), unit.pts)
            due = self._anchor[0] + (unit.pts - self._anchor[1]) / RTP_CLOCK
            wait = due - loop.time()
            if wait < -LATE_SECONDS or wait > MAX_QUEUED_SECONDS:  # far behind, or the clock jumped
                self._anchor = (loop.time(), unit.pts)
            elif wait > 0:
                await asyncio.sleep(wait)
            if self._units and self._units[0] is unit:
                self._units.popleft()
            packet = av.Packet(unit.data)
            packet.pts = unit.pts
            packet.time_base = fractions.Fraction(1, RTP_CLOCK)
            self.sent += 1
            return packet

    return _PassthroughTrack


class _ViewerLink:
    """What the session writes to the viewer (a `Link`): text frames are read for their type,
    binary ones demuxed into the track; a close ends the viewer."""

    def __init__(self, viewer: WhepViewer) -> None:
        self._viewer = viewer
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.set_result(None)

    def write_message(self, message: str | bytes, binary: bool = False) -> Awaitable[None]:
        if isinstance(message, bytes):
            self._viewer.media(message)
        else:
            self._viewer.text(message)
        return self._done  # the viewer's own queue is bounded (MAX_QUEUED_SECONDS): never waits here

    def close(self, code: int | None = None, reason: str | None = None) -> None:
        self._viewer.finish(f"the session closed its participants ({code})")


class ViewerEnded(RuntimeError):
    """The viewer ended while its answer was being made (the proxy stopped meanwhile)."""


def _connect_tasks(pc: Any) -> list[asyncio.Task[Any]]:
    """The pending tasks running `pc`'s ICE/DTLS connect (`RTCPeerConnection.__connect`).
    aiortc (1.x) starts one with a bare `ensure_future` at each `setRemoteDescription` and
    `setLocalDescription`, keeps no handle and does not cancel it at `close()`: a connect still
    waiting on ICE checks then outlives the closed connection, and is "destroyed but pending"
    when the loop stops. Found by its coroutine's bound `self` (coroutine introspection, the
    one handle Python gives on a task nobody kept)."""
    found = []
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        if (
            frame is not None
            and getattr(coro, "__qualname__", "").startswith("RTCPeerConnection.")
            and frame.f_locals.get("self") is pc
        ):
            found.append(task)
    return found


async def _reap_connect_tasks(pc: Any) -> None:
    """After `pc.close()`: cancel its connect tasks and wait for them (nothing they do on a closed
    connection matters), so that none is left pending on the loop."""
    tasks = [task for task in _connect_tasks(pc) if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class WhepViewer:
    """One WHEP resource: a peer connection that receives nothing and sends the session's video."""

    def __init__(self, viewers: WhepViewers, kind: str, ice: IceServers, holder: str, connect_seconds: float) -> None:
        from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

        # `holder.random`: a replica that gets the DELETE of another's viewer knows where it lives
        self.resource_id = f"{holder}.{secrets.token_urlsafe(16)}"
        self.kind = kind  # "watch" or "steer": the token it came with
        self.phase = ViewerPhase.NEGOTIATING
        self.ended_because = ""
        self._viewers = viewers
        self._demuxer = Demuxer()
        self.track = passthrough_track()
        self.link = _ViewerLink(self)
        self._leave: Callable[[], None] | None = None
        config = RTCConfiguration(
            iceServers=[
                RTCIceServer(urls=url, username=ice.username, credential=ice.credential)
                if url.startswith("turn")
                else RTCIceServer(urls=url)
                for url in ice.urls
            ]
        )
        self.pc = RTCPeerConnection(configuration=config)
        self.pc.on("connectionstatechange", self._state_changed)
        self._watchdog: asyncio.Task[None] | None = None
        self._connect_seconds = connect_seconds  # ended unless its ICE connects within this long
        self._closing: asyncio.Task[None] | None = None
        self._finishing: asyncio.Task[None] | None = None

    async def answer(self, offer: str) -> str:
        """Set the offer and return the answer, with the gathered host (and STUN/TURN)
        candidates in it: WHEP without trickle. The one video transceiver is made first, sending
        the passthrough track with H.264 alone preferred: aiortc negotiates a transceiver's codecs
        as the offer is set, so preferences set later would leave a browser's first codec (VP8)
        in the answer."""
        from aiortc.exceptions import InvalidStateError

        try:
            return await self._answer(offer)
        except InvalidStateError as exc:  # closed under it: `end` came while the answer was made
            if self.phase is ViewerPhase.ENDED:
                raise ViewerEnded(self.ended_because) from exc
            raise

    async def _answer(self, offer: str) -> str:
        from aiortc import RTCRtpSender, RTCSessionDescription
        from aiortc.exceptions import OperationError

        transceiver = self.pc.addTransceiver(self.track, direction="sendonly")
        h264 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() == "video/h264"]
        transceiver.setCodecPreferences(h264)
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        except OperationError as exc:  # no codec in common
            raise OfferError(406, f"no H.264 format in common (packetization-mode 1 is sent): {exc}") from exc
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        if self.phase is ViewerPhase.ENDED:  # ended (the proxy stopped) while the answer was made
            await _reap_connect_tasks(self.pc)  # the one setLocalDescription just started
            raise ViewerEnded(self.ended_because)
        self._watchdog = asyncio.ensure_future(self._watch(self._connect_seconds))
        return str(self.pc.localDescription.sdp)

    def joined(self, leave: Callable[[], None]) -> None:
        """The session attached it; `leave` detaches it (its participant leaves the session)."""
        self._leave = leave

    def text(self, raw: str) -> None:
        try:
            kind = json.loads(raw).get("type")
        except (ValueError, AttributeError):
            return
        if kind == protocol.DONE:
            self.finish("the session ended")

    def media(self, data: bytes) -> None:
        if self.phase is ViewerPhase.ENDED:
            return
        try:
            units = self._demuxer.payload(data)
        except ContinuationError as exc:
            log.warning("whep resource=%s: a payload could not be demuxed (%s): skipped", self.resource_id, exc)
            return
        self.track.push(units)

    def _state_changed(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.phase is ViewerPhase.NEGOTIATING:
            self.phase = ViewerPhase.PLAYING
            log.info("whep resource=%s connected", self.resource_id)
        elif state == "failed":
            self.end("ICE failed")
        elif state == "disconnected":
            self._restart_watchdog(DISCONNECTED_SECONDS)
        elif state == "closed":
            self.end("the peer connection closed")

    def _restart_watchdog(self, seconds: float) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watchdog = asyncio.ensure_future(self._watch(seconds))

    async def _watch(self, seconds: float) -> None:
        """End the viewer unless it is connected after `seconds`."""
        await asyncio.sleep(seconds)
        if self.pc.connectionState != "connected":
            self.end(f"not connected after {seconds:g} s ({self.pc.connectionState})")

    def finish(self, why: str) -> None:
        """The session has no more video for it: what is queued is sent (at most
        `MAX_QUEUED_SECONDS` of it), then the viewer ends."""
        if self.phase is ViewerPhase.ENDED or self._finishing is not None:
            return
        self.track.finish()
        self._finishing = asyncio.ensure_future(self._end_when_drained(why))

    async def _end_when_drained(self, why: str) -> None:
        # never connected, or the sender stalled: ended all the same once the time is up
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.track.drained.wait(), MAX_QUEUED_SECONDS + LATE_SECONDS + 1)
        self.end(why)

    def end(self, why: str) -> None:
        """End the viewer (idempotent): leave the session, stop the track, close the peer connection."""
        if self.phase is ViewerPhase.ENDED:
            return
        self.phase = ViewerPhase.ENDED
        self.ended_because = why
        log.info("whep resource=%s ended: %s", self.resource_id, why)
        leave, self._leave = self._leave, None
        if leave is not None:
            leave()
        self.track.finish()
        for task in (self._watchdog, self._finishing):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._closing = asyncio.ensure_future(self._close())

    async def _close(self) -> None:
        try:
            await self.pc.close()
            await _reap_connect_tasks(self.pc)
        finally:
            self.track.stop()
            self._viewers.forget(self)

    async def closed(self) -> None:
        """Wait until the peer connection is closed (after `end`, or `finish` and its drain)."""
        if self._finishing is not None:
            await asyncio.gather(self._finishing, return_exceptions=True)
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)


class WhepViewers:
    """This proxy's WHEP viewers by resource id (one writer: the WHEP door and the viewers' ends)."""

    def __init__(self, gauge: Gauge | None = None) -> None:
        self._viewers: dict[str, WhepViewer] = {}
        self._gauge = gauge  # rtvideo_proxy_whep_viewers
        self.peak = 0

    def __len__(self) -> int:
        return len(self._viewers)

    def add(self, viewer: WhepViewer) -> None:
        self._viewers[viewer.resource_id] = viewer
        self.peak = max(self.peak, len(self._viewers))
        if self._gauge is not None:
            self._gauge.set(len(self._viewers))

    def get(self, resource_id: str) -> WhepViewer | None:
        return self._viewers.get(resource_id)

    def forget(self, viewer: WhepViewer) -> None:
        if self._viewers.get(viewer.resource_id) is viewer:
            del self._viewers[viewer.resource_id]
            if self._gauge is not None:
                self._gauge.set(len(self._viewers))

    async def close_all(self) -> None:
        """The proxy stops: every viewer ends, and this waits until their connections are closed."""
        viewers = list(self._viewers.values())
        for viewer in viewers:
            viewer.end("the proxy stopped")
        await asyncio.gather(*(viewer.closed() for viewer in viewers), return_exceptions=True)
