"""`GET /metrics`: the proxy's Prometheus scrape (docs/operations.md "Metrics").

One responsibility: hand the scraper what `ProxyMetrics.exposition` renders, in the format its
`Accept` header asks for (OpenMetrics when it asks for it, the Prometheus text otherwise). It
reads the metrics and writes none. Invariants: behind the token when one is set (the metrics
name the Triton endpoints, which a stranger is not shown); the `Content-Type` is the one
the rendering chose, so that a scraper parses what it asked for. It serves the main port and
the health listener (`--health-port`) alike.
"""

from __future__ import annotations

import tornado.web

from rtvideo.proxy.edge.access import refused_without_token
from rtvideo.proxy.edge.socket import ProxyContext


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus text (OpenMetrics when the `Accept` header asks for it); behind the token when one is set."""

    def initialize(self, context: ProxyContext) -> None:
        self.context = context

    def get(self) -> None:
        if refused_without_token(self, self.context.settings.token):
            return
        body, content_type = self.context.metrics.exposition(self.request.headers.get("Accept"))
        self.set_header("Content-Type", content_type)
        self.finish(body)
