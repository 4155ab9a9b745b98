"""The `Host` check in front of every route: page, WebSocket doors, health, metrics, recordings
(a guard against DNS rebinding: docs/protocol.md, docs/security.md).

One responsibility: the proxy's Tornado application, whose handler lookup asks
`access.host_allowed` first. Invariants: it runs before any route's handler, so that no route
can forget it, and a refused `Host` gets 403 `Host not allowed` and nothing else (logged at
INFO with the peer), whatever path it asked for. The main port and the health listener are
both built on it.
"""

from __future__ import annotations

import logging
from typing import Any

import tornado.web
from tornado.httputil import HTTPServerRequest

from rtvideo.proxy.edge.access import host_allowed
from rtvideo.proxy.settings import ProxySettings

log = logging.getLogger(__name__)


class HostRefusedHandler(tornado.web.RequestHandler):
    """The answer to a request whose `Host` this server does not serve (DNS rebinding)."""

    def prepare(self) -> None:
        self.set_status(403, "Host not allowed")
        self.finish("Host not allowed\n")


class ProxyApplication(tornado.web.Application):
    """Checks the `Host` of every request (page, WebSocket, health, metrics) in one place."""

    def find_handler(self, request: HTTPServerRequest, **kwargs: Any) -> Any:
        settings: ProxySettings = self.settings["context"].settings
        if not host_allowed(request.host, settings.host, settings.allowed_hosts):
            log.info("peer=%s Host %r refused", request.remote_ip, request.host)
            return self.get_handler_delegate(request, HostRefusedHandler)
        return super().find_handler(request, **kwargs)
