"""A port on the engine's loopback carried to a port inside one workspace: how a harness on the engine's side
reaches a program that listens in a workspace (Chromium's DevTools and VLC's interface for OSWorld's getters, the
web shop for a BrowserGym browser).

Owns: ``PortForward``: listening on 127.0.0.1 (a port of its own), and for each connection accepted, a connection
made inside the workspace (``HostWorkspace.connect``) and the bytes carried both ways until either side closes.
Why asyncio's streams: the engine's loop already runs the runtime; a relay is two pumps per connection.
Must never: listen beyond the loopback, connect anywhere but the one port inside its one workspace, or leave a
connection open after ``close()``.
"""

from __future__ import annotations

import asyncio

from ..errors import EnvsError
from .host_workspace import HostWorkspace
from .relay import pump


class PortForward:
    """``async with PortForward(ws, 9222) as fwd: fwd.port``: a port on the engine's loopback whose connections are
    carried to 127.0.0.1:9222 inside the workspace (OSWorld's chrome getters and set-up steps reach Chromium's
    DevTools so; VLC's HTTP interface on 8080 likewise). Chromium names its WebSocket URLs after the Host header
    it is sent, so the engine-side port is the one its answers name."""

    def __init__(self, ws: HostWorkspace, inner_port: int, host: str = "127.0.0.1"):
        self.ws, self.inner_port, self.host = ws, inner_port, host
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> PortForward:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._carry, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._open):  # the connections still carried end with it
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner = await self.ws.connect(self.inner_port)
        except (OSError, EnvsError):  # nothing listens inside (yet): the caller sees the connection end, and retries
            writer.close()
            return
        inner_reader, inner_writer = await asyncio.open_connection(sock=inner)
        self._open.update((writer, inner_writer))
        try:
            await asyncio.gather(pump(reader, inner_writer), pump(inner_reader, writer))
        finally:
            for w in (writer, inner_writer):
                w.close()
                self._open.discard(w)
