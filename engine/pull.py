"""Pull mode: rollouts run ahead of a trainer that asks for batches, within a bound on their staleness.

A trainer that pulls (``batch = await engine.get_batch(n)``, train, ``engine.set_policy_version(v + 1)``, again)
wants the engine to keep rolling out while it trains, but not so far ahead that the rollouts it is handed were made
by a policy many updates old. ``engine.pull(source, batch_size=B, max_staleness=k)`` starts groups from ``source``
(an iterable of ``RolloutRequest``, possibly endless) while the run-ahead rule allows, keeps finished rollouts, and
``get_batch(n)`` hands them out oldest-first, each stamped with the policy version it started under and its
staleness (the trainer's version at hand-out minus that one).

The run-ahead rule (``RunAhead``, pure): with the trainer at version ``v`` (``v0`` when pulling started), at most
``(v - v0 + k + 1) * B`` rollouts have ever been started; a group starts whole or waits. A trainer that consumes
``B`` rollouts per version, in the order they started, never receives one more than ``k`` versions stale; one that
outlives ``k + 1`` batches of newer rollouts can be, and its stamp says so. The rule also bounds what is kept:
never more than ``(k + 1) * B`` rollouts beyond those handed out.

Oldest-first: among the finished, the lowest starting version first, then the order they finished; with
``whole_groups`` (the default, as GRPO needs) a group is handed out only whole, when its last sample has ended.
Nothing waits for an unfinished rollout once enough are ready.

Owns: ``RunAhead`` and ``Puller`` (the async shell: the producer task, in a ``TaskScope`` that ``close`` ends, with
the groups it starts in its ``TaskGroup``; the finished buffer; ``get_batch``).
Must never: start a rollout the rule forbids, hand out a rollout twice or lose a finished one (a rollout ends exactly
once: ok or a failure status, as in ``stream``), or split a group in ``whole_groups`` mode.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.policies.base import ServerConfigError

from .errors import EngineError, first_exception
from .records import RolloutRequest, RolloutResult, Trajectory

log = logging.getLogger(__name__)


class PullError(EngineError):
    """Pull mode was misused (bad bounds, a batch size the groups cannot fill, a second ``pull``)."""


@dataclass
class RunAhead:
    """How many rollouts may have started, given the trainer's policy version. No I/O, no event loop."""

    batch_size: int
    max_staleness: int
    start_version: int
    started: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise PullError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_staleness < 0:
            raise PullError(f"max_staleness must be >= 0, got {self.max_staleness}")

    def capacity(self, version: int) -> int:
        """Rollouts that may have started by the time the trainer is at ``version``."""
        return max(0, version - self.start_version + self.max_staleness + 1) * self.batch_size

    def may_start(self, group_size: int, version: int) -> bool:
        return self.started + group_size <= self.capacity(version)

    def start(self, group_size: int, version: int) -> None:
        if not self.may_start(group_size, version):
            raise PullError(f"a group of {group_size} may not start at version {version}: {self.started} started "
                            f"of {self.capacity(version)} allowed")
        self.started += group_size


@dataclass(order=True)
class _Ready:
    """Finished rollouts that go out together (a whole group, or one rollout), in hand-out order."""

    version: int
    finished: int
    results: list[RolloutResult] = field(compare=False)


class Puller:
    """Runs groups from ``source`` on ``run_group`` as ``RunAhead`` allows; ``get_batch`` hands them out."""

    def __init__(self, source: Iterable[RolloutRequest], *, batch_size: int, max_staleness: int,
                 whole_groups: bool, version: Callable[[], int],
                 run_group: Callable[[RolloutRequest, Callable[[Trajectory], Awaitable[None]]],
                                     Coroutine[Any, Any, None]],
                 peak_bytes: Callable[[], int]):
        self.rule = RunAhead(batch_size=batch_size, max_staleness=max_staleness, start_version=version())
        self.source: Iterator[RolloutRequest] = iter(source)
        self.whole_groups = whole_groups
        self.version, self.run_group, self.peak_bytes = version, run_group, peak_bytes
        self._ready: list[_Ready] = []  # a heap
        self._ready_count = 0
        self._partial: dict[str, list[RolloutResult]] = {}
        self._finished = itertools.count()
        self._running = 0  # rollouts started and not yet finished
        self._handed_out = 0
        self._exhausted = False  # the source gave its last request
        self._waiters: set[asyncio.Future[None]] = set()  # woken when anything a waiter checks has changed
        self._group_size: int | None = None
        # the producer, whose failure ``get_batch`` raises
        self._scope = TaskScope("bunshin-pull", on_error=lambda exc: log.debug("the pull's producer ended: %r", exc))
        self._task: asyncio.Task[None] | None = None
        first = next(self.source, None)  # a look at the first request: the group size is known from the start
        if first is not None:
            self._check(first)
            self.source = itertools.chain([first], self.source)

    # -- the producer ---------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = self._scope.start_soon(self._produce(), name="bunshin-pull")

    async def _produce(self) -> None:
        async with asyncio.TaskGroup() as groups:
            for request in self.source:
                self._check(request)
                while not self.rule.may_start(request.group_size, self.version()):
                    await self._wait_for_change()
                started = self.version()
                self.rule.start(request.group_size, started)
                self._running += request.group_size
                groups.create_task(self.run_group(request, self._finisher(request, started)))
            self._exhausted = True
            self._notify()

    def _check(self, request: RolloutRequest) -> None:
        if request.group_size < 1:
            raise PullError(f"group {request.group_id or request.task.task_id}: group_size must be >= 1")
        if request.group_size > self.rule.batch_size:
            raise PullError(f"group {request.group_id or request.task.task_id} of {request.group_size} samples "
                            f"can never start with batch_size={self.rule.batch_size}")
        if self.whole_groups:
            if self._group_size is None:
                self._group_size = request.group_size
            elif request.group_size != self._group_size:
                raise PullError(f"whole_groups needs one group size; group {request.group_id} has "
                                f"{request.group_size}, earlier groups {self._group_size}")

    def _finisher(self, request: RolloutRequest, started: int) -> Callable[[Trajectory], Awaitable[None]]:
        size = request.group_size

        async def finish(t: Trajectory) -> None:
            result = RolloutResult(trajectory=t, peak_memory_bytes=self.peak_bytes(), policy_version=started)
            self._running -= 1
            if not self.whole_groups:
                self._push([result], started)
                return
            members = self._partial.setdefault(t.group_id, [])
            members.append(result)
            if len(members) == size:
                del self._partial[t.group_id]
                self._push(sorted(members, key=lambda r: r.trajectory.sample), started)

        return finish

    def _push(self, results: list[RolloutResult], version: int) -> None:
        heapq.heappush(self._ready, _Ready(version, next(self._finished), results))
        self._ready_count += len(results)
        self._notify()

    def _notify(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _change(self) -> asyncio.Future[None]:
        """A future that the next change completes (made now, so no change between a check and the wait is lost)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        waiter.add_done_callback(self._waiters.discard)
        return waiter

    async def _wait_for_change(self) -> None:
        waiter = self._change()
        try:
            await waiter
        finally:
            waiter.cancel()

    def version_changed(self) -> None:
        """The trainer's policy version moved: the rule may allow more."""
        self._notify()

    # -- the consumer ---------------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Every request started, every rollout finished and handed out."""
        return self._exhausted and self._running == 0 and self._ready_count == 0 and not self._partial

    def statistics(self) -> dict[str, int]:
        return {"started": self.rule.started, "running": self._running, "ready": self._ready_count,
                "handed_out": self._handed_out, "capacity": self.rule.capacity(self.version())}

    async def get_batch(self, n: int) -> list[RolloutResult]:
        """``n`` finished rollouts, oldest first, stamped; fewer only when the source is used up and nothing else
        will finish (then the rest; ``[]`` once everything has been handed out)."""
        if n < 1:
            raise PullError(f"get_batch(n) needs n >= 1, got {n}")
        if self.whole_groups and self._group_size and n % self._group_size:
            raise PullError(f"get_batch({n}): whole groups of {self._group_size} cannot make {n}")
        while True:
            self._raise_if_failed()
            if self._ready_count >= n or (self._exhausted and self._running == 0 and not self._partial):
                return self._take(n)
            waiter = self._change()
            try:
                assert self._task is not None
                await asyncio.wait([waiter, self._task], return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()

    def _raise_if_failed(self) -> None:
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, BaseExceptionGroup):  # a model server not set up for the policy: the pull's end
                exc = first_exception(exc, ServerConfigError) or exc
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # the producer's TaskGroup wraps even its own errors
            raise exc  # type: ignore[misc]

    def _take(self, n: int) -> list[RolloutResult]:
        version = self.version()
        batch: list[RolloutResult] = []
        while self._ready and len(batch) + len(self._ready[0].results) <= n:
            entry = heapq.heappop(self._ready)
            self._ready_count -= len(entry.results)
            batch.extend(msgspec.structs.replace(r, staleness=version - r.policy_version) for r in entry.results)
        self._handed_out += len(batch)
        return batch

    async def close(self) -> None:
        """Stop starting groups and cancel the running ones (finished ones stay in the buffer)."""
        self._task = None
        await self._scope.aclose()  # a failed producer's error was (or would have been) raised by get_batch
