"""``TaskScope`` and ``run_to_end`` (envs/runtime/task_scope.py): every task ends with its scope, failures are
reported once and never escape, cancellation of the closer is re-raised after the tasks are gone; and the test
helper ``all_tasks_blocked`` itself. No sleeps: events and ``all_tasks_blocked``."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bunshin.envs.runtime.task_scope import ScopeClosed, TaskScope, run_to_end
from tests.quiet import all_tasks_blocked


@pytest.mark.asyncio
async def test_aclose_cancels_every_task_and_waits_for_its_cleanup() -> None:
    scope = TaskScope("t")
    cleaned: list[int] = []
    started = [asyncio.Event() for _ in range(3)]

    async def job(i: int) -> None:
        try:
            started[i].set()
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append(i)

    tasks = [scope.start_soon(job(i)) for i in range(3)]
    await asyncio.gather(*(e.wait() for e in started))
    assert len(scope) == 3
    await scope.aclose()
    assert sorted(cleaned) == [0, 1, 2] and all(t.cancelled() for t in tasks) and len(scope) == 0


@pytest.mark.asyncio
async def test_a_closed_scope_refuses_new_tasks_and_closes_the_coroutine() -> None:
    scope = TaskScope("t")
    await scope.aclose()

    async def never() -> None:
        raise AssertionError("ran")

    coro = never()
    with pytest.raises(ScopeClosed, match="scope t is closing"):
        scope.start_soon(coro)
    assert coro.cr_frame is None  # closed: no "never awaited" warning, nothing runs


@pytest.mark.asyncio
async def test_a_failing_task_is_counted_and_reported_once_and_the_others_run_on() -> None:
    seen: list[BaseException] = []
    scope = TaskScope("t", on_error=seen.append)
    go = asyncio.Event()

    async def fails() -> None:
        raise ValueError("boom")

    async def waits() -> str:
        await go.wait()
        return "done"

    scope.start_soon(fails())
    survivor = scope.start_soon(waits())
    await all_tasks_blocked()
    assert scope.failures == 1 and [str(e) for e in seen] == ["boom"] and not survivor.done()
    go.set()
    await scope.join()
    assert survivor.result() == "done" and len(scope) == 0


@pytest.mark.asyncio
async def test_join_waits_for_tasks_started_while_joining() -> None:
    scope = TaskScope("t")
    order: list[str] = []
    release = asyncio.Event()

    async def second() -> None:
        order.append("second")

    async def first() -> None:
        await release.wait()
        scope.start_soon(second())
        order.append("first")

    scope.start_soon(first())
    joining = asyncio.get_running_loop().create_task(scope.join())
    await all_tasks_blocked()
    assert not joining.done()
    release.set()
    await joining
    assert order == ["first", "second"]


@pytest.mark.asyncio
async def test_cancelling_the_closer_still_waits_for_the_tasks_then_reraises() -> None:
    scope = TaskScope("t")
    let_cleanup_finish = asyncio.Event()
    cleaned = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await let_cleanup_finish.wait()
            cleaned.set()

    scope.start_soon(slow_cleanup())
    await all_tasks_blocked()
    closer = asyncio.get_running_loop().create_task(scope.aclose())
    await all_tasks_blocked()
    closer.cancel()  # the closer is cancelled while the task's cleanup is still running
    await all_tasks_blocked()
    assert not closer.done() and not cleaned.is_set()
    let_cleanup_finish.set()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert cleaned.is_set() and len(scope) == 0


@pytest.mark.asyncio
async def test_run_to_end_finishes_a_thread_then_undoes_its_result_and_reraises() -> None:
    in_thread, leave_thread = threading.Event(), threading.Event()
    undone: list[str] = []

    def work() -> str:
        in_thread.set()
        leave_thread.wait(10)
        return "made"

    caller = asyncio.get_running_loop().create_task(run_to_end(asyncio.to_thread(work), undone.append))
    await asyncio.to_thread(in_thread.wait, 10)
    caller.cancel()
    await all_tasks_blocked()
    assert not caller.done()  # the thread is still running: the caller waits for it
    leave_thread.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone == ["made"]


@pytest.mark.asyncio
async def test_run_to_end_without_cancellation_gives_the_result_or_the_error() -> None:
    async def ok() -> int:
        return 7

    async def bad() -> int:
        raise KeyError("k")

    assert await run_to_end(ok()) == 7
    with pytest.raises(KeyError):
        await run_to_end(bad(), undo=lambda _: pytest.fail("undo without cancellation"))


@pytest.mark.asyncio
async def test_run_to_end_awaits_an_async_undo() -> None:
    gate = asyncio.Event()
    undone = asyncio.Event()

    async def make() -> str:
        await gate.wait()
        return "x"

    async def undo(_: str) -> None:
        await asyncio.sleep(0)  # an undo that itself awaits
        undone.set()

    caller = asyncio.get_running_loop().create_task(run_to_end(make(), undo))
    await all_tasks_blocked()
    caller.cancel()
    await all_tasks_blocked()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone.is_set()


@pytest.mark.asyncio
async def test_all_tasks_blocked_waits_for_runnable_tasks_and_fails_on_a_busy_one() -> None:
    steps: list[int] = []

    async def chain() -> None:
        for i in range(50):
            steps.append(i)
            await asyncio.sleep(0)  # runnable again at once: not blocked until the chain ends

    task = asyncio.get_running_loop().create_task(chain())
    await all_tasks_blocked()
    assert task.done() and steps == list(range(50))

    stop = False

    async def busy() -> None:
        while not stop:
            await asyncio.sleep(0)  # never blocked: a busy loop

    spinner = asyncio.get_running_loop().create_task(busy())
    with pytest.raises(AssertionError, match="still runnable"):
        await all_tasks_blocked(rounds=100)
    stop = True
    await spinner
