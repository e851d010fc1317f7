"""A workspace's life at its edges: closing twice, a fork that fails after the collector was frozen, and a tool call
that overruns the deadline the runtime enforces."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from bunshin.envs import (
    AppSpec,
    CallDeadlineExceeded,
    ForkFailed,
    Limits,
    ToolCall,
    WorkspaceBroken,
    WorkspaceClosed,
    WorkspaceRuntime,
)
from bunshin.envs.runtime import await_points
from bunshin.envs.workspace import deadline_s

from .conftest import cancel_at, pool_layers
from .quiet import until

pytestmark = pytest.mark.asyncio

PROBE = AppSpec(target="tests.apps.probe:ProbeApp")


def gone(rt: WorkspaceRuntime, ws_id: str, pid: int) -> list[str]:
    """What of workspace ``ws_id`` is still there: registry entry, cgroup, layer, host process."""
    left = []
    if ws_id in rt.workspaces:
        left.append("registered")
    if rt.cgroup.child(f"ws-{ws_id}").path("memory").exists():
        left.append("cgroup")
    if f"ws-{ws_id}" in pool_layers(rt):
        left.append("layer")
    try:
        os.kill(pid, 0)
        left.append("host process")
    except ProcessLookupError:
        pass
    return left


async def test_two_concurrent_closes_both_return_after_the_teardown(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(PROBE)
    first, second = asyncio.ensure_future(ws.close()), asyncio.ensure_future(ws.close())
    await second
    assert gone(runtime, ws.id, ws.pid) == []  # the second returned only once the first's teardown was done
    assert first.done() or gone(runtime, ws.id, ws.pid) == []
    await first
    await ws.close()  # and a third, later, returns at once
    with pytest.raises(WorkspaceClosed):
        await ws.execute(ToolCall(name="echo", args={"text": "x"}))


async def test_a_close_whose_caller_was_cancelled_is_finished_by_the_next(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(PROBE)
    first = asyncio.ensure_future(ws.close())
    # cancelled once its teardown has started
    with await_points.hook(cancel_at(first, "workspace.close")), pytest.raises(asyncio.CancelledError):
        await first
    await ws.close()
    assert gone(runtime, ws.id, ws.pid) == []


async def test_a_fork_that_fails_after_gc_freeze_leaves_the_source_unfrozen(make_runtime) -> None:
    rt = await make_runtime(faults=["fork.before_fork"])
    source = await rt.create(PROBE)
    count = ToolCall(name="gc_freeze_count")
    assert (await source.execute(count)).data["count"] == 0
    with pytest.raises(ForkFailed, match="fork.before_fork"):
        await source.fork()
    # the collector is thawed again: a frozen source would never collect its garbage
    assert (await source.execute(count)).data["count"] == 0
    assert list(rt.workspaces) == [source.id]


async def test_a_successful_fork_leaves_the_source_unfrozen_and_the_clone_frozen(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(PROBE)
    clone = await source.fork()
    count = ToolCall(name="gc_freeze_count")
    assert (await source.execute(count)).data["count"] == 0
    assert (await clone.execute(count)).data["count"] > 0  # the clone keeps the heap out of the collector's way


async def test_a_tool_that_overruns_its_deadline_breaks_only_its_workspace(make_runtime) -> None:
    rt = await make_runtime(limits=Limits(memory_bytes=1 << 30, pids=64, command_timeout_s=30, deadline_grace_s=1.0))
    stuck, bystander = await rt.create(PROBE), await rt.create(PROBE)
    started = time.monotonic()
    with pytest.raises(CallDeadlineExceeded) as info:
        await stuck.execute(ToolCall(name="spin", args={"seconds": 600}), timeout_s=1.0)
    took = time.monotonic() - started
    assert deadline_s(1.0, rt.limits) == 2.0 and 1.95 <= took < 6.0, took  # (the loop's timers have ms resolution)
    assert info.value.tool == "spin" and "overran its deadline" in info.value.reason
    assert isinstance(info.value, WorkspaceBroken) and isinstance(info.value, TimeoutError)
    # the host was stopped: the workspace reports itself broken with that reason from now on
    with pytest.raises(WorkspaceBroken, match="overran its deadline"):
        await stuck.execute(ToolCall(name="echo", args={"text": "again"}))
    assert await until(lambda: not os.path.exists(f"/proc/{stuck.pid}"), 5), "the stuck host is still running"
    assert (await bystander.execute(ToolCall(name="echo", args={"text": "alive"}))).output == "alive"
    await stuck.close()
    assert gone(rt, stuck.id, stuck.pid) == []


async def test_a_shell_command_stops_at_its_timeout_and_the_host_answers(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(PROBE)
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 30"}), timeout_s=1.0)
    assert obs.error == "command timed out after 1s"
    assert (await ws.execute(ToolCall(name="echo", args={"text": "next"}))).output == "next"


async def test_a_call_asks_for_a_positive_finite_timeout(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(PROBE)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout_s"):
            await ws.execute(ToolCall(name="echo"), timeout_s=bad)
    assert (await ws.execute(ToolCall(name="echo", args={"text": "fine"}))).output == "fine"
