"""The private-restore baseline behind the same interface, and the checkpoint files it restores from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.runtime import checkpoint_file

from .conftest import heap_app


@pytest.mark.asyncio
async def test_restored_clone_has_the_state_in_private_memory(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend="restore")
    source = await rt.create(heap_app(32 << 20))
    await source.execute(ToolCall(name="set", args={"key": "k", "value": [1, "two"]}))
    await source.execute(ToolCall(name="write_pages", args={"page": 5, "value": 77}))
    await source.execute(ToolCall(name="shell", args={"cmd": "echo restored > ~/f"}))
    clone = await source.fork()
    digest = ToolCall(name="digest")
    assert (await clone.execute(digest)).output == (await source.execute(digest)).output
    assert (await clone.execute(ToolCall(name="get", args={"key": "k"}))).output == "[1, 'two']"
    assert (await clone.execute(ToolCall(name="shell", args={"cmd": "cat ~/f"}))).output == "restored\n"
    # isolation both ways, as with the live fork
    await clone.execute(ToolCall(name="write_pages", args={"page": 5, "value": 1}))
    assert (await source.execute(ToolCall(name="read_page", args={"page": 5}))).data["byte"] == 77
    # the baseline's point: the clone owns a full private copy of the heap
    assert clone.memory().private >= 32 << 20
    assert clone.last_fork is not None and clone.last_fork.ready_s > clone.last_fork.freeze_s > 0
    # the source's dump stays while the source lives in this state, and goes with it
    assert dumps(rt) == {f"dump-{source.id}-3.bin", f"dump-{source.id}-3.layer"}
    await source.close()
    assert dumps(rt) == set()


def dumps(rt: WorkspaceRuntime) -> set[str]:
    """The dump layers in the run's pool and the images in its tmpfs (``dumps/``)."""
    return ({n for n in os.listdir(rt.layers.root) if n.startswith("dump-")}
            | {n for n in os.listdir(rt.layers.root / "dumps")})


@pytest.mark.asyncio
async def test_one_dump_per_source_state_restored_many_times_without_recomputing(make_runtime) -> None:
    """As CRIU restores one image many times: concurrent forks of one state share one dump; every process's state
    (the worker's token and heap, drawn from the source's seed at setup) is read back, not set up again; a tool
    call makes the next fork dump again and retires the old dump; closing the source removes its dump."""
    import asyncio

    from bunshin.envs import AppSpec

    rt: WorkspaceRuntime = await make_runtime(backend="restore")
    source = await rt.create(AppSpec(target="tests.apps.imaged:ImagedApp"))
    await source.execute(ToolCall(name="bump"))
    state = (await source.execute(ToolCall(name="state"))).data
    assert state["set_up_here"] and state["count"] == 1
    clones = await asyncio.gather(*(source.fork() for _ in range(3)))
    timings = sorted((c.last_fork.dump_reused, c.last_fork.freeze_s > 0) for c in clones)  # type: ignore[union-attr]
    assert timings == [(False, True), (True, False), (True, False)]
    assert dumps(rt) == {f"dump-{source.id}-2.bin", f"dump-{source.id}-2.bin.w0", f"dump-{source.id}-2.layer"}
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    assert [m[2] for m in mounts if m[1] == str(rt.layers.root / "dumps")] == ["tmpfs"]  # images in memory
    for clone in clones:
        restored = (await clone.execute(ToolCall(name="state"))).data
        assert restored == {**state, "set_up_here": False}  # the source's token and heap bytes, read back
    await source.execute(ToolCall(name="bump"))
    again = await source.fork()
    assert again.last_fork is not None and not again.last_fork.dump_reused
    assert (await again.execute(ToolCall(name="state"))).data["count"] == 2
    assert dumps(rt) == {f"dump-{source.id}-3.bin", f"dump-{source.id}-3.bin.w0", f"dump-{source.id}-3.layer"}
    await source.close()
    assert dumps(rt) == set()


def test_checkpoint_file_round_trip_and_refusals(tmp_path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        checkpoint_file.write(fd, "c.bin", [b"abc", memoryview(b"defg")])
        mapping, payload = checkpoint_file.map_verified(fd, "c.bin")
        assert bytes(payload) == b"abcdefg"
        payload.release()
        mapping.close()
        raw = bytearray((tmp_path / "c.bin").read_bytes())
        for name, mutate, message in [
            ("flip.bin", lambda b: b.__setitem__(21, b[21] ^ 1), "checksum mismatch"),
            ("magic.bin", lambda b: b.__setitem__(0, 0), "bad magic"),
            ("short.bin", lambda b: b.__delitem__(slice(5, None)), "shorter than its header"),
            ("cut.bin", lambda b: b.__delitem__(slice(-2, None)), "header says 7 payload bytes"),
            ("version.bin", lambda b: b.__setitem__(8, 9), "format version 9"),
        ]:
            bad = bytearray(raw)
            mutate(bad)
            (tmp_path / name).write_bytes(bad)
            with pytest.raises(checkpoint_file.CorruptCheckpoint, match=message) as info:
                checkpoint_file.map_verified(fd, name)
            assert name in str(info.value)
    finally:
        os.close(fd)


@pytest.mark.asyncio
async def test_restore_refuses_state_it_cannot_checkpoint(make_runtime) -> None:
    from bunshin.envs import AppSpec, ForkFailed

    rt: WorkspaceRuntime = await make_runtime(backend="restore")
    source = await rt.create(AppSpec(target="tests.apps.kv:KVApp"))
    with pytest.raises(ForkFailed, match=r"worker 0 could not image its state.*does not checkpoint"):
        await source.fork()
    assert (await source.execute(ToolCall(name="kv_get", args={"key": "k"}))).output == "None"


def test_a_worker_checkpoints_only_if_it_implements_it() -> None:
    """The worker side: a worker without the hooks refuses to image itself (the dump then fails, and so does the
    fork) and to restore; the web shop's are in tests/test_webshop_restore.py."""
    import random

    from bunshin.envs.app import AppContext
    from bunshin.envs.runtime.workers import Worker, WorkerApp, WorkerCheckpoint

    ctx = AppContext(ws_id="w", seed=1, rng=random.Random(1), run_agent=None)  # type: ignore[arg-type]
    worker = Worker(None, WorkerApp(), ctx, [])  # type: ignore[arg-type]
    r, w = os.pipe()
    os.close(r)
    with pytest.raises(NotImplementedError, match="does not checkpoint"):
        worker.handle(WorkerCheckpoint(), [w])
    with pytest.raises(OSError):
        os.fstat(w)  # the image descriptor is closed whatever happens
    assert worker.handle(WorkerCheckpoint(), []).error == "checkpoint needs exactly one descriptor, got 0"
    with pytest.raises(NotImplementedError, match="does not restore"):
        WorkerApp().restore(ctx, b"")


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["cow", "restore"])
async def test_a_hosts_start_up_memory_is_charged_to_its_workspace(make_runtime, backend) -> None:
    """The nursery puts a host in its workspace's cgroup before the interpreter starts, so the interpreter and
    its imports (~16 MiB) are the run's, for first hosts and restored clones alike (a host that joined its group
    only after its imports left them charged to the engine's group: the cgroup charge was ~2 MiB here)."""
    from bunshin.envs import AppSpec

    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(AppSpec(target="tests.apps.imaged:ImagedApp"))
    assert source.cgroup.memory_charge() >= 0.8 * source.memory().pss
    clone = await source.fork()
    if backend == "restore":  # a fresh host and worker, private
        assert clone.cgroup.memory_charge() >= 0.8 * clone.memory().pss
    assert rt.cgroup.memory_charge() >= 0.8 * (source.memory().pss + clone.memory().pss)
