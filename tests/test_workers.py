"""State kept in a worker process of the host is forked with the workspace: copy-on-write both ways, the worker's
clone inside the clone's namespaces and cgroup, files re-opened and sockets re-created there."""

from __future__ import annotations

import os

import pytest

from bunshin.envs import AppSpec, ToolCall, WorkspaceRuntime

pytestmark = pytest.mark.asyncio
KV = AppSpec(target="tests.apps.kv:KVApp")


async def tool(ws, name: str, **args):
    obs = await ws.execute(ToolCall(name=name, args=args))
    assert obs.error is None, obs
    return obs


async def test_worker_state_forks_with_the_workspace(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(KV)
    await tool(source, "kv_set", key="k", value="before")
    clone = await source.fork()
    await tool(clone, "kv_set", key="k", value="clone")
    await tool(source, "kv_set", key="k", value="source")
    assert (await tool(clone, "kv_get", key="k")).output == "'clone'"
    assert (await tool(source, "kv_get", key="k")).output == "'source'"
    grandchild = await clone.fork()
    assert (await tool(grandchild, "kv_get", key="k")).output == "'clone'"
    # the journal the worker keeps open was re-opened in each clone's own files
    log = lambda ws: tool(ws, "shell", cmd="cat ~/kv.log")  # noqa: E731
    assert (await log(source)).output == "k=before\nk=source\n"
    assert (await log(clone)).output == "k=before\nk=clone\n"


async def test_worker_clone_lives_in_the_clones_workspace(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(KV)
    clone = await source.fork()
    src_id, clone_id = (await tool(source, "kv_identity")).data, (await tool(clone, "kv_identity")).data
    assert src_id["pid"] != clone_id["pid"]
    assert clone_id["hostname"] == f"ws-{clone.id}" and clone_id["ws"] == clone.id
    assert src_id["hostname"] == f"ws-{source.id}"
    for ns in ("mnt", "net", "uts", "ipc"):
        assert os.readlink(f"/proc/{clone_id['pid']}/ns/{ns}") == os.readlink(f"/proc/{clone.pid}/ns/{ns}"), ns
    assert sorted(runtime.cgroup.child(f"ws-{clone.id}").procs()) == sorted([clone.pid, clone_id["pid"]])
    assert sorted(runtime.cgroup.child(f"ws-{source.id}").procs()) == sorted([source.pid, src_id["pid"]])
    # its listening socket exists in the clone's network namespace
    port = clone_id["port"]
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); "
             "print('ok')\"")
    assert (await tool(clone, "shell", cmd=probe)).output == "ok\n"
    # clones of one snapshot draw different numbers in their workers too
    snap = await source.snapshot()
    a, b = await snap.fork(), await snap.fork()
    assert (await tool(a, "kv_random")).data != (await tool(b, "kv_random")).data


async def test_closing_a_workspace_ends_its_workers(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(KV)
    clone = await source.fork()
    worker = (await tool(clone, "kv_identity")).data["pid"]
    await clone.close()
    assert not os.path.exists(f"/proc/{worker}")
    assert (await tool(source, "kv_get", key="x")).output == "None"


async def test_dead_host_with_workers_leaves_no_zombies(runtime: WorkspaceRuntime) -> None:
    import signal

    from bunshin.envs import WorkspaceBroken

    source = await runtime.create(KV)
    clone = await source.fork()
    for ws in (source, clone):
        os.kill(ws.pid, signal.SIGKILL)
        with pytest.raises(WorkspaceBroken, match="killed by SIGKILL"):
            await tool(ws, "kv_get", key="k")
        await ws.close()
    # (the fixture then checks that no process, zombie included, is left)


async def test_a_worker_serves_its_socket_in_each_clone(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(KV)
    await tool(source, "kv_set", key="k", value="source")
    clone = await source.fork()
    await tool(clone, "kv_set", key="k", value="clone")
    assert (await tool(source, "kv_fetch", key="k")).output == "source"
    assert (await tool(clone, "kv_fetch", key="k")).output == "clone"
    missing = await tool(clone, "kv_fetch", key="nope")
    assert missing.data["status"] == 404
    # agents reach it too, over their workspace's loopback
    port = (await tool(clone, "kv_identity")).data["port"]
    fetch = f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/k').read().decode())\""
    assert (await tool(clone, "shell", cmd=fetch)).output == "clone\n"
