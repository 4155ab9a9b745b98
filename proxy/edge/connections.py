"""The proxy's HTTP server, with a bound on open TCP connections.

Tornado accepts every connection and waits up to an hour (its default) for a request head, so
a client could hold any number of idle sockets (file descriptors) and starve the sessions; and
an upgraded WebSocket leaves Tornado's own connection bookkeeping, so it has no count to bound.
And a process out of file descriptors is worse than one that refuses: Tornado's accept loop
raises on EMFILE and the listening socket stays readable, so the bound must fit the fd limit.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream

log = logging.getLogger(__name__)

#: file descriptors kept for all but client connections (gRPC channels, logs, Triton's pipes)
RESERVED_FDS = 128


def fd_room(max_open: int) -> int:
    """How many connections this process can hold, at most `max_open`: its open-file limit is
    raised first (the soft one, up to the hard one) to fit `max_open` and RESERVED_FDS; some
    hosts start processes at a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_open + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= want:
        return max_open
    room = max(1, soft - RESERVED_FDS)
    log.warning(
        "the open-file limit (%d) holds %d connections, not the %d asked (--max-open-connections): "
        "raise the hard limit (ulimit -Hn)",
        soft,
        room,
        max_open,
    )
    return room


class BoundedHTTPServer(HTTPServer):
    """Closes a new connection at once while `max_open` connections (of any kind) are open, or
    `max_per_client` from its client (`group`: its address's network, `ProxySettings.client_group`):
    one client alone cannot hold them all. A trusted proxy's address (`trusted`, `--trusted-proxy`)
    carries many clients, so only the first bound holds it."""

    # Tornado's `Configurable` hands the constructor's arguments to `initialize`; this one adds
    # required keywords of its own, which mypy takes for an incompatible override.
    def initialize(  # type: ignore[override]
        self,
        *args: Any,
        max_open: int,
        max_per_client: int,
        on_refused: Callable[[str], None],
        trusted: Callable[[str], bool] = lambda _: False,
        group: Callable[[str], str] = lambda address: address,
        **kwargs: Any,
    ) -> None:
        super().initialize(*args, **kwargs)
        self._trusted = trusted
        self._group = group
        self._max_open = max_open
        self._max_per_client = max_per_client
        self._on_refused = on_refused  # called with the reason: open_connections, client_connections
        self._open: dict[IOStream, str] = {}  # each open connection's client (`group` of its address)
        self._full = False

    def handle_stream(self, stream: IOStream, address: Any) -> None:
        peer = address[0] if isinstance(address, tuple) else str(address)
        client = self._group(peer)
        self._open = {known: host for known, host in self._open.items() if not known.closed()}
        if len(self._open) >= self._max_open:
            if not self._full:
                log.warning(
                    "%d connections open: new ones are closed until some end (--max-open-connections)", self._max_open
                )
            self._full = True
            self._refuse(stream, "open_connections")
            return
        self._full = False
        if not self._trusted(peer) and sum(host == client for host in self._open.values()) >= self._max_per_client:
            self._refuse(stream, "client_connections")
            return
        self._open[stream] = client
        super().handle_stream(stream, address)

    def _refuse(self, stream: IOStream, reason: str) -> None:
        self._on_refused(reason)
        stream.close()
