"""Prepared shells (``envs/runtime/shells.py``): a live clone's cgroup and network, UTS and IPC namespaces made ahead
of its fork, which then only snapshots, clones and attaches. A clone in a shell is a workspace like any other (its
own hostname, loopback, network, cgroup holding only its processes); a fault at each new step (the shell's making,
the clone's attach, the clone itself) leaves no half-built shell or clone; unused shells go with the run."""

from __future__ import annotations

import asyncio
import os

import pytest

from bunshin.envs import ForkFailed, ToolCall, WorkspaceRuntime
from bunshin.envs.runtime import await_points
from bunshin.envs.runtime.shells import SHELLS

from .conftest import cancel_at, heap_app, pool_layers, workspace_groups, workspace_procs
from .quiet import until

pytestmark = pytest.mark.asyncio


async def out(ws, cmd: str) -> str:
    return (await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))).output.strip()


async def shells_ready(rt: WorkspaceRuntime, count: int) -> bool:
    return await until(lambda: len(rt.hosts.shells.ready(SHELLS)) >= count, 30)


def engine_fds() -> int:
    """The engine's open descriptors (a pidfd of a holder never closed would show here)."""
    return len(os.listdir("/proc/self/fd"))


def net_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


async def test_a_clone_in_a_shell_is_a_workspace_of_its_own_and_the_pool_refills(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(prepared_shells=2)
    source = await rt.create(heap_app())
    assert await shells_ready(rt, 2), rt.shell_stats()
    fds = engine_fds()
    shells = rt.hosts.shells.ready(SHELLS)
    holders = {s.holder_pid for s in shells}
    one, two = await source.fork(), await source.fork()
    assert one.last_fork.shell and two.last_fork.shell
    assert {one.id, two.id} == {s.id for s in shells}  # a shell's id becomes its clone's
    assert rt.shell_stats().hits == 2
    for clone in (one, two):
        assert await out(clone, "hostname") == f"ws-{clone.id}"
        assert await out(clone, "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 8080)); "
                                "s.listen(); socket.create_connection(('127.0.0.1', 8080)); print('lo up')\"") == "lo up"
        procs = set(clone.cgroup.procs())
        assert clone.pid in procs and not procs & holders  # holders live in the run's holders' group, never here
    assert len({net_ns(source.pid), net_ns(one.pid), net_ns(two.pid)}) == 3
    assert not [pid for pid in holders if os.path.exists(f"/proc/{pid}")] or await until(
        lambda: not [pid for pid in holders if os.path.exists(f"/proc/{pid}")], 10)
    assert await shells_ready(rt, 2), rt.shell_stats()  # refilled once the forks ended
    assert rt.shell_stats().started >= 4
    # a clone of a clone in a shell, and a snapshot and its clone, take shells too
    grandchild = await one.fork()
    assert grandchild.last_fork.shell
    assert await out(grandchild, "hostname") == f"ws-{grandchild.id}"
    snapshot = await source.snapshot()
    assert snapshot.last_fork.shell
    assert await shells_ready(rt, 1), rt.shell_stats()
    from_snapshot = await snapshot.fork()
    assert from_snapshot.last_fork.shell and await out(from_snapshot, "hostname") == f"ws-{from_snapshot.id}"
    for ws in (one, two, grandchild, from_snapshot, snapshot):
        await ws.close()
    assert workspace_groups(rt) == [f"ws-{source.id}"]
    assert await until(lambda: workspace_procs(rt) == [source.pid], 10), workspace_procs(rt)  # holders ended
    assert await shells_ready(rt, 2) and await until(lambda: engine_fds() == fds, 10), (fds, engine_fds())


async def test_without_shells_every_fork_makes_its_own(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(prepared_shells=0)
    source = await rt.create(heap_app())
    clone = await source.fork()
    assert not clone.last_fork.shell and "loopback" in clone.last_fork.clone_steps_s
    groups = sorted(p.name for p in rt.cgroup.path("memory").iterdir() if p.is_dir())
    assert rt.shell_stats().started == 0 and groups == sorted([f"ws-{source.id}", f"ws-{clone.id}"])


@pytest.mark.parametrize("fault", ["shell.holder", "shell.holder:exit", "shell.holder:hang"])
async def test_a_shell_whose_holder_fails_leaves_nothing_and_forks_go_on_without_it(make_runtime, monkeypatch,
                                                                                   fault: str) -> None:
    from bunshin.envs.runtime import shells

    monkeypatch.setattr(shells, "HOLDER_READY_TIMEOUT_S", 2.0)
    rt: WorkspaceRuntime = await make_runtime(faults=[fault], prepared_shells=2)
    source = await rt.create(heap_app())
    assert await until(lambda: rt.shell_stats().failed >= 1, 30), rt.shell_stats()
    assert await until(lambda: rt.hosts.shells.ready(SHELLS) == [] and not rt.hosts.shells.maker.making, 10)
    assert workspace_groups(rt) == [f"ws-{source.id}"]
    assert sorted(rt.cgroup.procs()) == [source.pid]  # no holder lives on, hung or not
    clone = await source.fork()  # a miss: the fork makes its own cgroup and namespaces
    assert not clone.last_fork.shell
    assert await out(clone, "hostname") == f"ws-{clone.id}"


async def test_a_cancelled_shell_making_leaves_nothing(make_runtime) -> None:
    """Cancelled as it asks the nursery for the holder: the exchange runs to its end, the holder is killed, the
    cgroup removed."""
    point = "shell.make"
    rt: WorkspaceRuntime = await make_runtime(prepared_shells=1)
    source = await rt.create(heap_app())
    await rt.hosts.shells.aclose()  # the run's own filling is stopped: this test makes one by hand
    task = asyncio.ensure_future(rt.hosts.shells.maker.make())
    with await_points.hook(cancel_at(task, point), point), pytest.raises(asyncio.CancelledError):
        await task
    assert not rt.hosts.shells.maker.making
    assert workspace_groups(rt) == [f"ws-{source.id}"]
    assert await until(lambda: sorted(rt.cgroup.procs()) == [source.pid], 10), rt.cgroup.procs()


@pytest.mark.parametrize("fault", ["clone.after_attach", "clone.after_attach:exit", "clone.after_attach:hang",
                                   "clone.before_cgroup", "clone.after_cgroup"])
async def test_a_fault_at_the_attach_or_in_the_clone_leaves_no_half_built_clone(make_runtime, fault: str) -> None:
    rt: WorkspaceRuntime = await make_runtime(faults=[fault], prepared_shells=1, start_timeout_s=5.0)
    source = await rt.create(heap_app())
    assert await shells_ready(rt, 1), rt.shell_stats()
    (shell,) = rt.hosts.shells.ready(SHELLS)
    layers = set(pool_layers(rt))
    with pytest.raises(ForkFailed):
        await source.fork()
    assert rt.shell_stats().hits == 1
    assert not os.path.exists(f"/proc/{shell.holder_pid}") or await until(
        lambda: not os.path.exists(f"/proc/{shell.holder_pid}"), 10)
    assert f"ws-{shell.id}" not in workspace_groups(rt) and workspace_groups(rt) == [f"ws-{source.id}"]
    assert workspace_procs(rt) == [source.pid]
    assert set(pool_layers(rt)) == layers and list(rt.workspaces) == [source.id]
    assert await out(source, "echo alive") == "alive"


async def test_a_shell_whose_holder_died_while_it_waited_is_not_handed_out(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(prepared_shells=1)
    source = await rt.create(heap_app())
    assert await shells_ready(rt, 1), rt.shell_stats()
    (shell,) = rt.hosts.shells.ready(SHELLS)
    os.kill(shell.holder_pid, 9)
    assert await until(lambda: not shell.holder_alive(), 10)
    clone = await source.fork()
    assert not clone.last_fork.shell or clone.id != shell.id
    assert await out(clone, "hostname") == f"ws-{clone.id}"
    assert await until(lambda: f"ws-{shell.id}" not in workspace_groups(rt) and not any(
        p.name == f"ws-{shell.id}" for p in rt.cgroup.path("memory").iterdir()), 10)


async def test_unused_shells_go_with_the_run(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(prepared_shells=3)
    await rt.create(heap_app())
    assert await shells_ready(rt, 3), rt.shell_stats()
    shells = rt.hosts.shells.ready(SHELLS)
    fds = engine_fds()
    await rt.hosts.shells.aclose()  # what the run's close does first, before the nursery and the run's cgroup go
    assert rt.shell_stats().unused == 3
    assert not [s.holder_pid for s in shells if os.path.exists(f"/proc/{s.holder_pid}")]  # reaped, not zombies
    assert not [s.id for s in shells if rt.cgroup.child(f"ws-{s.id}").path("memory").exists()]
    assert engine_fds() == fds - 3  # their pidfds closed
