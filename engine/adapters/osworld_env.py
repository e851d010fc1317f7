"""OSWorld's own ``DesktopEnv`` on a BunshinRL desktop workspace: the runtime is its provider.

Owns: ``RuntimeProvider`` (OSWorld's ``Provider`` contract: ``start_emulator`` makes a desktop workspace and serves
its VM API over HTTP, ``get_ip_address`` names it, ``revert_to_snapshot`` replaces it with a fresh desktop,
``stop_emulator`` closes it; ``save_state`` refuses) and ``desktop_env(...)``, a ``DesktopEnv`` built on it
(``envs/xdesktop/osworld_judge.make_desktop_env``). The runtime runs on a thread of its own
(``session.RuntimeLoop``); OSWorld's code stays synchronous and speaks HTTP to the workspace, as to a VM.
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
from bunshin.envs.xdesktop.files_cache import FilesCache
from bunshin.envs.xdesktop.http import Endpoint
from bunshin.envs.xdesktop.osworld_judge import make_desktop_env

from .session import AdapterError, RuntimeLoop, track

DESKTOP_APP = desktop_app()
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
        self.endpoint: Endpoint | None = None

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
        endpoint = Endpoint(ws)
        try:
            await endpoint.start()
        except BaseException:
            await ws.close()
            self.loop.workspaces.discard(ws)
            raise
        self.ws, self.endpoint = ws, endpoint

    def get_ip_address(self, path_to_vm: str) -> str:
        if self.endpoint is None:
            raise AdapterError("the desktop is not started (start_emulator first)")
        return self.endpoint.address

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
        endpoint, ws = self.endpoint, self.ws
        self.endpoint, self.ws = None, None
        try:
            if endpoint is not None:
                await endpoint.close()
        finally:
            if ws is not None:
                await ws.close()
                self.loop.workspaces.discard(ws)

    def close_runtime(self) -> None:
        """End the run: every workspace, the runtime, the thread (idempotent)."""
        with contextlib.suppress(Exception):
            self.stop_emulator("")
        self.loop.shutdown()


def desktop_env(*, state_dir: Path | None = None, limits: Limits | None = None,
                files: FilesCache | None = None, **kwargs: Any) -> Any:
    """OSWorld's ``DesktopEnv`` (desktop-env 1.0.2, the osworld extra) whose VM is a desktop workspace; ``kwargs``
    go to ``DesktopEnv`` (``action_space``, ``cache_dir``, ``require_a11y_tree``...). A task's downloads and cloud
    files come from ``files`` (default: this machine's files cache, which holds the osworld suite's own).
    ``env.close()`` closes the desktop; ``env.provider.close_runtime()`` ends the run (also done at exit)."""
    provider = RuntimeProvider(state_dir=state_dir, limits=limits)
    try:
        return make_desktop_env(provider, files if files is not None else FilesCache(), **kwargs)
    except BaseException:
        provider.close_runtime()
        raise
