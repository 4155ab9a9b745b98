"""Helpers shared by the end-to-end tests: collect a session, check the stream rules, decode."""

from __future__ import annotations

import functools
import io
import json
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import av
import numpy as np
from jsonschema import Draft202012Validator

from rtvideo.core.chunks import mentioned_event_ids

FAST_MODEL = "realtime_video"  # unpaced, so tests run at generator speed
#: vLLM-Omni's example client asks for this model; the fast model also serves it (--served-model-name)
HELIOS_ID = "BestWishYsh/Helios-Distilled"
FAST_MODEL_NAMES = (FAST_MODEL, HELIOS_ID)
PACED_MODEL = "realtime_video_paced"  # the shipped pacing, two sessions at most
#: small and in-process, 4 sessions on a sequence batcher of SLOTS_MODEL_SLOTS slots: the model
#: whose slot gauges tests/e2e/test_late_probe.py reads (no other test uses it, so what it holds
#: is that test's), served by the session's Triton rather than one of its own
SLOTS_MODEL = "realtime_video_slots"
SLOTS_MODEL_SLOTS = 8
SLOTS_MODEL_OPTIONS = {"width": "64", "height": "64", "render_workers": "0", "max_sessions": "4"}
#: as SLOTS_MODEL, with Triton's idle timeout (max_sequence_idle_microseconds) at IDLE_MODEL_SECONDS
#: (the shipped one is 120 s): tests/e2e/test_sequence_slots.py fills its batcher and waits it out
IDLE_MODEL = "realtime_video_idle"
IDLE_MODEL_SECONDS = 8.0
#: a media chunk's lists of the events that ended in it (docs/protocol.md §6)
ENDS = ("completed_event_ids", "superseded_event_ids", "interrupted_event_ids")


@functools.cache
def schema_validator(name: str) -> Draft202012Validator:
    """`rtvideo/schemas/<name>.json` (the package data users get), checked and compiled once."""
    schema = json.loads((files("rtvideo") / "schemas" / f"{name}.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(message: Any, name: str) -> list[str]:
    """Why `message` does not match the schema `name` (empty when it does)."""
    errors = schema_validator(name).iter_errors(message)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def check_server_message(message: dict[str, Any]) -> None:
    """Every message the server sends matches rtvideo/schemas/server_messages.json."""
    errors = schema_errors(message, "server_messages")
    assert not errors, f"{message.get('type')} breaks server_messages.json: {errors}; message: {message}"


@dataclass
class Transcript:
    """Everything one session received, in arrival order; each message is checked against the
    published JSON Schema as it is added, so every end-to-end test validates what it receives."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[tuple[dict[str, Any], bytes]] = field(default_factory=list)

    def add(self, message: dict[str, Any] | None, data: bytes) -> None:
        if message is None:
            return
        check_server_message(message)
        self.messages.append(message)
        if message.get("type") == "video.chunk_metadata":
            self.pairs.append((message, data))

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    @property
    def media(self) -> list[dict[str, Any]]:
        return [m for m, _ in self.pairs if m["kind"] == "media"]

    @property
    def video(self) -> bytes:
        return b"".join(data for _, data in self.pairs)


def check_stream_rules(t: Transcript) -> None:
    """The rules every session obeys (docs/protocol.md §3, §6, §7)."""
    start = t.messages[0]
    assert start["type"] == "video.start", start
    rid = start["request_id"]
    acked: set[str] = set()
    for m in t.messages:
        if "request_id" in m and m["type"] != "video.start":
            assert m["request_id"] == rid
        if m["type"] == "session.interaction.queued":
            acked.add(m["event_id"])
        if m["type"] == "video.chunk_metadata":
            named = mentioned_event_ids(m)
            assert named <= acked, f"metadata names {named - acked} before their ack"
    for i, (meta, data) in enumerate(t.pairs):
        assert meta["transport_chunk_index"] == i
        assert meta["byte_length"] == len(data)
        assert set(meta["transition_progress"]) == set(meta["active_event_ids"])
    media = t.media
    assert [m["generation_chunk_index"] for m in media] == list(range(len(media)))
    check_event_lifetimes(media)
    if t.pairs and t.pairs[-1][0]["kind"] == "trailer":
        assert t.pairs[-1][0]["generation_chunk_index"] is None and t.pairs[-1][0]["num_frames"] == 0
    assert all(m["kind"] == "media" for m, _ in t.pairs[:-1])
    if t.pairs:
        assert t.pairs[0][1][4:8] == b"ftyp"
    done = t.messages[-1]
    assert done["type"] == "session.done" and done["chunks"] == len(t.pairs)


def event_ends(t: Transcript) -> list[str]:
    """Every end an event of the session reached, an id once per end (docs/protocol.md §6): each
    completed, superseded or interrupted in a media chunk, then each the done names unapplied or
    unfinished. An acked event stands here exactly once."""
    done = t.messages[-1]
    in_chunks = [e for m in t.media for key in ENDS for e in m[key]]
    return in_chunks + done["unapplied_event_ids"] + done["unfinished_event_ids"]


def check_event_lifetimes(media: list[dict[str, Any]]) -> None:
    """The chunk lists of every kind of event (docs/protocol.md §6): started and completed events
    are active in that chunk; an event starts once and completes once; it is active in every
    chunk from its start to its completion, with no gap, and never listed after its end
    (completed, superseded or interrupted)."""
    started_at: dict[str, int] = {}
    last_active: dict[str, int] = {}
    ended: set[str] = set()
    for m in media:
        i, active = m["generation_chunk_index"], set(m["active_event_ids"])
        lists = {k: m[k] for k in ("started_event_ids", "active_event_ids", "completed_event_ids")}
        assert set(m["started_event_ids"]) <= active, (i, lists)
        assert set(m["completed_event_ids"]) <= active, (i, lists)
        for e in m["started_event_ids"]:
            assert e not in started_at, (f"{e} started twice", i, lists)
            started_at[e] = i
        for e in active:
            assert e in started_at, (f"{e} active before it started", i, lists)
            assert e not in ended, (f"{e} listed after its end", i, lists)
            assert started_at[e] == i or last_active.get(e) == i - 1, (f"{e} active with a gap", i, lists)
            last_active[e] = i
        ended |= {e for key in ENDS for e in m[key]}


def decode(video: bytes) -> np.ndarray:
    """Decode a fragmented MP4 with PyAV into RGB frames [N, H, W, 3]."""
    with av.open(io.BytesIO(video), mode="r", format="mp4") as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)


def split_chunks(frames: np.ndarray, counts: Iterable[int]) -> list[np.ndarray]:
    out, at = [], 0
    for n in counts:
        out.append(frames[at : at + n])
        at += n
    return out


def distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float32) - b.astype(np.float32)).mean())


def metric(triton: Any, name: str, model: str, label: str = "") -> float:
    """A model's custom metric from Triton's /metrics, summed over its other labels (0 before any);
    `label` (e.g. 'reason="stopped"') keeps only the series that carry it."""
    text = urllib.request.urlopen(triton.metrics_url, timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and f'model="{model}"' in line and label in line
    )


def wait_for_metric(triton: Any, name: str, model: str, expected: float, timeout: float = 30.0) -> None:
    """Metrics are flushed a few times a second: poll until the value is reached (the default
    deadline only bounds a failure: a loaded machine publishes late)."""
    deadline = time.monotonic() + timeout
    while (value := metric(triton, name, model)) != expected:
        assert time.monotonic() < deadline, f"{name}{{model={model}}} is {value}, expected {expected}"
        time.sleep(0.05)


def ids(meta: dict[str, Any]) -> tuple:
    """A chunk metadata's event ids: started, active, completed, superseded, interrupted."""
    return (
        meta["started_event_ids"],
        meta["active_event_ids"],
        meta["completed_event_ids"],
        meta["superseded_event_ids"],
        meta["interrupted_event_ids"],
    )
