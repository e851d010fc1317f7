"""The tree fork, engine side (``--backend kmod``): a live fork of a workspace's whole process tree, made from
outside it through the kernel module (``kmod/``), its memory shared copy-on-write with the source's.

The sequence, in order (each step's owner):

1. here: hold the source's channel (no request in flight), make the clone's cgroup, freeze the source's cgroup;
2. here: snapshot the source's writable layer (btrfs) and read its frozen tree (``treefork/reader.py``); the
   clone gets the engine's descriptors in place of the source's external ones (``TREE_*_FD`` in
   ``protocol.py``): a channel of its own, its own log, the run's cgroup hierarchies;
3. the nursery: spawn the builder (``kmod/treefork/builder.c``) as a child of its own, with the clone's root
   assembled for it on the snapshot (``rootfs.assemble``, in the builder's mount namespace); the builder stays the
   parent of the clone's pid 1, the clone dies with it and it with the nursery, so the workspace's pid is the
   builder's;
4. here: the plan to the builder, its "grafted", the source thawed (its freeze covered the snapshot, the reading
   and the graft), a snapshot's cgroup frozen, the release; a running clone, still in its source's ``recv`` on
   what is now its own channel, is told which workspace it is (``Become``) and answers ``Ready``.

A snapshot (``frozen``) is the released clone kept frozen in its cgroup: it answers nothing, and forking it reads
its tree as it is. The hosts of this backend are tree-fork hosts (``HostConfig.tree``).
Owns: that sequence and its undo.
Must never: leave a half-built clone, or a source frozen, whatever fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import ForkFailed, WorkspaceStartFailed
from ...workspace import ForkTiming
from .. import await_points
from ..cgroups import Cgroup
from ..channel import async_send_frame
from ..host_workspace import HostSnapshot, HostWorkspace
from ..hosts import KILL_TIMEOUT_S, Hosts
from ..protocol import TREE_CGROUP_FD, TREE_CHANNEL_FD, Become, NurserySpawn, RootSpec, encoder
from ..treefork.errors import TreeForkFailed, TreeForkRefused
from ..treefork.fork import BuilderLines
from ..treefork.plan import TreePlan, render
from ..treefork.procfs import last, status
from ..treefork.reader import read_tree
from .backends import AllOrNothingFork, clone_seed

BUILDER_ENV = "BUNSHIN_TREEFORK_BUILDER"  # the builder's path, when it is not on PATH as bunshin-treefork
DEVICE = "/dev/bunshin"
FREEZE_TIMEOUT_S = 10.0
BUILD_TIMEOUT_S = 120.0  # from the builder's spawn to its release (a TCG guest is slow)
TRANSIENT_BUDGET_S, TRANSIENT_PAUSE_S = 20.0, 0.2  # a fork refused for a transient state: tried again after a pause


def builder_path() -> str | None:
    """The tree-fork builder's program, or None when this host has none."""
    return os.environ.get(BUILDER_ENV) or shutil.which("bunshin-treefork")


def unavailable() -> str | None:
    """Why the tree fork cannot run here (None: it can): the module's device and the builder."""
    if not os.path.exists(DEVICE):
        return f"no {DEVICE}: the bunshin kernel module is not loaded (kmod/README.md)"
    if builder_path() is None:
        return f"no tree-fork builder: set {BUILDER_ENV} or put bunshin-treefork on PATH (make -C kmod/treefork)"
    return None


def why_not(hosts: Hosts) -> str | None:
    """Why this run cannot tree-fork (None: it can)."""
    if hosts.run.cgroup.layout.version != 2:
        return "the tree fork needs cgroup v2 (the builder moves the clone into one group)"
    return unavailable()


@dataclass
class _Build:
    """One builder at work: its pid (the nursery's child), the pipes the engine talks to it on."""

    pid: int
    plan_w: int
    lines: BuilderLines
    deadline: float
    inherited: list[int]  # the numbers, in the builder, of the clone's channel end, its log, the cgroup hierarchies

    def send(self, text: str) -> None:
        data = text.encode()
        while data:
            data = data[os.write(self.plan_w, data):]

    def close(self) -> None:
        for fd in (self.plan_w, self.lines.fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class KmodFork(AllOrNothingFork):
    name = "kmod"
    shares_memory = True
    tree_hosts = True

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    async def _fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        """A fork refused for a state a running source leaves by itself (a desktop's client caught connecting to
        its X server or bus) is tried again once the source has run a moment (0.2 s, then half as long again each
        time, up to 2 s), for ``TRANSIENT_BUDGET_S`` at most (a frozen source, a snapshot, stays as it is: refused
        at once)."""
        started, pause = time.monotonic(), TRANSIENT_PAUSE_S
        while True:
            try:
                return await self._fork_once(source, seed=seed, frozen=frozen)
            except ForkFailed as exc:
                refused = exc.__cause__
                if not (isinstance(refused, TreeForkRefused) and refused.transient) or source.frozen or \
                        time.monotonic() - started + pause > TRANSIENT_BUDGET_S:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 2.0)

    async def _fork_once(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        hosts = self.hosts
        why = why_not(hosts)
        if why is not None:  # its hosts run anywhere (tools, close); a fork needs all of these
            raise ForkFailed(source.id, f"kmod: {why}")
        started = time.monotonic()
        clone_id = hosts.new_id()
        layer = f"ws-{clone_id}"
        group = await asyncio.to_thread(hosts.new_cgroup, clone_id)
        engine_end, clone_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        build: _Build | None = None
        try:
            async with source.exclusive():
                freeze_s, build = await self._graft(source, clone_id, layer, group, clone_end)
            if frozen:
                await asyncio.to_thread(group.freeze, True)  # released, every clone process traps in the freezer
            await await_points.reached("fork.kmod.release")
            await asyncio.to_thread(self._release, build)
            new_seed = clone_seed(source, seed)
            engine_end.setblocking(False)
            if not frozen:
                await async_send_frame(engine_end, encoder.encode(Become(ws_id=clone_id, seed=new_seed, layer=layer,
                                                                         cgroup_rel=f"ws-{clone_id}")))
                await hosts.await_ready(clone_id, engine_end)
            cls = HostSnapshot if frozen else HostWorkspace
            clone = cls(hosts, clone_id, pid=build.pid, sock=engine_end, cgroup=group, layer=layer, seed=new_seed,
                        app=source.app_spec, parent=source.id, generation=source.generation + 1)
            clone.says_goodbye = not frozen  # a frozen clone answers nothing: it is killed
            clone.last_fork = ForkTiming(freeze_s=freeze_s, ready_s=time.monotonic() - started)
        except BaseException as exc:
            engine_end.close()
            await asyncio.shield(self._undo(build, group, layer, clone_id))
            if isinstance(exc, TreeForkRefused | TreeForkFailed | WorkspaceStartFailed | OSError):
                raise ForkFailed(source.id, f"tree fork to {clone_id} failed: {exc}{hosts.host_log(clone_id)}"
                                 ) from exc
            raise
        finally:
            clone_end.close()
            if build is not None:
                build.close()
        await hosts.admit(clone)
        return clone

    async def _graft(self, source: HostWorkspace, clone_id: str, layer: str, group: Cgroup,
                     clone_end: socket.socket) -> tuple[float, _Build]:
        """Steps 1 to 4 up to the graft, with the source frozen: when its graft is done, or on any failure, the
        source is thawed again (unless it is a snapshot, frozen for good). How long it was frozen, and the build."""
        hosts = self.hosts
        thaw = not source.frozen
        frozen_at = time.monotonic()
        if thaw:
            await asyncio.to_thread(_freeze, source.cgroup)
        try:
            await await_points.reached("fork.kmod.frozen")
            await asyncio.to_thread(hosts.layers.snapshot, source.layer, layer)
            init = await asyncio.to_thread(tree_init, source.pid)
            log_fd = os.open(hosts.run.run_dir / f"host-{clone_id}.log",
                             os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                build = await self._spawn_builder(source, clone_id, layer, [clone_end.fileno(), log_fd])
            finally:
                os.close(log_fd)
            try:
                await await_points.reached("fork.kmod.builder")
                numbers = build.inherited
                inherit = {(1, TREE_CHANNEL_FD): numbers[0], (1, 1): numbers[1]}
                inherit.update({(1, TREE_CGROUP_FD + i): n for i, n in enumerate(numbers[2:])})
                plan = await asyncio.to_thread(read_tree, init, f"ws-{clone_id}", inherit)
                plan.root, plan.cgroup = str(hosts.run.run_dir / "roots" / clone_id), str(group.path("memory"))
                # the source's cgroups below its own (its agents', its programs'), the clone's below its own
                await asyncio.to_thread(lambda: [group.child(below).create() for below in plan.cgroups])
                await asyncio.to_thread(self._until_grafted, build, plan)
            except BaseException:
                await asyncio.shield(self._kill_builder(build))
                raise
        finally:
            if thaw:
                await asyncio.shield(asyncio.to_thread(source.cgroup.freeze, False))
        return time.monotonic() - frozen_at, build

    async def _spawn_builder(self, source: HostWorkspace, clone_id: str, layer: str, given: list[int]) -> _Build:
        """The builder, as the nursery's child, in a mount namespace with the clone's root; ``given``: the clone's
        channel end and log, then the run's cgroup hierarchies are passed too (their numbers in the builder are
        ``_Build.inherited``)."""
        run = self.hosts.run
        program = builder_path()
        if program is None:
            raise ForkFailed(source.id, unavailable() or "no builder")
        image = await run.images.for_app(source.app_spec)
        target = run.run_dir / "roots" / clone_id
        await asyncio.to_thread(target.mkdir, parents=True)
        plan_r, plan_w = os.pipe2(os.O_CLOEXEC)
        lines_r, lines_w = os.pipe2(os.O_CLOEXEC)
        fds = [plan_r, lines_w, *given, *run.cgroup_fds]
        request = NurserySpawn(
            argv=[program], log_path=str(run.run_dir / f"host-{clone_id}.log"), cwd=str(run.run_dir),
            stdin=0, stdout=1, env={"BUNSHIN_TREEFORK_ENGINE": str(run.nursery.pid)},
            root=RootSpec(pool_path=str(run.layers.root), target=str(target), lower=image.lower, layer=layer,
                          image_binds=[b.pair() for b in image.binds], runtime_binds=run.runtime_binds))
        try:
            spawned = await run.nursery.spawn_request(request, fds)
        except BaseException:
            os.close(plan_w)
            os.close(lines_r)
            raise
        finally:
            os.close(plan_r)
            os.close(lines_w)
        return _Build(pid=spawned.pid, plan_w=plan_w, lines=BuilderLines(lines_r),
                      deadline=time.monotonic() + BUILD_TIMEOUT_S, inherited=spawned.fds[2:])

    @staticmethod
    def _until_grafted(build: _Build, plan: TreePlan) -> None:
        build.send(render(plan))
        build.lines.next("grafted", build.deadline)

    @staticmethod
    def _release(build: _Build) -> None:
        build.send("release\n")
        os.close(build.plan_w)
        build.plan_w = -1
        build.lines.next("released", build.deadline)

    async def _kill_builder(self, build: _Build) -> None:
        """Kill the builder (its clone's pid 1 dies with it, and the whole clone with that) and wait until the
        nursery has reaped it."""
        nursery = self.hosts.run.nursery
        if not nursery.exited(build.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(build.pid, signal.SIGKILL)
        await nursery.wait_exit(build.pid, timeout=KILL_TIMEOUT_S)
        nursery.forget(build.pid)

    async def _undo(self, build: _Build | None, group: Cgroup, layer: str, clone_id: str) -> None:
        if build is not None:
            await self._kill_builder(build)
        await asyncio.to_thread(self.hosts.remove_remains, group, layer, clone_id)


def _freeze(group: Cgroup) -> None:
    """Freeze ``group`` and wait until every task of it is frozen."""
    group.freeze(True)
    deadline = time.monotonic() + FREEZE_TIMEOUT_S
    while not group.is_frozen():
        if time.monotonic() > deadline:
            group.freeze(False)
            raise TimeoutError(f"cgroup {group.rel} not frozen after {FREEZE_TIMEOUT_S:g} s")
        time.sleep(0.0005)


def tree_init(pid: int) -> int:
    """The pid (ours) of the tree's pid 1 of a workspace whose process is ``pid``: a first host is its tree's pid 1;
    a clone's process is its builder, whose one child is."""
    if last(status(pid)["NSpid"]) == 1:
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(children) != 1:
        raise TreeForkFailed(0, 0, f"the builder {pid} has {len(children)} children, not its clone's pid 1")
    return int(children[0])

