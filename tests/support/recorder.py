"""`Recorder`: a backend Channel that keeps what a session sent, for tests without Triton."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any


class Recorder:
    """A Channel that keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[dict | None, bytes, bool]] = []
        self.cancelled = False
        self.finished = threading.Event()

    def send(self, message: Mapping[str, Any] | None, data: bytes = b"", *, final: bool = False) -> None:
        assert not self.finished.is_set(), "nothing may follow a FINAL response"
        self.sent.append((dict(message) if message is not None else None, data, final))
        if final:
            self.finished.set()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def types(self) -> list[str]:
        return [m["type"] if m else "<final>" for m, _, _ in self.sent]
