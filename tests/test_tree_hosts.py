"""Workspaces under the tree-fork backend (``--backend kmod``) on this host, whose kernel cannot load the module:
their hosts are tree-fork hosts (pid 1 of a PID namespace of their own, agents in it, the engine's descriptors at
fixed numbers) and the tree fork's reader reads a live one without a refusal; the fork itself is refused, naming
why, and leaves nothing behind. The fork runs in the VM (``kmod/vmtest``'s ``treefork: engine``)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import pytest

from bunshin.envs import AppSpec, ForkFailed, RequestRefused, ToolCall, WorkspaceRuntime
from bunshin.envs.runtime import await_points, image
from bunshin.envs.runtime.fork import kmod
from bunshin.envs.runtime.fork.kmod import BUILDER_ENV, tree_init
from bunshin.envs.runtime.host_workspace import HostWorkspace
from bunshin.envs.runtime.protocol import TREE_CGROUP_FD, TREE_CHANNEL_FD, Become
from bunshin.envs.runtime.treefork.procfs import last, status, walk
from bunshin.envs.runtime.treefork.reader import read_tree

from .conftest import cancel_at, pool_layers

KMOD = Path(__file__).resolve().parent.parent / "kmod"
PROBE = AppSpec(target="tests.apps.probe:ProbeApp")
SHOP = AppSpec(target="bunshin.envs.webshop.app:ShopApp", kwargs={"catalog_size": 200})
LAUNCHER = AppSpec(target="tests.apps.launcher:LauncherApp")


def shell(cmd: str) -> ToolCall:
    return ToolCall(name="shell", args={"cmd": cmd})


def states(pid: int) -> dict[int, str]:
    """Every process of the tree below ``pid`` (ours): its state letter."""
    return {p: status(p)["State"][0] for p in walk(pid)}


@pytest.mark.asyncio
async def test_a_tree_hosts_processes_share_its_pid_namespace_and_orphans_are_reaped(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(PROBE)
    assert isinstance(ws, HostWorkspace)
    assert last(status(ws.pid)["NSpid"]) == 1, "the host is pid 1 of its own namespace"
    assert tree_init(ws.pid) == ws.pid
    obs = await ws.execute(shell("sleep 1 > /dev/null 2>&1 & echo $$ $!; readlink /proc/self/ns/pid"))
    assert obs.exit_code == 0, obs
    lines = obs.output.split()
    assert lines[2] == os.readlink(f"/proc/{ws.pid}/ns/pid"), f"the agent is in the host's pid namespace: {obs}"
    assert 1 < int(lines[0]) < 100, "numbered in the host's namespace"
    deadline = time.monotonic() + 20  # the background job exits, orphaned onto the host: a zombie of its until...
    while "Z" not in states(ws.pid).values():
        assert time.monotonic() < deadline, states(ws.pid)
        await asyncio.sleep(0.05)
    await ws.execute(ToolCall(name="echo", args={"text": "x"}))  # ...the host reaps it, before each request
    assert "Z" not in states(ws.pid).values(), states(ws.pid)
    fds = set(map(int, os.listdir(f"/proc/{ws.pid}/fd")))
    assert TREE_CHANNEL_FD in fds and TREE_CGROUP_FD in fds
    await ws.close()


@pytest.mark.asyncio
async def test_a_timed_out_command_takes_its_background_jobs_with_it(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(PROBE)
    obs = await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 300 & sleep 300", "timeout_s": 0.5}))
    assert obs.exit_code != 0 and "timed out" in (obs.error or "")
    assert [p for p in walk(ws.pid) if p != ws.pid] == [], states(ws.pid)
    obs = await ws.execute(shell("echo again"))
    assert obs.output.strip() == "again"
    await ws.close()


@pytest.mark.asyncio
async def test_the_tree_fork_reads_a_live_web_shop_workspace_without_a_refusal(make_runtime) -> None:
    """The webshop's host, its server worker and an agent's background job, frozen: read_tree plans every
    process and descriptor, the engine's (channel, log, cgroup hierarchies) as inherited."""
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(SHOP)
    assert isinstance(ws, HostWorkspace)
    await ws.execute(shell("sleep 60 > /dev/null 2>&1 &"))
    await ws.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/"}))
    ws.cgroup.freeze(True)
    try:
        inherit = {(1, TREE_CHANNEL_FD): 100, (1, 1): 101, (1, TREE_CGROUP_FD): 102}
        plan = read_tree(ws.pid, hostname="clone", inherit=inherit)
    finally:
        ws.cgroup.freeze(False)
    assert len(plan.processes) >= 3, [p.comm for p in plan.processes]  # host, server, the background job
    inherited = {f.count for f in plan.files if f.kind == "inherit"}
    assert {100, 101, 102} <= inherited
    await ws.close()


@pytest.mark.asyncio
async def test_an_application_process_runs_flat_in_a_cgroup_of_its_own_and_its_stop_takes_every_process(
        make_runtime) -> None:
    """On a tree-fork host a program an app launches (a browser, a display server) is in the host's PID and mount
    namespaces (the tree fork reads one of each: the live workspace reads without a refusal), in a cgroup of its own
    below the workspace's, its "tmpfs" path a directory of the workspace's files, the agent's; stopping it kills
    what it started, the daemon that left its session too, and removes its cgroup."""
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(LAUNCHER)
    assert isinstance(ws, HostWorkspace)
    program = (await ws.execute(ToolCall(name="launched", args={}))).data["pid"]
    deadline = time.monotonic() + 20
    while len([p for p in walk(ws.pid) if _comm(p) == "sleep"]) < 2:  # the daemon is the host's once orphaned
        assert time.monotonic() < deadline, states(ws.pid)
        await asyncio.sleep(0.05)
    host_program = next(p for p in walk(ws.pid) if last(status(p)["NSpid"]) == program)
    ours = [p for p in _cgroup_procs(ws, "app-1")]
    assert host_program in ours and len(ours) == 3, (ours, states(ws.pid))  # the program, its job, the daemon
    for p in ours:
        for kind in ("pid", "mnt"):
            assert os.readlink(f"/proc/{p}/ns/{kind}") == os.readlink(f"/proc/{ws.pid}/ns/{kind}"), (p, kind)
    cache = Path(f"/proc/{ws.pid}/root/tmp/launcher-cache")
    assert cache.is_dir() and (cache / "log").read_text() == "started\n"
    assert (cache.stat().st_uid, cache.stat().st_mode & 0o777) == (image.AGENT_UID, 0o700)
    ws.cgroup.freeze(True)
    try:
        plan = read_tree(ws.pid, hostname="clone", inherit={(1, TREE_CHANNEL_FD): 100, (1, 1): 101,
                                                            (1, TREE_CGROUP_FD): 102})
    finally:
        ws.cgroup.freeze(False)
    assert {p.comm for p in plan.processes} >= {"sleep"}, [p.comm for p in plan.processes]
    await ws.execute(ToolCall(name="stop", args={}))
    assert [p for p in walk(ws.pid) if p != ws.pid] == [], states(ws.pid)
    assert not any(d.exists() for d in ws.cgroup.child("app-1").dirs())
    await ws.close()


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _cgroup_procs(ws: HostWorkspace, name: str) -> list[int]:
    return [int(x) for x in (ws.cgroup.child(name).path("memory") / "cgroup.procs").read_text().split()]


@pytest.mark.asyncio
async def test_without_the_module_a_tree_fork_is_refused_naming_why_and_leaves_nothing(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(PROBE)
    layers = pool_layers(rt)
    with pytest.raises(ForkFailed, match="kmod: .*(/dev/bunshin|cgroup v2)"):
        await ws.fork()
    assert pool_layers(rt) == layers
    obs = await ws.execute(ToolCall(name="echo", args={"text": "still"}))
    assert "still" in obs.output
    await ws.close()


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tree-fork builder, built as ``kmod/vmtest`` builds it."""
    out = tmp_path_factory.mktemp("builder") / "bunshin-treefork"
    subprocess.run(["gcc", "-static", "-O2", "-Wall", "-Werror", "-Wno-unused-result", "-o", str(out),
                    str(KMOD / "treefork" / "builder.c"), "-lpthread"], check=True)
    return out


def mounts_below(path: Path) -> list[str]:
    """Mount points below ``path`` in any mount namespace this host has (ours, and every process's)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                text = (proc / "mountinfo").read_text()
            except OSError:
                continue
            found.update(line.split()[4] for line in text.splitlines() if line.split()[4].startswith(str(path)))
    return sorted(found)


@pytest.mark.asyncio
@pytest.mark.parametrize("point", [None, "fork.kmod.frozen", "fork.kmod.builder"])
async def test_a_tree_fork_that_fails_in_the_builder_or_is_cancelled_leaves_nothing_and_the_source_runs_on(
        make_runtime, builder: Path, monkeypatch: pytest.MonkeyPatch, point: str | None) -> None:
    """Without the module the builder gets as far as the clone's helpers (namespaces, root, open files, cgroup,
    pids kept) and fails at the graft's device: the fork fails naming it (or, cancelled at one of the engine's
    steps, is undone), the builder and its clone are gone, no cgroup, layer, root directory or mount of the clone is
    left, and the source, thawed, serves on."""
    monkeypatch.setenv(BUILDER_ENV, str(builder))
    monkeypatch.setattr(kmod, "why_not", lambda hosts: None)  # the engine's check; the builder finds out itself
    rt: WorkspaceRuntime = await make_runtime(backend="kmod")
    ws = await rt.create(SHOP)
    assert isinstance(ws, HostWorkspace)
    await ws.execute(shell("echo kept > ~/note; sleep 60 > /dev/null 2>&1 &"))
    layers, before = pool_layers(rt), set(walk(ws.pid))
    task = asyncio.ensure_future(ws.fork())
    if point is None:
        with pytest.raises(ForkFailed, match="/dev/bunshin"):
            await task
    else:
        with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
            await task
    assert pool_layers(rt) == layers
    assert sorted(p.name for p in (rt.run_dir / "roots").iterdir()) == [ws.id]
    assert mounts_below(rt.run_dir / "roots") == [], "the clone's root went with the builder's mount namespace"
    assert set(walk(ws.pid)) == before and all(s != "T" for s in states(ws.pid).values())
    assert [c.name for c in rt.cgroup.path("memory").iterdir() if c.name.startswith("ws-")] == [f"ws-{ws.id}"]
    obs = await ws.execute(shell("cat ~/note"))
    assert obs.output.strip() == "kept"
    await ws.close()



@pytest.mark.asyncio
async def test_only_a_tree_fork_clone_becomes_another_workspace(make_runtime) -> None:
    """``Become`` is for a tree-fork clone's host; a userspace-fork host refuses it and serves on as itself."""
    rt: WorkspaceRuntime = await make_runtime(backend="cow")
    ws = await rt.create(PROBE)
    assert isinstance(ws, HostWorkspace)
    with pytest.raises(RequestRefused, match="only a tree-fork clone"):
        await ws.request(Become(ws_id="other", seed=1, layer="ws-other", cgroup_rel="ws-other"))
    assert (await ws.execute(ToolCall(name="echo", args={"text": "me"}))).output.strip() == "me"
    await ws.close()
