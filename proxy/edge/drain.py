"""`/v1/endpoints/{endpoint}/drain` (docs/recordings.md "Moves"): the operator drains a Triton.

- `POST`: the endpoint takes no new session, and each live session there moves to another
  endpoint with room; `{"endpoint", "draining": true, "sessions", "moving"}`. A session that
  cannot move (another generator) runs on there until it ends.
- `DELETE`: the endpoint takes new sessions again; `{"endpoint", "draining": false}`.

An unknown endpoint is 404. The operator's lever: it needs `--admin-token` as
`Authorization: Bearer` (401 without it; 403 when the proxy has none configured), whoever
the caller is and wherever it calls from, and it refuses a foreign Origin and any body
(`refused_unsafe_request`), so that no web page can drain a server.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import tornado.web

from rtvideo.proxy.edge.access import is_operator, refused_unsafe_request
from rtvideo.proxy.session.mover import MoveReason

log = logging.getLogger(__name__)

PATH = r"/v1/endpoints/([^/]+)/drain"


class OnStream(Protocol):
    """A session's Triton side (rtvideo.proxy.session.upstream's `Upstream`)."""

    @property
    def stream(self) -> object | None: ...


class Movable(Protocol):
    """A session, as a drain finds and moves it."""

    @property
    def upstream(self) -> OnStream: ...

    def move(self, reason: MoveReason) -> bool: ...


class DrainHandler(tornado.web.RequestHandler):
    def initialize(
        self,
        drain: Callable[[str, bool], list[object] | None],
        sessions: Callable[[], Iterable[Movable]],
        admin_token: str | None,
        allowed_origins: tuple[str, ...],
    ) -> None:
        self._drain = drain
        self._sessions = sessions
        self._admin_token = admin_token
        self._allowed_origins = allowed_origins

    def prepare(self) -> None:
        self.set_header("Cache-Control", "no-store")
        if refused_unsafe_request(self, self._allowed_origins):
            return
        if self._admin_token is None:
            self._json(403, {"error": "draining needs the operator's credential: this proxy has no --admin-token"})
        elif not is_operator(self.request, self._admin_token):
            self.set_header("WWW-Authenticate", 'Bearer realm="rtvideo-operator"')
            self._json(401, {"error": "draining needs the operator's credential (Authorization: Bearer)"})

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def post(self, endpoint: str) -> None:
        streams = self._drain(endpoint, True)
        if streams is None:
            self._json(404, {"error": f"no Triton endpoint {endpoint}"})
            return
        there = [s for s in self._sessions() if s.upstream.stream in streams]
        moving = sum(s.move(MoveReason.DRAIN) for s in there)
        log.warning("endpoint %s drained: %d of %d session(s) there moving", endpoint, moving, len(there))
        self._json(200, {"endpoint": endpoint, "draining": True, "sessions": len(there), "moving": moving})

    def delete(self, endpoint: str) -> None:
        if self._drain(endpoint, False) is None:
            self._json(404, {"error": f"no Triton endpoint {endpoint}"})
            return
        self._json(200, {"endpoint": endpoint, "draining": False})
