"""Synchronising tests without sleeps: ``all_tasks_blocked`` returns once nothing else on the loop can run.

A test that needs "the background work has got as far as it can" (a catch-up waiting for a workspace, a branch
waiting for a slot) awaits this instead of sleeping a guessed time: every other task is then waiting on a future
that is not done (an event, a lock, a timer, a socket, a thread). A task waiting on a thread counts as blocked,
as in trio's ``wait_all_tasks_blocked``: a test that needs the thread's result waits for an event the code sets.

What another process does (a host exiting, the kernel removing a cgroup, a subprocess writing a file) sets no event
this loop can wait on: ``settled`` and ``until`` (``settled_sync`` in synchronous tests) poll a check of it, with a
deadline. They are for other processes only; work of this process is waited for with events or
``all_tasks_blocked``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

ROUNDS = 10_000  # loop iterations before giving up: some task keeps becoming ready (a busy loop)


def _blocked(task: asyncio.Task[object]) -> bool:
    waiter = task._fut_waiter  # type: ignore[attr-defined]  # CPython's Task (C or Python) and uvloop's alike
    return task.done() or (waiter is not None and not waiter.done())


async def all_tasks_blocked(rounds: int = ROUNDS) -> None:
    """Return once every other task of the running loop is blocked, in two loop iterations in a row (a callback
    scheduled with ``call_soon`` may wake one between them). Raises ``AssertionError`` after ``rounds``."""
    me = asyncio.current_task()
    quiet = 0
    for _ in range(rounds):
        await asyncio.sleep(0)
        if all(t is me or _blocked(t) for t in asyncio.all_tasks()):
            quiet += 1
            if quiet == 2:
                return
        else:
            quiet = 0
    raise AssertionError(f"tasks still runnable after {rounds} loop iterations: "
                         f"{[t for t in asyncio.all_tasks() if t is not me and not _blocked(t)]}")


POLL_S = 0.05  # how often ``settled`` looks again


async def settled(left: Callable[[], T], timeout_s: float = 10.0) -> T:
    """Poll ``left`` (what another process has still to remove or finish: a list, a flag) until it returns something
    falsy or ``timeout_s`` passes; its last value, for the test's assertion and message."""
    deadline = time.monotonic() + timeout_s
    while (value := left()) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return value


async def until(condition: Callable[[], object], timeout_s: float = 10.0) -> bool:
    """Whether ``condition`` (about another process) came true within ``timeout_s``, polled."""
    return not await settled(lambda: not condition(), timeout_s)


def settled_sync(left: Callable[[], T], timeout_s: float = 10.0) -> T:
    """``settled`` for a synchronous test (the adapters' APIs, subprocesses driven without a loop)."""
    deadline = time.monotonic() + timeout_s
    while (value := left()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return value
