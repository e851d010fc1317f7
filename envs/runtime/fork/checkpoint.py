"""The private-restore baseline, host side: dumping every process of the workspace, and restoring one dump into
a fresh host's private memory.

Owns: ``write`` (agents frozen, app and workers quiesced; each worker writes its own image ``<path>.w<index>``,
then the host's app its ``checkpoint()`` as ``<path>``; the files snapshotted read-only at the same instant) and
``restore_app`` (the host's image mapped and verified, handed to the app's ``restore`` instead of ``setup``; the
workers the app spawns meanwhile restore from their images, ``worker_image``). As CRIU dumps every process of a
container and its restore reads the images back, nothing is recomputed on either side.
Must never: leave the agents frozen, or a restored workspace missing a worker the source had.
"""

from __future__ import annotations

import os
import time

from ...app import WorkerError
from .. import checkpoint_file
from ..layers import snapshot_at
from ..protocol import Checkpointed, Failed, Reply
from .state import ForkState


def worker_path(path: str, index: int) -> str:
    return f"{path}.w{index}"


def write(state: ForkState, path: str, layer: str) -> Reply:
    started = time.monotonic_ns()
    agents = state.agents.running
    written = 0
    try:
        state.agents.freeze()
        state.app.before_fork(state.ctx)
        for index, worker in enumerate(state.workers):
            fd = checkpoint_file.create(state.pool_fd, worker_path(path, index))
            try:
                written += worker.checkpoint(fd)
            except WorkerError as exc:
                return Failed(kind="checkpoint", message=f"worker {index} could not image its state: {exc}")
            finally:
                os.close(fd)
        app_state = state.app.checkpoint()
        parts = app_state if isinstance(app_state, list) else [app_state]
        written += checkpoint_file.write(state.pool_fd, path, parts)
        if state.layer_fd >= 0:  # a container host's files are its container's, which the engine commits
            snapshot_at(state.pool_fd, state.layer_fd, layer, readonly=True)
    finally:
        if agents:
            state.agents.thaw()
    return Checkpointed(bytes_written=written, freeze_ns=time.monotonic_ns() - started, workers=len(state.workers))


def restore_app(state: ForkState, path: str, workers: int) -> None:
    """At the start of a restoring host: the app's state from the dump at ``path`` (relative to the pool), with
    ``workers`` worker images beside it."""
    state.restoring = (path, workers)
    mapping, payload = checkpoint_file.map_verified(state.pool_fd, path)
    try:
        state.app.restore(state.ctx, payload)
    finally:
        payload.release()
        mapping.close()
        state.restoring = None
    if len(state.workers) != workers:
        raise checkpoint_file.CorruptCheckpoint(
            f"checkpoint {path}: the source had {workers} worker(s), the restored app spawned {len(state.workers)}")


def worker_image(state: ForkState, index: int) -> tuple[int, str] | None:
    """While restoring: the open image of the source's worker ``index`` (the caller closes it), else None."""
    if state.restoring is None:
        return None
    path, workers = state.restoring
    if index >= workers:
        raise checkpoint_file.CorruptCheckpoint(
            f"checkpoint {path}: the restored app spawns worker {index}, the source had {workers}")
    name = worker_path(path, index)
    return os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=state.pool_fd), name
