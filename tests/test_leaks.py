"""Nothing of a workspace outlives it: cancellation at any point, and an engine killed in the middle of a fork."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bunshin.envs import WorkspaceRuntime
from bunshin.envs.runtime import await_points

from .conftest import SHARED_POINTS, cancel_at, heap_app, host_processes, leftovers, ping, pool_layers, workspace_groups
from .quiet import settled, until

pytestmark = pytest.mark.asyncio


def consistent(rt: WorkspaceRuntime) -> None:
    """The runtime's registry, the cgroups and the layers all name the same workspaces."""
    ids = set(rt.workspaces)
    groups = {name.removeprefix("ws-") for name in workspace_groups(rt)}
    layers = {n.removeprefix("ws-") for n in pool_layers(rt) if n.startswith("ws-")}
    assert groups == ids, (groups, ids)
    assert layers == ids, (layers, ids)
    for ws in rt.workspaces.values():
        assert rt.cgroup.child(f"ws-{ws.id}").procs(), f"{ws.id} has no process"


FORK_POINTS = ["fork.cow.request", "workspace.request.sent", "hosts.await_ready"]
CREATE_POINTS = ["runtime.create.layer", "hosts.start.spawn", "hosts.await_ready"]


async def test_the_await_points_named_here_are_the_ones_fork_and_create_pass(runtime: WorkspaceRuntime) -> None:
    with await_points.seen() as created:
        source = await runtime.create(heap_app())
    with await_points.seen() as forked:
        await source.fork()
    assert sorted(set(created) - SHARED_POINTS) == sorted(CREATE_POINTS)
    assert sorted(set(forked) - SHARED_POINTS) == sorted(FORK_POINTS)


@pytest.mark.parametrize("point", FORK_POINTS)
async def test_cancelled_fork_leaves_nothing_and_source_in_step(runtime: WorkspaceRuntime, point: str) -> None:
    from bunshin.envs import ToolCall

    source = await runtime.create(heap_app())
    task = asyncio.ensure_future(source.fork())
    with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
        await task
    consistent(runtime)
    assert list(runtime.workspaces) == [source.id]
    # the source's channel is still in step: the next reply is the answer to the next request
    assert (await source.execute(ToolCall(name="shell", args={"cmd": "echo next"}))).output == "next\n"
    assert (await source.fork()).parent == source.id


RESTORE_POINTS = ["fork.restore.checkpoint", "workspace.request.sent", "hosts.start.spawn", "hosts.await_ready"]


@pytest.mark.parametrize("point", RESTORE_POINTS)
async def test_a_cancelled_restore_leaves_nothing_and_its_dump_goes_with_the_source(make_runtime, point: str) -> None:
    """The restore backend: a fork cancelled while dumping or restoring leaves no clone; the dump is kept for the
    next fork of the same state (or removed if it was never finished) and goes when the source closes."""
    from bunshin.envs import ToolCall

    rt: WorkspaceRuntime = await make_runtime(backend="restore")
    source = await rt.create(heap_app())
    task = asyncio.ensure_future(source.fork())
    with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
        await task
    consistent(rt)
    assert list(rt.workspaces) == [source.id]
    assert (await source.execute(ToolCall(name="shell", args={"cmd": "echo next"}))).output == "next\n"
    assert (await source.fork()).parent == source.id
    await source.close()
    assert not os.listdir(rt.layers.root / "dumps") and not [n for n in pool_layers(rt) if n.startswith("dump-")]


@pytest.mark.parametrize("point", CREATE_POINTS)
async def test_cancelled_create_leaves_nothing(runtime: WorkspaceRuntime, point: str) -> None:
    task = asyncio.ensure_future(runtime.create(heap_app()))
    with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
        await task
    consistent(runtime)
    assert runtime.workspaces == {}


async def test_cancelled_execute_keeps_channel_in_step(runtime: WorkspaceRuntime) -> None:
    from bunshin.envs import ToolCall

    ws = await runtime.create(heap_app())
    task = asyncio.ensure_future(ws.execute(ToolCall(name="shell", args={"cmd": "sleep 0.3; echo first"})))
    with await_points.hook(cancel_at(task, "workspace.request.sent")), pytest.raises(asyncio.CancelledError):
        await task
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo second"}))).output == "second\n"


async def test_cancelled_runtime_close_still_cleans_up(make_runtime) -> None:
    rt = await make_runtime()
    ws = await rt.create(heap_app())
    await ws.fork()
    task = asyncio.ensure_future(rt.close())
    with await_points.hook(cancel_at(task, "runtime.close")), pytest.raises(asyncio.CancelledError):
        await task
    assert await settled(lambda: leftovers(rt.run_id, rt.run_dir)) == []  # the hosts exit, the kernel drops cgroups


@pytest.mark.parametrize("fault", ["fork.after_snapshot:hang", "clone.after_cgroup:hang"])
async def test_engine_killed_mid_fork_is_cleaned_up_at_next_start(state_dir: Path, fault: str) -> None:
    victim = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.engine_victim", str(state_dir), fault,
                                                  stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    try:
        assert victim.stdout is not None
        _, run_id, run_dir_text = (await victim.stdout.readline()).decode().split()
        assert (await victim.stdout.readline()).decode().strip() == "forking"
        run_dir = Path(run_dir_text)
        # the victim's fork reached its fault once the clone's layer is in the pool
        assert await until(lambda: len(list((run_dir / "pool").glob("ws-*"))) == 2, 20)
        assert len(host_processes()) >= 1
    finally:
        victim.kill()
        await victim.wait()
    # Hosts die with their engine (parent-death signal) ...
    assert await settled(host_processes) == []
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
    with await_points.hook(cancel_at(slow, "workspace.request.sent")), pytest.raises(asyncio.CancelledError):
        await slow
    waiting = asyncio.ensure_future(ws.execute(ToolCall(name="shell", args={"cmd": "echo second"})))
    # cancelled while it waits for the orphaned reply of the first
    with await_points.hook(cancel_at(waiting, "workspace.request.orphan")), pytest.raises(asyncio.CancelledError):
        await waiting
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": "echo third"}))).output == "third\n"
    assert (await ping(ws)).pid == ws.pid


async def test_fork_cancelled_twice_still_leaves_nothing(runtime) -> None:
    source = await runtime.create(heap_app())
    task = asyncio.ensure_future(source.fork())
    with (await_points.hook(cancel_at(task, "fork.cow.request"), "fork.cow.request"),
          await_points.hook(cancel_at(task, "hosts.await_ready"), "hosts.await_ready"),
          pytest.raises(asyncio.CancelledError)):
        await task
    consistent(runtime)
    assert list(runtime.workspaces) == [source.id]


async def test_a_cancelled_spawn_leaves_no_process_and_the_next_spawn_its_own_reply(make_runtime) -> None:
    """A spawn whose caller is cancelled while the nursery is at work: the process it spawned is killed and reaped
    before the cancellation reaches the caller. Left alone it lived on after the caller had undone everything else
    (a restore or create cancelled at ``hosts.start.spawn``: a child between fork and exec, a host waiting for its
    configuration; here a program that never exits on its own)."""
    from .conftest import live_processes

    runtime = await make_runtime(prepared_shells=0)  # the nursery serves this test's spawns alone
    nursery, marker = runtime.nursery, f"bunshin-cancelled-spawn-{os.getpid()}"

    def spawn(tag: str):
        return nursery.spawn([sys.executable, "-c", "import time; time.sleep(600)", marker, tag], fds=[],
                             log_path=str(runtime.run_dir / "spawned.log"), cwd=str(runtime.run_dir))

    def spawned(tag: str) -> list[int]:
        return [pid for pid, cmd, _ in live_processes() if marker.encode() in cmd and tag.encode() in cmd]

    second: list[int] = []
    task = asyncio.ensure_future(spawn("first"))
    try:
        # cancelled once the request is sent: the nursery is at work (a fixed wait could find the spawn done)
        with await_points.hook(cancel_at(task, "nursery.request.sent"), "nursery.request.sent"), \
                pytest.raises(asyncio.CancelledError):
            await task
        assert spawned("first") == []
        second.append(await spawn("second"))  # spawns are one at a time: the first exchange is over
        # Popen returns once the exec closed its error pipe, a moment before the kernel sets the new command line
        # (/proc/PID/cmdline reads empty meanwhile): seen under load
        assert await until(lambda: spawned("second") == second, 10) and spawned("first") == []
    finally:
        for left in {*spawned(""), *second}:
            if not nursery.exited(left):  # (a reaped pid may be someone else's by now)
                os.kill(left, 9)
            await nursery.wait_exit(left, timeout=10.0)
            nursery.forget(left)


async def test_a_spawn_waiting_on_a_nursery_that_dies_ends_cancelled_or_not(make_runtime) -> None:
    """A cancelled spawn waits for the nursery's reply (it runs to its end); a nursery that dies before it replies
    ends the wait of every spawn, cancelled or not, instead of leaving them waiting forever."""
    from bunshin.envs.runtime.nursery import NurseryError

    from .quiet import all_tasks_blocked

    rt: WorkspaceRuntime = await make_runtime()
    nursery = rt.nursery

    def spawn():
        return nursery.spawn([sys.executable, "-c", "pass"], fds=[], log_path=str(rt.run_dir / "spawned.log"),
                             cwd=str(rt.run_dir))

    os.kill(nursery.pid, signal.SIGSTOP)  # it takes the request and cannot answer
    try:
        cancelled = asyncio.ensure_future(spawn())
        await all_tasks_blocked()
        cancelled.cancel()
        waiting = asyncio.ensure_future(spawn())  # queued behind the first
        await all_tasks_blocked()
        assert not cancelled.done()
    finally:
        os.kill(nursery.pid, signal.SIGKILL)
    done, _ = await asyncio.wait([cancelled, waiting], timeout=30)  # awaiting them would pass on a timeout's cancel
    assert done == {cancelled, waiting}
    assert cancelled.cancelled()
    with pytest.raises(NurseryError, match="channel"):
        waiting.result()
