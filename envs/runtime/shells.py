"""Prepared shells: a live clone's cgroup and its network, UTS and IPC namespaces, made ahead of the fork that takes
them, so the fork itself only snapshots, clones and attaches (issue 28, item 2).

Owns: what a shell is, making one (``ShellMaker.make``: the cgroup as a workspace's is made, with its agents'
subgroup and the run's limits, then a holder the nursery forks into it that makes the namespaces and sleeps,
``NurseryShell``), unmaking one (``remove``: the cgroup with its holder), ending a holder once its clone is in
(``release``), and the pool of them (``ShellPool``: a ``ReadyPool`` with one shelf, ``ready_pool.py``). The clone
takes the shell's id as its own (its cgroup ``ws-<id>``, its hostname), joins the cgroup and enters the namespaces
through a pidfd of the holder the engine opened when the holder said it was ready, and sends with the fork (a pid
could be reused; a pidfd names that process or none), then kills the holder and waits for its exit
(``end_holder``): the namespaces live on in the clone, whose cgroup is its own alone when it is ready; the engine
collects the holder's exit off the fork's path (``release``). Warm-pool slots bring a cgroup and a network of their own and take no shell; other
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
from .nursery import Nursery
from .ready_pool import Preparation, ReadyPool
from .task_scope import TaskScope, run_to_end

DEFAULT_SHELLS = 2  # a group's forks come a few at once; the pool refills while they run
SHELLS = "shells"  # the pool's one key
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
        """A pidfd reads as ready once its process has exited."""
        return not select.select([self.holder_fd], [], [], 0)[0]


def end_holder(holder_fd: int, timeout_s: float = HOLDER_EXIT_TIMEOUT_S) -> None:
    """In the clone, once it has entered the shell's namespaces: kill the holder and wait until it has exited (a
    pidfd reads as ready then, the holder already out of the cgroup), so the clone's cgroup is the clone's alone
    by the time it says it is ready."""
    signal.pidfd_send_signal(holder_fd, signal.SIGKILL)
    if not select.select([holder_fd], [], [], timeout_s)[0]:
        raise TimeoutError(f"a prepared shell's holder did not exit within {timeout_s} s of its SIGKILL")


class ShellMaker:
    """Makes and unmakes shells with what a run has: its ids, cgroups and nursery (given, not imported: ``Hosts``
    owns them)."""

    def __init__(self, *, new_id: Callable[[], str], new_cgroup: Callable[[str], Cgroup], nursery: Nursery,
                 cgroup_fds: list[int], faults: list[str]):
        self.new_id, self.new_cgroup, self.nursery = new_id, new_cgroup, nursery
        self.cgroup_fds, self.faults = cgroup_fds, faults
        self.making: set[str] = set()  # the cgroup names of shells being made

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
        group = await run_to_end(asyncio.to_thread(self.new_cgroup, shell_id),
                                 undo=lambda made: asyncio.to_thread(made.remove))
        pid = None
        try:
            await await_points.reached("shell.make")
            pid = await self.nursery.shell(name, self.cgroup_fds, name, faults=self.faults,
                                           ready_timeout_s=HOLDER_READY_TIMEOUT_S)
            return Shell(id=shell_id, cgroup=group, holder_pid=pid, holder_fd=os.pidfd_open(pid))
        except BaseException:
            await asyncio.shield(self._unmake(group, pid))
            raise

    async def remove(self, shell: Shell) -> None:
        """A shell nobody took, or whose fork failed: its cgroup goes, its holder with it (finishes under
        cancellation)."""
        await asyncio.shield(self._unmake(shell.cgroup, shell.holder_pid, shell.holder_fd))

    async def release(self, shell: Shell) -> None:
        """Once the shell's clone is in (it ended the holder itself, ``end_holder``): the holder's exit is
        collected (a task of the run, off the fork's path)."""
        with contextlib.suppress(ProcessLookupError):  # in case the clone did not get that far
            signal.pidfd_send_signal(shell.holder_fd, signal.SIGKILL)
        await self._forget_holder(shell.holder_pid, shell.holder_fd)

    async def _unmake(self, group: Cgroup, pid: int | None, pidfd: int | None = None) -> None:
        await asyncio.to_thread(group.remove)  # kills what is in it: the holder
        if pid is not None:
            await self._forget_holder(pid, pidfd)

    async def _forget_holder(self, pid: int, pidfd: int | None) -> None:
        try:
            await self.nursery.wait_exit(pid, HOLDER_EXIT_TIMEOUT_S)
            self.nursery.forget(pid)
        finally:
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
        """The cgroup names (below the run's) of the shells ready or being made: not workspaces yet."""
        return {f"ws-{shell.id}" for shell in self.ready(SHELLS)} | self.maker.making