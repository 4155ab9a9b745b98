"""`rtvideo replay`: re-generate a built-in-generator recording in this process, no Triton.

The recording's event log is the session's state (`rtvideo.core.session_log`): the built-in
source (`GeneratorChunkSource`) gets every event that started as a scripted event of a
`rebuild` at chunk 0, so each one is admitted just before its recorded boundary, a camera
event at its recorded frame, and every chunk is rendered. Frames are encoded with the model's
encoder and settings (`FragmentedMp4Encoder`, the built-in generator's limits), so the output
is the recorded `video.mp4` again, byte for byte, when both ran on the same kind of device (CPU
here) with the same torch thread count (the model's `torch_threads`, 1 by default: MiniLM's
prompt embeddings differ in their last bits with another count, and so may a pixel).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rtvideo.backend import catalog
from rtvideo.backend.runtime.ports import GeneratorSession, VideoGenerator
from rtvideo.backend.runtime.sources import GeneratorChunkSource, RenderedChunk
from rtvideo.core.conditioning import LINEAR, Conditioning
from rtvideo.core.pose import Pose
from rtvideo.core.rebuild import Rebuild
from rtvideo.core.session_config import SessionConfig
from rtvideo.core.session_log import SessionLog, parse_lines, read_log
from rtvideo.core.transitions import ChunkPlan

#: how long fetching a recording's files may take
FETCH_TIMEOUT_SECONDS = 60.0


class ReplayError(RuntimeError):
    """The recording cannot be replayed here; the message says why."""


class FrameRenderer:
    """A `Renderer` that renders without encoding and keeps each chunk's raw frames (`last`)."""

    def __init__(self, session: GeneratorSession) -> None:
        self._session = session
        self.last: np.ndarray | None = None

    def render(self, mix: Conditioning, num_frames: int, poses: Sequence[Pose] | None = None) -> RenderedChunk:
        t0 = time.perf_counter()
        frames = self._session.generate(mix, num_frames, poses)
        self.last = frames
        return RenderedChunk(b"", len(frames), time.perf_counter() - t0, 0.0)

    def skip(self, num_frames: int) -> None:
        self._session.skip(num_frames)  # type: ignore[attr-defined]  # the built-in session's

    def close(self) -> bytes:
        self._session.close()
        return b""


def session_config(log: SessionLog) -> SessionConfig:
    """The recorded session's configuration, from its `video.start` `config`."""
    if log.branched_from is not None:
        raise ReplayError(
            "this recording is a branch of another one: its events before the branch point are in the other "
            f"recording ({log.branched_from}); replaying a branch is not supported yet"
        )
    if not log.built_in():
        raise ReplayError(
            "this recording was made with a generator other than the built-in one (its config has sampling): "
            "only the built-in generator's sessions can be re-generated exactly"
        )
    c = log.config
    try:
        prompts = c.get("prompts")
        return SessionConfig(
            prompt=str(c["prompt"]),
            format=str(c.get("format", "m4s")),
            model=str(c.get("model", "")),
            width=int(c["width"]),
            height=int(c["height"]),
            fps=int(c["fps"]),
            frames_per_chunk=int(c["frames_per_chunk"]),
            default_transition_chunks=int(c["default_transition_chunks"]),
            num_frames=None if c.get("num_frames") is None else int(c["num_frames"]),
            seed=int(c["seed"]),
            prompts=None if prompts is None else tuple((str(p["text"]), float(p["weight"])) for p in prompts),
            interpolation=str(c.get("interpolation", LINEAR)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"the recording's video.start config is not usable: {exc!r}") from None


def _reference_image(log: SessionLog, config: SessionConfig) -> np.ndarray | None:
    reference = log.start_fields.get("image_reference")
    if reference is None:
        return None
    from rtvideo.backend.media.image_reference import MediaPolicy, load_image_reference, resize_image
    from rtvideo.core.start_request import validate_start

    url = validate_start({"prompt": "x", "image_reference": reference}).image_reference
    assert url is not None
    return resize_image(load_image_reference(url, MediaPolicy()), config.width, config.height)


@dataclass
class Replayed:
    """One replayed chunk: its plan and raw frames."""

    plan: ChunkPlan
    frames: np.ndarray


def replay_frames(log: SessionLog, generator: VideoGenerator, rebuild_at: int = 0) -> Iterator[Replayed]:
    """The recording's chunks from `rebuild_at` on (the earlier ones rebuilt, not rendered), raw."""
    config = session_config(log)
    image = _reference_image(log, config)
    session = generator.open_session(
        width=config.width,
        height=config.height,
        seed=config.seed,
        fps=config.fps,
        **({"image": image} if image is not None else {}),
    )
    renderer = FrameRenderer(session)
    events = log.rebuild(max(log.chunk_frames, default=0)).events
    source = GeneratorChunkSource(renderer, _with_rebuild(config, Rebuild(rebuild_at, events)))
    try:
        for index in sorted(log.chunk_frames):
            if index < rebuild_at:
                continue
            chunk = source.next_chunk(log.chunk_frames[index])
            assert renderer.last is not None
            yield Replayed(chunk.plan, renderer.last)
    finally:
        source.close()


def _with_rebuild(config: SessionConfig, rebuild: Rebuild) -> SessionConfig:
    from dataclasses import replace

    return replace(config, rebuild=rebuild)


def replay_to_file(log: SessionLog, generator: VideoGenerator, out: Path) -> int:
    """Re-generate the whole recording into `out` (fMP4, the model's encoder); returns its frames."""
    from rtvideo.backend.media.encoder import FragmentedMp4Encoder

    config = session_config(log)
    encoder = FragmentedMp4Encoder(config.width, config.height, config.fps, catalog.LIMITS["builtin"])
    frames = 0
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "wb") as f:
        for chunk in replay_frames(log, generator):
            f.write(encoder.encode_chunk(chunk.frames))
            frames += len(chunk.frames)
        f.write(encoder.close())
    os.replace(tmp, out)
    return frames


# --- reading a recording ---------------------------------------------------------------------
#: a recording's URL path: `.../v1/recordings/{id}`, or one of its files (what the product prints:
#: `rtvideo record --record` names its video.mp4, the recordings page links both files)
_RECORDING_PATH = re.compile(r"(?P<base>.*/v1/recordings/[0-9a-f]{32})(?:/(?:video\.mp4|events\.jsonl))?/?")


@dataclass(frozen=True)
class RecordingUrl:
    """A proxy's recording, as a URL the product prints names it."""

    base: str  # http(s)://HOST[/prefix]/v1/recordings/{id}: no query, no file
    token: str | None  # the URL's `?token=` (the proxy's client token), if any
    recording_token: str | None  # the URL's `?recording_token=`, if any


def recording_url(location: str) -> RecordingUrl:
    """`location` read as a recording's URL: `…/v1/recordings/{id}`, `…/{id}/video.mp4` or
    `…/{id}/events.jsonl`, each with or without `?recording_token=` (and `?token=`, as the
    recordings page's links carry it). ReplayError for anything else (the message never quotes
    the query: it holds tokens)."""
    parts = urllib.parse.urlsplit(location)
    match = _RECORDING_PATH.fullmatch(parts.path)
    if parts.scheme not in ("http", "https") or not parts.netloc or match is None:
        shown = urllib.parse.urlunsplit(parts._replace(query="", fragment=""))
        raise ReplayError(
            f"{shown} is not a recording URL: expected http(s)://HOST/v1/recordings/ID "
            "(or its /video.mp4 or /events.jsonl), with ?recording_token= or --recording-token"
        )
    query = urllib.parse.parse_qs(parts.query)
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, match["base"], "", ""))
    token, recording_token = query.get("token"), query.get("recording_token")
    return RecordingUrl(base, token[-1] if token else None, recording_token[-1] if recording_token else None)


def load_recording(
    location: str, token: str | None = None, recording_token: str | None = None
) -> tuple[dict[str, Any] | None, SessionLog]:
    """The manifest (None when absent) and event log of a recording directory, or of a proxy's
    recording URL (`recording_url`), fetched with the recording's token (the bearer, or
    `?recording_token=` beside the client's `token` when the proxy has one). Tokens given as
    arguments win over those the URL carries."""
    if location.startswith(("http://", "https://")):
        url = recording_url(location)
        token, recording_token = token or url.token, recording_token or url.recording_token
        manifest = json.loads(_fetch(url.base, token, recording_token))
        text = _fetch(url.base + "/events.jsonl", token, recording_token).decode("utf-8")
    else:
        folder = Path(location)
        if not (folder / "events.jsonl").is_file():
            raise ReplayError(f"{folder} is not a recording: it has no events.jsonl")
        manifest_path = folder / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else None
        text = (folder / "events.jsonl").read_text(encoding="utf-8")
    return manifest, read_log(parse_lines(text))


def _fetch(url: str, token: str | None, recording_token: str | None = None) -> bytes:
    bearer = token or recording_token
    query = "?" + urllib.parse.urlencode({"recording_token": recording_token}) if token and recording_token else ""
    request = urllib.request.Request(url + query, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_SECONDS) as response:
            return bytes(response.read())
    except OSError as exc:  # the URL without its query: a token never reaches a message
        raise ReplayError(f"could not fetch {url}: {exc}") from None


# --- the command -------------------------------------------------------------------------------
def main(args: Any) -> int:
    """`rtvideo replay` (its arguments: `rtvideo.backend.replay.command`): 0 when written, 1
    (one line on standard error) when it cannot be replayed."""
    import sys

    try:
        _, log = load_recording(args.recording, args.token, args.recording_token)
        session_config(log)  # refuses another generator's recording before anything loads
        from rtvideo.backend.builtin.generator import BuiltinGenerator
        from rtvideo.backend.runtime.cpu_threads import limit_cpu_threads

        limit_cpu_threads(max(1, args.torch_threads))
        generator = BuiltinGenerator(device=args.device, fps=int(log.config.get("fps", 16)))
        t0 = time.perf_counter()
        frames = replay_to_file(log, generator, args.output)
    except (ReplayError, ValueError) as exc:
        print(f"rtvideo replay: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.output}: {log.chunks} chunks, {frames} frames, {len(log.events)} events "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return 0
