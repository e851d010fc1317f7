"""Owning scopes for background work: every task the project starts belongs to something that ends it.

Owns: ``TaskScope``, the one nursery helper outside ``asyncio.TaskGroup``: ``start_soon`` starts a task it keeps,
``join`` waits for the ones it holds, ``aclose`` cancels what is left and waits until all of them have ended (even
when the caller is cancelled meanwhile: cancellation is re-raised once they are gone). A task's failure never
escapes the scope: it is logged once, counted (``failures``), and given to ``on_error`` when one was passed; a
``TaskGroup`` is the tool when one failure must stop the rest. And ``run_to_end``, for an operation that must not be
cut halfway (a thread, a request that cannot be taken back): it is awaited to its end even when the caller is
cancelled, its result handed to ``undo``, then the cancellation re-raised.
Must never: lose a task (one started is in the scope until it has ended), swallow a ``CancelledError`` of its
caller, or start a task once the scope is closing (``ScopeClosed``; the coroutine is closed, never left unawaited).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..errors import EnvsError

T = TypeVar("T")
log = logging.getLogger(__name__)


class ScopeClosed(EnvsError, RuntimeError):
    """A task was started in a scope that is closing or closed."""


class TaskScope:
    """``async with TaskScope("prefix-cache") as scope: scope.start_soon(coro)``; or keep one in an object and
    ``await scope.aclose()`` in its ``close``."""

    def __init__(self, name: str, *, on_error: Callable[[BaseException], None] | None = None):
        self.name = name
        self.on_error = on_error
        self.failures = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False

    def __repr__(self) -> str:
        return f"<TaskScope {self.name} tasks={len(self._tasks)}{' closing' if self._closing else ''}>"

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closing(self) -> bool:
        return self._closing

    def start_soon(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Run ``coro`` as a task of this scope; the task is returned so the caller may await or cancel it."""
        if self._closing:
            coro.close()
            raise ScopeClosed(f"task scope {self.name} is closing: no new task")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        self.failures += 1
        if self.on_error is not None:
            self.on_error(exc)
        else:
            log.warning("task %s of scope %s failed: %r", task.get_name(), self.name, exc, exc_info=exc)

    async def join(self) -> None:
        """Until every task of the scope (those started meanwhile too) has ended; nothing is cancelled."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def aclose(self) -> None:
        """Cancel every task and wait until all have ended; no task can be started afterwards. Finishes even when
        the caller is cancelled meanwhile, then re-raises that cancellation."""
        self._closing = True
        cancelled = False
        asked: set[asyncio.Task[Any]] = set()
        while self._tasks:
            pending = list(self._tasks)
            for task in pending:
                if task not in asked:  # once: a second cancel would cut the task's own cleanup short
                    asked.add(task)
                    task.cancel()
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    async def __aenter__(self) -> TaskScope:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def run_to_end(aw: Awaitable[T], undo: Callable[[T], Any] | None = None) -> T:
    """Await ``aw`` to its end even if the caller is cancelled meanwhile (a thread cannot be interrupted; a request
    sent cannot be taken back), then re-raise the cancellation, handing the result nobody will use to ``undo`` (a
    coroutine function's result is awaited, itself run to its end). Without cancellation: ``aw``'s result, or its
    exception."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if undo is not None and not task.cancelled() and task.exception() is None:
            undone = undo(task.result())
            if asyncio.iscoroutine(undone):
                await run_to_end(undone)
        raise asyncio.CancelledError
    return task.result()
