"""The reply of the probe and listing routes (`/healthz`, `/readyz`, `/livez`, `/v1/models`).

One responsibility: a handler bound to the proxy's shared state (`ProxyContext`) that answers
one JSON object. Invariants: the status is 200 or 503 and nothing else (a probe reads the
status; the body says why), the body is `application/json`, and `Cache-Control: no-store`, so
that no cache in between ever answers a probe with an old state.
"""

from __future__ import annotations

import json

import tornado.web

from rtvideo.proxy.edge.socket import ProxyContext


class JsonHandler(tornado.web.RequestHandler):
    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def reply(self, ok: bool, body: dict) -> None:
        self.set_status(200 if ok else 503)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(body))
