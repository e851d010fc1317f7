"""The live fork (cow backend): copy-on-write isolation both ways, sharing, snapshots, chains, seeds, undo."""

from __future__ import annotations

import pytest

from bunshin.envs import AppSpec, ForkFailed, RequestRefused, Snapshot, ToolCall, Workspace, WorkspaceRuntime
from bunshin.envs.runtime.cgroups import Cgroup

from .conftest import heap_app, pool_layers, workspace_groups

pytestmark = pytest.mark.asyncio


def sh(cmd: str) -> ToolCall:
    return ToolCall(name="shell", args={"cmd": cmd})


async def out(ws: Workspace, cmd: str) -> str:
    obs = await ws.execute(sh(cmd))
    assert obs.error is None, obs
    return obs.output.strip()


async def get(ws: Workspace, key: str) -> str:
    return (await ws.execute(ToolCall(name="get", args={"key": key}))).output


async def put(ws: Workspace, key: str, value: object) -> None:
    await ws.execute(ToolCall(name="set", args={"key": key, "value": value}))


async def page(ws: Workspace, n: int) -> int:
    return (await ws.execute(ToolCall(name="read_page", args={"page": n}))).data["byte"]


async def write_page(ws: Workspace, n: int, value: int) -> None:
    await ws.execute(ToolCall(name="write_pages", args={"page": n, "value": value}))


async def test_memory_and_files_are_copy_on_write_both_ways(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(heap_app())
    await put(source, "k", "before")
    await write_page(source, 3, 11)
    await out(source, "echo before > ~/f")
    clone = await source.fork()

    # the clone starts from the source's state
    assert await get(clone, "k") == "'before'"
    assert await page(clone, 3) == 11
    assert await out(clone, "cat ~/f") == "before"

    # the source's writes are not seen by the clone, and then the clone's are not seen by the source
    seen_by_reader = {"k": "'before'", "page": 11, "files": "before\nf"}
    for writer, reader, name, value in ((source, clone, "source", 22), (clone, source, "clone", 33)):
        await put(writer, "k", name)
        await write_page(writer, 3, value)
        await out(writer, f"echo {name} > ~/f; echo x > ~/only-{name}")
        assert await get(reader, "k") == seen_by_reader["k"]
        assert await page(reader, 3) == seen_by_reader["page"]
        assert await out(reader, "cat ~/f; ls ~") == seen_by_reader["files"]
        seen_by_reader = {"k": f"'{name}'", "page": value, "files": f"{name}\nf\nonly-{name}"}


async def test_fork_of_fork_sees_its_own_parents_state(runtime: WorkspaceRuntime) -> None:
    a = await runtime.create(heap_app())
    await put(a, "k", "a")
    b = await a.fork()
    await put(b, "k", "b")
    await out(b, "echo b > ~/f")
    await put(a, "k", "a2")
    c = await b.fork()
    assert await get(c, "k") == "'b'"
    assert await out(c, "cat ~/f") == "b"
    assert c.parent == b.id and c.generation == 2
    assert await get(a, "k") == "'a2'"


async def test_clone_of_256mib_workspace_shares_its_memory(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(heap_app(256 << 20))
    clone = await source.fork()
    mem = clone.memory()
    assert mem.processes == 1
    assert mem.private <= 8 << 20, f"clone holds {mem.private / 2**20:.1f} MiB private right after the fork"
    assert mem.shared >= 256 << 20
    # after writing 10% of its heap pages it owns about that much, not the whole heap
    await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.10}))
    after = clone.memory().private
    assert 20 << 20 <= after <= 40 << 20, after


async def test_snapshot_is_frozen_and_forkable_later(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(heap_app())
    await put(source, "k", "at-snapshot")
    await out(source, "echo snap > ~/f")
    snap = await source.snapshot()
    assert isinstance(snap, Snapshot)
    with pytest.raises(RequestRefused):
        await snap.execute(sh("true"))
    await put(source, "k", "later")
    await out(source, "echo later > ~/f")
    one, two = await snap.fork(), await snap.fork()
    for clone in (one, two):
        assert await get(clone, "k") == "'at-snapshot'"
        assert await out(clone, "cat ~/f") == "snap"
    await out(one, "echo one > ~/f")
    assert await out(two, "cat ~/f") == "snap"
    # the snapshot's layer is read-only: nothing a clone does reaches it
    assert await out((await snap.fork()), "cat ~/f") == "snap"


async def test_chain_of_64_generations_outlives_its_ancestors(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app(4 << 20))
    chain = [ws]
    for gen in range(1, 65):
        await put(ws, f"g{gen}", gen)
        nxt = await ws.fork()
        if gen % 2 == 0:
            await chain[-1].close()  # an ancestor going away must not take its descendants with it
        chain.append(nxt)
        ws = nxt
    assert ws.generation == 64
    assert await get(ws, "g64") == "64"
    assert await get(ws, "g1") == "1"
    await out(ws, "echo deep > ~/f")
    assert await out(ws, "cat ~/f; hostname") == f"deep\nws-{ws.id}"


async def test_clones_draw_their_own_random_streams(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(heap_app())
    snap = await source.snapshot()
    draw = ToolCall(name="random", args={"n": 6})
    a, b = await snap.fork(), await snap.fork()
    ra, rb = (await a.execute(draw)), (await b.execute(draw))
    assert ra.output != rb.output and ra.data != rb.data
    same1, same2 = await snap.fork(seed=1234), await snap.fork(seed=1234)
    r1, r2 = (await same1.execute(draw)), (await same2.execute(draw))
    assert r1.output == r2.output and r1.data == r2.data


@pytest.mark.parametrize("fault", ["fork.before_snapshot", "fork.after_snapshot", "clone.before_cgroup",
                                   "clone.after_cgroup"])
async def test_failed_fork_leaves_source_running_and_nothing_behind(make_runtime, fault: str) -> None:
    rt = await make_runtime(faults=[fault])
    source = await rt.create(heap_app())
    await put(source, "k", "v")
    before_layers = set(pool_layers(rt))
    with pytest.raises(ForkFailed):
        await source.fork()
    assert await get(source, "k") == "'v'"
    assert set(pool_layers(rt)) == before_layers
    assert workspace_groups(rt) == [f"ws-{source.id}"]
    assert list(rt.workspaces) == [source.id]


async def test_clone_gets_own_cgroup_and_namespaces(runtime: WorkspaceRuntime) -> None:
    import os

    source = await runtime.create(heap_app())
    clone = await source.fork()
    assert Cgroup(runtime.layout, f"{runtime.cgroup.rel}/ws-{clone.id}").procs() == [clone.pid]
    for ns in ("mnt", "net", "uts", "ipc"):
        assert os.readlink(f"/proc/{clone.pid}/ns/{ns}") != os.readlink(f"/proc/{source.pid}/ns/{ns}"), ns
        assert os.readlink(f"/proc/{clone.pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    assert await out(clone, "hostname") == f"ws-{clone.id}"


async def test_agent_jobs_are_frozen_for_the_fork_and_run_on_after(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    await out(ws, "(while true; do echo tick >> ~/ticks; sleep 0.01; done) > /dev/null 2>&1 & echo started")
    agents = runtime.cgroup.child(f"ws-{ws.id}/agent")
    assert len(agents.procs()) >= 2  # the agent namespace's init and the loop
    assert ws.pid not in agents.procs()
    clone = await ws.fork()
    count = "wc -l < ~/ticks"
    at_fork, before = int(await out(clone, count)), int(await out(ws, count))
    # the source's job was thawed after the fork: it ticks on (another process: polled in the shell, within the
    # command's timeout) ...
    await out(ws, f"until [ $({count}) -ge {before + 20} ]; do sleep 0.01; done")
    assert int(await out(clone, count)) == at_fork  # ... while nothing writes the clone's copy: the job is the source's


async def test_a_clone_that_renders_once_more_does_not_copy_the_render_buffers(runtime: WorkspaceRuntime) -> None:
    """A tool that fills and frees a large buffer at every call (a page's render). The source has run it before
    the fork; the clone runs it once more and keeps almost nothing: the buffer is a mapping of its own, given back
    when freed (``host.fork_friendly_malloc``), not heap pages shared with the source and rewritten, which the
    clone would keep a copy of (8 MiB here: glibc raises its mmap threshold to a block once it was freed)."""
    source = await runtime.create(AppSpec(target="tests.apps.probe:ProbeApp"))
    scratch = ToolCall(name="scratch", args={"nbytes": 8 << 20, "times": 3})
    assert (await source.execute(scratch)).error is None
    clone = await source.fork()
    before = clone.memory().private
    assert (await clone.execute(scratch)).error is None
    grown = clone.memory().private - before
    assert grown < 2 << 20, f"the clone kept {grown / 2**20:.1f} MiB after one render"
