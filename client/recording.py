"""`Recording`: what one `rtvideo record` session sent and received, and its progress lines.

The session loop (`rtvideo.client.record_session`) feeds it every frame; the output
(`rtvideo.client.record_output`) writes what it holds; `rtvideo record` reads its result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rtvideo.client.session import VirtualPlayhead
from rtvideo.core import protocol
from rtvideo.core.errors import SESSION_ENDING_CODES

_ENDING = {code.value for code in SESSION_ENDING_CODES}


@dataclass
class Recording:
    """What one session sent and received, and the state of its progress lines."""

    url: str
    started_wall: float = field(default_factory=time.time)
    origin: float = field(default_factory=time.monotonic)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    #: every session.metrics received, as `{"t", "message"}` (a start that asked for them)
    metrics: list[dict[str, Any]] = field(default_factory=list)
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
            if line := recording_line(message, self.url):
                say(line)
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
        elif kind == protocol.METRICS:
            self.metrics.append({"t": round(t, 6), "message": message})

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


def recording_line(message: dict[str, Any], url: str) -> str | None:
    """What to tell the user of a recorded session's video.start: where the server keeps it, and
    its recording token (the capability that reads, branches and deletes it: printed once, to
    the user alone, as the page keeps it in its browser)."""
    rid = message.get("recording_id")
    if not rid or message.get("resumed"):
        return None
    parts = urlsplit(url)
    base = urlunsplit(parts._replace(scheme="https" if parts.scheme == "wss" else "http", path="", query=""))
    token = message.get("recording_token")
    where = f"{base}/v1/recordings/{rid}"
    if token is None:
        return f"recorded by the server as {rid}: {where}"
    return f"recorded by the server as {rid}: {where}/video.mp4?recording_token={token} (keep the token: it opens, branches and deletes the recording)"
