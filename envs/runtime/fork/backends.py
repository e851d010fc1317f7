"""Fork backends: one interface, chosen per run (``bunshin doctor`` says which can run here).

- ``cow`` (``cow.py``): the userspace live fork. No application memory is copied: clones share every page they do
  not write, and files through btrfs snapshots of the source's writable layer.
- ``restore`` (``restore.py``): the private-restore baseline. The source dumps every process's state once per
  state; fresh hosts read the dump back into private memory, as CRIU's restore does.

Owns: the ``ForkBackend`` protocol, choosing a backend by name, a clone's seed, and ``all_or_nothing``: a fork
either returns a clone or leaves nothing behind, whatever happens to its caller.
Must never: let a cancelled fork leave a clone (cgroup, layer, process) behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ...seeds import derive_seed
from ...workspace import Workspace

if TYPE_CHECKING:
    from ..hosts import Hosts

BACKENDS = ("cow", "restore")


class ForkBackend(Protocol):
    name: str

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        """A clone of ``source`` (a Snapshot when ``frozen``), registered with the run's hosts."""

    async def forget(self, source: Workspace) -> None:
        """``source`` closed: drop what the backend kept for forking it (a dump)."""


class AllOrNothingFork:
    """Base of the backends: ``fork`` runs the backend's ``_fork`` through ``all_or_nothing``."""

    name = ""

    def __init__(self, hosts: Hosts):
        self.hosts = hosts

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        return await all_or_nothing(self._fork(source, seed=seed, frozen=frozen))

    async def _fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        raise NotImplementedError

    async def forget(self, source: Workspace) -> None:
        pass


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"unknown fork backend {name!r} (known: {', '.join(BACKENDS)})")
    return name


def make_backend(name: str, hosts: Hosts) -> ForkBackend:
    from .cow import CowFork
    from .restore import PrivateRestore

    return {"cow": CowFork, "restore": PrivateRestore}[check_backend(name)](hosts)


def clone_seed(source: Workspace, seed: int | None) -> int:
    """The seed a clone gets: the caller's, else one derived from the source's seed and its fork count."""
    source.forks += 1
    return derive_seed(source.seed, "fork", source.forks) if seed is None else seed


async def all_or_nothing(make: Coroutine[Any, Any, Workspace]) -> Workspace:
    """Run a fork to its end even if the caller is cancelled (forks are short), then undo it: a cancelled fork
    leaves no clone behind, and a source whose fork was cancelled has a channel in step."""
    inner = asyncio.ensure_future(make)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        clone = None
        while not inner.done():  # however often we are cancelled meanwhile: the fork is short
            try:
                await asyncio.shield(inner)
            except asyncio.CancelledError:
                continue
            except Exception:
                break
        if not inner.cancelled() and inner.exception() is None:
            clone = inner.result()
        if clone is not None:
            await asyncio.shield(clone.close())
        raise
