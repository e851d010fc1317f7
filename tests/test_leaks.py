"""Nothing of a workspace outlives it: cancellation at any point, and an engine killed in the middle of a fork."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bunshin.envs import WorkspaceRuntime

from .conftest import heap_app, host_processes, leftovers

pytestmark = pytest.mark.asyncio


def consistent(rt: WorkspaceRuntime) -> None:
    """The runtime's registry, the cgroups and the layers all name the same workspaces."""
    ids = set(rt.workspaces)
    groups = {p.name.removeprefix("ws-") for p in rt.cgroup.path("memory").iterdir() if p.is_dir()}
    layers = {n.removeprefix("ws-") for n in rt.layers.names() if n.startswith("ws-")}
    assert groups == ids, (groups, ids)
    assert layers == ids, (layers, ids)
    for ws in rt.workspaces.values():
        assert rt.cgroup.child(f"ws-{ws.id}").procs(), f"{ws.id} has no process"


@pytest.mark.parametrize("delay", [0, 0.0005, 0.002, 0.005, 0.01, 0.02, 0.04])
async def test_cancelled_fork_leaves_nothing_and_source_in_step(runtime: WorkspaceRuntime, delay: float) -> None:
    from bunshin.envs import ToolCall

    source = await runtime.create(heap_app())
    task = asyncio.ensure_future(source.fork())
    await asyncio.sleep(delay)
    task.cancel()
    try:
        clone = await task
    except asyncio.CancelledError:
        clone = None
    if clone is not None:
        await clone.close()
    consistent(runtime)
    assert list(runtime.workspaces) == [source.id]
    # the source's channel is still in step: the next reply is the answer to the next request
    assert (await source.execute(ToolCall(name="shell", args={"cmd": "echo next"}))).output == "next\n"
    assert (await source.fork()).parent == source.id


@pytest.mark.parametrize("delay", [0, 0.01, 0.1, 0.3])
async def test_cancelled_create_leaves_nothing(runtime: WorkspaceRuntime, delay: float) -> None:
    task = asyncio.ensure_future(runtime.create(heap_app()))
    await asyncio.sleep(delay)
    task.cancel()
    try:
        ws = await task
    except asyncio.CancelledError:
        ws = None
    if ws is not None:
        await ws.close()
    consistent(runtime)
    assert runtime.workspaces == {}


async def test_cancelled_execute_keeps_channel_in_step(runtime: WorkspaceRuntime) -> None:
    from bunshin.envs import ToolCall

    ws = await runtime.create(heap_app())
    task = asyncio.ensure_future(ws.execute(ToolCall(name="shell", args={"cmd": "sleep 0.3; echo first"})))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo second"}))).output == "second\n"


async def test_cancelled_runtime_close_still_cleans_up(make_runtime) -> None:
    rt = await make_runtime()
    ws = await rt.create(heap_app())
    await ws.fork()
    task = asyncio.ensure_future(rt.close())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 10
    while leftovers(rt.run_id, rt.run_dir) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert leftovers(rt.run_id, rt.run_dir) == []


@pytest.mark.parametrize("fault", ["fork.after_snapshot:hang", "clone.after_cgroup:hang"])
async def test_engine_killed_mid_fork_is_cleaned_up_at_next_start(state_dir: Path, fault: str) -> None:
    victim = subprocess.Popen([sys.executable, "-m", "tests.engine_victim", str(state_dir), fault],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        assert victim.stdout is not None
        _, run_id, run_dir_text = victim.stdout.readline().split()
        assert victim.stdout.readline().strip() == "forking"
        time.sleep(0.5)  # let the fork reach its fault
        run_dir = Path(run_dir_text)
        assert len(host_processes()) >= 1
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    # Hosts die with their engine (parent-death signal) ...
    deadline = time.monotonic() + 10
    while host_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes() == []
    # ... but its cgroups, pool mount and directory wait for the next start.
    left = leftovers(run_id, run_dir)
    assert any(x.startswith("cgroup") for x in left) and any(x.startswith("mount") for x in left), left
    rt = WorkspaceRuntime(state_dir=state_dir)
    await rt.start()
    try:
        assert leftovers(run_id, run_dir, ignore=frozenset({rt.nursery.pid})) == []
    finally:
        await rt.close()
    assert leftovers(rt.run_id, rt.run_dir) == []
    # (only these two runs: another test session may have live runs in the same state directory)
    assert not any(line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if str(run_dir) in line or str(rt.run_dir) in line)
    assert not {run_dir.name, rt.run_dir.name} & set(os.listdir(state_dir / "runs"))


async def test_cancelling_the_wait_for_an_orphaned_reply_keeps_the_channel_in_step(runtime) -> None:
    from bunshin.envs import ToolCall

    ws = await runtime.create(heap_app())
    slow = asyncio.ensure_future(ws.execute(ToolCall(name="shell", args={"cmd": "sleep 0.4; echo first"})))
    await asyncio.sleep(0.05)
    slow.cancel()
    waiting = asyncio.ensure_future(ws.execute(ToolCall(name="shell", args={"cmd": "echo second"})))
    await asyncio.sleep(0.05)  # it now waits for the orphaned reply of the first
    waiting.cancel()
    for task in (slow, waiting):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo third"}))).output == "third\n"
    assert (await ws.ping()).pid == ws.pid


async def test_fork_cancelled_twice_still_leaves_nothing(runtime) -> None:
    source = await runtime.create(heap_app())
    task = asyncio.ensure_future(source.fork())
    await asyncio.sleep(0.002)
    task.cancel()
    await asyncio.sleep(0.002)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    consistent(runtime)
    assert list(runtime.workspaces) == [source.id]
