"""A TCP relay to a port on 127.0.0.1 that a test can cut (every connection through it aborted:
RST, no close frame, the drop a client sees when its network goes away) and take down and up
again on the same port (a server that goes away and comes back)."""

from __future__ import annotations

import asyncio


class TcpRelay:
    """Listens on 127.0.0.1:`port` (0: a free one, kept across `down`/`up`) for `to_port`."""

    def __init__(self, to_port: int, port: int = 0) -> None:
        self.to_port, self.port = to_port, port
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

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.to_port)
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
