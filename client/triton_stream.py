"""A blocking direct-gRPC session client (one Triton stream per session), for tests and benchmarks.

Shows the Triton-level contract of docs/protocol.md §8 in code: the start request
carries `sequence_start` and receives the session's stream; every later request
gets exactly one response; `session.stop` carries `sequence_end`. `close()` ends a
sequence the caller did not end, so its batcher slot is freed at once.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import tritonclient.grpc as grpcclient

from rtvideo.core import protocol
from rtvideo.triton import access, wire
from rtvideo.triton.wire import Reply

MODEL = "realtime_video"


class TritonStreamSession:
    """One session on its own stream. `key`: Triton's access key (rtvideo.triton.access), sent
    as the `triton-grpc-protocol-rtvideo-key` header; default `$RTVIDEO_TRITON_KEY`, none when unset."""

    def __init__(
        self,
        url: str,
        model: str = MODEL,
        sequence_id: int | None = None,
        key: str | None = None,
        secret: str | None = None,
    ) -> None:
        self.url = url
        self.model = model
        self.sequence_id = sequence_id or random.randint(1, 2**62)
        #: the session's secret, sent as request parameter `rtvideo_session_secret` on every request
        #: (docs/protocol.md §8); drawn here unless given. None sends none (a test of the refusal).
        self.secret: str | None = secret or access.new_session_secret()
        self.replies: queue.Queue[Reply | RuntimeError] = queue.Queue()
        self._client = grpcclient.InferenceServerClient(url)
        self._client.start_stream(callback=self._on_response, headers=access.key_headers(key or access.key_from_env()))
        self._counter = 0
        self._lock = threading.Lock()
        self.sent_at: dict[str, float] = {}
        self._started = False  # a sequence_start was sent
        self._ended = False  # a sequence_end was sent
        self._done = threading.Event()  # session.done arrived (or the stream broke)
        self._closed = False

    def _on_response(self, result: Any, error: Any) -> None:
        now = time.perf_counter()
        if error is not None:
            self._done.set()  # nothing more comes on a broken stream
            self.replies.put(RuntimeError(f"stream error: {error}"))
            return
        tag = result.get_response().id
        reply = wire.parse_reply(tag, result.as_numpy(wire.META), result.as_numpy(wire.DATA), now)
        if reply.message is not None and reply.message.get("type") == protocol.DONE:
            self._done.set()
        self.replies.put(reply)

    def send(self, message: Mapping[str, Any] | str | bytes, *, start: bool = False, end: bool = False) -> str:
        """Send one raw client message on the session's sequence; returns the request tag."""
        tensor = grpcclient.InferInput(wire.REQUEST, [1], "BYTES")
        tensor.set_data_from_numpy(wire.request_array(message))
        with self._lock:
            self._counter += 1
            tag = f"r{self._counter}"
        self.sent_at[tag] = time.perf_counter()
        if start:
            self._started, self._ended = True, False
            self._done.clear()
        self._ended = self._ended or end
        self._client.async_stream_infer(
            self.model,
            [tensor],
            request_id=tag,
            sequence_id=self.sequence_id,
            sequence_start=start,
            sequence_end=end,
            parameters=wire.secret_parameters(self.secret),
        )
        return tag

    def start(self, prompt: str | None, **fields: Any) -> str:
        """`prompt` None: a blend start (`prompts=[...]` in `fields`)."""
        scene = {} if prompt is None else {"prompt": prompt}
        return self.send({"type": protocol.START, **scene, **fields}, start=True)

    def interact(
        self,
        prompt: str | None = None,
        *,
        event_id: str | None = None,
        transition_chunks: int | None = None,
        event: Mapping[str, Any] | None = None,
        interpolation: str | None = None,
    ) -> str:
        """`event` (e.g. `{"prompts": [{"text": ..., "weight": ...}, ...]}`, a blend) in place of
        `{"prompt": prompt}`; `interpolation` `"linear"` or `"slerp"` (None: the session's default)."""
        interaction: dict[str, Any] = {"event": dict(event) if event is not None else {"prompt": prompt}}
        if event_id is not None:
            interaction["event_id"] = event_id
        if transition_chunks is not None:
            interaction["transition_chunks"] = transition_chunks
        if interpolation is not None:
            interaction["interpolation"] = interpolation
        return self.send({"type": protocol.INTERACTION, "interaction": interaction})

    def stop(self) -> str:
        return self.send({"type": protocol.STOP}, end=True)

    def next(self, timeout: float = 30.0) -> Reply:
        reply = self.replies.get(timeout=timeout)
        if isinstance(reply, RuntimeError):
            raise reply
        return reply

    def until(self, kind: str, timeout: float = 60.0) -> Iterator[Reply]:
        """Yield replies up to and including the first message of type `kind`."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self.next(max(0.01, deadline - time.monotonic()))
            yield reply
            if reply.message is not None and reply.message.get("type") == kind:
                return

    def close(self, timeout: float = 5.0) -> None:
        """End the session and the stream. A session still running (started, no `sequence_end`
        sent, no `session.done` seen) is stopped first: `session.stop` with `sequence_end`,
        then up to `timeout` s for its `session.done`, so Triton frees the sequence's slot now
        rather than after `max_sequence_idle_microseconds` (docs/protocol.md §8)."""
        if self._closed:
            return
        try:
            if self._started and not self._done.is_set():
                if not self._ended:
                    self.stop()
                self._done.wait(timeout)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Drop the stream without ending the sequence: the model frees the session within a
        chunk, but Triton keeps the slot until the idle limit. `close()` is the polite way."""
        if self._closed:
            return
        self._closed = True
        self._client.stop_stream(cancel_requests=True)
        self._client.close()

    def __enter__(self) -> TritonStreamSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
