"""A TCP relay to a port on 127.0.0.1 that a test can cut (every connection through it aborted:
RST, no close frame, the drop a client sees when its network goes away) and take down and up
again on the same port (a server that goes away and comes back).

Given several ports it is a load balancer in front of replicas: each new connection goes to the
next port in turn that accepts the TCP connect (one that refuses it, a process that is gone, is
skipped, as a balancer's connect-time failover does); when none does, the client's connection
is aborted. It knows nothing of HTTP: a replica that accepts and then refuses (a draining
proxy's 503) is the client's to retry."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

#: how long a connect to one target may take before the next one is tried
CONNECT_SECONDS = 2.0


class TcpRelay:
    """Listens on 127.0.0.1:`port` (0: a free one, kept across `down`/`up`) for `to_port`, or
    round-robin for each of several ports."""

    def __init__(self, to_port: int | Sequence[int], port: int = 0) -> None:
        self.targets = [to_port] if isinstance(to_port, int) else list(to_port)
        if not self.targets:
            raise ValueError("a relay needs at least one port to relay to")
        self.port = port
        #: connections relayed so far, by target port
        self.relayed: Counter[int] = Counter()
        self._next = 0  # the index in `targets` the next connection tries first
        self._server: asyncio.AbstractServer | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task] = set()

    async def up(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Abort every connection through it; it goes on accepting new ones."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def down(self) -> None:
        """No longer listening, every connection through it aborted."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._forward(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the next target in turn that accepts one (None: none does)."""
        first = self._next
        self._next = (first + 1) % len(self.targets)  # the next client starts one further on
        for step in range(len(self.targets)):
            target = self.targets[(first + step) % len(self.targets)]
            try:
                opened = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", target), CONNECT_SECONDS)
            except (OSError, asyncio.TimeoutError):
                continue
            self.relayed[target] += 1
            return opened
        return None

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._upstream()
        if upstream is None:
            writer.transport.abort()  # nothing to relay to: the client sees a reset
            return
        up_reader, up_writer = upstream
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()  # the other side ended: so does this one, after what it sent
            except (ConnectionError, RuntimeError):
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        for w in (writer, up_writer):  # a long-lived relay keeps no list of dead connections
            if w in self._writers:
                self._writers.remove(w)
