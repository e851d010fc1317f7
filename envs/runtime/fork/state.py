"""``ForkState``: the part of a workspace host's state that its fork, checkpoint and restore steps read and rewrite.

Owns: the record itself (made and owned by the ``Host`` in ``host.py``, handed to ``source.py``, ``clone.py`` and
``checkpoint.py`` instead of the host), the named fault points those steps share (``fault``), and replying on the
current engine channel (``reply``). A clone rewrites ``sock``, ``layer_fd``, ``ws_id`` and ``frozen`` here, and the
host sees its new identity because it reads them from this record.
Must never: import ``host.py`` (the host depends on the fork steps, never the other way round).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from ...app import AppContext, WorkspaceApp
from ..agents import Agents
from ..app_processes import AppProcesses
from ..channel import send_frame
from ..faults import fault
from ..protocol import HostConfig, Reply, encoder
from ..workers import WorkerHandle


@dataclass(eq=False)
class ForkState:
    """``sock``: the engine channel of the workspace this process is now; ``pool_fd``: the layer pool (O_RDONLY);
    ``layer_fd``: the writable layer; ``cgroup_fds``: the run's cgroup hierarchies; ``restoring``: (dump, worker
    images) while the app restores from a dump."""

    ws_id: str
    frozen: bool
    sock: socket.socket
    pool_fd: int
    layer_fd: int
    cgroup_fds: list[int]
    config: HostConfig
    app: WorkspaceApp
    ctx: AppContext
    agents: Agents
    workers: list[WorkerHandle]
    apps: AppProcesses
    restoring: tuple[str, int] | None = None

    def fault(self, name: str) -> None:
        """A named step tests can break (``faults.py``)."""
        fault(self.config.faults, name)

    def reply(self, message: Reply) -> None:
        send_frame(self.sock, encoder.encode(message))
