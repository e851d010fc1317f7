"""The fork backend interface: what every backend implements, and the parts they share.

Owns: the ``ForkBackend`` protocol, ``AllOrNothingFork`` (a fork either returns a clone or leaves nothing behind,
whatever happens to its caller: it runs to its end and a clone nobody takes is closed) and a clone's seed. Which
backends exist, and choosing one by name, is ``registry.py``'s.
Must never: let a cancelled fork leave a clone (cgroup, layer, process) behind, or import a backend.
"""

from __future__ import annotations

from typing import Protocol

from ...seeds import derive_seed
from ..host_workspace import HostWorkspace
from ..task_scope import run_to_end


class ForkBackend(Protocol):
    name: str
    # whether its clones take their long-lived programs from the warm pool (``warm_pool.py``): the run keeps slots
    # ready only for a backend that takes them (a private restore starts its own, as CRIU's would)
    takes_warm_slots: bool
    # whether its clones share the source's memory (a live fork): a workspace opting into KSM then has only what
    # the fork cannot share merged (its app's own programs), not the host's pages its clones map already
    shares_memory: bool
    # whether its hosts are tree-fork hosts (``HostConfig.tree``): pid 1 of a PID namespace each, read from outside
    tree_hosts: bool
    # whether its clones take prepared shells (``shells.py``): the run keeps them ready only for a backend that does
    takes_shells: bool

    async def fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        """A clone of ``source`` (a HostSnapshot when ``frozen``), registered with the run's hosts."""

    async def forget(self, source: HostWorkspace) -> None:
        """``source`` closed: drop what the backend kept for forking it (a dump)."""


class AllOrNothingFork:
    """Base of the backends: ``fork`` runs the backend's ``_fork`` to its end even if the caller is cancelled (forks
    are short), then undoes it: a cancelled fork leaves no clone behind, and a source whose fork was cancelled has
    a channel in step."""

    name = ""
    takes_warm_slots = False
    shares_memory = False
    tree_hosts = False
    takes_shells = False

    async def fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        return await run_to_end(self._fork(source, seed=seed, frozen=frozen), undo=lambda clone: clone.close())

    async def _fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        raise NotImplementedError

    async def forget(self, source: HostWorkspace) -> None:
        pass


def clone_seed(source: HostWorkspace, seed: int | None) -> int:
    """The seed a clone gets: the caller's, else one derived from the source's seed and its fork count."""
    source.forks += 1
    return derive_seed(source.seed, "fork", source.forks) if seed is None else seed
