"""The live fork, clone side (in the freshly forked clone of a host): the clone becomes a workspace of its own.

Steps: take its own engine socket (the source's is closed); a session of its own; die with the run's nursery;
join its cgroup; fresh mount, network, UTS and IPC namespaces; mount its root on the snapshot of the source's
layer and pivot into it; forget the source's agent namespace; hand each worker's clone a pidfd of ours so it
enters our namespaces (``worker.py``); then, for a running clone, bring up loopback, reseed, re-open files,
re-create listening sockets and run the app's ``after_fork``; a snapshot instead lets go of the source's files and
sockets and waits. Last, ``Ready`` on its own socket.
Must never: keep a descriptor of the source workspace (its engine socket above all).
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

from ...seeds import derive_seed
from .. import image, namespaces, rootfs
from ..cgroups import join_by_fds
from ..protocol import CloneSpec, Ready
from .worker import die_with

if TYPE_CHECKING:
    from ..host import Host


class BecameClone(Exception):
    """Raised in a freshly forked clone to unwind the source's request handler back to the serve loop."""


def become(host: Host, spec: CloneSpec, clone_fd: int, worker_ends: list[socket.socket]) -> None:
    started = time.monotonic()
    host.sock.close()  # the source's channel; the clone answers on its own
    host.sock = socket.socket(fileno=clone_fd)
    os.setsid()
    die_with(host.config.reaper_pid)
    join_by_fds(host.cgroup_fds, spec.cgroup_rel)
    host.fault("clone.after_cgroup")
    namespaces.enter_new_workspace_namespaces(spec.hostname)
    os.fchdir(host.pool_fd)
    layer_fd = os.open(spec.layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=host.pool_fd)
    rootfs.assemble_and_pivot(target=image.CLONE_ROOT, lower=host.config.lower, layer=spec.layer,
                              frozen=spec.frozen, image_binds=host.config.image_binds,
                              runtime_binds=host.config.runtime_binds)
    os.close(host.layer_fd)
    host.layer_fd = layer_fd
    host.agents.become_clones(spec.cgroup_rel)
    host.ws_id, host.frozen = spec.ws_id, spec.frozen
    host.ctx.ws_id = spec.ws_id
    if host.workers:
        pidfd = os.pidfd_open(os.getpid())  # the workers' clones enter our namespaces through it
        try:
            for w, end in zip(host.workers, worker_ends):
                w.adopt(pidfd, end, ws_id=spec.ws_id, seed=derive_seed(spec.seed, "worker", w.index),
                        cgroup_rel=spec.cgroup_rel, reaper_pid=host.config.reaper_pid, frozen=spec.frozen)
        finally:
            os.close(pidfd)
    if spec.frozen:
        host.ctx.suspend_after_fork()
    else:
        namespaces.loopback_up()
        host.ctx.reseed(spec.seed)
        host.ctx.rebind_after_fork()
        host.app.after_fork(host.ctx)
    host.reply(Ready(ws_id=host.ws_id, pid=os.getpid(), setup_s=time.monotonic() - started))
