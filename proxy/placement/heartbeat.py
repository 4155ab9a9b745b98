"""The model's heartbeat and its sequence slots, read from a Triton's metrics port: busy, late
or dead, when a probe gets no answer in time.

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

A moving heartbeat says the model lives, not that its slots are held: a loaded host answers a
probe late with most slots free. So the same flush carries the batcher's slots and how many
are held (`rtvideo_sequence_slots`, `rtvideo_sequence_slots_held`, per model instance;
rtvideo/backend/runtime/sequence_slots.py), and `Heartbeat.pulse` says both: the model is
full only when every instance reports every slot held. A model that reports no slots (an
older one) is never taken for full.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass

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

#: the batcher's slots of a model instance, and those its sequences hold (rtvideo/backend/runtime/metrics.py)
SLOTS_METRIC = "rtvideo_sequence_slots"
HELD_METRIC = "rtvideo_sequence_slots_held"

_SAMPLE = re.compile(rf"^{HEARTBEAT_METRIC}\{{([^}}]*)\}}\s+(\S+)", re.M)
_SLOT_SAMPLE = re.compile(rf"^({SLOTS_METRIC}|{HELD_METRIC})\{{([^}}]*)\}}\s+(\S+)", re.M)


@dataclass(frozen=True)
class Pulse:
    """What the model's metrics say when a probe got no answer in time: whether its heartbeat
    moves (it lives), and whether every sequence slot is held (None: it reports no slots)."""

    moving: bool
    full: bool | None = None


def metrics_url(grpc_address: str, metrics_port: int) -> str:
    """`http://HOST:METRICS_PORT/metrics` of the Triton whose gRPC address is `grpc_address`."""
    host, _ = split_address(grpc_address)
    return f"http://{join_address(host, metrics_port)}/metrics"


def slots_full_in(text: str, model: str) -> bool | None:
    """Whether every instance of `model` reports every sequence slot held (held >= slots), in
    Prometheus text; None when it reports no slots (then it is never taken for full)."""
    label = f'model="{model}"'
    slots: dict[str, float] = {}
    held: dict[str, float] = {}
    for name, labels, value in _SLOT_SAMPLE.findall(text):
        parts = labels.split(",")
        if label not in parts:
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number):
            instance = ",".join(sorted(p for p in parts if p != label))
            (slots if name == SLOTS_METRIC else held)[instance] = number
    if not slots or slots.keys() - held.keys():
        return None
    return all(held[instance] >= count for instance, count in slots.items())


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
        text = await self._text()
        return None if text is None else heartbeat_in(text, self.model)

    async def _text(self) -> str | None:
        """Triton's /metrics now; None when it cannot be read."""
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
        return str(response.body.decode("utf-8", "replace"))

    async def moving(self, window: float = FRESH_SECONDS) -> bool:
        """Whether the heartbeat changes within `window` seconds (read every `POLL_SECONDS`)."""
        return (await self.pulse(window)).moving

    async def pulse(self, window: float = FRESH_SECONDS) -> Pulse:
        """Whether the heartbeat changes within `window` seconds (read every `POLL_SECONDS`), and
        whether the model's slots are all held, as its last read metrics say."""
        text = await self._text()
        first = None if text is None else heartbeat_in(text, self.model)
        if text is None or first is None:
            return Pulse(moving=False)
        deadline = time.monotonic() + window
        while time.monotonic() < deadline:
            await asyncio.sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            text = await self._text()
            now = None if text is None else heartbeat_in(text, self.model)
            if text is None or now is None:
                return Pulse(moving=False)
            if now != first:
                return Pulse(moving=True, full=slots_full_in(text, self.model))
        return Pulse(moving=False)
