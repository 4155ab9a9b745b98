"""`rtvideo replay`'s command line, importable without the backend's packages: the work
(`rtvideo.backend.replay.regenerate`, torch and PyAV) is imported only when the command runs, so a
client-only install lists it and says what it needs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = (
    "Re-generate a built-in generator's recording in this process (no Triton): each interaction "
    "takes effect exactly where its event log says; the output is the recorded video.mp4 again "
    "(docs/recordings.md)."
)


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "recording",
        help="a recording directory (manifest.json, events.jsonl), or a proxy's recording URL: "
        "http(s)://HOST/v1/recordings/ID, or its /video.mp4 or /events.jsonl, with or without "
        "?recording_token= (as `rtvideo record --record` prints it)",
    )
    parser.add_argument("-o", "--output", required=True, type=Path, help="the MP4 to write")
    parser.add_argument(
        "--token",
        default=os.environ.get("RTVIDEO_TOKEN"),
        help="the proxy's client token, for a recording URL, when it has one (default: $RTVIDEO_TOKEN)",
    )
    parser.add_argument(
        "--recording-token",
        default=os.environ.get("RTVIDEO_RECORDING_TOKEN"),
        help="the recording's token (video.start's recording_token), for a recording URL; best given as "
        "$RTVIDEO_RECORDING_TOKEN, not on a command line",
    )
    parser.add_argument("--device", default="cpu", help="the built-in generator's device (default cpu)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's CPU threads: the model's `torch_threads` (default 1); the prompt embeddings, "
        "and so the frames, are exact only with the same count",
    )


def main(args: Any) -> int:
    try:
        from rtvideo.backend.replay import regenerate
    except ImportError as exc:
        print(
            f"rtvideo replay: error: it needs the backend's packages ({exc.name} is missing): "
            "pip install 'rtvideo[backend]'",
            file=sys.stderr,
        )
        return 1
    return regenerate.main(args)
