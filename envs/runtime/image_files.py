"""Durable images of workspaces, and workspaces restored from them: what the prefix tree's cold checkpoints store.

Owns: ``WorkspaceImage`` (a workspace's state images in the pool's tmpfs ``dumps/``, the host's first and then
each worker's, written by the private-restore baseline's ``fork/checkpoint.py``, plus a read-only btrfs snapshot
of its files whose ``upper/`` tree is the overlayfs upper a checkpoint store diffs); ``ImageFiles`` (naming,
making and removing images; those still live when the run closes are removed then); and ``restore`` (a fresh
workspace from an image's parts and a callable that fills its layer, whatever the run's fork backend: the host
reads the images as a private restore's does). See docs/fork.md "Durable images".
Must never: leave an image's files or layer behind once it is discarded or its run closed, nor a restore's
layer, cgroup, process or image files behind when the restore fails or is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ImageCorrupt, ImageFailed, RequestRefused, WorkspaceStartFailed
from . import await_points, checkpoint_file
from .fork.checkpoint import worker_path
from .host_workspace import HostWorkspace
from .layers import DUMPS, LayerStore
from .protocol import Checkpoint, Checkpointed
from .task_scope import run_to_end

Buffer = bytes | bytearray | memoryview
# Fills an empty overlayfs upper directory; returns the image's parts when the caller passed none (so that one
# ``CheckpointStore.read_node(node, target)`` gives both), else anything.
FillLayer = Callable[[Path], Sequence[Buffer] | None]
# Starts the restored workspace's host: (layer, its image file relative to the pool, worker images) -> the workspace.
StartRestored = Callable[[str, str, int], Awaitable[HostWorkspace]]
_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True, eq=False)
class WorkspaceImage:
    """An image of one workspace state. ``files``: the host's image then worker 0, 1, ... (absolute paths, each a
    whole checkpoint file); ``layer_upper``: the overlayfs upper tree of the read-only snapshot of its files."""

    name: str
    source: str  # the imaged workspace's id
    files: tuple[Path, ...]
    workers: int
    layer_upper: Path
    bytes_written: int
    freeze_s: float
    _owner: ImageFiles = field(repr=False)

    def read_parts(self) -> list[bytes]:
        """Every file whole (header and trailer included), in order: what ``restore_image`` writes back byte for
        byte. Blocking: call it in a thread."""
        return [path.read_bytes() for path in self.files]

    def discard(self) -> None:
        """Remove the image's files and layer snapshot. Idempotent, thread-safe, blocking (a few ms)."""
        self._owner.discard(self.name)

    @property
    def discarded(self) -> bool:
        return not self._owner.is_live(self.name)


class ImageFiles:
    """The images of one run (``Hosts.images``)."""

    def __init__(self, layers: LayerStore):
        self.layers = layers
        self.dumps = layers.path(DUMPS)
        self._live: set[str] = set()
        self._lock = threading.Lock()
        self._counter = 0

    def is_live(self, stem: str) -> bool:
        return stem in self._live

    def live(self) -> list[str]:
        return sorted(self._live)

    async def take(self, source: HostWorkspace, name: str) -> WorkspaceImage:
        """Image ``source`` (a running workspace or a Snapshot). A cancelled call waits for the host to finish
        writing (the request cannot be taken back) and removes what it wrote."""
        if not _LABEL.fullmatch(name):
            raise ValueError(f"bad image name {name!r} (letters, digits, '_', '.', '-'; at most 100)")
        self._counter += 1
        stem = f"img-{self._counter:04d}-{name}"
        with self._lock:
            self._live.add(stem)  # from the start: a run closing meanwhile removes what is written
        return await run_to_end(self._take(source, stem), undo=lambda _: asyncio.to_thread(self.discard, stem))

    async def _take(self, source: HostWorkspace, stem: str) -> WorkspaceImage:
        host_file = f"{stem}.bin"
        try:
            await await_points.reached("image.take.request")
            reply = await source.request(Checkpoint(path=f"{DUMPS}/{host_file}", layer=f"{stem}.layer"))
            done = source.expect(reply, Checkpointed)
        except BaseException as exc:
            await asyncio.shield(asyncio.to_thread(self.discard, stem))
            if isinstance(exc, RequestRefused):
                raise ImageFailed(source.id, f"image {stem} failed: {exc.detail}") from exc
            raise
        files = (self.dumps / host_file, *(self.dumps / worker_path(host_file, i) for i in range(done.workers)))
        return WorkspaceImage(name=stem, source=source.id, files=files, workers=done.workers,
                              layer_upper=self.layers.path(f"{stem}.layer") / "upper",
                              bytes_written=done.bytes_written, freeze_s=done.freeze_ns / 1e9, _owner=self)

    def discard(self, stem: str) -> None:
        with self._lock:
            if stem not in self._live:
                return
            self._live.discard(stem)
        try:
            remove_files(self.dumps, f"{stem}.bin")
        finally:
            self.layers.delete(f"{stem}.layer")

    def discard_all(self) -> None:
        """Remove every image still live (the run is closing). Blocking."""
        errors = []
        for stem in self.live():
            try:
                self.discard(stem)
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


def remove_files(dumps: Path, host_file: str) -> None:
    """Delete the host's image ``host_file`` in ``dumps`` and every worker image beside it. Blocking."""
    workers = worker_path(host_file, 0).removesuffix("0")
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(dumps):
            if name == host_file or name.startswith(workers):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(dumps / name)


async def restore(layers: LayerStore, ws_id: str, parts: Sequence[Buffer] | None, fill_layer: FillLayer,
                  start: StartRestored) -> HostWorkspace:
    """A new workspace ``ws_id`` restored from ``parts`` (the host's image, then each worker's; None: the ones
    ``fill_layer`` returns) and a layer whose upper tree ``fill_layer`` fills, its host started by ``start``. See
    ``WorkspaceRuntime.restore_image``."""
    layer, host_file = f"ws-{ws_id}", f"restore-{ws_id}.bin"
    await await_points.reached("image.restore.prepare")
    workers = await run_to_end(  # the thread runs on regardless of a cancellation; undone once it is done
        asyncio.to_thread(_prepare, layers, ws_id, layer, host_file, parts, fill_layer),
        undo=lambda _: asyncio.to_thread(_undo, layers, layer, host_file))
    try:
        return await start(layer, f"{DUMPS}/{host_file}", workers)
    except WorkspaceStartFailed as exc:
        if "CorruptCheckpoint" in exc.detail and not isinstance(exc, ImageCorrupt):
            raise ImageCorrupt(ws_id, exc.detail) from exc  # checked by the host: e.g. the number of workers
        raise
    finally:
        await asyncio.shield(asyncio.to_thread(remove_files, layers.path(DUMPS), host_file))


def _prepare(layers: LayerStore, ws_id: str, layer: str, host_file: str, parts: Sequence[Buffer] | None,
             fill_layer: FillLayer) -> int:
    """Make the layer, fill it, write and verify the images; the number of worker images. Undoes itself on any
    failure. Blocking (a thread)."""
    try:
        upper = layers.create(layer) / "upper"
        try:
            filled = fill_layer(upper)
        except Exception as exc:
            raise WorkspaceStartFailed(ws_id, f"filling its layer failed: {type(exc).__name__}: {exc}") from exc
        parts = filled if parts is None else parts
        if not parts:
            raise ImageCorrupt(ws_id, "no image parts (fill_layer returned none, or the list is empty)")
        _write_images(layers.path(DUMPS), ws_id, host_file, parts)
    except BaseException:
        _undo(layers, layer, host_file)
        raise
    return len(parts) - 1


def _write_images(dumps: Path, ws_id: str, host_file: str, parts: Sequence[Buffer]) -> None:
    dir_fd = os.open(dumps, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            name = host_file if index == 0 else worker_path(host_file, index - 1)
            fd = checkpoint_file.create(dir_fd, name)
            try:
                view = memoryview(part).cast("B")
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                raise WorkspaceStartFailed(ws_id, f"writing image {name} failed: {exc}") from exc
            finally:
                os.close(fd)
            try:  # the host's own check, before a host is started for nothing
                mapping, payload = checkpoint_file.map_verified(dir_fd, name)
            except checkpoint_file.CorruptCheckpoint as exc:
                whose = "the host's image" if index == 0 else f"worker {index - 1}'s image"
                raise ImageCorrupt(ws_id, f"part {index} ({whose}) is corrupt: {exc}") from exc
            payload.release()
            mapping.close()
    finally:
        os.close(dir_fd)


def _undo(layers: LayerStore, layer: str, host_file: str) -> None:
    try:
        remove_files(layers.path(DUMPS), host_file)
    finally:
        layers.delete(layer)
