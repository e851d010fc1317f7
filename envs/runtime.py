"""A run's workspaces: the state directory, the layer pool, the parent cgroup, the base image, and every host.

Owns: starting and stopping a run (including the clean-up of runs whose engine died), spawning first hosts,
reaping every host (the engine is a child subreaper, so clones orphaned by the fork's double fork land on it),
naming and removing workspaces' cgroups and layers, and the per-run memory figure.
Must never: leave a process, mount, cgroup or layer behind when ``close()`` returns, cancelled or not.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .cgroups import AGENT_GROUP, Cgroup, CgroupLayout
from .channel import ChannelClosed, async_recv_frame, async_send_frame
from .cleanup import engine_record, register, remove_stale_runs, unregister
from .errors import HostUnsupported, WorkspaceStartFailed
from .image import PreparedImage, build_default_image, place_directory, place_tarball, runtime_paths
from .layers import LayerStore
from .nursery import Nursery
from .memory import processes_memory
from .seeds import derive_seed
from .records import (AppSpec, Checkpoint, Checkpointed, Failed, HostConfig, Limits, MemoryStats, Ready,
                      encoder, reply_decoder)
from .workspace import Workspace

DEFAULT_STATE_DIR = Path(os.environ.get("BUNSHIN_STATE_DIR", "/var/lib/bunshin"))
START_TIMEOUT_S = 60.0


class WorkspaceRuntime:
    """Async context manager: ``async with WorkspaceRuntime(backend="cow") as rt: ws = await rt.create(app)``."""

    def __init__(self, *, backend: str = "cow", image: str | Path | None = None, limits: Limits | None = None,
                 seed: int = 0, state_dir: Path | None = None, faults: list[str] | None = None,
                 start_timeout_s: float = START_TIMEOUT_S):
        """``start_timeout_s``: how long a new host (a create, a clone, a restore) may take to report ready; an
        engine starting many at once on few cores raises it."""
        from .backends import make_backend

        self.backend = make_backend(backend, self)
        self.image_source = Path(image) if image else None
        self.limits = limits or Limits()
        self.seed = seed
        self.state_dir = Path(state_dir or DEFAULT_STATE_DIR)
        self.faults = list(faults or [])
        self.start_timeout_s = start_timeout_s
        self.run_id = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        self.run_dir = self.state_dir / "runs" / self.run_id
        self.workspaces: dict[str, Workspace] = {}
        self._started = False
        self._counter = 0

    # -- run lifecycle -----------------------------------------------------------------------------------------
    async def __aenter__(self) -> WorkspaceRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if os.geteuid() != 0:
            raise HostUnsupported("the workspace runtime needs root (namespaces, mounts, cgroups)")
        await asyncio.to_thread(remove_stale_runs, self.state_dir)
        # The run directory appears with its engine.json already inside, so a second engine starting at the same
        # moment never sees it half-made (and so dead).
        staging = self.run_dir.with_name(f".{self.run_id}")
        staging.mkdir(parents=True)
        record = engine_record(self.run_id, os.getpid())
        (staging / "engine.json").write_text(record)
        register(self.run_id, record)
        staging.rename(self.run_dir)
        self._started = True
        try:
            self.nursery = Nursery(str(self.run_dir / "nursery.log"), str(self.run_dir))
            await self.nursery.start()
            self.layout = CgroupLayout.detect()
            self.cgroup = Cgroup(self.layout, f"bunshin-{self.run_id}").create(delegate=True)
            self.layers = await asyncio.to_thread(LayerStore.create_pool, self.run_dir)
            self.image = await asyncio.to_thread(self._prepare_image)
            self.pool_fd = self.layers.open_detached()
            self.cgroup_fds = [os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for d in self.cgroup.dirs()]
        except BaseException:
            await self.close()
            raise

    def _prepare_image(self) -> PreparedImage:
        root = self.layers.root
        if self.image_source is None:
            prepared = build_default_image(root)
        elif self.image_source.is_dir():
            prepared = place_directory(root, self.image_source)
        else:
            prepared = place_tarball(root, self.image_source)
        self.runtime_binds = runtime_paths()
        return prepared

    async def close(self) -> None:
        """Close every workspace, then remove the run's cgroup, pool and directory. Finishes under cancellation."""
        if not self._started:
            return
        self._started = False
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        """Every step runs even when an earlier one failed; the first failure is raised at the end."""
        errors: list[BaseException] = []

        async def step(coro: Any) -> None:
            try:
                await coro
            except Exception as exc:
                errors.append(exc)

        for ws in list(self.workspaces.values()):
            await step(ws.close())
        if hasattr(self, "nursery"):
            await step(self.nursery.close())
        for fd in getattr(self, "cgroup_fds", []):
            os.close(fd)
        if hasattr(self, "pool_fd"):
            os.close(self.pool_fd)
        if hasattr(self, "cgroup"):
            await step(asyncio.to_thread(self.cgroup.remove))
        if hasattr(self, "layers"):
            await step(asyncio.to_thread(self.layers.destroy_pool))
        await asyncio.to_thread(shutil.rmtree, self.run_dir, ignore_errors=True)
        unregister(self.run_id)
        if errors:
            raise errors[0]

    # -- naming -------------------------------------------------------------------------------------------------
    def new_id(self) -> str:
        self._counter += 1
        return f"{self._counter:04d}{secrets.token_hex(2)}"

    def new_cgroup(self, ws_id: str) -> Cgroup:
        group = self.cgroup.child(f"ws-{ws_id}").create()
        group.child(AGENT_GROUP).create()  # limits below are hierarchical: they cover the agents too
        group.set_limits(self.limits.memory_bytes, self.limits.pids)
        return group

    # -- first hosts ---------------------------------------------------------------------------------------------
    async def create(self, app: AppSpec | None = None, *, seed: int | None = None,
                     hostname: str | None = None) -> Workspace:
        """Build a new workspace from the image and start its application."""
        ws_id = self.new_id()
        layer = f"ws-{ws_id}"
        making = asyncio.ensure_future(asyncio.to_thread(self.layers.create, layer))
        try:
            await asyncio.shield(making)
        except asyncio.CancelledError:
            await making  # the thread runs on regardless; undo only once it is done
            await asyncio.to_thread(self.layers.delete, layer)
            raise
        return await self.start_host(ws_id, layer, app or AppSpec(), seed=seed, hostname=hostname)

    async def start_host(self, ws_id: str, layer: str, app: AppSpec, *, seed: int | None, hostname: str | None,
                         restore_from: str | None = None, parent: str | None = None,
                         generation: int = 0, cls: type[Workspace] = Workspace) -> Workspace:
        """Spawn a host on an existing layer; on any failure undo the cgroup, the layer and the process."""
        target = self.run_dir / "roots" / ws_id
        making = asyncio.ensure_future(asyncio.to_thread(self._make_group_and_root, ws_id, target))
        try:
            group = await asyncio.shield(making)
        except asyncio.CancelledError:
            group = await making  # the thread runs on regardless; undo once it is done
            await asyncio.to_thread(self._remove_remains, group, layer, ws_id)
            raise
        seed = derive_seed(self.seed, ws_id) if seed is None else seed
        engine_end, host_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        config = HostConfig(
            ws_id=ws_id, hostname=hostname or f"ws-{ws_id}", seed=seed, layer=layer, lower=self.image.lower,
            image_binds=[b.path for b in self.image.binds], runtime_binds=self.runtime_binds,
            mount_target=str(target), cgroup_rel=f"ws-{ws_id}", app=app, reaper_pid=self.nursery.pid,
            restore_from=restore_from, faults=self.faults,
        )
        pid: int | None = None
        try:
            pid = await self.nursery.spawn(
                [sys.executable, "-m", "bunshin.envs.host", "--channel", "{0}", "--pool", "{1}", "--cgroups",
                 ",".join(f"{{{i + 2}}}" for i in range(len(self.cgroup_fds)))],
                fds=[host_end.fileno(), self.pool_fd, *self.cgroup_fds],
                log_path=str(self.run_dir / f"host-{ws_id}.log"), cwd=str(self.run_dir))
            host_end.close()
            engine_end.setblocking(False)
            await async_send_frame(engine_end, encoder.encode(config))
            pid = await self.await_ready(ws_id, engine_end)
            ws = cls(self, ws_id, pid=pid, sock=engine_end, cgroup=group, layer=layer, seed=seed, app=app,
                     parent=parent, generation=generation)
        except BaseException as exc:
            host_end.close()
            engine_end.close()
            await asyncio.shield(self._abandon_start(pid, group, layer, ws_id))
            if isinstance(exc, Exception) and not isinstance(exc, WorkspaceStartFailed):
                log_tail = self.host_log(ws_id)
                raise WorkspaceStartFailed(ws_id, f"{type(exc).__name__}: {exc}{log_tail}") from exc
            raise
        self.workspaces[ws_id] = ws
        return ws

    def _make_group_and_root(self, ws_id: str, target: Path) -> Cgroup:
        group = self.new_cgroup(ws_id)
        target.mkdir(parents=True)
        return group

    async def await_ready(self, ws_id: str, sock: socket.socket) -> int:
        """Wait for a host's Ready on ``sock``; a Failed reply or a closed channel raises WorkspaceStartFailed."""
        try:
            async with asyncio.timeout(self.start_timeout_s):
                reply = reply_decoder.decode(await async_recv_frame(sock))
        except ChannelClosed as exc:
            raise WorkspaceStartFailed(ws_id, f"host exited before it was ready{self.host_log(ws_id)}") from exc
        except TimeoutError as exc:
            raise WorkspaceStartFailed(ws_id, f"host not ready after {self.start_timeout_s:g}s") from exc
        if isinstance(reply, Failed):
            raise WorkspaceStartFailed(ws_id, f"{reply.kind}: {reply.message}{self.host_log(ws_id)}")
        if not isinstance(reply, Ready) or reply.ws_id != ws_id:
            raise WorkspaceStartFailed(ws_id, f"unexpected first reply {reply!r}")
        return reply.pid

    def host_log(self, ws_id: str) -> str:
        try:
            text = (self.run_dir / f"host-{ws_id}.log").read_text(errors="replace").strip()
        except FileNotFoundError:
            return ""
        return f"\n--- host log ---\n{text[-4000:]}" if text else ""

    # -- removal ------------------------------------------------------------------------------------------------
    async def _abandon_start(self, pid: int | None, group: Cgroup, layer: str, ws_id: str) -> None:
        if pid is not None:
            self._kill_if_running(pid)
            await self.nursery.wait_exit(pid, timeout=5.0)
            self.nursery.forget(pid)
        await asyncio.to_thread(self._remove_remains, group, layer, ws_id)

    def _kill_if_running(self, pid: int) -> None:
        """SIGKILL a host the nursery has not yet reported dead (a reported pid may already be someone else's)."""
        if self.nursery.exited(pid):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    async def discard(self, ws: Workspace) -> None:
        """After a host stopped serving: kill what is left in its cgroup, remove cgroup and layer."""
        self.workspaces.pop(ws.id, None)
        await asyncio.to_thread(ws.cgroup.kill_all)
        self._kill_if_running(ws.pid)
        await self.nursery.wait_exit(ws.pid, timeout=10.0)
        self.nursery.forget(ws.pid)
        await asyncio.to_thread(self._remove_remains, ws.cgroup, ws.layer, ws.id)

    def _remove_remains(self, group: Cgroup, layer: str, ws_id: str) -> None:
        """Remove a workspace's cgroup, layer and mount point; each is tried even if another fails."""
        try:
            group.remove()
        finally:
            try:
                self.layers.delete(layer)
            finally:
                shutil.rmtree(self.run_dir / "roots" / ws_id, ignore_errors=True)

    # -- checkpoints and memory -------------------------------------------------------------------------------------
    async def checkpoint(self, ws: Workspace, path: str) -> int:
        layer = f"{Path(path).name}.layer"
        reply = await ws.request(Checkpoint(path=path, layer=layer))
        assert isinstance(reply, Checkpointed)
        return reply.bytes_written

    def memory(self) -> MemoryStats:
        """Every workspace of the run together (PSS summed over all their processes)."""
        if not hasattr(self, "cgroup"):
            return MemoryStats()
        return processes_memory(self.cgroup.procs(), self.cgroup.memory_charge())
