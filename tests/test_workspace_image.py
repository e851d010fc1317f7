"""Durable images of workspaces and workspaces restored from them (``envs/runtime/image_files.py``): what the prefix
tree's cold checkpoints store, through the real ``CheckpointStore`` too, on both fork backends; and nothing left
behind by a discarded image, a closed run, a corrupt image or a cancelled restore."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from bunshin.engine.prefix.store import CheckpointStore
from bunshin.envs import AppSpec, Snapshot, ToolCall, WorkspaceRuntime
from bunshin.envs.errors import ImageCorrupt, ImageFailed, WorkspaceStartFailed
from bunshin.envs.runtime import await_points

from .conftest import SHARED_POINTS, cancel_at, host_processes, pool_layers, workspace_groups

pytestmark = pytest.mark.asyncio
APP = AppSpec(target="tests.apps.imaged:ImagedApp")  # a host counter and a worker with a token and a heap
BACKENDS = ["cow", "restore"]
STATE = ToolCall(name="state")
FILES = ToolCall(name="shell", args={"cmd": "cd ~ && stat -c '%n %U %a %s' f d d/g link && cat f d/g && readlink link"})


def copy_upper(src: Path):
    """A ``fill_layer`` copying an image's upper tree as it is: owners, modes, times, xattrs, whiteouts, links."""
    def fill(target: Path) -> None:
        subprocess.run(["cp", "-a", "--", f"{src}/.", str(target)], check=True)
    return fill


async def change(ws, text: str) -> None:
    """Tool calls that change the host's memory and the workspace's files."""
    await ws.execute(ToolCall(name="bump"))
    cmd = f"cd ~ && echo {text} > f && mkdir -p d && echo g-{text} > d/g && chmod 640 d/g && ln -sfn d/g link"
    assert (await ws.execute(ToolCall(name="shell", args={"cmd": cmd}))).exit_code == 0


async def observe(ws) -> tuple[object, ...]:
    """What the next calls answer: the app's state (the worker's token and heap digest included) and the files."""
    state = dict((await ws.execute(STATE)).data)
    state.pop("set_up_here")  # True where the worker ran setup, False where it was restored: the one difference
    await ws.execute(ToolCall(name="bump"))
    return state, (await ws.execute(STATE)).data["count"], (await ws.execute(FILES)).output


def image_files(rt: WorkspaceRuntime) -> set[str]:
    """The images' files in the dumps tmpfs and their layers (not the restore backend's dumps)."""
    return ({n for n in os.listdir(rt.layers.root / "dumps") if n.startswith(("img-", "restore-"))}
            | {n for n in pool_layers(rt) if n.startswith("img-")})


def remains(rt: WorkspaceRuntime) -> tuple[object, ...]:
    """What the run holds: workspaces, cgroups, layers, images in the dumps tmpfs, host processes."""
    groups = workspace_groups(rt)
    return (sorted(rt.workspaces), groups, pool_layers(rt), sorted(os.listdir(rt.layers.root / "dumps")),
            sorted(host_processes(shells=False)))


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_image_restores_to_a_workspace_that_answers_as_its_source(make_runtime, backend: str) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(APP)
    await change(source, "one")
    image = await source.image("n1")
    assert image.workers == 1 and len(image.files) == 2 and image.source == source.id
    assert [p.name for p in image.files] == [f"{image.name}.bin", f"{image.name}.bin.w0"]
    assert image.bytes_written == sum(p.stat().st_size for p in image.files) and image.freeze_s > 0
    assert (image.layer_upper / "home/agent/f").read_text() == "one\n"
    parts = await asyncio.to_thread(image.read_parts)
    assert [bytes(p[:8]) for p in parts] == [b"BUNSHCKP"] * 2
    restored = await rt.restore_image(APP, parts, copy_upper(image.layer_upper))
    assert restored.id in rt.workspaces and not restored.frozen and restored.parent is None
    assert image_files(rt) == {*(p.name for p in image.files), f"{image.name}.layer"}  # the restore's copies: gone
    seen = await observe(restored)
    assert seen == await observe(source)
    assert seen[2] == "f agent 644 4\nd agent 755 2\nd/g agent 640 6\nlink agent 777 3\none\ng-one\nd/g\n"
    assert (await restored.execute(ToolCall(name="shell", args={"cmd": "echo 2 >> ~/d/g"}))).exit_code == 0
    # the restored workspace forks with the run's backend, and its clone has the worker and the files too
    clone = await restored.fork()
    assert await observe(clone) == await observe(restored)
    assert (await clone.execute(ToolCall(name="shell", args={"cmd": "cat ~/d/g"}))).output == "g-one\n2\n"
    # discarding removes the files and the layer snapshot, once
    image.discard()
    image.discard()
    assert image.discarded and not any(p.exists() for p in image.files)
    assert not image.layer_upper.exists() and not image_files(rt)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_image_through_the_checkpoint_store_and_a_delta_on_it(make_runtime, tmp_path, backend) -> None:
    """``read_node`` gives the parts and fills the layer in one call: ``restore_image(app, None, fill)`` takes the
    parts from what ``fill`` returns."""
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(APP)
    await change(source, "one")
    first = await source.image("n1")
    with CheckpointStore(tmp_path / "store") as store:
        parts = await asyncio.to_thread(first.read_parts)
        await asyncio.to_thread(store.write_node, "n1", parts, first.layer_upper)
        restored = await rt.restore_image(APP, None, lambda target: store.read_node("n1", target))
        expected = await observe(source)  # observe() changes the state (a bump): compare before moving on
        assert await observe(restored) == expected
        await change(source, "two")
        await source.execute(ToolCall(name="shell", args={"cmd": "rm ~/d/g && touch ~/d/g"}))
        second = await source.image("n2")
        parts = await asyncio.to_thread(second.read_parts)
        record = await asyncio.to_thread(store.write_node, "n2", parts, second.layer_upper, parent="n1",
                                         parent_layer=first.layer_upper)
        assert record.parent == "n1" and 0 < record.files_changed < 10
        first.discard()
        second.discard()
        child = await rt.restore_image(APP, None, lambda target: store.read_node("n2", target))
        assert await observe(child) == await observe(source)
    assert not image_files(rt) and rt.hosts.images.live() == []  # type: ignore[union-attr]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_image_of_a_snapshot_restores_frozen_or_running(make_runtime, backend: str) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(APP)
    await change(source, "snap")
    snap = await source.snapshot()
    await change(source, "later")  # the snapshot keeps the state it was taken in
    image = await snap.image("snap")
    parts = await asyncio.to_thread(image.read_parts)
    frozen = await rt.restore_image(APP, parts, copy_upper(image.layer_upper), frozen=True)
    assert isinstance(frozen, Snapshot)
    running = await rt.restore_image(APP, parts, copy_upper(image.layer_upper), seed=7)
    assert running.seed == 7
    expected = await observe(await snap.fork())
    assert await observe(await frozen.fork()) == expected
    assert await observe(running) == expected
    assert (await running.execute(STATE)).data["count"] == 2  # change() once, then observe()


async def test_images_left_at_close_are_removed_and_discard_stays_idempotent(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime()
    source = await rt.create(APP)
    images = [await source.image("a"), await source.image("a")]  # one label, two images
    assert len({i.name for i in images}) == 2 and len(os.listdir(rt.layers.root / "dumps")) == 4
    await source.close()  # an image outlives its workspace
    assert all(p.exists() for i in images for p in i.files)
    images[0].discard()
    assert [n for n in pool_layers(rt) if n.startswith("img-")] == [f"{images[1].name}.layer"]
    await rt.close()  # the leak check of make_runtime also runs after the test
    assert all(i.discarded for i in images)
    images[1].discard()
    with pytest.raises(ValueError, match="bad image name"):
        await source.image("../x")


async def test_an_app_that_cannot_image_itself_fails_typed_and_keeps_running(make_runtime) -> None:
    rt: WorkspaceRuntime = await make_runtime()
    source = await rt.create(AppSpec(target="tests.apps.kv:KVApp"))
    before = remains(rt)
    with pytest.raises(ImageFailed, match="worker 0 could not image its state"):
        await source.image("kv")
    assert remains(rt) == before and rt.hosts.images.live() == []  # type: ignore[union-attr]
    assert (await source.execute(ToolCall(name="kv_get", args={"key": "k"}))).output == "None"


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_corrupt_image_is_reported_and_leaves_nothing(make_runtime, backend: str) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(APP)
    await change(source, "x")
    image = await source.image("bad")
    parts = [bytearray(p) for p in await asyncio.to_thread(image.read_parts)]
    fill = copy_upper(image.layer_upper)
    before = remains(rt)
    for index, whose in ((0, "the host's image"), (1, "worker 0's image")):
        bad = [bytearray(p) for p in parts]
        bad[index][30] ^= 1  # a payload byte
        with pytest.raises(ImageCorrupt, match=rf"part {index} \({whose}\) is corrupt: .*checksum mismatch"):
            await rt.restore_image(APP, bad, fill)
        assert remains(rt) == before
    # a missing worker image: caught by the host, which spawns a worker the image does not have
    with pytest.raises(ImageCorrupt, match="spawns worker 0, the source had 0"):
        await rt.restore_image(APP, parts[:1], fill)
    assert remains(rt) == before
    # a failing fill_layer (say, a store's CorruptEntry) is a start failure with that cause
    def broken(target: Path) -> None:
        raise OSError("no such chunk")
    with pytest.raises(WorkspaceStartFailed, match="filling its layer failed: OSError: no such chunk") as info:
        await rt.restore_image(APP, parts, broken)
    assert isinstance(info.value.__cause__, OSError)
    assert remains(rt) == before
    # and the same parts restore fine
    assert (await (await rt.restore_image(APP, parts, fill)).execute(STATE)).data["count"] == 1


RESTORE_POINTS = ["image.restore.prepare", "hosts.start.spawn", "hosts.await_ready"]


async def test_the_await_points_named_here_are_the_ones_a_restore_passes(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(APP)
    image = await source.image("p")
    with await_points.seen() as passed:
        await runtime.restore_image(APP, await asyncio.to_thread(image.read_parts), copy_upper(image.layer_upper))
    assert sorted(set(passed) - SHARED_POINTS) == sorted(RESTORE_POINTS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("point", RESTORE_POINTS)
async def test_a_cancelled_restore_leaves_nothing(make_runtime, backend: str, point: str) -> None:
    rt: WorkspaceRuntime = await make_runtime(backend=backend)
    source = await rt.create(APP)
    await change(source, "c")
    image = await source.image("c")
    parts = await asyncio.to_thread(image.read_parts)
    before = remains(rt)
    task = asyncio.ensure_future(rt.restore_image(APP, parts, copy_upper(image.layer_upper)))
    with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
        await task
    assert remains(rt) == before
    restored = await rt.restore_image(APP, parts, copy_upper(image.layer_upper))
    assert await observe(restored) == await observe(source)


async def test_a_cancelled_image_leaves_nothing_and_the_source_in_step(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(APP)
    before = remains(runtime)
    for point in ("image.take.request", "workspace.request.sent"):
        task = asyncio.ensure_future(source.image("c"))
        with await_points.hook(cancel_at(task, point)), pytest.raises(asyncio.CancelledError):
            await task
        assert remains(runtime) == before and runtime.hosts.images.live() == []  # type: ignore[union-attr]
    assert (await source.execute(ToolCall(name="bump"))).output == "1"
