"""The private-restore baseline, host side: writing a checkpoint of the application state, and restoring one into
a fresh host's private memory.

Owns: ``write`` (agents frozen, app quiesced, its ``checkpoint()`` written as a checkpoint file, the files
snapshotted read-only at the same instant) and ``restore_app`` (the checkpoint mapped and verified, handed to the
app's ``restore`` instead of ``setup``). An app that keeps state in workers must carry their state in its own
checkpoint; the host refuses one that does not (``WorkspaceApp.checkpoint`` not overridden) rather than lose it.
Must never: leave the agents frozen.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ...app import WorkspaceApp
from .. import checkpoint_file
from ..layers import snapshot_at
from ..protocol import Checkpointed, Failed, Reply

if TYPE_CHECKING:
    from ..host import Host


def write(host: Host, path: str, layer: str) -> Reply:
    if host.workers and type(host.app).checkpoint is WorkspaceApp.checkpoint:
        return Failed(kind="checkpoint", message="the private-restore backend checkpoints the host's state "
                      f"only, and this application keeps state in {len(host.workers)} worker process(es) "
                      "without checkpointing them (WorkspaceApp.checkpoint is not overridden)")
    started = time.monotonic_ns()
    agents = host.agents.running
    try:
        host.agents.freeze()
        host.app.before_fork(host.ctx)
        state = host.app.checkpoint()
        parts = state if isinstance(state, list) else [state]
        written = checkpoint_file.write(host.pool_fd, path, parts)
        snapshot_at(host.pool_fd, host.layer_fd, layer, readonly=True)
    finally:
        if agents:
            host.agents.thaw()
    return Checkpointed(bytes_written=written, freeze_ns=time.monotonic_ns() - started)


def restore_app(host: Host, path: str) -> None:
    """At the start of a restoring host: the app's state from the checkpoint at ``path`` (relative to the pool)."""
    mapping, payload = checkpoint_file.map_verified(host.pool_fd, path)
    try:
        host.app.restore(host.ctx, payload)
    finally:
        payload.release()
        mapping.close()
