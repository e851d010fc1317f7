"""Speculation slots: a bounded number of branches at once, within a memory budget and the CPU rule, highest
priority first.

Owns: ``SpecSlots``. A slot bounds the branches at work (forking and running their call); a finished branch waiting
for the real call holds no slot, only memory. ``resources_allow()`` judges memory and the cores' load
(``memory.py``: every live branch counts; ``cpu.py``: no branch on saturated cores). ``acquire(priority,
preempt)`` waits for a slot: granted at once when one is free and the resources allow one more branch; when every
slot is taken, a request whose priority is clearly higher than the lowest running grant's (``PREEMPT_MARGIN``)
takes that grant's slot, and the grant's ``preempt`` callback is called (its branch is cancelled); otherwise the
request waits, and freed slots go to the waiting request of highest priority. Priority is tail priority
(``tail.py``): the predicted seconds until the sample ends.
Must never: grant more than ``slots`` at once, or lose a slot (``release`` is idempotent; a cancelled waiter leaves
the queue).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

PREEMPT_MARGIN = 3.0  # a request preempts a running branch only if its priority is this many times higher
RECHECK_S = 0.25  # waiters blocked by memory or CPU alone look again this often (both also fall)


@dataclass(eq=False)
class Grant:
    priority: float
    preempt: Callable[[], None]
    released: bool = field(default=False, repr=False)


class SpecSlots:
    def __init__(self, slots: int, resources_allow: Callable[[], bool]):
        self.slots, self.resources_allow = slots, resources_allow
        self.running: set[Grant] = set()
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.preempted = 0

    async def acquire(self, priority: float, preempt: Callable[[], None]) -> Grant:
        while True:
            if len(self.running) < self.slots and self.resources_allow() and self._first_in_line(priority):
                return self._grant(priority, preempt)
            if len(self.running) >= self.slots and self.resources_allow():
                lowest = min(self.running, key=lambda g: g.priority)
                if priority > lowest.priority * PREEMPT_MARGIN:
                    self.release(lowest)
                    self.preempted += 1
                    lowest.preempt()
                    return self._grant(priority, preempt)
            wake = asyncio.get_running_loop().create_future()
            entry = (-priority, next(self._order), wake)
            heapq.heappush(self._waiters, entry)
            try:
                async with asyncio.timeout(RECHECK_S if len(self.running) < self.slots else None):
                    await wake
            except TimeoutError:
                pass
            finally:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                    heapq.heapify(self._waiters)

    def _first_in_line(self, priority: float) -> bool:
        """No waiter of higher priority is owed the free slot."""
        live = [w for w in self._waiters if not w[2].done()]
        return not live or -min(live)[0] <= priority

    def _grant(self, priority: float, preempt: Callable[[], None]) -> Grant:
        grant = Grant(priority, preempt)
        self.running.add(grant)
        return grant

    def release(self, grant: Grant) -> None:
        if grant.released:
            return
        grant.released = True
        self.running.discard(grant)
        if self._waiters:  # wake the first in line; it takes the slot if the resources allow
            _, _, wake = self._waiters[0]
            if not wake.done():
                wake.set_result(None)
