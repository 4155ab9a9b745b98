"""One Triton endpoint as the placement pool (rtvideo.proxy.placement.pool) sees it, and what it
takes to know one: the names a `--triton-url` resolves to and the session slots its model has.

Each `--triton-url HOST:PORT` is one endpoint, and for a HOST that is a name, one endpoint per
address it resolves to (a Kubernetes headless Service). Each endpoint has its own `Supervisor`
(the model's health probe through that server) and its capacity: the model's `max_sessions`
(its config, read over gRPC) times its model instances.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from rtvideo.proxy.placement.bridge import TritonBridge
from rtvideo.proxy.placement.supervisor import Supervisor

#: (host, port) → the addresses to use; a resolver that fails keeps the endpoints it gave before
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

#: an endpoint that answered `server_busy` counts as full (`/readyz`) this long, unless a session
#: starts there or one of this proxy's ends there first: other clients (proxies, direct gRPC) fill
#: it too, and only its answers tell
FULL_HOLD_SECONDS = 10.0


class SlotHolder(Protocol):
    """A session's stream as an endpoint holds it (`PlacedStream`, rtvideo.proxy.placement.placed_stream):
    whether its model gave it a slot, and how it ends when the endpoint goes down."""

    @property
    def admitted(self) -> bool: ...

    def lost(self, reason: str) -> None: ...


# --- names and capacity ----------------------------------------------------------------------------
async def system_resolver(host: str, port: int) -> list[str]:
    """What the system resolver (DNS, /etc/hosts) gives for a name: its IPv4 addresses when it
    has any, else its IPv6 ones, so that a dual-stack name does not count one server twice."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = [str(info[4][0]) for info in infos if info[0] == socket.AF_INET]
    v6 = [str(info[4][0]) for info in infos if info[0] == socket.AF_INET6]
    return list(dict.fromkeys(v4 or v6))


def capacity_of(config: Any, reported: dict[str, Any] | None = None) -> int | None:
    """Session slots of a model config (Triton's `ModelConfig` protobuf): the `max_sessions`
    parameter times the model instances (with KIND_GPU, `count` per listed GPU); where the
    parameter is `auto` (the model's own limit, e.g. a vLLM-Omni engine's `max_num_seqs`), the
    limit the model `reported` in its probe's pong. None when neither gives a number."""
    per_instance = 0
    if "max_sessions" in config.parameters:  # `in` first: indexing a protobuf map inserts
        try:
            per_instance = int(config.parameters["max_sessions"].string_value)
        except ValueError:
            per_instance = 0
    if per_instance <= 0 and reported is not None:
        value = reported.get("max_sessions")
        per_instance = value if isinstance(value, int) and not isinstance(value, bool) else 0
    if per_instance <= 0:
        return None
    instances = 0
    for group in config.instance_group:
        gpus = len(group.gpus) if group.kind == 1 else 0  # ModelInstanceGroup.KIND_GPU
        instances += max(1, group.count) * max(1, gpus)
    return per_instance * max(1, instances)


# --- one endpoint --------------------------------------------------------------------------------
class Endpoint:
    """One Triton server as the pool sees it."""

    def __init__(self, address: str, source: str, bridge: TritonBridge) -> None:
        self.address = address  # HOST:PORT with HOST an address (or the name, when not resolved)
        self.source = source  # the --triton-url it came from
        self.bridge = bridge
        self.supervisor: Supervisor  # set by the pool
        self.capacity: int | None = None  # unknown until the model config is read
        self.streams: set[SlotHolder] = set()  # this proxy's sessions there (placed or being placed)
        self.leaving = False  # no longer resolved: no new session; gone once its sessions end
        self.draining = False  # drained by the operator: no new session; its live ones move
        self.refused_at = -math.inf  # when it last answered server_busy

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - len(self.streams)

    @property
    def admitting(self) -> bool:
        return not self.leaving and not self.draining and self.supervisor.admitting

    @property
    def has_free_slot(self) -> bool:
        """Whether a new session may find a slot here: it takes sessions, answers its probe, this
        proxy's sessions leave a slot of its capacity (unknown: assumed), and it did not answer
        server_busy in the last FULL_HOLD_SECONDS (unless a slot was seen to free since)."""
        if not (self.admitting and self.supervisor.ready) or (self.free is not None and self.free <= 0):
            return False
        return time.monotonic() - self.refused_at >= FULL_HOLD_SECONDS

    def status(self) -> dict[str, Any]:
        return {
            "endpoint": self.address,
            "source": self.source,
            "state": self.supervisor.state.value,
            "admitting": self.admitting,
            "leaving": self.leaving,
            "draining": self.draining,
            "sessions": len(self.streams),
            "capacity": self.capacity,
            "free": self.free,
            **{k: v for k, v in self.supervisor.status().items() if k != "backend"},
        }
