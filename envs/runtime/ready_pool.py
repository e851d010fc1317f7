"""A pool of things prepared ahead of the forks that take them, within a memory budget: the warm pool's slots
(``warm_pool.py``), the prepared shells (``shells.py``).

Owns: keeping up to ``size`` ready items per key (an item is made only while the run's charge plus one item's
stays under ``budget_bytes``), handing one out (a hit) or none (a miss), refilling a key's shelf in the background
one item at a time (tasks of the run's scope), the counts, and discarding every item nobody took when it closes.
An item handed out is the pool's no longer; an item found unusable when taken (its process died while it waited)
is discarded and the next one tried.
Must never: hand out an item twice, make one past the budget, or keep one past ``aclose``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from .task_scope import ScopeClosed, TaskScope

log = logging.getLogger(__name__)

K = TypeVar("K")
T = TypeVar("T")


@dataclass
class PoolStats:
    """Takes that found a ready item (``hits``) or none (``misses``); items started, failed, discarded unused."""

    hits: int = 0
    misses: int = 0
    started: int = 0
    failed: int = 0
    unused: int = 0
    refused_for_budget: int = 0


@dataclass
class _Shelf(Generic[K, T]):
    """The items of one key: ``ready`` to take, and whether a refill is running."""

    key: K
    ready: list[T] = field(default_factory=list)
    filling: asyncio.Task[None] | None = None
    item_bytes: int = 0  # the charge of the last item made ready: what one more will cost


@dataclass(frozen=True)
class Preparation(Generic[K, T]):
    """How a pool's items are made and unmade: ``make(key)``; ``discard(item)`` (finishes under cancellation);
    ``usable(item)``: still fit to hand out; ``cost(item)``: its memory charge (blocking: run in a thread);
    ``name(key)``: the refill task's name, for logs too."""

    make: Callable[[K], Awaitable[T]]
    discard: Callable[[T], Coroutine[Any, Any, None]]
    usable: Callable[[T], bool]
    cost: Callable[[T], int]
    name: Callable[[K], str]


class ReadyPool(Generic[K, T]):
    """``charge()``: the run's memory charge now; ``tasks``: the run's scope the refills run in."""

    def __init__(self, prep: Preparation[K, T], charge: Callable[[], int], tasks: TaskScope, *, size: int,
                 budget_bytes: int):
        if size < 0:
            raise ValueError(f"a pool's size is a count of items, got {size}")
        self.prep, self.charge, self.tasks = prep, charge, tasks
        self.size = size
        self.budget_bytes = budget_bytes
        self.stats = PoolStats()
        self._shelves: dict[bytes, _Shelf[K, T]] = {}
        self._closed = False

    def _shelf(self, key: K) -> _Shelf[K, T]:
        encoded = msgspec.msgpack.encode(key)
        shelf = self._shelves.get(encoded)
        if shelf is None:
            shelf = self._shelves[encoded] = _Shelf(key)
        return shelf

    def ready(self, key: K) -> list[T]:
        """The items of ``key`` ready now (a copy: taking is ``take``'s)."""
        return list(self._shelf(key).ready)

    def want(self, key: K) -> None:
        """Start filling the shelf of ``key`` up to ``size`` (nothing if it is full or filling already)."""
        if self._closed or self.size == 0:
            return
        shelf = self._shelf(key)
        if shelf.filling is None and len(shelf.ready) < self.size:
            shelf.filling = self.tasks.start_soon(self._fill(shelf), name=self.prep.name(key))

    def take(self, key: K) -> T | None:
        """A ready item of ``key``, or None: none is ready. Refilling is the caller's to ask (``want``), when it
        suits it."""
        shelf = self._shelf(key)
        while shelf.ready:
            item = shelf.ready.pop(0)
            if not self.prep.usable(item):  # its process died while it waited: discarded, try the next
                with contextlib.suppress(ScopeClosed):  # closing: the run's end removes what is left of it
                    self.tasks.start_soon(self.prep.discard(item), name=f"discard dead: {self.prep.name(key)}")
                continue
            self.stats.hits += 1
            return item
        self.stats.misses += 1
        return None

    async def _fill(self, shelf: _Shelf[K, T]) -> None:
        try:
            while not self._closed and len(shelf.ready) < self.size:
                if self.charge() + shelf.item_bytes > self.budget_bytes:  # the first item: the charge alone
                    self.stats.refused_for_budget += 1
                    return  # the next take (or want) tries again: a close may have made room by then
                try:
                    item = await self.prep.make(shelf.key)
                except Exception as exc:  # an item that cannot be made is a miss for the forks, never their failure
                    self.stats.failed += 1
                    log.warning("a pool item (%s) was not made: %s", self.prep.name(shelf.key), exc)
                    return
                self.stats.started += 1
                if self._closed:
                    await asyncio.shield(self.prep.discard(item))
                    return
                shelf.ready.append(item)  # first: a cancellation below leaves it to ``aclose``
                shelf.item_bytes = await asyncio.to_thread(self.prep.cost, item)
        finally:
            shelf.filling = None

    async def aclose(self) -> None:
        """Stop refilling and discard every item nobody took (finishes under cancellation); an item whose discard
        fails does not keep the others: the first failure is raised once every item was tried."""
        self._closed = True
        failures: list[BaseException] = []
        for shelf in self._shelves.values():
            if shelf.filling is not None:
                shelf.filling.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await shelf.filling
            items, shelf.ready = shelf.ready, []
            for item in items:
                self.stats.unused += 1
                try:
                    await asyncio.shield(self.prep.discard(item))
                except Exception as exc:
                    log.warning("a pool item (%s) was not discarded: %s", self.prep.name(shelf.key), exc)
                    failures.append(exc)
        if failures:
            raise failures[0]
