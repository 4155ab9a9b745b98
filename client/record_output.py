"""Writing what an `rtvideo record` session received: the progressive MP4 (remuxed by
PyAV, imported only here and only when it is written), the raw stream and the timeline.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from collections.abc import Callable
from pathlib import Path

from rtvideo.client.recording import Recording


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


def metrics_path(output: Path) -> Path:
    """Where `rtvideo record --metrics` writes the session.metrics: beside the video, OUT.metrics.jsonl."""
    return output.with_suffix(".metrics.jsonl")


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
    if getattr(args, "metrics", False):
        path = metrics_path(args.output)
        path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in rec.metrics))
        say(f"wrote {path} ({len(rec.metrics)} session.metrics)")
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
