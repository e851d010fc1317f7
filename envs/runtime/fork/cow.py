"""The live fork, engine side: ask the source's host to fork itself, and take the clone in.

The whole sequence, in order (each step's file):

1. here: take a prepared shell (``shells.py``: its id becomes the clone's, whose cgroup and namespaces it holds)
   or else name the clone and make its cgroup (or take a warm-pool slot, ``warm_pool.py``: the clone will join its
   cgroup and network namespace and take what its app lent) and a socketpair; send ``Fork`` to the source's host
   with the clone's end (and a pidfd of the shell's holder);
2. ``source.py`` (in the source host): freeze the agents, quiesce the app and its workers, snapshot the writable
   layer (btrfs, constant time), have every worker fork itself (``worker.py``), ``gc.freeze()``, ``fork()``
   twice (so the clone is orphaned onto the run's nursery), thaw, answer ``Forked`` with the freeze window;
3. ``clone.py`` (in the clone): join its cgroup, enter fresh namespaces, mount its own root on the snapshot,
   adopt the workers' clones, reseed, re-open files and re-create sockets, answer ``Ready`` on its own socket;
4. here: wait for that ``Ready``, end the shell's holder, register the clone. Any failure undoes what was made
   (the shell taken included); the source runs on.

Owns: steps 1 and 4 and their undo.
Must never: leave a half-made clone (cgroup, layer, process) behind when a fork fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import socket
import time

from ...errors import ForkFailed, RequestRefused, WorkspaceBroken, WorkspaceStartFailed
from ...workspace import ForkTiming
from .. import await_points
from ..cgroups import Cgroup
from ..host_workspace import HostSnapshot, HostWorkspace
from ..hosts import KILL_TIMEOUT_S, Hosts
from ..protocol import Borrow, CloneSpec, Fork, Forked, Lend, Lent
from ..shells import SHELLS, Shell
from ..task_scope import ScopeClosed
from .backends import AllOrNothingFork, clone_seed


class CowFork(AllOrNothingFork):
    name = "cow"
    takes_warm_slots = True
    shares_memory = True
    takes_shells = True

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts

    async def _fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        hosts = self.hosts
        started = time.monotonic()  # the same boundary as the restore backend's: the clone's cgroup is inside
        warm = source.app_spec.warm
        slot = hosts.pool.take(warm) if warm is not None and not frozen else None
        shell = hosts.shells.take(SHELLS) if slot is None else None  # a slot brings its own cgroup and network
        clone_id = shell.id if shell is not None else hosts.new_id()
        try:
            return await self._fork_with(source, clone_id, slot, shell, seed=seed, frozen=frozen, started=started)
        finally:
            if warm is not None and not frozen:
                hosts.pool.want(warm)  # the refill, once this fork's browser is restored (or the fork failed)
            if slot is None:
                hosts.shells.want(SHELLS)  # likewise, once the fork has ended: it does not compete with it

    async def _fork_with(self, source: HostWorkspace, clone_id: str, slot: HostWorkspace | None,
                         shell: Shell | None, *, seed: int | None, frozen: bool, started: float) -> HostWorkspace:
        hosts = self.hosts
        fds: list[int] = []
        if shell is not None:  # the clone joins the shell's cgroup and enters its namespaces (``shells.py``)
            borrow, cgroup_rel, group = None, f"ws-{shell.id}", shell.cgroup
            fds.append(shell.holder_fd)
        elif slot is None:
            borrow, cgroup_rel = None, f"ws-{clone_id}"
            group = await asyncio.to_thread(hosts.new_cgroup, clone_id)
        else:  # the clone takes the slot over: its cgroup, its network namespace, what its app lent
            try:
                lent = slot.expect(await slot.request(Lend()), Lent)
            except BaseException as exc:
                await asyncio.shield(slot.close())
                if isinstance(exc, RequestRefused | WorkspaceBroken):
                    raise ForkFailed(source.id, f"fork to {clone_id}: the warm slot {slot.id} lent nothing: "
                                                f"{exc.detail}") from exc
                raise
            borrow = Borrow(pid=slot.pid, fds=lent.fds, data=lent.data)
            cgroup_rel, group = f"ws-{slot.id}", slot.cgroup
        spec = CloneSpec(ws_id=clone_id, hostname=f"ws-{clone_id}", seed=clone_seed(source, seed),
                         layer=f"ws-{clone_id}", cgroup_rel=cgroup_rel, frozen=frozen, borrow=borrow,
                         shell=shell is not None)
        try:
            engine_end, clone_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except BaseException:
            await asyncio.shield(self._undo(group, spec, slot, shell))
            raise
        engine_end.setblocking(False)
        forked: Forked | None = None
        try:
            try:
                await await_points.reached("fork.cow.request")
                reply = await source.request(Fork(clone=spec), fds=[clone_end.fileno(), *fds])
            finally:
                clone_end.close()
            forked = source.expect(reply, Forked)
            ready = await hosts.await_ready(clone_id, engine_end)
            cls = HostSnapshot if frozen else HostWorkspace
            clone = cls(hosts, clone_id, pid=ready.pid, sock=engine_end, cgroup=group, layer=spec.layer, seed=spec.seed,
                        app=source.app_spec, parent=source.id, generation=source.generation + 1)
            clone.last_fork = ForkTiming(freeze_s=forked.freeze_ns / 1e9,
                                         ready_s=time.monotonic() - started, warm_slot=slot is not None,
                                         clone_steps_s=dict(ready.steps_s), one_step=forked.one_step,
                                         source_cpu_s=forked.cpu_ns / 1e9, shell=shell is not None)
            if slot is not None:
                clone.companions.append(slot)
        except BaseException as exc:
            engine_end.close()
            if forked is not None and forked.clone_pid:  # it may not have reached its cgroup: killed by its pid
                await asyncio.shield(self._kill_clone(forked.clone_pid))
            await asyncio.shield(self._undo(group, spec, slot, shell))
            if isinstance(exc, RequestRefused | WorkspaceStartFailed):
                raise ForkFailed(source.id, f"fork to {clone_id} failed: {exc.detail}") from exc
            raise
        if shell is not None:  # the clone is in its namespaces: the holder goes, off the fork's path
            try:
                hosts.tasks.start_soon(hosts.shells.maker.release(shell), name=f"release shell {shell.id}")
            except ScopeClosed:  # the run is closing: here, then
                await asyncio.shield(hosts.shells.maker.release(shell))
        await hosts.admit(clone)
        return clone

    async def _kill_clone(self, pid: int) -> None:
        """A clone that never became ready: killed, and waited for until the nursery has reaped it."""
        self.hosts.kill_if_running(pid)
        await self.hosts.wait_exit(pid, KILL_TIMEOUT_S)
        self.hosts.run.nursery.forget(pid)

    async def _undo(self, group: Cgroup, spec: CloneSpec, slot: HostWorkspace | None, shell: Shell | None) -> None:
        """A fork that failed: what it made goes (the shell it took with its holder; the slot it took too: its
        browser may be half-restored)."""
        if slot is None:
            try:  # the cgroup first: what a half-made clone started in it dies before its layer goes
                if shell is not None:
                    await self.hosts.shells.maker.remove(shell)
                else:
                    await asyncio.to_thread(group.remove)
            finally:
                await asyncio.to_thread(self.hosts.remove_remains, None, spec.layer, spec.ws_id)
            return
        await asyncio.to_thread(group.kill_all, KILL_TIMEOUT_S)  # a half-made clone in the slot's cgroup
        await slot.close()
        await asyncio.to_thread(self.hosts.remove_remains, None, spec.layer, spec.ws_id)
