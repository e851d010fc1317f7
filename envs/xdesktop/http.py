"""OSWorld's VM API over HTTP for one desktop workspace: the addresses OSWorld's own controllers call.

Owns: ``VmHttpServer``, an HTTP server on the engine's loopback, a port of its own per workspace, that turns each request into the
workspace's ``vm`` tool call (``envs/xdesktop/vm_api.py``) under that route's deadline, and the answer back
into HTTP (status, content type, an attachment's name); request bodies bounded (``MAX_REQUEST``); and
``Endpoint``, the server and two ``PortForward``s (``envs/runtime/port_forward.py``: Chromium's DevTools, VLC's
interface) together as OSWorld addresses a VM (``ip:server:chromium:vnc:vlc``).
Why aiohttp: already the project's HTTP library (a dependency of the engine), it parses JSON, forms and multipart
uploads as OSWorld's Flask server does; the controllers on the other side are plain ``requests``.
Must never: listen beyond 127.0.0.1 (agents cannot reach it: a workspace's network namespace has only its own
loopback), or let one failed request stop the server.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..errors import EnvsError
from ..records import ToolCall
from ..runtime.host_workspace import HostWorkspace
from ..runtime.port_forward import PortForward
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
