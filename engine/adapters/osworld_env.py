"""OSWorld's own ``DesktopEnv`` on a BunshinRL desktop workspace: the runtime is its provider.

Owns: ``RuntimeProvider`` (OSWorld's ``Provider`` contract: ``start_emulator`` makes a desktop workspace and serves
its VM API over HTTP, ``get_ip_address`` names it, ``revert_to_snapshot`` replaces it with a fresh desktop,
``stop_emulator`` closes it; ``save_state`` refuses), ``RuntimeVMManager`` (OSWorld's registry of VMs: the runtime
keeps its own), and ``desktop_env(...)``, a ``DesktopEnv`` built on them. The runtime runs on a thread of its own
(``session.RuntimeLoop``); OSWorld's code stays synchronous and speaks HTTP to the workspace, as to a VM.
Why the factory is swapped: ``DesktopEnv`` takes providers from a fixed list by name; ours is constructed under
the name ``docker`` (a VM that starts clean, which ours does) with OSWorld's factory replaced for that one call.
A live fork cannot carry a desktop: the snapshot a revert goes back to is the desktop as its session starts it.
Must never: leave a workspace, its HTTP server or the runtime behind (``DesktopEnv.close`` stops the emulator;
``close_runtime`` or the interpreter's exit ends the run).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from bunshin.envs.records import AppSpec, Limits
from bunshin.envs.runtime.host_workspace import HostWorkspace
from bunshin.envs.runtime.runtime import WorkspaceRuntime
from bunshin.envs.xdesktop.app import desktop_app

from .osworld_http import PortForward, VmHttpServer
from .session import AdapterError, RuntimeLoop, track

DESKTOP_APP = desktop_app()
UNSERVED_PORT = 9  # VNC is not served: DesktopEnv needs a number (discard)
CHROMIUM_PORT, VLC_PORT = 9222, 8080  # inside the workspace, as in OSWorld's VM
CALL_TIMEOUT_S = 180.0


class RuntimeProvider:
    """OSWorld's provider, backed by one runtime on its own thread. ``path_to_vm`` is only a name here."""

    def __init__(self, *, state_dir: Path | None = None, limits: Limits | None = None, app: AppSpec = DESKTOP_APP):
        self.app = app
        self.loop = track(RuntimeLoop(use_uvloop=True))
        kwargs: dict[str, Any] = {"limits": limits or Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150)}
        if state_dir is not None:
            kwargs["state_dir"] = state_dir
        self.loop.runtime = WorkspaceRuntime(**kwargs)
        try:
            self._call(self.loop.runtime.start())
        except BaseException:
            self.loop.shutdown()  # the runtime's close undoes what its start made; then the thread ends
            raise
        self.ws: HostWorkspace | None = None
        self.server: VmHttpServer | None = None
        self.forwards: dict[int, PortForward] = {}

    def _call(self, coro: Any) -> Any:
        return self.loop.submit(coro).result(CALL_TIMEOUT_S)

    # -- OSWorld's Provider ------------------------------------------------------------------------------------
    def start_emulator(self, path_to_vm: str, headless: bool = True, os_type: str = "Ubuntu") -> None:
        if self.ws is None:
            self._call(self._start())

    async def _start(self) -> None:
        assert self.loop.runtime is not None
        ws = await self.loop.runtime.create(self.app)
        self.loop.workspaces.add(ws)
        server = VmHttpServer(ws)
        forwards = {port: PortForward(ws, port) for port in (CHROMIUM_PORT, VLC_PORT)}
        try:
            await server.start()
            for forward in forwards.values():
                await forward.start()
        except BaseException:
            for forward in forwards.values():
                await forward.close()
            await server.close()
            await ws.close()
            self.loop.workspaces.discard(ws)
            raise
        self.ws, self.server, self.forwards = ws, server, forwards

    def get_ip_address(self, path_to_vm: str) -> str:
        if self.server is None:
            raise AdapterError("the desktop is not started (start_emulator first)")
        return (f"127.0.0.1:{self.server.port}:{self.forwards[CHROMIUM_PORT].port}:{UNSERVED_PORT}:"
                f"{self.forwards[VLC_PORT].port}")

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise AdapterError("save_state: a desktop workspace cannot be snapshotted live (its programs are not "
                           "forkable); revert_to_snapshot gives a fresh desktop")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        self.stop_emulator(path_to_vm)
        self.start_emulator(path_to_vm)
        return path_to_vm

    def stop_emulator(self, path_to_vm: str, region: str | None = None, *args: Any, **kwargs: Any) -> None:
        if self.ws is not None:
            self._call(self._stop())

    async def _stop(self) -> None:
        server, ws, forwards = self.server, self.ws, self.forwards
        self.server, self.ws, self.forwards = None, None, {}
        try:
            for forward in forwards.values():
                await forward.close()
            if server is not None:
                await server.close()
        finally:
            if ws is not None:
                await ws.close()
                self.loop.workspaces.discard(ws)

    def close_runtime(self) -> None:
        """End the run: every workspace, the runtime, the thread (idempotent)."""
        with contextlib.suppress(Exception):
            self.stop_emulator("")
        self.loop.shutdown()


class RuntimeVMManager:
    """OSWorld's VM registry: the runtime keeps its workspaces itself, so there is nothing to register."""

    checked_and_cleaned = True

    def initialize_registry(self, **kwargs: Any) -> None: ...
    def add_vm(self, vm_path: str, **kwargs: Any) -> None: ...
    def delete_vm(self, vm_path: str, **kwargs: Any) -> None: ...
    def occupy_vm(self, vm_path: str, pid: int, **kwargs: Any) -> None: ...
    def check_and_clean(self, **kwargs: Any) -> None: ...

    def list_free_vms(self, **kwargs: Any) -> list[str]:
        return ["bunshin-desktop"]

    def get_vm_path(self, **kwargs: Any) -> str:
        return "bunshin-desktop"


def desktop_env(*, state_dir: Path | None = None, limits: Limits | None = None, **kwargs: Any) -> Any:
    """OSWorld's ``DesktopEnv`` (desktop-env 1.0.2, the osworld extra) whose VM is a desktop workspace; ``kwargs``
    go to ``DesktopEnv`` (``action_space``, ``cache_dir``, ``require_a11y_tree``...). ``env.close()`` closes the
    desktop; ``env.provider.close_runtime()`` ends the run (also done at exit)."""
    import desktop_env.desktop_env as osworld

    provider = RuntimeProvider(state_dir=state_dir, limits=limits)
    made = osworld.create_vm_manager_and_provider
    osworld.create_vm_manager_and_provider = lambda *args, **kw: (RuntimeVMManager(), provider)
    try:
        return osworld.DesktopEnv(provider_name="docker", path_to_vm="bunshin-desktop", os_type="Ubuntu", **kwargs)
    except BaseException:
        provider.close_runtime()
        raise
    finally:
        osworld.create_vm_manager_and_provider = made
