"""The private-restore baseline, engine side: what a CRIU-like system does instead of a live fork.

The source's host writes a checkpoint of its application state (``checkpoint.py``, in the host) and snapshots its
files beside it; a fresh host starts on a copy of those files and restores the state into private memory. Nothing
is shared with the source: this is what the live fork is measured against.
Owns: that sequence and the removal of the checkpoint once the clone is ready (or failed).
Must never: leave the checkpoint file or its layer behind.
"""

from __future__ import annotations

import asyncio
import os
import time

from ...errors import ForkFailed, RequestRefused, WorkspaceStartFailed
from ...workspace import ForkTiming, Snapshot, Workspace
from .. import await_points
from ..protocol import Checkpoint, Checkpointed
from .backends import AllOrNothingFork, clone_seed


class PrivateRestore(AllOrNothingFork):
    name = "restore"

    async def _fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        hosts = self.hosts
        clone_id = hosts.new_id()
        path = f"ckpt-{clone_id}.bin"
        ckpt_layer = f"{path}.layer"
        layer = f"ws-{clone_id}"
        started = time.monotonic()
        try:
            await await_points.reached("fork.restore.checkpoint")
            reply = await source.request(Checkpoint(path=path, layer=ckpt_layer))
            source.expect(reply, Checkpointed)
            await asyncio.to_thread(hosts.layers.snapshot, ckpt_layer, layer)
            clone = await hosts.start(clone_id, layer, source.app_spec, seed=clone_seed(source, seed),
                                      hostname=None, restore_from=path, parent=source.id,
                                      generation=source.generation + 1, cls=Snapshot if frozen else Workspace)
        except RequestRefused as exc:
            await asyncio.to_thread(hosts.layers.delete, layer)
            raise ForkFailed(source.id, f"checkpoint for {clone_id} failed: {exc.detail}") from exc
        except WorkspaceStartFailed as exc:
            raise ForkFailed(source.id, f"restore into {clone_id} failed: {exc.detail}") from exc
        finally:
            await asyncio.shield(asyncio.to_thread(self._remove_checkpoint, path, ckpt_layer))
        clone.last_fork = ForkTiming(freeze_s=reply.freeze_ns / 1e9,  # type: ignore[union-attr]
                                     ready_s=time.monotonic() - started)
        return clone

    def _remove_checkpoint(self, path: str, layer: str) -> None:
        try:
            os.unlink(path, dir_fd=self.hosts.pool_fd)
        except FileNotFoundError:
            pass
        self.hosts.layers.delete(layer)
