"""Admission: whether one more rollout may start now. Pure decisions (``Admission``) and a thin async shell
(``AdmissionGate``).

A rollout is admitted when fewer than ``concurrency`` run, and, with a memory budget, when the run's memory now plus
what one more rollout may take (``estimate``: the largest growth any rollout has shown so far, never below a floor)
fits the budget. One rollout always runs, whatever the budget: a batch whose single rollout does not fit must still
make progress. The clock and the memory reading are injected, so the decisions are tested without a runtime.
Must never: let more than ``concurrency`` run, admit over the budget while another rollout runs, or lose a slot
(a released ticket is released once, whatever happened to its holder).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from .errors import EngineError

MiB = 1 << 20
INITIAL_ESTIMATE = 64 * MiB  # what one more rollout may take before any has been measured
ESTIMATE_FLOOR = 16 * MiB


class Verdict(enum.Enum):
    ADMIT = "admit"
    WAIT_FOR_SLOT = "wait for a slot"  # ``concurrency`` rollouts run: wait for one to end
    WAIT_FOR_MEMORY = "wait for memory"  # the budget would be exceeded: wait for one to end or memory to fall


@dataclass
class Ticket:
    """One admitted rollout. ``waited_s``: from asking to admission. ``grew`` is set by the holder when it knows
    how much memory its rollout took (it refines the estimate at release)."""

    number: int
    asked_at: float
    admitted_at: float
    grew: int | None = None
    released: bool = field(default=False, repr=False)

    @property
    def waited_s(self) -> float:
        return self.admitted_at - self.asked_at


class Admission:
    """The admission decisions; no I/O, no event loop."""

    def __init__(self, concurrency: int, memory_budget: int | None, *, memory: Callable[[], int],
                 clock: Callable[[], float], initial_estimate: int = INITIAL_ESTIMATE,
                 estimate_floor: int = ESTIMATE_FLOOR):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if memory_budget is not None and memory_budget < 0:
            raise ValueError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
        self.concurrency, self.memory_budget = concurrency, memory_budget
        self.memory, self.clock = memory, clock
        self.estimate = max(initial_estimate, estimate_floor)
        self.estimate_floor = estimate_floor
        self.active = 0
        self.admitted = 0
        self.peak_active = 0

    def verdict(self) -> Verdict:
        if self.active >= self.concurrency:
            return Verdict.WAIT_FOR_SLOT
        if self.memory_budget is not None and self.active > 0 and self.memory() + self.estimate > self.memory_budget:
            return Verdict.WAIT_FOR_MEMORY
        return Verdict.ADMIT

    def admit(self, asked_at: float) -> Ticket:
        """Admit one rollout (call only after ``verdict()`` said ADMIT)."""
        verdict = self.verdict()
        if verdict is not Verdict.ADMIT:
            raise EngineError(f"admit() while the verdict is {verdict.value!r}")
        self.active += 1
        self.admitted += 1
        self.peak_active = max(self.peak_active, self.active)
        return Ticket(number=self.admitted, asked_at=asked_at, admitted_at=self.clock())

    def release(self, ticket: Ticket) -> None:
        """The rollout of ``ticket`` ended; its measured growth, if any, raises the estimate. Idempotent."""
        if ticket.released:
            return
        ticket.released = True
        self.active -= 1
        if ticket.grew is not None:
            self.estimate = max(self.estimate, ticket.grew, self.estimate_floor)


class AdmissionGate:
    """The async shell: ``async with gate.slot() as ticket:`` waits until ``Admission`` admits, and releases on
    every path out. Waiters for memory re-check every ``recheck_s`` (memory also falls on its own: a workspace
    closed, a page freed); every release wakes them all to re-check."""

    def __init__(self, admission: Admission, recheck_s: float = 0.5):
        self.admission = admission
        self.recheck_s = recheck_s
        self._waiters: set[asyncio.Future[None]] = set()

    async def acquire(self) -> Ticket:
        asked_at = self.admission.clock()
        loop = asyncio.get_running_loop()
        while True:
            verdict = self.admission.verdict()
            if verdict is Verdict.ADMIT:
                return self.admission.admit(asked_at)
            wake = loop.create_future()
            self._waiters.add(wake)
            try:
                if verdict is Verdict.WAIT_FOR_MEMORY:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.recheck_s):
                            await wake
                else:
                    await wake
            finally:
                self._waiters.discard(wake)

    def release(self, ticket: Ticket) -> None:
        """Synchronous (it must run on cancellation paths without awaiting): release and wake every waiter."""
        self.admission.release(ticket)
        for wake in self._waiters:
            if not wake.done():
                wake.set_result(None)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[Ticket]:
        ticket = await self.acquire()
        try:
            yield ticket
        finally:
            self.release(ticket)
