"""One session's clocks for the proxy's latency metrics (rtvideo.proxy.observability.metrics records them):
`StreamTiming` from the frames handed to the owner's socket, `PlayheadTiming` from the player's
`session.playback` reports."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rtvideo.core import protocol
from rtvideo.proxy.observability.metrics import ProxyMetrics
from rtvideo.proxy.observability.playback_metrics import LateChunks, Underrun, UnderrunDetector


def stream_fps(video_start: Mapping[str, Any]) -> float | None:
    """The fps of a `video.start`'s config (None when it names none): media time of the frames."""
    fps = (video_start.get("config") or {}).get("fps")
    return float(fps) if isinstance(fps, (int, float)) and fps > 0 else None


class StreamTiming:
    """One session's stream clock, fed every frame handed to the socket, in order.

    `started()` marks the session.start going to the model; the first media chunk handed out
    after it gives `rtvideo_proxy_time_to_first_chunk_seconds`. Every media chunk gives
    `rtvideo_proxy_chunk_lead_seconds`: the chunk's end time in the stream (frames so far /
    the fps of `video.start`'s config) minus the wall time since the first media chunk was
    handed out, i.e. how far a player that started on the first chunk is from running dry;
    and `rtvideo_delivery_late_chunks_total` when it came after that player needed it
    (`LateChunks`, whose player waits for a late chunk instead of staying behind for good).
    """

    def __init__(self, metrics: ProxyMetrics, clock: Any = time.monotonic) -> None:
        self._metrics = metrics
        self._clock = clock
        self._started: float | None = None
        self._fps: float | None = None
        self._first: float | None = None
        self._frames = 0
        self._late = LateChunks()  # rtvideo_delivery_late_chunks_total

    def started(self) -> None:
        self._started = self._clock()

    def taken(self, message: Mapping[str, Any] | None) -> None:
        if message is None:
            return
        kind = message.get("type")
        if kind == protocol.VIDEO_START:
            self._fps = stream_fps(message)
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == "media":
            now = self._clock()
            if self._first is None:
                self._first = now
                if self._started is not None:
                    self._metrics.time_to_first_chunk_seconds.observe(now - self._started)
            frames = message.get("num_frames")
            self._frames += frames if isinstance(frames, int) else 0
            if self._fps:
                self._metrics.chunk_lead_seconds.observe(self._frames / self._fps - (now - self._first))
                seconds = frames / self._fps if isinstance(frames, int) else 0.0
                if self._late.chunk(now, seconds):
                    self._metrics.delivery_late_chunks.inc()


#: event ids a session's `PlayheadTiming` keeps while waiting to see them on screen
MAX_TRACKED_EVENTS = 256


class PlayheadTiming:
    """One session's on-screen clock, fed from its playhead reports (`session.playback`).

    An update's media start is that of the first media chunk handed out whose
    `started_event_ids` lists it (frames before it / the fps of `video.start`). A report whose
    position has passed that start shows it; it was shown `position - start` seconds before the
    report (the player runs at real time), so `rtvideo_proxy_interaction_visible_seconds` is
    `report time - (position - start) - send time`, once per event, never negative. A session
    that sends no reports observes nothing. Bounded: at most `MAX_TRACKED_EVENTS` are kept.
    The same moment less the ack's hand-out gives `rtvideo_interaction_to_screen_seconds`.
    The reports also feed the session's `UnderrunDetector` (rtvideo.proxy.observability.playback_metrics).
    """

    def __init__(
        self,
        metrics: ProxyMetrics,
        clock: Any = time.perf_counter,
        on_shown: Callable[[str, float], None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._on_shown = (
            on_shown  # (event id, when it was shown): the session's trace (rtvideo.proxy.observability.tracing)
        )
        self._fps: float | None = None
        self._seconds = 0.0  # media handed out so far
        self._sent_at: dict[str, float] = {}  # event id → when the client's update arrived
        self._acked_at: dict[str, float] = {}  # event id → when its ack was handed out
        self._underruns = UnderrunDetector()
        #: media the player holds beyond its playhead, from its latest report (None: no report yet)
        self.buffered_seconds: float | None = None
        self._starts: dict[str, float] = {}  # event id → media start of its first chunk

    def sent(self, event_id: str, at: float) -> None:
        if event_id in self._sent_at:
            return  # a retry: the first send counts
        if len(self._sent_at) >= MAX_TRACKED_EVENTS:  # forget the oldest (one that was never shown)
            oldest = next(iter(self._sent_at))
            del self._sent_at[oldest]
            self._starts.pop(oldest, None)
            self._acked_at.pop(oldest, None)
        self._sent_at[event_id] = at
        self._acked_at[event_id] = self._clock()  # called as its ack is handed out

    def taken(self, message: Mapping[str, Any] | None) -> None:
        if message is None:
            return
        kind = message.get("type")
        if kind == protocol.DONE:
            self._underruns.stream_ended()
        if kind == protocol.VIDEO_START:
            self._fps = stream_fps(message)
        elif kind == protocol.CHUNK_METADATA and message.get("kind") == "media" and self._fps:
            for event_id in message.get("started_event_ids") or ():
                if event_id in self._sent_at and event_id not in self._starts:
                    self._starts[event_id] = self._seconds
            frames = message.get("num_frames")
            self._seconds += frames / self._fps if isinstance(frames, int) else 0.0

    def report(self, position: float, buffered: float | None) -> None:
        now = self._clock()
        lead = buffered if buffered is not None else self._seconds - position
        self.buffered_seconds = max(0.0, min(lead, self._seconds))
        self._metrics.reported_lead_seconds.observe(self.buffered_seconds)
        self._underrun(self._underruns.report(now, position, max(0.0, lead)))
        for event_id, start in list(self._starts.items()):
            if position >= start:
                shown = now - (position - start)
                if self._on_shown is not None:
                    self._on_shown(event_id, shown)
                self._metrics.interaction_visible_seconds.observe(max(0.0, shown - self._sent_at.pop(event_id)))
                self._metrics.interaction_to_screen_seconds.observe(
                    max(0.0, shown - self._acked_at.pop(event_id, shown))
                )
                del self._starts[event_id]

    def finish(self) -> None:
        """The session ended: an underrun in progress ends with it."""
        self._underrun(self._underruns.finish())

    def _underrun(self, change: Underrun | None) -> None:
        if change is None:
            return
        if change.began:
            self._metrics.playback_underruns.inc()
        else:
            self._metrics.playback_underrun_seconds.observe(change.seconds)
