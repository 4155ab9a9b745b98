"""A session that starts from a recording (docs/recordings.md "Branching").

`session.start` with `"from_recording": {"recording_id": ID, "generation_chunk_index": N,
"recording_token": TOKEN}` starts a new session whose chunk N is the recorded session's chunk N: the recorded start (its
seed pinned) goes to the model with `rebuild` (docs/triton-model.md), every event that took
effect at chunks 0..N with where it did, read from the recording's event log
(rtvideo.core.session_log). The model rebuilds its state without encoding and streams from
chunk N.

Rules: the recording's token is required (without it, or with another's, the answer is the
one an unknown id gets: a recording's existence is not told to a stranger); the start's
`prompt` may be omitted; every other session field it gives must equal the recording's
(`invalid_start` naming the first that differs, never quoting the recording's value); the proxy's own options
(`record`, `watchable`, `resumable`, `steerable`) and `metrics` are the new session's. A
client never sends `rebuild` itself (`invalid_start`): it is how the proxy talks to the model.
Only a built-in-generator recording branches exactly. Another generator's (vLLM-Omni's)
engine state cannot be rebuilt: its branch is the approximation of rtvideo.core.approximation,
from the recording's last frame before chunk N (read from its `video.mp4`) and the prompt in
effect there; `video.start` says `branch_exact: false`.

The log is read and parsed as a stream on the recordings' branch threads, never on the event
loop, and at most `MAX_BRANCHES` branches are prepared at once (`server_busy` beyond).
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass, replace
from typing import Any

from rtvideo.core import server_messages
from rtvideo.core.approximation import approximate_start
from rtvideo.core.errors import ErrorCode, ProtocolError
from rtvideo.core.fields import as_int
from rtvideo.core.session_log import SessionLog, SessionLogError, iter_lines, read_log
from rtvideo.proxy.placement import first_frame
from rtvideo.proxy.recordings import ids
from rtvideo.proxy.recordings.backing import EVENTS, VIDEO
from rtvideo.proxy.recordings.service import BranchesBusy, Recordings

FROM_RECORDING = "from_recording"
REBUILD = "rebuild"
#: start fields a branch may set for itself (the proxy's options, and in-band metrics)
OWN_FIELDS = frozenset({"type", "record", "watchable", "resumable", "steerable", "metrics"})
MAX_CHUNK_INDEX = 1_000_000
#: a branch's own length, when its start gives one: the frames its stream carries from chunk N
#: (an open-ended recording's branch is open-ended otherwise: a client saving it never returns)
LENGTH_FIELDS = frozenset({"num_frames", "seconds"})
#: a recording token is 4 + 43 characters; anything much longer is not one
MAX_TOKEN_CHARS = 256


@dataclass(frozen=True)
class Branch:
    recording_id: str
    generation_chunk_index: int
    #: the recording's token (never logged, never in `as_json`)
    token: str = ""
    #: whether chunk N is the recording's exactly (the built-in generator) or approximated
    exact: bool = True

    def as_json(self) -> dict[str, Any]:
        return {"recording_id": self.recording_id, "generation_chunk_index": self.generation_chunk_index}


def _invalid(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_START, message)


def take_branch(first: dict[str, Any]) -> Branch | None:
    """`from_recording`, checked and taken out of the start (None when absent); a client's
    `rebuild` is refused."""
    if REBUILD in first:
        raise _invalid("rebuild is not a session.start field (branch with from_recording)")
    if FROM_RECORDING not in first:
        return None
    spec = first.pop(FROM_RECORDING)
    if not isinstance(spec, dict) or set(spec) != {"recording_id", "generation_chunk_index", "recording_token"}:
        raise _invalid("from_recording must be {recording_id, generation_chunk_index, recording_token}")
    try:
        rid = ids.check(spec["recording_id"])
    except ids.MalformedId as exc:
        raise _invalid(f"from_recording.recording_id: {exc}") from None
    index = as_int(
        spec["generation_chunk_index"],
        "from_recording.generation_chunk_index",
        0,
        MAX_CHUNK_INDEX,
        ErrorCode.INVALID_START,
    )
    token = spec["recording_token"]
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS:
        raise _invalid("from_recording.recording_token must be the recording's token (a string)")
    return Branch(rid, index, token)


def _read_log(recordings: Recordings, branch: Branch) -> tuple[dict[str, Any], SessionLog]:
    """The manifest and the parsed event log, read line by line (blocking: on the branch threads)."""
    manifest = recordings.store.authorised(branch.recording_id, branch.token)
    opened = recordings.store.open(branch.recording_id, EVENTS) if manifest is not None else None
    if manifest is None or opened is None:
        raise _invalid(f"from_recording: no recording {branch.recording_id}")
    if manifest.get("status") == "recording":
        opened[0].close()
        raise _invalid(f"from_recording: recording {branch.recording_id} is still being recorded")
    f, _ = opened
    with f:
        try:
            return manifest, read_log(iter_lines(io.TextIOWrapper(f, encoding="utf-8")))
        except (SessionLogError, UnicodeDecodeError) as exc:
            raise _invalid(f"from_recording: recording {branch.recording_id} cannot be read: {exc}") from None


def _frame_before(recordings: Recordings, branch: Branch) -> str:
    """The recording's last frame before chunk N as a data URL (blocking). Its video holds one
    fragment per media chunk in order, chunk k the k-th (a branch of a branch is refused)."""
    opened = recordings.store.open(branch.recording_id, VIDEO)
    if opened is None:
        raise _invalid(f"from_recording: no recording {branch.recording_id}")
    f, _ = opened
    try:
        with f:
            init, fragment = first_frame.fragment_of(f, branch.generation_chunk_index - 1)
        return first_frame.image_url(first_frame.last_frame(init, fragment))
    except first_frame.NoFrame as exc:
        raise _invalid(f"from_recording: recording {branch.recording_id}'s video: {exc}") from None


def _check(log: SessionLog, branch: Branch, given: dict[str, Any]) -> None:
    if log.branched_from is not None:  # its earlier events are in another recording's log
        raise _invalid("from_recording: this recording is itself a branch; branch its parent instead")
    if branch.generation_chunk_index >= log.chunks:
        raise _invalid(
            f"from_recording.generation_chunk_index {branch.generation_chunk_index}: "
            f"the recording has chunks 0-{log.chunks - 1}"
        )
    recorded = log.start_message()
    for name, value in given.items():
        if name in OWN_FIELDS or name in LENGTH_FIELDS:
            continue
        if recorded.get(name) != value:
            raise _invalid(f"{name}: a branch keeps the recording's value; omit it, or send the recorded one")


async def branch_start(recordings: Recordings | None, branch: Branch, given: dict[str, Any]) -> tuple[bytes, Branch]:
    """The start to send the model for `branch` (`given`: the client's start without the proxy's
    options), and the branch with its exactness. ProtocolError (`invalid_start`) when it cannot
    be branched."""
    if recordings is None:
        raise _invalid("from_recording: recordings are off on this server (rtvideo serve --recordings DIR)")
    try:
        with recordings.branch_gate():
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(recordings.branch_reader, _prepare, recordings, branch, given)
    except BranchesBusy as exc:
        raise ProtocolError(ErrorCode.SERVER_BUSY, f"from_recording: {exc}") from None


def _length(given: dict[str, Any], log: SessionLog) -> int | None:
    """The frames the branch's start asks for (`num_frames`, or `seconds` at the recording's
    fps, rounded as the model rounds them); None when it asks for none."""
    frames, seconds = given.get("num_frames"), given.get("seconds")
    if isinstance(frames, int) and not isinstance(frames, bool) and frames >= 1:
        return frames
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)  # vLLM-Omni's form, as rtvideo.core.start_request takes it
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds > 0:
        return max(1, round(seconds * float(log.config.get("fps") or 16)))
    if frames is not None or seconds is not None:
        raise _invalid("num_frames must be an integer >= 1 and seconds a number > 0")
    return None


def _prepare(recordings: Recordings, branch: Branch, given: dict[str, Any]) -> tuple[bytes, Branch]:
    """The model's start for `branch` (blocking: read, parsed and built on the branch threads)."""
    _, log = _read_log(recordings, branch)
    _check(log, branch, given)
    start = log.start_message()
    for name in OWN_FIELDS - {"type"}:
        start.pop(name, None)
        if name in given:
            start[name] = given[name]
    at = branch.generation_chunk_index
    length = _length(given, log)
    if length is not None:  # the model counts the session from chunk 0: the chunks before N, then the branch's
        start.pop("seconds", None)
        start["num_frames"] = sum(frames for index, frames in log.chunk_frames.items() if index < at) + length
    if log.built_in():
        start[REBUILD] = log.rebuild(at).to_json()
        exact = True
    else:
        image = _frame_before(recordings, branch) if at > 0 else None
        frames_before = sum(frames for index, frames in log.chunk_frames.items() if index < at)
        start = approximate_start(
            start, seed=log.seed, at=at, events=log.events, image_url=image, frames_before=frames_before
        )
        exact = False
    encoded = server_messages.encode(start).encode("utf-8", "surrogatepass")
    return encoded, replace(branch, exact=exact)
