"""The seam between a proxy session and Triton: what its `Upstream` (rtvideo.proxy.session.upstream) writes
to and reads from.

Two implementations: `TritonStream` (rtvideo.proxy.placement.bridge: one server, one gRPC stream) and
`PlacedStream` (rtvideo.proxy.placement.placed_stream: placed over many servers, replayed until one takes
the session). The session knows only these two Protocols.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from rtvideo.triton.wire import Reply


class SessionStream(Protocol):
    """One session's Triton sequence (docs/protocol.md §8).

    `send` queues one client message and returns the tag its replies carry (`START_TAG` for the
    start); `replies` yields them in arrival order until the call ends and raises
    `BackendUnavailable` (rtvideo.proxy.placement.bridge) when it breaks; `close_requests` half-closes
    (Triton ends the call once every request completed); `cancel` ends it now, and its
    sequence with it."""

    @property
    def sequence_id(self) -> int: ...

    def send(self, raw: bytes, *, start: bool = False, end: bool = False) -> str: ...

    def replies(self) -> AsyncIterator[Reply]: ...

    def close_requests(self) -> None: ...

    def cancel(self) -> None: ...


class StreamSource(Protocol):
    """Where a session's stream comes from: a `TritonBridge` or the `EndpointPool`."""

    def open_stream(self, patience: float = 0.0) -> SessionStream: ...
