"""The workspace contract, one set of tests run on both implementations: the real runtime (root: namespaces, cgroups,
host processes) and the in-memory one (``envs/memory_workspace.py``, any user). Each test takes ``rt``, a started
runtime of either kind (ids ``memory`` / ``real``; ``-k memory`` runs the half that needs no root). The app is
``tests/apps/counter.py``, whose state is plain Python objects, so it runs alike in both. The in-memory workspace's
own decisions (what it refuses, files in its directory, modelled latency) are tested at the end.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from bunshin.envs import (
    AppSpec,
    CallDeadlineExceeded,
    ForkFailed,
    Limits,
    RequestRefused,
    ToolCall,
    WorkspaceBroken,
    WorkspaceClosed,
    WorkspaceRuntime,
    WorkspaceStartFailed,
    derive_seed,
)
from bunshin.envs.app import AppContext, Tool, WorkspaceApp
from bunshin.envs.memory_workspace import Latency, MemoryRuntime, NeedsRealWorkspace
from bunshin.envs.records import Observation
from bunshin.envs.workspace import Snapshot, Workspace, deadline_s

from .conftest import assert_no_leaks
from .quiet import all_tasks_blocked

pytestmark = pytest.mark.asyncio

COUNTER = AppSpec(target="tests.apps.counter:CounterApp")
LIMITS = Limits(memory_bytes=256 << 20, pids=64, command_timeout_s=30, deadline_grace_s=0.5)


@pytest_asyncio.fixture(params=["memory", "real", "docker"])
async def rt(request: pytest.FixtureRequest, state_dir: Path, tmp_path: Path) -> AsyncIterator[Any]:
    """A started runtime of any kind; closed and checked for leftovers after the test. ``docker``: the real
    runtime with every workspace a Docker container on the declared image ``base`` (``--runtime docker``)."""
    if request.param in ("real", "docker"):
        if os.geteuid() != 0:
            pytest.skip("the real runtime needs root")
        kind = {} if request.param == "real" else {
            "runtime": "docker", "image": request.getfixturevalue("base_docker_ref")}
        runtime: Any = WorkspaceRuntime(state_dir=state_dir, limits=LIMITS, **kind)
    else:
        runtime = MemoryRuntime(state_dir=tmp_path, limits=LIMITS)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()
    if request.param in ("real", "docker"):
        await assert_no_leaks(runtime)
    else:
        assert runtime.workspaces == {} and not runtime.run_dir.exists()


def live_hook(rt: Any) -> int:
    """How many ``after_fork`` hooks a clone's app ran: one in a live clone; none under ``--runtime docker``, whose
    clone is a fresh container whose app restores its source's dump instead (``restore`` runs, not the hook)."""
    return 0 if getattr(rt, "runtime_kind", "") == "docker" else 1


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(name=name, args=args)


async def value(ws: Any) -> int:
    return (await ws.execute(call("_value"))).data["value"]


async def test_a_call_runs_the_apps_tool_and_a_failing_tool_is_an_observation(rt: Any) -> None:
    ws = await rt.create(COUNTER, seed=7)
    assert (await ws.execute(call("add", n=3))).output == "value 3"
    got = await ws.execute(call("get"))
    assert got.data == {"value": 3, "notes": []} and got.error is None and got.tool_seconds >= 0
    assert (await ws.execute(call("add", n="x"))).error == "add needs an integer 'n', got 'x'"
    assert (await ws.execute(call("fail"))).error == "asked to fail"
    assert (await ws.execute(call("crash"))).error == "tool 'crash' failed: ValueError: asked to crash"
    unknown = await ws.execute(call("nope"))
    assert unknown.error is not None and unknown.error.startswith("unknown tool 'nope' (available: [")
    assert "'shell'" in unknown.error  # the built-in tool is listed by both
    assert await value(ws) == 3 and ws.broken is None
    assert (ws.seed, ws.parent, ws.generation, ws.frozen, ws.closed) == (7, None, 0, False, False)
    assert rt.workspaces[ws.id] is ws
    assert isinstance(ws, Workspace) and not isinstance(ws, Snapshot)  # an implementation of the one contract


async def test_a_call_asks_for_a_positive_finite_timeout(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout_s"):
            await ws.execute(call("get"), timeout_s=bad)
    assert (await ws.execute(call("add", n=1), timeout_s=5)).output == "value 1"


async def test_forks_are_isolated_both_ways(rt: Any) -> None:
    source = await rt.create(COUNTER)
    await source.execute(call("add", n=10))
    await source.execute(call("note", text="before"))
    clone = await source.fork()
    assert (clone.parent, clone.generation, clone.frozen) == (source.id, 1, False)
    assert clone.last_fork is not None and clone.last_fork.ready_s >= clone.last_fork.freeze_s >= 0
    await source.execute(call("add", n=1))
    await source.execute(call("note", text="source"))
    await clone.execute(call("add", n=100))
    await clone.execute(call("note", text="clone"))
    assert (await source.execute(call("get"))).data == {"value": 11, "notes": ["before", "source"]}
    assert (await clone.execute(call("get"))).data == {"value": 110, "notes": ["before", "clone"]}
    grandchild = await clone.fork()
    await clone.close()  # a clone's clone outlives it
    assert (await grandchild.execute(call("get"))).data == {"value": 110, "notes": ["before", "clone"]}
    assert grandchild.generation == 2 and grandchild.parent == clone.id


async def test_clones_get_derived_seeds_a_reseeded_stream_and_their_after_fork(rt: Any) -> None:
    source = await rt.create(COUNTER, seed=11)
    assert (await source.execute(call("draw"))).data["draw"] == random.Random(11).getrandbits(32)
    first, second = await source.fork(), await source.fork()
    assert first.seed == derive_seed(11, "fork", 1) and second.seed == derive_seed(11, "fork", 2)
    chosen = await source.fork(seed=1234)
    assert chosen.seed == 1234
    for clone in (first, second, chosen):
        me = (await clone.execute(call("whoami"))).data
        assert me == {"ws": clone.id, "seed": clone.seed, "after_forks": live_hook(rt)}
        assert (await clone.execute(call("draw"))).data["draw"] == random.Random(clone.seed).getrandbits(32)
    twin = await source.fork(seed=1234)  # the same seed from the same state: the same draws
    assert (await twin.execute(call("draw"))).data == (await (await source.fork(seed=1234)).execute(call("draw"))).data
    assert (await source.execute(call("whoami"))).data["after_forks"] == 0  # the source ran no after_fork


async def test_a_snapshot_refuses_tools_and_forks_into_running_clones(rt: Any) -> None:
    source = await rt.create(COUNTER, seed=3)
    await source.execute(call("add", n=5))
    snap = await source.snapshot()
    assert snap.frozen and snap.parent == source.id and snap.seed == derive_seed(3, "fork", 1)
    assert isinstance(snap, Snapshot)
    with pytest.raises(RequestRefused) as refused:
        await snap.execute(call("get"))
    assert refused.value.kind == "bad_request" and refused.value.ws_id == snap.id
    await source.execute(call("add", n=1))  # the source moves on; the snapshot keeps its state
    clones = [await snap.fork(), await snap.fork(seed=99)]
    assert clones[0].seed == derive_seed(snap.seed, "fork", 1) and clones[1].seed == 99
    for clone in clones:
        assert not clone.frozen and clone.parent == snap.id and clone.generation == 2
        assert await value(clone) == 5
        assert (await clone.execute(call("whoami"))).data["after_forks"] == live_hook(rt)  # the snapshot ran none
        assert (await clone.execute(call("draw"))).data["draw"] == random.Random(clone.seed).getrandbits(32)
    await clones[0].execute(call("add", n=2))
    assert await value(clones[1]) == 5 and await value(source) == 6
    assert await value(await snap.fork()) == 5


async def test_a_call_over_its_deadline_raises_and_leaves_the_workspace_broken(rt: Any) -> None:
    stuck, bystander = await rt.create(COUNTER), await rt.create(COUNTER)
    with pytest.raises(CallDeadlineExceeded) as info:
        await stuck.execute(call("sleep", seconds=1.5), timeout_s=0.2)
    assert info.value.tool == "sleep" and info.value.deadline_s == deadline_s(0.2, LIMITS) == 0.7
    assert isinstance(info.value, WorkspaceBroken) and isinstance(info.value, TimeoutError)
    assert stuck.broken is not None and "overran its deadline" in stuck.broken
    with pytest.raises(WorkspaceBroken, match="overran its deadline"):
        await stuck.execute(call("get"))
    with pytest.raises(WorkspaceBroken, match="overran its deadline"):
        await stuck.fork()
    assert (await bystander.execute(call("add", n=1))).output == "value 1"
    await stuck.close()
    assert stuck.closed and stuck.id not in rt.workspaces


async def test_a_state_over_the_memory_limit_breaks_the_workspace(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    with pytest.raises(WorkspaceBroken, match="memory limit"):
        await ws.execute(call("grow", nbytes=384 << 20))
    with pytest.raises(WorkspaceBroken, match="memory limit"):
        await ws.execute(call("get"))
    await ws.close()


async def test_a_closed_workspace_refuses_use_and_closes_twice_and_concurrently(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    first, second = asyncio.ensure_future(ws.close()), asyncio.ensure_future(ws.close())
    await second
    assert ws.closed and ws.id not in rt.workspaces  # the second returned once the first's teardown was done
    await first
    await ws.close()  # a third, later, returns at once
    with pytest.raises(WorkspaceClosed):
        await ws.execute(call("get"))
    with pytest.raises(WorkspaceClosed):
        await ws.fork()
    with pytest.raises(WorkspaceClosed):
        await ws.snapshot()


async def test_a_close_whose_caller_was_cancelled_still_finishes(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    await ws.execute(call("add", n=1))
    closing = asyncio.ensure_future(ws.close())
    await asyncio.sleep(0)  # one turn of the loop: the new task runs to its first await, inside close
    assert ws.closed and not closing.done()  # the close has started, and not finished
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert ws.closed
    await ws.close()  # returns once the teardown the cancelled caller started has finished
    assert ws.id not in rt.workspaces


async def test_a_cancelled_callers_call_still_runs_and_the_next_request_waits_for_it(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    slow = asyncio.ensure_future(ws.execute(call("slow_add", n=5, seconds=0.3)))
    await all_tasks_blocked()  # sent: the tool is running
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await value(ws) == 5  # the call ran to its end before this one
    assert ws.broken is None


async def test_memory_figures_are_sane(rt: Any) -> None:
    ws = await rt.create(COUNTER)
    await ws.execute(call("grow", nbytes=8 << 20))
    clone = await ws.fork()
    snap = await ws.snapshot()
    for w in (ws, clone, snap):
        m = await asyncio.to_thread(w.memory)
        assert min(m.pss, m.private, m.shared, m.rss, m.anon_huge, m.cgroup_charge) >= 0, m
        assert m.processes >= 1 and m.pss <= m.rss and m.private <= m.rss, m
        assert w.charge() >= 0
    assert (await asyncio.to_thread(ws.memory)).rss >= 8 << 20  # the state is in it
    await clone.execute(call("grow", nbytes=16 << 20))  # written in the clone: its own
    assert clone.charge() >= 16 << 20
    assert (await asyncio.to_thread(rt.memory)).rss >= 8 << 20


# -- the in-memory workspace's own decisions --------------------------------------------------------------------


class JournalApp(WorkspaceApp):
    """Files in the workspace's directory (the one thing an in-memory app may keep outside its objects)."""

    def setup(self, ctx: AppContext) -> None:
        self.journal = ctx.open("journal.txt", "w")

    def tools(self) -> dict[str, Tool]:
        return {"write": self._write, "read": self._read}

    def _write(self, args: dict[str, Any]) -> Observation:
        self.journal.file.write(args["text"])
        return Observation(output="ok")

    def _read(self, args: dict[str, Any]) -> Observation:
        self.journal.file.flush()
        with open(self.journal.path) as f:
            return Observation(output=f.read())


class Refuser(WorkspaceApp):
    """Asks at setup for what only a real workspace has: ``what`` says which."""

    def __init__(self, what: str):
        self.what = what

    def setup(self, ctx: AppContext) -> None:
        match self.what:
            case "listen":
                ctx.listen(0)
            case "spawn":
                ctx.spawn("tests.apps.kv:KVWorker", journal="kv.log")
            case "open":
                ctx.open("/etc/hostname")
            case "agent":
                ctx.run_agent("ls", 1.0)


class Uncopyable(WorkspaceApp):
    def setup(self, ctx: AppContext) -> None:
        import threading

        self.lock = threading.Lock()

    def tools(self) -> dict[str, Tool]:
        return {"ping": lambda args: Observation(output="pong")}


@pytest_asyncio.fixture
async def mem(tmp_path: Path) -> AsyncIterator[MemoryRuntime]:
    async with MemoryRuntime(state_dir=tmp_path, limits=LIMITS) as runtime:
        yield runtime
    assert runtime.workspaces == {} and not runtime.run_dir.exists()


@pytest.mark.parametrize("what", ["listen", "spawn", "open", "agent"])
async def test_memory_refuses_what_needs_a_real_workspace_naming_the_app_and_the_call(mem: MemoryRuntime,
                                                                                      what: str) -> None:
    target = "tests.test_workspace_contract:Refuser"
    with pytest.raises(NeedsRealWorkspace, match=f"{target}: ctx\\.") as info:
        await mem.create(AppSpec(target=target, kwargs={"what": what}))
    assert info.value.app == target
    assert not any(mem.run_dir.iterdir())  # nothing of the workspace is left


async def test_memory_refuses_shell_images_and_restores(mem: MemoryRuntime) -> None:
    ws = await mem.create(COUNTER)
    with pytest.raises(NeedsRealWorkspace, match="the tool 'shell'"):
        await ws.execute(call("shell", cmd="ls"))
    assert ws.broken is None and (await ws.execute(call("add", n=1))).output == "value 1"
    with pytest.raises(NeedsRealWorkspace, match="image"):
        await ws.image("n-1")
    with pytest.raises(NeedsRealWorkspace, match="restore_image"):
        await mem.restore_image(COUNTER, None, lambda upper: None)


async def test_memory_start_failures_are_typed(mem: MemoryRuntime) -> None:
    with pytest.raises(WorkspaceStartFailed, match="TypeError"):
        await mem.create(AppSpec(target="tests.apps.counter:CounterApp", kwargs={"nope": 1}))
    with pytest.raises(WorkspaceStartFailed, match="not a WorkspaceApp"):
        await mem.create(AppSpec(target="tests.apps.counter:MAX_SLEEP_S"))
    assert mem.workspaces == {}


async def test_memory_files_in_the_workspace_directory_fork_with_it(mem: MemoryRuntime) -> None:
    source = await mem.create(AppSpec(target="tests.test_workspace_contract:JournalApp"))
    await source.execute(call("write", text="a"))
    clone = await source.fork()
    snap = await source.snapshot()
    await clone.execute(call("write", text="clone"))
    await source.execute(call("write", text="source"))
    assert (await clone.execute(call("read"))).output == "aclone"
    assert (await source.execute(call("read"))).output == "asource"
    later = await snap.fork()
    await later.execute(call("write", text="snap"))
    assert (await later.execute(call("read"))).output == "asnap"
    dirs = {ws.directory for ws in (source, clone, snap, later)}
    assert len(dirs) == 4 and all(Path(d).parent == mem.run_dir for d in dirs)
    await later.close()
    assert not Path(later.directory).exists()


async def test_memory_a_state_it_cannot_copy_fails_the_fork_and_the_source_runs_on(mem: MemoryRuntime) -> None:
    source = await mem.create(AppSpec(target="tests.test_workspace_contract:Uncopyable"))
    with pytest.raises(ForkFailed, match="could not be copied in memory"):
        await source.fork()
    assert list(mem.workspaces) == [source.id] and len(list(mem.run_dir.iterdir())) == 1
    assert (await source.execute(call("ping"))).output == "pong"


async def test_memory_modelled_latency_is_slept_and_reported(tmp_path: Path) -> None:
    latency = Latency(fork_s=0.05, snapshot_s=0.02, call_s=0.7)
    async with MemoryRuntime(state_dir=tmp_path, latency=latency, limits=LIMITS) as runtime:
        ws = await runtime.create(COUNTER)
        clone = await ws.fork()
        assert clone.last_fork is not None and clone.last_fork.ready_s >= 0.05 > clone.last_fork.freeze_s
        snap = await ws.snapshot()
        assert snap.last_fork is not None and snap.last_fork.ready_s >= 0.02
        # a call's modelled round trip is inside its deadline: 0.7 s > 0.1 s asked + 0.5 s grace
        with pytest.raises(CallDeadlineExceeded):
            await ws.execute(call("add", n=1), timeout_s=0.1)
        assert (await clone.execute(call("add", n=1))).output == "value 1"
    with pytest.raises(ValueError, match="call_s"):
        Latency(call_s=-1)


async def test_memory_a_fork_cancelled_in_its_modelled_latency_leaves_no_clone(tmp_path: Path) -> None:
    async with MemoryRuntime(state_dir=tmp_path, latency=Latency(fork_s=30)) as runtime:
        ws = await runtime.create(COUNTER)
        forking = asyncio.ensure_future(ws.fork())
        await all_tasks_blocked()
        forking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await forking
        assert list(runtime.workspaces) == [ws.id] and len(list(runtime.run_dir.iterdir())) == 1
