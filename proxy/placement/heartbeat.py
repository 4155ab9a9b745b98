"""The model's heartbeat, read from a Triton's metrics port: busy or dead, when a probe gets no answer.

The health probe (docs/protocol.md §8) is a one-request sequence, so it needs a free slot of
the model's sequence batcher; with every slot held (abandoned sequences, a flood of starts)
it waits silently in Triton's backlog, exactly like a probe to a wedged model. The model
therefore publishes `rtvideo_model_heartbeat_seconds` (unix time) with its once-a-second
metrics flush, only while its request path moves, on Triton's own metrics endpoint, which
needs no slot. `Heartbeat.moving` reads it twice or more, `POLL_SECONDS` apart, and says
whether it changed within `FRESH_SECONDS`: the value is compared with itself, never with
this proxy's clock, so clocks that differ between hosts do not matter. An unreachable
endpoint, an error answer, a missing or frozen value (a killed stub's values freeze) all
read as "not moving".
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time

from tornado.httpclient import AsyncHTTPClient

from rtvideo.proxy.placement.addresses import join_address, split_address

log = logging.getLogger(__name__)

#: the gauge the model sets with each metrics flush (rtvideo/backend/runtime/metrics.py HEARTBEAT)
HEARTBEAT_METRIC = "rtvideo_model_heartbeat_seconds"
#: the heartbeat must change within this many seconds to count as fresh (the model beats once a second)
FRESH_SECONDS = 3.0
#: the wait between two reads of it
POLL_SECONDS = 0.5
#: one read of Triton's /metrics may take this long
READ_TIMEOUT_SECONDS = 1.0

_SAMPLE = re.compile(rf"^{HEARTBEAT_METRIC}\{{([^}}]*)\}}\s+(\S+)", re.M)


def metrics_url(grpc_address: str, metrics_port: int) -> str:
    """`http://HOST:METRICS_PORT/metrics` of the Triton whose gRPC address is `grpc_address`."""
    host, _ = split_address(grpc_address)
    return f"http://{join_address(host, metrics_port)}/metrics"


def heartbeat_in(text: str, model: str) -> float | None:
    """The latest heartbeat of `model` in Prometheus text (the highest of its instances), or None."""
    label = f'model="{model}"'
    values = []
    for labels, value in _SAMPLE.findall(text):
        if label in labels.split(","):
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                values.append(number)
    return max(values) if values else None


class Heartbeat:
    """Reads one Triton's heartbeat of `model` at `url` (its `/metrics`)."""

    def __init__(self, url: str, model: str) -> None:
        self.url = url
        self.model = model

    async def read(self) -> float | None:
        """The heartbeat now; None when the endpoint cannot be read or has none."""
        try:
            response = await AsyncHTTPClient().fetch(
                self.url,
                connect_timeout=READ_TIMEOUT_SECONDS,
                request_timeout=READ_TIMEOUT_SECONDS,
                raise_error=False,
                follow_redirects=False,
            )
        except Exception as exc:  # noqa: BLE001 - unreachable: no heartbeat
            log.debug("heartbeat %s not read: %s", self.url, exc)
            return None
        if response.code != 200 or response.body is None:
            log.debug("heartbeat %s: HTTP %s", self.url, response.code)
            return None
        return heartbeat_in(response.body.decode("utf-8", "replace"), self.model)

    async def moving(self, window: float = FRESH_SECONDS) -> bool:
        """Whether the heartbeat changes within `window` seconds (read every `POLL_SECONDS`)."""
        first = await self.read()
        if first is None:
            return False
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            now = await self.read()
            if now is None:
                return False
            if now != first:
                return True
        return False
