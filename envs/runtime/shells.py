"""Prepared shells: a live clone's cgroup and its network, UTS and IPC namespaces, made ahead of the fork that takes
them, so the fork itself only snapshots, clones and attaches.

Owns: what a shell is, making one (``ShellMaker.make``: the cgroup as a workspace's is made, with its agents'
subgroup and the run's limits, empty; and a holder the nursery forks, in a group of the run's for holders, that
makes the namespaces and sleeps, ``NurseryShell``), unmaking one (``remove``: the holder ended, the cgroup
removed), ending a holder once its clone is in (``release``), and the pool of them (``ShellPool``: a ``ReadyPool`` with one shelf, ``ready_pool.py``). The clone
takes the shell's id as its own (its cgroup ``ws-<id>``, its hostname), joins the cgroup and enters the namespaces
through a pidfd of the holder the engine opened when the holder said it was ready, and sends with the fork (a pid
could be reused; a pidfd names that process or none). Once the clone is ready the engine ends the holder, off the
fork's path: the namespaces live on in the clone. Warm-pool slots bring a cgroup and a network of their own and take no shell; other
backends make their clones their own way.
Must never: leave a shell's cgroup or holder behind on any path (a failed or cancelled make, a failed fork, the
run's end), or hand out a shell whose holder is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
from collections.abc import Callable
from dataclasses import dataclass

from . import await_points
from .cgroups import Cgroup
from .nursery import HOLDER_NAME, Nursery
from .ready_pool import Preparation, ReadyPool
from .task_scope import TaskScope, run_to_end

DEFAULT_SHELLS = 2  # a group's forks come a few at once; the pool refills while they run
SHELLS = "shells"  # the pool's one key
HOLDERS = "shell-holders"  # the group below the run's where every holder lives
HOLDER_READY_TIMEOUT_S = 30.0  # a holder is a fork of a small process: it is ready at once, unless the machine is swamped
HOLDER_EXIT_TIMEOUT_S = 10.0


@dataclass(frozen=True, eq=False)
class Shell:
    """A prepared shell: the id its clone will take, its cgroup, its holder (pid, and a pidfd of it kept open)."""

    id: str
    cgroup: Cgroup
    holder_pid: int
    holder_fd: int

    def holder_alive(self) -> bool:
        """A pidfd reads as ready once its process has exited (``poll``: any descriptor number)."""
        poller = select.poll()
        poller.register(self.holder_fd, select.POLLIN)
        return not poller.poll(0)


class ShellMaker:
    """Makes and unmakes shells with what a run has: its ids, cgroups and nursery (given, not imported: ``Hosts``
    owns them). Every holder lives in one group below the run's, ``HOLDERS``: never in its shell's, so a clone's
    cgroup holds the clone's processes alone from the start, and the holder can be ended after the clone is ready."""

    def __init__(self, *, new_id: Callable[[], str], new_cgroup: Callable[[str], Cgroup], run_cgroup: Cgroup,
                 nursery: Nursery, cgroup_fds: list[int], faults: list[str]):
        self.new_id, self.new_cgroup, self.nursery = new_id, new_cgroup, nursery
        self.run_cgroup, self.cgroup_fds, self.faults = run_cgroup, cgroup_fds, faults
        self.making: set[str] = set()  # the cgroup names of shells being made
        self.ending: set[int] = set()  # the pids of holders being ended, until reaped
        self._holders_made = False

    async def make(self, _key: str = SHELLS) -> Shell:
        """A new shell; a failure or a cancellation leaves nothing of it."""
        shell_id = self.new_id()
        name = f"ws-{shell_id}"
        self.making.add(name)
        try:
            return await self._make(shell_id, name)
        finally:
            self.making.discard(name)

    async def _make(self, shell_id: str, name: str) -> Shell:
        if not self._holders_made:  # removed with the run's cgroup
            await run_to_end(asyncio.to_thread(self.run_cgroup.child(HOLDERS).create))
            self._holders_made = True
        group = await run_to_end(asyncio.to_thread(self.new_cgroup, shell_id),
                                 undo=lambda made: asyncio.to_thread(made.remove))
        pid = None
        try:
            await await_points.reached("shell.make")
            pid = await self.nursery.shell(HOLDERS, self.cgroup_fds, name, faults=self.faults,
                                           ready_timeout_s=HOLDER_READY_TIMEOUT_S)
            return Shell(id=shell_id, cgroup=group, holder_pid=pid, holder_fd=self._open_holder(pid))
        except BaseException:
            await asyncio.shield(self._unmake(group, pid))
            raise

    def _open_holder(self, pid: int) -> int:
        """A pidfd of holder ``pid``, checked to be the holder still: the nursery's child, named ``HOLDER_NAME``
        (had it died and been reaped since it said it was ready, the pid could be another process's)."""
        pidfd = os.pidfd_open(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            comm, rest = stat[stat.index(b"(") + 1:stat.rindex(b")")], stat[stat.rindex(b")") + 2:].split()
            if comm != HOLDER_NAME or int(rest[1]) != self.nursery.pid:
                raise ProcessLookupError(f"pid {pid} is no longer the shell's holder ({comm!r}, parent {rest[1]!r})")
        except BaseException:
            os.close(pidfd)
            raise
        return pidfd

    async def remove(self, shell: Shell) -> None:
        """A shell nobody took, or whose fork failed: its holder is ended, its cgroup removed (with anything a
        failed clone left in it; finishes under cancellation)."""
        await asyncio.shield(self._unmake(shell.cgroup, shell.holder_pid, shell.holder_fd))

    async def release(self, shell: Shell) -> None:
        """Once the shell's clone is in its namespaces (it said Ready): the holder is ended, off the fork's path (a
        task of the run); the namespaces live on in the clone, the cgroup is the clone's."""
        await self._end_holder(shell.holder_pid, shell.holder_fd)

    async def _unmake(self, group: Cgroup, pid: int | None, pidfd: int | None = None) -> None:
        try:
            if pid is not None:
                await self._end_holder(pid, pidfd)
        finally:
            await asyncio.to_thread(group.remove)

    async def _end_holder(self, pid: int, pidfd: int | None) -> None:
        """SIGKILL through the pidfd (a pid could name another process once the holder is reaped), then wait for
        the nursery to reap it."""
        self.ending.add(pid)
        try:
            if pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            elif not self.nursery.exited(pid):  # not reaped yet: the pid is still the holder's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            await self.nursery.wait_exit(pid, HOLDER_EXIT_TIMEOUT_S)
            self.nursery.forget(pid)
        finally:
            self.ending.discard(pid)
            if pidfd is not None:
                os.close(pidfd)


class ShellPool(ReadyPool[str, Shell]):
    """Up to ``size`` ready shells within ``budget_bytes`` of the run's charge (``charge()``), refilled in ``tasks``."""

    def __init__(self, maker: ShellMaker, charge: Callable[[], int], tasks: TaskScope, *, size: int,
                 budget_bytes: int):
        prep: Preparation[str, Shell] = Preparation(
            make=maker.make, discard=maker.remove, usable=Shell.holder_alive,
            cost=lambda shell: shell.cgroup.memory_charge(), name=lambda _key: "prepared shells")
        super().__init__(prep, charge, tasks, size=size, budget_bytes=budget_bytes)
        self.maker = maker

    def groups(self) -> set[str]:
        """The cgroup names (below the run's) of the shells ready or being made, and of their holders' group: not
        workspaces."""
        return {f"ws-{shell.id}" for shell in self.ready(SHELLS)} | self.maker.making | {HOLDERS}

    def holders(self) -> set[int] | None:
        """The pids of the holders the pool accounts for now (its ready shells', those being ended); None while a
        shell is being made (its holder's pid is not known yet)."""
        if self.maker.making:
            return None
        return {shell.holder_pid for shell in self.ready(SHELLS)} | self.maker.ending