"""OSWorld's VM API over HTTP for one desktop workspace: the addresses OSWorld's own controllers call.

Owns: ``VmHttpServer``, an HTTP server on the engine's loopback, a port of its own per workspace, that turns each request into the
workspace's ``vm`` tool call (``envs/xdesktop/vm_api.py``) under that route's deadline, and the answer back
into HTTP (status, content type, an attachment's name); request bodies bounded (``MAX_REQUEST``); and
``PortForward``, a loopback port carried to a port inside the workspace (Chromium's DevTools, VLC's interface);
``Endpoint``, the three together as OSWorld addresses a VM (``ip:server:chromium:vnc:vlc``).
Why aiohttp: already the project's HTTP library (a dependency of the engine), it parses JSON, forms and multipart
uploads as OSWorld's Flask server does; the controllers on the other side are plain ``requests``.
Must never: listen beyond 127.0.0.1 (agents cannot reach it: a workspace's network namespace has only its own
loopback), or let one failed request stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from ..errors import EnvsError
from ..records import ToolCall
from ..runtime.host_workspace import HostWorkspace
from ..workspace import Workspace
from .vm_api import call_timeout_s

MAX_REQUEST = 300 << 20  # the largest upload the VM API takes (256 MiB) and its form


class VmHttpServer:
    """``async with VmHttpServer(ws) as server: server.port``: OSWorld's ``http://127.0.0.1:<port>``."""

    def __init__(self, ws: Workspace, host: str = "127.0.0.1", port: int = 0):
        self.ws = ws
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> VmHttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> int:
        app = web.Application(client_max_size=MAX_REQUEST)
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the port the kernel gave (port 0: any free one)
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve(self, request: web.Request) -> web.Response:
        try:
            args = await _decode(request)
        except ValueError as exc:
            return web.Response(status=400, text=f"bad request: {exc}")
        try:
            obs = await self.ws.execute(ToolCall(name="vm", args=args), timeout_s=call_timeout_s(args))
        except EnvsError as exc:  # the workspace broke or was closed: the VM is gone, as a dead VM's server is
            return web.Response(status=502, text=f"the workspace did not answer: {exc}")
        if obs.error is not None or "status" not in obs.data:
            return web.Response(status=500, text=f"vm: {obs.error or obs.output}")
        data = obs.data
        headers = {}
        if data.get("filename"):
            headers["Content-Disposition"] = f'attachment; filename="{data["filename"]}"'
        kind, _, charset = str(data["content_type"]).partition("; charset=")
        return web.Response(status=int(data["status"]), body=data["body"], content_type=kind,
                            charset=charset or None, headers=headers)


async def _decode(request: web.Request) -> dict[str, Any]:
    """The ``VmRequest`` of an HTTP request: its JSON body, or its form fields and uploaded files."""
    body: Any = None
    form: dict[str, str] = {}
    files: dict[str, bytes] = {}
    if request.content_type == "application/json":
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"the JSON body does not parse: {exc}") from exc
    elif request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        for name, value in (await request.post()).items():
            if isinstance(value, web.FileField):
                files[name] = value.file.read()
            else:
                form[name] = str(value)
    elif request.can_read_body:
        raw = await request.read()
        if raw:  # requests' ``json=`` always says so; a body of another type is taken as JSON if it is
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                body = None
    return {"method": request.method, "path": request.path, "json": body, "form": form, "files": files}


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
            await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))
        finally:
            for w in (writer, inner_writer):
                w.close()
                self._open.discard(w)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(1 << 16):
            sink.write(chunk)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()


UNSERVED_PORT = 9  # VNC is not served: OSWorld's address needs a number (discard)
CHROMIUM_PORT, VLC_PORT = 9222, 8080  # inside the workspace, as in OSWorld's VM


class Endpoint:
    """``async with Endpoint(ws) as ep: ep.address``: the workspace's VM API, Chromium's DevTools and VLC's HTTP
    interface on the engine's loopback, named as OSWorld's providers name a VM
    (``"127.0.0.1:<server>:<chromium>:<vnc>:<vlc>"``, what ``DesktopEnv`` splits)."""

    def __init__(self, ws: HostWorkspace):
        self.ws = ws
        self.server = VmHttpServer(ws)
        self.forwards = {port: PortForward(ws, port) for port in (CHROMIUM_PORT, VLC_PORT)}

    async def __aenter__(self) -> Endpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> str:
        try:
            await self.server.start()
            for forward in self.forwards.values():
                await forward.start()
        except BaseException:
            await self.close()
            raise
        return self.address

    async def close(self) -> None:
        for forward in self.forwards.values():
            await forward.close()
        await self.server.close()

    @property
    def address(self) -> str:
        return (f"127.0.0.1:{self.server.port}:{self.forwards[CHROMIUM_PORT].port}:{UNSERVED_PORT}:"
                f"{self.forwards[VLC_PORT].port}")
