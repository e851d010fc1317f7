"""The private-restore baseline behind the same interface, and the checkpoint files it restores from."""

from __future__ import annotations

import os

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
    # nothing of the checkpoint is left in the pool
    assert not [n for n in os.listdir(rt.layers.root) if n.startswith("ckpt-")]


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
    with pytest.raises(ForkFailed, match=r"worker process\(es\) without checkpointing them"):
        await source.fork()
    assert (await source.execute(ToolCall(name="kv_get", args={"key": "k"}))).output == "None"


def test_a_worker_checkpoints_only_if_it_implements_it() -> None:
    """The worker side of an app that does checkpoint its workers: a worker without the hooks refuses (the host
    app's checkpoint then fails, and so does the fork); the web shop's are in tests/test_webshop_restore.py."""
    import random

    from bunshin.envs.app import AppContext
    from bunshin.envs.runtime.workers import Worker, WorkerApp, WorkerCheckpoint, WorkerRestore

    worker = Worker(None, WorkerApp(), AppContext(ws_id="w", seed=1, rng=random.Random(1), run_agent=None),  # type: ignore[arg-type]
                    [])
    with pytest.raises(NotImplementedError, match="does not checkpoint"):
        worker.handle(WorkerCheckpoint(), [])
    with pytest.raises(NotImplementedError, match="does not restore"):
        worker.handle(WorkerRestore(data=b""), [])
