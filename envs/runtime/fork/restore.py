"""The private-restore baseline, engine side: what a CRIU-like system does instead of a live fork.

The source's host dumps every process of the workspace (``checkpoint.py``: the host's and each worker's state
image, in the pool's tmpfs ``dumps/``) and snapshots its files beside them, once per state of the source: a dump is
restored as many times as the source is forked before its next tool call (CRIU restores one image many times). A restore starts a fresh host on
a copy of those files, which reads the images back into private memory and starts the workers from theirs.
Nothing is shared with the source and nothing is recomputed: this is what the live fork is measured against.
Owns: the dumps (one per source state, reference-counted by the restores reading them, removed when the source
changes, closes, or the dump fails; each written by a task of the run's scope, ``Hosts.tasks``, which every fork of
that state awaits) and the restore sequence.
Must never: leave a dump's files or layer behind, or restore a dump of a state the source has left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass

from ...errors import ForkFailed, RequestRefused, WorkspaceStartFailed
from ...workspace import ForkTiming
from .. import await_points
from ..host_workspace import HostWorkspace
from ..hosts import Hosts
from ..layers import DUMPS
from ..protocol import Checkpoint, Checkpointed
from .backends import AllOrNothingFork, clone_seed
from .checkpoint import worker_path


@dataclass
class Dump:
    """One dump of a source's state: ``path`` (the host's image), ``workers`` images beside it, ``layer`` (the
    files); ``calls`` is the source's call count it was taken at."""

    path: str
    layer: str
    calls: int
    workers: int = 0
    bytes_written: int = 0
    freeze_s: float = 0.0
    readers: int = 0  # forks waiting for it or restoring from it
    retired: bool = False  # the source changed or closed: removed once no fork reads it
    removed: bool = False


class PrivateRestore(AllOrNothingFork):
    name = "restore"

    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self._dumps: dict[str, tuple[Dump, asyncio.Task[Dump]]] = {}  # source id -> its latest dump

    async def _fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        hosts = self.hosts
        started = time.monotonic()
        dump, made = await self._dump_of(source)
        clone_id = hosts.new_id()
        try:
            layer = await self._clone_files(dump, clone_id)
            clone = await hosts.start(clone_id, layer, source.app_spec, seed=clone_seed(source, seed),
                                      hostname=None, restore_from=dump.path, restore_workers=dump.workers,
                                      parent=source.id, generation=source.generation + 1,
                                      frozen=frozen)
        except WorkspaceStartFailed as exc:
            raise ForkFailed(source.id, f"restore into {clone_id} failed: {exc.detail}") from exc
        finally:
            await self._release(dump)
        clone.last_fork = ForkTiming(freeze_s=dump.freeze_s if made else 0.0, ready_s=time.monotonic() - started,
                                     dump_reused=not made)
        return clone

    async def _clone_files(self, dump: Dump, clone_id: str) -> str:
        """The clone's files from the dump's: its layer, a snapshot of the dump's (what ``Hosts.start`` takes)."""
        layer = f"ws-{clone_id}"
        await asyncio.to_thread(self.hosts.layers.snapshot, dump.layer, layer)
        return layer

    async def _files_taken(self, source: HostWorkspace, dump: Dump) -> None:
        """After the source's host wrote the dump: its files are taken too (here the host snapshotted its layer
        beside the dump, in the same request)."""

    async def _discard_dump(self, dump: Dump) -> None:
        """Remove the dump's images and files (``_remove``), finishing under cancellation."""
        await asyncio.shield(asyncio.to_thread(self._remove, dump))

    async def _dump_of(self, source: HostWorkspace) -> tuple[Dump, bool]:
        """The dump of the source's current state, held for reading (``_release`` it), and whether this call
        made it. Concurrent forks of one state share one dump."""
        entry = self._dumps.get(source.id)
        made = entry is None or entry[0].calls != source.calls
        if made:
            stale = entry
            name = f"dump-{source.id}-{source.calls}"
            dump = Dump(path=f"{DUMPS}/{name}.bin", layer=f"{name}.layer", calls=source.calls)
            entry = (dump, self.hosts.tasks.start_soon(self._write(source, dump), name=f"dump {name}"))
            self._dumps[source.id] = entry  # before any await: a concurrent fork of this state finds it
            if stale is not None:
                await self._retire(stale[0])
        assert entry is not None  # found, or made just now
        dump, writing = entry
        dump.readers += 1  # before awaiting: nobody removes a dump someone waits for
        try:
            await asyncio.shield(writing)
        except BaseException:
            if writing.done() and self._dumps.get(source.id) is entry:
                del self._dumps[source.id]  # a failed dump is not kept: the next fork tries again
            await self._release(dump)
            raise
        return dump, made

    async def _release(self, dump: Dump) -> None:
        dump.readers -= 1
        if dump.retired and dump.readers == 0:
            await self._discard_dump(dump)

    async def _write(self, source: HostWorkspace, dump: Dump) -> Dump:
        try:
            await await_points.reached("fork.restore.checkpoint")
            reply = await source.request(Checkpoint(path=dump.path, layer=dump.layer))
            done = source.expect(reply, Checkpointed)
            await self._files_taken(source, dump)
        except BaseException as exc:
            await self._discard_dump(dump)
            if isinstance(exc, RequestRefused):
                raise ForkFailed(source.id, f"dump of {source.id} failed: {exc.detail}") from exc
            raise
        dump.workers, dump.bytes_written = done.workers, done.bytes_written
        dump.freeze_s = done.freeze_ns / 1e9
        return dump

    async def forget(self, source: HostWorkspace) -> None:
        """The source closed: its dump goes once no restore reads it."""
        entry = self._dumps.pop(source.id, None)
        if entry is not None:
            await self._retire(entry[0])

    async def _retire(self, dump: Dump) -> None:
        """No fork will read ``dump`` again; it goes when the last reader releases it."""
        dump.retired = True
        if dump.readers == 0:
            await self._discard_dump(dump)

    def _remove(self, dump: Dump) -> None:
        """Delete the dump's images (the host's and every worker's it wrote, even if the dump failed midway) and its
        layer. Blocking; a second call does nothing."""
        if dump.removed:
            return
        dump.removed = True
        self._remove_images(dump)
        self.hosts.layers.delete(dump.layer)

    def _remove_images(self, dump: Dump) -> None:
        """Delete the dump's process images in the dumps tmpfs. Blocking."""
        images = self.hosts.layers.path(DUMPS)
        stem = os.path.basename(dump.path)
        workers = worker_path(stem, 0).removesuffix("0")  # "<stem>.w": every worker image's prefix
        for name in os.listdir(images):
            if name == stem or name.startswith(workers):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(images / name)
