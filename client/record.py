"""Record one realtime video session to an MP4, with prompt updates on a schedule.

    rtvideo record "A quiet harbour at dawn" --seconds 10 --update "3:A snowy street at night"
    rtvideo record "Lanterns" --url ws://gpu-box:8080 --update "2:Fog rolls in:0" -o fog.mp4 --timeline t.json
    rtvideo record "A lighthouse" --seconds 8 --record   # the server keeps it too: id and token printed

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
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from websockets.exceptions import InvalidHandshake, InvalidStatus

from rtvideo.client.record_output import save
from rtvideo.client.record_session import ENDPOINT, endpoint, record_session
from rtvideo.client.session import image_data_url
from rtvideo.core import fields, protocol
from rtvideo.core.errors import ProtocolError

DEFAULT_URL = "ws://127.0.0.1:8080/v1/realtime/video"
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
        if chunks > fields.MAX_TRANSITION_CHUNKS:
            raise argparse.ArgumentTypeError(f"{text!r}: TRANSITION_CHUNKS must be 0 to {fields.MAX_TRANSITION_CHUNKS}")
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
    parser.add_argument(
        "--record",
        action="store_true",
        help="the server records the session too (record: true; it needs rtvideo serve --recordings DIR): "
        "prints the recording's id and its recording token, which opens, branches and deletes it",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="ask for in-band metrics (docs/protocol.md section 3.5) and write each session.metrics as a "
        "line {t, message} of OUTPUT with the suffix .metrics.jsonl (out.mp4: out.metrics.jsonl)",
    )


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
