"""Record one realtime video session to an MP4, with prompt updates on a schedule.

    rtvideo record "A quiet harbour at dawn" --seconds 10 --update "3:A snowy street at night"
    rtvideo record "Lanterns" --url ws://gpu-box:8080 --update "2:Fog rolls in:0" -o fog.mp4 --timeline t.json

Connects to `WebSocket /v1/realtime/video` (docs/protocol.md), sends `session.start`,
sends each `--update AT:PROMPT[:TRANSITION_CHUNKS]` as a `session.interaction` AT
seconds after `video.start` arrived, and prints one line per chunk on stderr: its
index, frames, bytes, the lead of the received video over real time (positive: ahead
of playback), the acks that arrived since the previous chunk with their latency, and
the events the chunk started and completed.

At the end it writes a progressive MP4 with its duration (`-o`, the fragmented stream
remuxed by PyAV, not re-encoded), and on request the fragmented stream as received
(`--raw`) and a JSON timeline of every message sent and received with its time
(`--timeline`). Ctrl-C sends `session.stop` and still saves what arrived; a second
Ctrl-C stops waiting. Exit status 0 only after a complete `session.done` (every chunk
it counts arrived, no session-ending error), 1 otherwise, 2 for a usage error.

AT is read from the left up to the first ':'; the rest is the prompt, except a final
':N' with N an integer, which is the transition length in chunks. A prompt that itself
ends in ':N' needs an explicit length after it ("2:ratio 16:9:3").

Needs `websockets` and PyAV (`pip install av`); no torch, no Triton.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from rtvideo.client.session import VirtualPlayhead, image_data_url
from rtvideo.core import protocol
from rtvideo.core.errors import SESSION_ENDING_CODES, ProtocolError
from rtvideo.proxy.tasks import TaskSet  # asyncio only: no proxy dependency

DEFAULT_URL = "ws://127.0.0.1:8080/v1/realtime/video"
ENDPOINT = "/v1/realtime/video"
#: after Ctrl-C (session.stop), how long to wait for session.done before giving up
STOP_WAIT_SECONDS = 15.0
#: the first wait before a resume attempt; each further attempt waits twice as long
RESUME_BACKOFF_SECONDS = 0.25
_ENDING = {code.value for code in SESSION_ENDING_CODES}
AV_MISSING = "rtvideo record: PyAV is needed to write the recording: pip install av (or pip install 'rtvideo[backend]')"


@dataclass(frozen=True)
class Update:
    """One scheduled prompt update: `at` seconds after `video.start`."""

    at: float
    prompt: str
    transition_chunks: int | None = None


def parse_update(text: str) -> Update:
    """`AT:PROMPT[:TRANSITION_CHUNKS]`: AT up to the first ':', an optional final ':N'."""
    at_text, sep, rest = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: use AT:PROMPT[:TRANSITION_CHUNKS], e.g. '2.5:a snowy street:3'")
    try:
        at = float(at_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: AT must be seconds after video.start, not {at_text!r}") from None
    if not math.isfinite(at) or at < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: AT must be 0 or more seconds")
    prompt, chunks = rest, None
    head, sep, tail = rest.rpartition(":")
    if sep and tail.strip().isascii() and tail.strip().isdigit():
        prompt, chunks = head, int(tail)
        if chunks > protocol.MAX_TRANSITION_CHUNKS:
            raise argparse.ArgumentTypeError(
                f"{text!r}: TRANSITION_CHUNKS must be 0 to {protocol.MAX_TRANSITION_CHUNKS}"
            )
    if not prompt.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: the prompt is empty")
    return Update(at, prompt, chunks)


@dataclass(frozen=True)
class CameraUpdate:
    """One scheduled camera event: `at` seconds after `video.start`, `camera` its payload."""

    at: float
    camera: dict[str, Any]


def parse_camera(text: str) -> CameraUpdate:
    """`AT:JSON`: AT seconds after video.start, JSON the camera payload (docs/protocol.md), e.g.
    '1:{"mode":"velocity","data":{"translation":[0,0,0.05],"rotation":[0,0,0,1]}}'. Its shape is
    checked here with the server's own rules, so a typo fails before the session starts."""
    at_text, sep, rest = text.partition(":")
    example = '1:{"mode":"velocity","data":{"translation":[0,0,0.05],"rotation":[0,0,0,1]}}'
    if not sep:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: use AT:JSON, e.g. '{example}'")
    try:
        at = float(at_text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:60]!r}: AT must be seconds after video.start, not {at_text!r}"
        ) from None
    if not math.isfinite(at) or at < 0:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: AT must be 0 or more seconds")
    try:
        camera = json.loads(rest)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: the camera is not JSON ({exc}); e.g. '{example}'") from None
    try:
        protocol.parse_message(
            json.dumps(
                {
                    "type": protocol.INTERACTION,
                    "interaction": {"event_id": "check", "event": {"multi_modal_data": {"camera": camera}}},
                }
            )
        )
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(f"{text[:60]!r}: {exc.message}") from None
    return CameraUpdate(at, camera)


def parse_image(text: str) -> str:
    """`--image-reference FILE`: the file as a data: URL (read when the arguments are parsed)."""
    try:
        return image_data_url(text)
    except (OSError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the initial prompt")
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the server's WebSocket URL (default: {DEFAULT_URL}; a bare ws://HOST:PORT gets {ENDPOINT})",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("RTVIDEO_TOKEN"),
        help="bearer token, sent as Authorization: Bearer (default: $RTVIDEO_TOKEN)",
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--seconds", type=float, help="length of the video (default: until Ctrl-C)")
    length.add_argument("--num-frames", type=int, help="frames of the video (default: until Ctrl-C)")
    for name in ("width", "height", "fps", "seed"):
        parser.add_argument(
            f"--{name}", type=int, help=f"{name} (default: the model's{', random' if name == 'seed' else ''})"
        )
    parser.add_argument(
        "--update",
        type=parse_update,
        action="append",
        default=[],
        metavar="AT:PROMPT[:N]",
        help="send PROMPT AT seconds after video.start, blended over N chunks (default: the model's); repeatable",
    )
    parser.add_argument(
        "--camera",
        type=parse_camera,
        action="append",
        default=[],
        metavar="AT:JSON",
        help="send a camera event AT seconds after video.start; JSON is its payload, e.g. "
        '\'{"mode":"velocity","data":{"translation":[0,0,0.05],"rotation":[0,0,0,1]}}\' (repeatable)',
    )
    parser.add_argument(
        "--image-reference",
        type=parse_image,
        metavar="FILE",
        help="a PNG, JPEG or WebP image for the first frame (sent as a data: URL image_reference)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("out.mp4"), help="the progressive MP4 to write (default: out.mp4)"
    )
    parser.add_argument(
        "--report-playback",
        type=float,
        metavar="SECONDS",
        help="send a session.playback report this often, from the media time a player started on "
        "the first chunk would show, so the server paces the stream to it (default: no reports)",
    )
    parser.add_argument("--raw", type=Path, metavar="FILE", help="also write the fragmented MP4 stream as received")
    parser.add_argument(
        "--resume-attempts",
        type=int,
        default=5,
        metavar="N",
        help="resume a dropped connection up to N times, with backoff (docs/protocol.md section 10.1); "
        "0: off, the session ends with its connection",
    )
    parser.add_argument(
        "--timeline",
        type=Path,
        metavar="FILE",
        help="also write every message sent and received, with its time, as JSON",
    )


def endpoint(url: str) -> str:
    """A bare `ws://host:port` gets the protocol's path."""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path=ENDPOINT)
    return urlunsplit(parts)


# --- one session ---------------------------------------------------------------------------------
@dataclass
class Recording:
    """What one session sent and received, and the state of its progress lines."""

    url: str
    started_wall: float = field(default_factory=time.time)
    origin: float = field(default_factory=time.monotonic)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    metadata: list[dict[str, Any]] = field(default_factory=list)
    video_start: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    failure: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    sent_at: dict[str, float] = field(default_factory=dict)
    ack_latency: dict[str, float] = field(default_factory=dict)
    unsent: list[str] = field(default_factory=list)
    interrupted: bool = False
    _pending_meta: dict[str, Any] | None = None
    _new_acks: list[str] = field(default_factory=list)
    _frames: int = 0
    _first_media_at: float | None = None
    playhead: VirtualPlayhead = field(default_factory=VirtualPlayhead)
    last_index: int = -1  # transport index of the last payload kept (a resume names it)

    def _fresh(self, meta: dict[str, Any]) -> bool:
        """Whether a payload goes into the recording: not an init pair (docs/protocol.md §9.1),
        not one kept already, so that a resumed recording has no gap and no duplicate."""
        index = meta.get("transport_chunk_index", self.last_index + 1)
        if meta and not isinstance(index, int):
            return False
        if isinstance(index, int) and index <= self.last_index:
            return False
        self.last_index = index if isinstance(index, int) else self.last_index + 1
        return True

    def now(self) -> float:
        return time.monotonic() - self.origin

    def sent(self, message: dict[str, Any]) -> None:
        t = self.now()
        self.timeline.append({"t": round(t, 6), "direction": "sent", "message": message})
        if message["type"] == protocol.INTERACTION:
            self.sent_at.setdefault(message["interaction"]["event_id"], t)

    def received_text(self, message: dict[str, Any], say: Callable[[str], None]) -> None:
        t = self.now()
        self.timeline.append({"t": round(t, 6), "direction": "received", "message": message})
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self.video_start = message
            config = message.get("config", {})
            ignored = config.get("ignored_fields") or []
            say(
                f"video.start {message.get('request_id')}: {config.get('width')}x{config.get('height')} "
                f"@ {config.get('fps')} fps, seed {config.get('seed')}"
                + (f", ignored {', '.join(ignored)}" if ignored else "")
            )
        elif kind == protocol.CHUNK_METADATA:
            self._pending_meta = message
        elif kind == protocol.QUEUED:
            eid = message.get("event_id", "")
            if eid in self.sent_at and eid not in self.ack_latency:
                self.ack_latency[eid] = t - self.sent_at[eid]
            self._new_acks.append(eid)
        elif kind == protocol.ERROR:
            self.errors.append(message)
            if message.get("code") in _ENDING:
                self.failure = message
            event = f" (event {message['event_id']})" if message.get("event_id") else ""
            say(f"error {message.get('code')}: {message.get('message')}{event}")
        elif kind == protocol.DONE:
            self.done = message

    def received_binary(self, data: bytes, say: Callable[[str], None]) -> None:
        t = self.now()
        meta, self._pending_meta = self._pending_meta or {}, None
        self.timeline.append({"t": round(t, 6), "direction": "received", "binary_bytes": len(data)})
        if not self._fresh(meta):
            return  # an init pair or a replayed payload after a resume: the recording has it already
        self.payloads.append(data)
        self.metadata.append(meta)
        self.playhead.received(VirtualPlayhead.chunk_seconds(meta, self.video_start), time.monotonic())
        say(self._progress_line(meta, len(data), t))

    def _progress_line(self, meta: dict[str, Any], size: int, t: float) -> str:
        index = meta.get("transport_chunk_index", len(self.payloads) - 1)
        acks = (
            " ".join(
                f"{eid}({self.ack_latency[eid] * 1000:.1f}ms)" if eid in self.ack_latency else eid
                for eid in self._new_acks
            )
            or "-"
        )
        self._new_acks.clear()
        if meta.get("kind") == "trailer":
            return f"[chunk {index:3d}] trailer bytes={size} acks={acks}"
        frames = int(meta.get("num_frames") or 0)
        self._frames += frames
        if self._first_media_at is None:
            self._first_media_at = t
        fps = (self.video_start or {}).get("config", {}).get("fps") or 0
        lead = f"{self._frames / fps - (t - self._first_media_at):+.2f}s" if fps else "?"
        started = ",".join(meta.get("started_event_ids") or []) or "-"
        completed = ",".join(meta.get("completed_event_ids") or []) or "-"
        return (
            f"[chunk {index:3d}] frames={frames} total={self._frames} bytes={size} lead={lead} "
            f"acks={acks} started={started} completed={completed}"
        )

    @property
    def frames(self) -> int:
        return self._frames

    @property
    def complete(self) -> bool:
        """`session.done` arrived, with every chunk it counts, and nothing ended the session early."""
        return self.done is not None and self.failure is None and self.done.get("chunks") == len(self.payloads)

    def timeline_json(self) -> dict[str, Any]:
        parts = urlsplit(self.url)
        return {
            "url": urlunsplit(parts._replace(query="")),  # never a ?token=
            "started_at": self.started_wall,
            "clock": "t = seconds since the connection was opened (monotonic)",
            "messages": self.timeline,
        }


async def record_session(args: argparse.Namespace, say: Callable[[str], None]) -> Recording:
    """Run one session to its end (or Ctrl-C), returning what arrived."""
    url = endpoint(args.url)
    rec = Recording(url)
    start: dict[str, Any] = {"type": protocol.START, "prompt": args.prompt}
    for name in ("seconds", "num_frames", "width", "height", "fps", "seed"):
        if getattr(args, name) is not None:
            start[name] = getattr(args, name)
    if getattr(args, "image_reference", None) is not None:
        start["image_reference"] = {"image_url": args.image_reference}
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    loop = asyncio.get_running_loop()
    tasks = TaskSet()
    ws: ClientConnection | None = None
    send_lock = asyncio.Lock()

    async def send(message: dict[str, Any]) -> None:
        assert ws is not None
        async with send_lock:
            await ws.send(json.dumps(message))
            rec.sent(message)

    def spawn(coro: Any) -> None:
        tasks.spawn(coro)

    async def stop_then_give_up() -> None:
        if ws is None:  # not connected yet: the stop follows the start
            return
        if rec.done is None:
            try:
                await send({"type": protocol.STOP})
            except ConnectionClosed:
                return
        await asyncio.sleep(STOP_WAIT_SECONDS)
        say(f"no session.done {STOP_WAIT_SECONDS:.0f} s after session.stop; closing")
        await ws.close()

    def on_sigint() -> None:
        if not rec.interrupted:
            rec.interrupted = True
            say("interrupted: session.stop sent, waiting for session.done (Ctrl-C again to quit now)")
            spawn(stop_then_give_up())
        elif ws is not None:
            say("quitting without session.done")
            spawn(ws.close())

    async def run_updates(updates: list[tuple[float, dict[str, Any]]], video_started: float) -> None:
        for at, interaction in updates:
            delay = video_started + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if rec.interrupted or rec.done is not None:
                return
            await send({"type": protocol.INTERACTION, "interaction": interaction})
            rec.unsent.remove(interaction["event_id"])

    async def report_playback(every: float) -> None:
        try:
            while rec.done is None and not rec.interrupted:
                await send(rec.playhead.report(time.monotonic()))
                await asyncio.sleep(every)
        except ConnectionClosed:
            pass  # the session is over: what arrived is saved

    updates: list[tuple[float, dict[str, Any]]] = []
    for number, update in enumerate(sorted(args.update, key=lambda u: u.at), 1):
        interaction: dict[str, Any] = {"event_id": f"update-{number}", "event": {"prompt": update.prompt}}
        if update.transition_chunks is not None:
            interaction["transition_chunks"] = update.transition_chunks
        updates.append((update.at, interaction))
    for number, move in enumerate(sorted(getattr(args, "camera", []), key=lambda c: c.at), 1):
        updates.append(
            (move.at, {"event_id": f"camera-{number}", "event": {"multi_modal_data": {"camera": move.camera}}})
        )
    updates.sort(key=lambda item: item[0])  # stable: prompt updates first at equal times
    rec.unsent = [interaction["event_id"] for _, interaction in updates]
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    attempts = getattr(args, "resume_attempts", 0) or 0
    if attempts > 0:
        start["resumable"] = True  # a dropped connection is resumed (docs/protocol.md §9.1)
    try:
        ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=10)
        rec.origin, rec.started_wall = time.monotonic(), time.time()
        await send(start)
        if rec.interrupted:
            spawn(stop_then_give_up())
        while True:  # one turn per connection: the first, then each resumed one
            try:
                async for frame in ws:
                    if isinstance(frame, bytes):
                        rec.received_binary(frame, say)
                        continue
                    try:
                        message = json.loads(frame)
                    except ValueError:
                        say(f"not JSON from the server: {frame[:80]!r}")
                        continue
                    rec.received_text(message, say)
                    if message.get("type") == protocol.VIDEO_START and updates:
                        spawn(run_updates(updates, time.monotonic()))
                    if message.get("type") == protocol.VIDEO_START and getattr(args, "report_playback", None):
                        spawn(report_playback(args.report_playback))
                    if rec.done is not None:
                        break
            except ConnectionClosed:
                pass
            if rec.done is not None or rec.interrupted or attempts <= 0:
                break
            resumed = await resume_recording(url, headers, rec, attempts, say)
            if resumed is None:
                break
            ws = resumed
    except (ConnectionClosed, OSError, InvalidHandshake):
        if ws is None:
            raise
        # what arrived is saved; `complete` says whether it is everything
    finally:
        if ws is not None:
            await ws.close()
        loop.remove_signal_handler(signal.SIGINT)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*list(tasks), return_exceptions=True)
    return rec


async def resume_recording(
    url: str, headers: dict[str, str] | None, rec: Recording, attempts: int, say: Callable[[str], None]
) -> ClientConnection | None:
    """The connection dropped before session.done: resume it (docs/protocol.md §9.1) up to
    `attempts` times, waiting 0.25 s, 0.5 s, 1 s… between; None when it cannot be resumed."""
    token = (rec.video_start or {}).get("resume_token")
    if not token:
        return None
    for attempt in range(attempts):
        await asyncio.sleep(RESUME_BACKOFF_SECONDS * 2**attempt)
        say(f"connection lost after chunk {rec.last_index}: resuming ({attempt + 1}/{attempts})")
        try:
            ws = await connect(url, additional_headers=headers, max_size=None, open_timeout=10)
            resume = {"type": protocol.RESUME, "resume_token": token, "last_transport_chunk_index": rec.last_index}
            await ws.send(json.dumps(resume))
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        except (OSError, ConnectionClosed, InvalidHandshake, asyncio.TimeoutError, ValueError):
            continue
        if first.get("type") == protocol.VIDEO_START and first.get("resumed"):
            rec.received_text(first, say)
            return ws
        await ws.close()
        if first.get("type") == protocol.ERROR and "attached" in str(first.get("message")):
            continue  # the server has not seen the old connection go yet
        rec.received_text(first, say)
        rec.failure = first
        return None
    say(f"could not resume after {attempts} attempts")
    return None


# --- saving --------------------------------------------------------------------------------------
def remux_to_mp4(stream: bytes, path: Path) -> None:
    """The fragmented MP4 `stream` as a progressive MP4 (`moov` first, with the duration), packets
    copied as they are: no re-encode. Written next to `path` and then renamed over it."""
    import av

    tmp = path.with_name(path.name + ".part")
    with av.open(io.BytesIO(stream), mode="r", format="mp4") as src:
        source = src.streams.video[0]
        with av.open(str(tmp), mode="w", format="mp4", options={"movflags": "+faststart"}) as dst:
            target = dst.add_stream_from_template(source)
            for packet in src.demux(source):
                if packet.dts is None:  # the demuxer's empty flush packet
                    continue
                packet.stream = target
                dst.mux(packet)
    os.replace(tmp, path)


def save(rec: Recording, args: argparse.Namespace, say: Callable[[str], None]) -> bool:
    """Write the requested files; False when the MP4 could not be written."""
    ok = True
    stream = b"".join(rec.payloads)
    if args.raw is not None:
        args.raw.write_bytes(stream)
        say(f"wrote {args.raw} ({len(stream)} bytes, fragmented MP4 as received)")
    if args.timeline is not None:
        args.timeline.write_text(json.dumps(rec.timeline_json(), indent=1, ensure_ascii=False) + "\n")
        say(f"wrote {args.timeline} ({len(rec.timeline)} messages)")
    if not rec.payloads:
        say("no video arrived; no MP4 written")
        return ok
    try:
        remux_to_mp4(stream, args.output)
    except Exception as exc:  # noqa: BLE001 - a damaged stream: say so, keep the exit status honest
        say(f"could not write {args.output}: {exc}")
        return False
    fps = (rec.video_start or {}).get("config", {}).get("fps") or 0
    seconds = f", {rec.frames / fps:.2f} s" if fps else ""
    say(f"wrote {args.output} ({rec.frames} frames{seconds})")
    return ok


def main(args: argparse.Namespace) -> int:
    """`rtvideo record`: 0 after a complete session.done, 1 otherwise."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        import av  # noqa: F401 - checked before connecting, not after the session
    except ImportError:
        say(AV_MISSING)
        return 1
    if args.seconds is None and args.num_frames is None:
        say("open-ended session: Ctrl-C stops it and saves what arrived")
    try:
        rec = asyncio.run(record_session(args, say))
    except InvalidStatus as exc:
        say(f"rtvideo record: the server refused the connection: HTTP {exc.response.status_code}")
        return 1
    except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
        say(f"rtvideo record: cannot connect to {endpoint(args.url)}: {exc or type(exc).__name__}")
        return 1
    except KeyboardInterrupt:  # before the session's handler was in place: nothing to save
        return 1
    saved = save(rec, args, say)
    for eid in rec.unsent:
        say(f"{eid} was not sent: the session ended first")
    if rec.done is not None:
        done = rec.done
        say(
            f"session.done: {done.get('chunks')} chunks, stopped={str(done.get('stopped')).lower()}, "
            f"unapplied={done.get('unapplied_event_ids')}, unfinished={done.get('unfinished_event_ids')}"
        )
    else:
        say("the connection ended without session.done")
    if rec.done is not None and not rec.complete and rec.failure is None:
        say(f"session.done counts {rec.done.get('chunks')} chunks, {len(rec.payloads)} arrived")
    return 0 if rec.complete and saved else 1
