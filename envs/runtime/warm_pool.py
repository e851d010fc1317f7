"""The warm pool: workspaces prepared ahead (slots) whose app has started its long-lived programs (a browser), for
the running clones of an app that names them (``AppSpec.warm``) to take over instead of starting their own.

Owns: keeping up to ``size`` ready slots per warm app within the memory budget (a slot is started only while the
run's charge plus one slot's stays under ``budget_bytes``), handing one to a fork (a hit) or none (a miss: the clone
starts its own programs), refilling in the background one slot at a time once the fork that took one has ended (tasks of the run's scope), the hit and
miss counts, and closing the slots nobody took. A slot handed out is the pool's no longer: the clone joins the
slot's cgroup and network namespace, its app takes what the slot's app lent (``Lend``), and the slot's host and
layer are removed with the clone (``HostWorkspace.companions``).
Must never: hand out a slot twice, start slots past the budget, or keep one past the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from ..records import AppSpec
from .host_workspace import HostWorkspace
from .task_scope import TaskScope

log = logging.getLogger(__name__)

DEFAULT_SIZE = 2  # ready slots per warm app: a group's first forks hit, the pool refills while they run
BUDGET_SHARE = 0.5  # without a budget: half the memory the host had available when the run started


@dataclass
class PoolStats:
    """Forks that found a ready slot (``hits``) or none (``misses``); slots started, failed, closed unused."""

    hits: int = 0
    misses: int = 0
    started: int = 0
    failed: int = 0
    unused: int = 0
    refused_for_budget: int = 0


@dataclass
class _Shelf:
    """The slots of one warm app: ``ready`` to take, and whether a refill is running."""

    spec: AppSpec
    ready: list[HostWorkspace] = field(default_factory=list)
    filling: asyncio.Task[None] | None = None
    slot_bytes: int = 0  # the charge of the last slot made ready: what one more will cost


class WarmPool:
    """``start_slot(spec)``: a new workspace running ``spec`` (registered nowhere); ``charge()``: the run's memory
    charge now; ``tasks``: the run's scope the refills run in."""

    def __init__(self, start_slot: Callable[[AppSpec], Awaitable[HostWorkspace]], charge: Callable[[], int],
                 tasks: TaskScope, *, size: int = DEFAULT_SIZE, budget_bytes: int | None = None):
        if size < 0:
            raise ValueError(f"a warm pool's size is a count of slots, got {size}")
        self.start_slot, self.charge, self.tasks = start_slot, charge, tasks
        self.size = size
        self.budget_bytes = budget_bytes if budget_bytes is not None else default_budget()
        self.stats = PoolStats()
        self._shelves: dict[bytes, _Shelf] = {}
        self._closed = False

    def _shelf(self, spec: AppSpec) -> _Shelf:
        key = msgspec.msgpack.encode(spec)
        shelf = self._shelves.get(key)
        if shelf is None:
            shelf = self._shelves[key] = _Shelf(spec)
        return shelf

    def ready(self, spec: AppSpec) -> list[HostWorkspace]:
        """The slots of ``spec`` ready now (a copy: taking is ``take``'s)."""
        return list(self._shelf(spec).ready)

    def want(self, spec: AppSpec) -> None:
        """Start filling the shelf of ``spec`` up to ``size`` (nothing if it is full or filling already)."""
        if self._closed or self.size == 0:
            return
        shelf = self._shelf(spec)
        if shelf.filling is None and len(shelf.ready) < self.size:
            shelf.filling = self.tasks.start_soon(self._fill(shelf), name=f"warm pool {spec.target}")

    def take(self, spec: AppSpec) -> HostWorkspace | None:
        """A ready slot of ``spec`` for a fork, or None: no slot is ready. The fork asks for the refill (``want``)
        once it has ended: a slot started meanwhile would take the cores the fork's browser restore needs."""
        shelf = self._shelf(spec)
        while shelf.ready:
            slot = shelf.ready.pop(0)
            if slot.broken or slot.closed:  # its host died while it waited: removed, try the next
                self.tasks.start_soon(slot.close(), name=f"close dead slot {slot.id}")
                continue
            self.stats.hits += 1
            return slot
        self.stats.misses += 1
        return None

    async def _fill(self, shelf: _Shelf) -> None:
        try:
            while not self._closed and len(shelf.ready) < self.size:
                if self.charge() + shelf.slot_bytes > self.budget_bytes:  # the first slot: the charge alone
                    self.stats.refused_for_budget += 1
                    return  # the next take (or want) tries again: a close may have made room by then
                try:
                    slot = await self.start_slot(shelf.spec)
                except Exception as exc:  # a slot that cannot start is a miss for the forks, never their failure
                    self.stats.failed += 1
                    log.warning("a warm-pool slot of %s did not start: %s", shelf.spec.target, exc)
                    return
                self.stats.started += 1
                if self._closed:
                    await slot.close()
                    return
                shelf.slot_bytes = await asyncio.to_thread(slot.charge)
                shelf.ready.append(slot)
        finally:
            shelf.filling = None

    async def aclose(self) -> None:
        """Stop refilling and close every slot nobody took (finishes under cancellation)."""
        self._closed = True
        for shelf in self._shelves.values():
            if shelf.filling is not None:
                shelf.filling.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await shelf.filling
            slots, shelf.ready = shelf.ready, []
            for slot in slots:
                self.stats.unused += 1
                await asyncio.shield(slot.close())


def default_budget() -> int:
    """``BUDGET_SHARE`` of the host's available memory now (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * BUDGET_SHARE)
    except OSError:
        pass
    return 1 << 30
