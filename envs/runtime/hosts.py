"""Host lifecycle: the small surface through which workspaces and fork backends start, watch and remove hosts.

Owns: naming workspaces, making and removing a workspace's cgroup, layer and mount point, spawning a first host
through the nursery and handing it its configuration, waiting for a host's Ready (a first host, a clone, a
restore), registering live workspaces (and opening the egress proxy of those whose app declares one), stopping a host that overran a deadline, and discarding a workspace whose
host stopped serving, and the run's task scope (``tasks``: every workspace's in-flight exchange, teardown and
discard, and the restore backend's dumps; the runtime closes it last). It implements ``WorkspaceServices`` for
every ``HostWorkspace`` of the run (images through the run's ``ImageFiles``, ``image_files.py``); fork backends are
given a ``Hosts`` and nothing else of the run.
Must never: leave a half-started host, cgroup, layer or mount point behind when a start fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageFailed, StartTimeout, WorkspaceStartFailed
from ..records import AppSpec, Limits
from ..seeds import derive_seed
from . import await_points
from .base_images import BaseImages
from .cgroups import AGENT_GROUP, Cgroup
from .channel import ChannelClosed, async_recv_frame, async_send_frame
from .egress import EgressProxy, parse_allow
from .fork.backends import ForkBackend
from .host_workspace import HostSnapshot, HostWorkspace
from .image_files import ImageFiles, WorkspaceImage
from .ksm import KsmHold
from .layers import LayerStore
from .nursery import Nursery
from .protocol import Failed, HostConfig, Ready, encoder, reply_decoder
from .shells import DEFAULT_SHELLS, SHELLS, ShellMaker, ShellPool
from .task_scope import TaskScope, run_to_end
from .warm_pool import WarmPool

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 60.0  # a killed process may take long to exit on a loaded machine (unmapping, writeback)


@dataclass
class RunResources:
    """What a run made at its start and every host of it uses (see ``WorkspaceRuntime.start``)."""

    run_dir: Path
    seed: int
    limits: Limits
    faults: list[str]
    start_timeout_s: float
    nursery: Nursery
    cgroup: Cgroup
    layers: LayerStore
    images: BaseImages
    runtime_binds: list[str]
    pool_fd: int
    cgroup_fds: list[int]
    warm_pool: int = 0  # ready slots per warm app (``warm_pool.py``); 0: none, every clone starts its own
    warm_budget_bytes: int | None = None  # the run's charge the pool never takes beyond (None: half of what is free)
    ksm: KsmHold | None = None  # the run's hold on ksmd's tuning, taken by the first workspace that opts into KSM
    one_step_clones: bool = True  # ``HostConfig.one_step_clones``
    shells: int = DEFAULT_SHELLS  # prepared shells kept ready (``shells.py``); 0: every fork makes its own


class Hosts:
    """The hosts of one run. ``backend`` is set by the runtime once it has made the fork backend."""

    def __init__(self, run: RunResources, make_backend: Callable[[Hosts], ForkBackend]):
        self.run = run
        self.limits = run.limits
        self.layers = run.layers
        self.workspaces: dict[str, HostWorkspace] = {}
        # A failure of one of these tasks is raised to whoever awaits it (a request, a close, a fork); one whose
        # awaiter was cancelled is only noted here.
        self.tasks = TaskScope("hosts", on_error=lambda exc: log.debug("a background task of the run failed: %r", exc))
        self.backend = make_backend(self)
        self._counter = 0
        self.pool = WarmPool(self._start_slot, run.cgroup.memory_charge, self.tasks, size=run.warm_pool,
                             budget_bytes=run.warm_budget_bytes)
        maker = ShellMaker(new_id=self.new_id, new_cgroup=self.new_cgroup, run_cgroup=run.cgroup, nursery=run.nursery,
                           cgroup_fds=run.cgroup_fds, faults=run.faults)
        self.shells = ShellPool(maker, run.cgroup.memory_charge, self.tasks, size=run.shells,
                                budget_bytes=self.pool.budget_bytes)
        if self.backend.takes_shells:  # from the run's start: its first forks take shells too (each is a few ms)
            self.shells.want(SHELLS)
        self.images = ImageFiles(run.layers)  # durable images of workspaces (``Workspace.image``)

    # -- naming and remains ---------------------------------------------------------------------------------------
    def new_id(self) -> str:
        self._counter += 1
        return f"{self._counter:04d}{secrets.token_hex(2)}"

    def new_cgroup(self, ws_id: str) -> Cgroup:
        """The workspace's cgroup, with the agents' subgroup and the run's limits (hierarchical: they cover the
        agents too). Blocking: call it in a thread."""
        group = self.run.cgroup.child(f"ws-{ws_id}").create()
        group.child(AGENT_GROUP).create()
        group.set_limits(self.limits.memory_bytes, self.limits.pids)
        return group

    def remove_remains(self, group: Cgroup | None, layer: str, ws_id: str) -> None:
        """Remove a workspace's cgroup (None: it has none of its own), layer and mount point; each is tried even
        if another fails. Blocking."""
        try:
            if group is not None:
                group.remove()
        finally:
            try:
                self.layers.delete(layer)
            finally:
                shutil.rmtree(self.run.run_dir / "roots" / ws_id, ignore_errors=True)

    def host_log(self, ws_id: str) -> str:
        try:
            text = (self.run.run_dir / f"host-{ws_id}.log").read_text(errors="replace").strip()
        except FileNotFoundError:
            return ""
        return f"\n--- host log ---\n{text[-4000:]}" if text else ""

    def register(self, ws: HostWorkspace) -> None:
        self.workspaces[ws.id] = ws

    async def admit(self, ws: HostWorkspace) -> None:
        """Register a live workspace (a new one, a clone) and open its way out when its app declares one
        (``AppSpec.egress``: the proxy listens in its own network namespace, a clone's too); if that fails the
        workspace is closed and ``WorkspaceStartFailed`` says why."""
        if ws.app_spec.egress and not ws.frozen:
            proxy = EgressProxy(parse_allow(ws.app_spec.egress))
            try:
                await proxy.start(ws.pid)
            except BaseException as exc:
                await asyncio.shield(ws.close())
                if isinstance(exc, Exception):
                    raise WorkspaceStartFailed(ws.id, f"its egress proxy did not start: {type(exc).__name__}: "
                                                      f"{exc}") from exc
                raise
            ws.egress = proxy
        self.register(ws)

    # -- starting ------------------------------------------------------------------------------------------------
    async def start(self, ws_id: str, layer: str, app: AppSpec, *, seed: int | None, hostname: str | None,
                    restore_from: str | None = None, restore_workers: int = 0, parent: str | None = None,
                    generation: int = 0, frozen: bool = False, register: bool = True) -> HostWorkspace:
        """Spawn a host on an existing layer and wait until it is ready (a ``HostSnapshot`` when ``frozen``); on
        any failure (cancellation too) undo the cgroup, the layer, the mount point and the process. A workspace of
        an app with warm slots (``AppSpec.warm``) has the pool fill them; ``register=False``: a slot, the pool's."""
        target = self.run.run_dir / "roots" / ws_id
        image = await self.run.images.for_app(app)  # before anything is made: an image not built is the caller's
        parse_allow(app.egress)  # likewise a bad egress entry (BadEgress names it)
        if app.merge_memory and self.run.ksm is not None and not self.run.ksm.held:
            await asyncio.to_thread(self.run.ksm.take)  # ksmd tuned before the first mergeable program starts
        group = await run_to_end(  # the thread runs on regardless of a cancellation; undone once it is done
            asyncio.to_thread(self._make_group_and_root, ws_id, target),
            undo=lambda made: asyncio.to_thread(self.remove_remains, made, layer, ws_id))
        seed = derive_seed(self.run.seed, ws_id) if seed is None else seed
        engine_end, host_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        run = self.run
        config = HostConfig(
            ws_id=ws_id, hostname=hostname or f"ws-{ws_id}", seed=seed, layer=layer, lower=image.lower,
            image_binds=[b.pair() for b in image.binds], runtime_binds=run.runtime_binds,
            mount_target=str(target), cgroup_rel=f"ws-{ws_id}", app=app, reaper_pid=run.nursery.pid,
            one_step_clones=run.one_step_clones,
            restore_from=restore_from, restore_workers=restore_workers, faults=run.faults,
            # KSM for what the fork cannot share: under a live fork the host's pages are its clones' already (the
            # app opts in its own programs, a browser); under a private restore nothing is shared, all may merge
            merge_memory=app.merge_memory and not self.backend.shares_memory,
            tree=self.backend.tree_hosts, pool_path=str(run.layers.root) if self.backend.tree_hosts else "",
            image_env=dict(image.config.env) if image.config else {},
            image_cwd=image.config.working_dir if image.config else "",
        )
        pid: int | None = None
        try:
            await await_points.reached("hosts.start.spawn")
            pid = await run.nursery.spawn(
                [sys.executable, "-m", "bunshin.envs.runtime.host", "--channel", "{0}", "--pool", "{1}",
                 "--cgroups", ",".join(f"{{{i + 2}}}" for i in range(len(run.cgroup_fds)))],
                fds=[host_end.fileno(), run.pool_fd, *run.cgroup_fds],
                log_path=str(run.run_dir / f"host-{ws_id}.log"), cwd=str(run.run_dir),
                cgroup_rel=f"ws-{ws_id}", cgroup_fds=list(range(2, 2 + len(run.cgroup_fds))),
                pid_namespace=self.backend.tree_hosts)
            host_end.close()
            engine_end.setblocking(False)
            await async_send_frame(engine_end, encoder.encode(config))
            pid = (await self.await_ready(ws_id, engine_end)).pid
            cls = HostSnapshot if frozen else HostWorkspace
            ws = cls(self, ws_id, pid=pid, sock=engine_end, cgroup=group, layer=layer, seed=seed, app=app,
                     parent=parent, generation=generation)
        except BaseException as exc:
            host_end.close()
            engine_end.close()
            await asyncio.shield(self._abandon_start(pid, group, layer, ws_id))
            if isinstance(exc, Exception) and not isinstance(exc, WorkspaceStartFailed):
                raise WorkspaceStartFailed(ws_id, f"{type(exc).__name__}: {exc}{self.host_log(ws_id)}") from exc
            raise
        if register:
            await self.admit(ws)
            if not frozen:
                self.prepare(app)
        return ws

    def prepare(self, app: AppSpec) -> None:
        """Have the warm pool fill the slots the live clones of ``app`` will take (nothing for an app without
        slots, or a backend whose clones take none), and the shell pool its shells (for a backend that takes them)."""
        if app.warm is not None and self.backend.takes_warm_slots:
            self.pool.want(app.warm)
        if self.backend.takes_shells:
            self.shells.want(SHELLS)

    async def _start_slot(self, spec: AppSpec) -> HostWorkspace:
        """A warm-pool slot: a new workspace of ``spec`` on a layer of its own, registered nowhere."""
        ws_id = self.new_id()
        layer = f"ws-{ws_id}"
        await run_to_end(asyncio.to_thread(self.layers.create, layer),
                         undo=lambda _: asyncio.to_thread(self.layers.delete, layer))
        return await self.start(ws_id, layer, spec, seed=None, hostname=None, register=False)

    def _make_group_and_root(self, ws_id: str, target: Path) -> Cgroup:
        group = self.new_cgroup(ws_id)
        target.mkdir(parents=True)
        return group

    async def await_ready(self, ws_id: str, sock: socket.socket) -> Ready:
        """Wait for a host's Ready on ``sock`` (its pid, its setup's time). A Failed reply or a closed channel raises
        WorkspaceStartFailed, no reply within the start timeout StartTimeout."""
        timeout = self.run.start_timeout_s
        try:
            await await_points.reached("hosts.await_ready")
            async with asyncio.timeout(timeout):
                reply = reply_decoder.decode(await async_recv_frame(sock))
        except ChannelClosed as exc:
            raise WorkspaceStartFailed(ws_id, f"host exited before it was ready{self.host_log(ws_id)}") from exc
        except TimeoutError as exc:
            raise StartTimeout(ws_id, f"host not ready after {timeout:g}s") from exc
        if isinstance(reply, Failed):
            raise WorkspaceStartFailed(ws_id, f"{reply.kind}: {reply.message}{self.host_log(ws_id)}")
        if not isinstance(reply, Ready) or reply.ws_id != ws_id:
            raise WorkspaceStartFailed(ws_id, f"unexpected first reply {reply!r}")
        return reply

    async def _abandon_start(self, pid: int | None, group: Cgroup, layer: str, ws_id: str) -> None:
        if pid is not None:
            self.kill_if_running(pid)
            await self.run.nursery.wait_exit(pid, timeout=5.0)
            self.run.nursery.forget(pid)
        await asyncio.to_thread(self.remove_remains, group, layer, ws_id)

    # -- WorkspaceServices ---------------------------------------------------------------------------------------
    async def fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        return await self.backend.fork(source, seed=seed, frozen=frozen)

    async def image(self, source: HostWorkspace, name: str) -> WorkspaceImage:
        if self.backend.tree_hosts:
            raise ImageFailed(source.id, f"{self.backend.name}: a tree-fork workspace has no process images yet")
        return await self.images.take(source, name)

    async def wait_exit(self, pid: int, timeout: float) -> int | None:
        return await self.run.nursery.wait_exit(pid, timeout=timeout)

    def stop(self, ws: HostWorkspace) -> None:
        self.kill_if_running(ws.pid)

    async def discard(self, ws: HostWorkspace) -> None:
        """After a host stopped serving: kill what is left in its cgroup, remove cgroup and layer. A task of
        ``tasks``: the runtime's close waits for discards still running (a cancelled ``close`` leaves one behind)."""
        self.workspaces.pop(ws.id, None)
        await asyncio.shield(self.tasks.start_soon(self._discard(ws), name=f"discard {ws.id}"))

    async def _discard(self, ws: HostWorkspace) -> None:
        if ws.egress is not None:
            await ws.egress.close()
        await asyncio.to_thread(ws.cgroup.kill_all, KILL_TIMEOUT_S)  # a warm-pool slot it took is in it too
        for host in (ws, *ws.companions):
            self.kill_if_running(host.pid)
            await self.run.nursery.wait_exit(host.pid, timeout=10.0)
            self.run.nursery.forget(host.pid)
        await asyncio.to_thread(self.remove_remains, ws.cgroup, ws.layer, ws.id)
        for slot in ws.companions:  # its cgroup was the clone's, removed above
            slot.sock.close()
            await asyncio.to_thread(self.remove_remains, None, slot.layer, slot.id)
        await self.backend.forget(ws)

    async def aclose(self) -> None:
        """Once every workspace is closed: close the warm pool's slots and the shells nobody took, wait until every task of the run (discards
        still running above all) has finished, then close the scope (their failures are theirs: reported to their
        callers)."""
        try:
            try:
                await self.pool.aclose()
            finally:
                await self.shells.aclose()
        finally:
            await self.tasks.join()
            await self.tasks.aclose()

    def kill_if_running(self, pid: int) -> None:
        """SIGKILL a host the nursery has not yet reported dead (a reported pid may already be someone else's)."""
        if self.run.nursery.exited(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
