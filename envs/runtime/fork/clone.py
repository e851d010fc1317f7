"""The live fork, clone side (in the freshly forked clone of a host): the clone becomes a workspace of its own.

Steps: take its own engine socket (the source's is closed); a session of its own; die with the run's nursery;
join its cgroup; fresh mount, network, UTS and IPC namespaces (with a prepared shell, ``shells.py``: a fresh
mount namespace, and the shell's other three entered through its holder's pidfd); mount its root on the snapshot of the source's
layer and pivot into it; forget the source's agent namespace; hand each worker's clone a pidfd of ours so it
enters our namespaces (``worker.py``); then, for a running clone, bring up loopback, reseed, re-open files,
re-create listening sockets and run the app's ``after_fork``; a snapshot instead lets go of the source's files and
sockets and waits. Last, ``Ready`` on its own socket, with each step's time (``Steps``).
Must never: keep a descriptor of the source workspace (its engine socket above all).
"""

from __future__ import annotations

import os
import socket
import time

from ...app import Lending
from ...seeds import derive_seed
from .. import image, namespaces, rootfs, syscalls
from ..cgroups import join_by_fds
from ..protocol import CloneSpec, Ready
from .state import ForkState
from .worker import die_with


class Steps:
    """How long each step of ``become`` took (seconds, in order), for ``Ready.steps_s``."""

    def __init__(self, started: float):
        self.took: dict[str, float] = {}
        self._last = started

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.took[name] = now - self._last
        self._last = now


class BecameClone(Exception):
    """Raised in a freshly forked clone to unwind the source's request handler back to the serve loop."""


def become(state: ForkState, spec: CloneSpec, clone_fd: int, shell_fd: int | None,
           worker_ends: list[socket.socket]) -> None:
    started = time.monotonic()
    steps = Steps(started)
    state.sock.close()  # the source's channel; the clone answers on its own
    state.sock = socket.socket(fileno=clone_fd)
    os.setsid()
    die_with(state.config.reaper_pid)
    state.fault("clone.before_cgroup")  # still in its source's cgroup: the engine kills it by pid if it fails here
    join_by_fds(state.cgroup_fds, spec.cgroup_rel)
    steps.mark("cgroup")
    state.fault("clone.after_cgroup")
    borrowed = None
    if shell_fd is not None:  # a prepared shell: its network (loopback up), UTS and IPC namespaces, made ahead
        try:
            namespaces.enter_new_workspace_namespaces(spec.hostname, shell=shell_fd)
        finally:
            os.close(shell_fd)
        state.fault("clone.after_attach")
    elif spec.borrow is None:
        namespaces.enter_new_workspace_namespaces(spec.hostname)
    else:  # a warm-pool slot: its network namespace (its browser is in it) and the descriptors its app lent
        slot = os.pidfd_open(spec.borrow.pid)
        try:
            namespaces.enter_new_workspace_namespaces(spec.hostname, network_of=slot)
            borrowed = Lending(fds={name: syscalls.pidfd_getfd(slot, number)
                                    for name, number in spec.borrow.fds.items()}, data=dict(spec.borrow.data))
        finally:
            os.close(slot)
    os.fchdir(state.pool_fd)
    steps.mark("namespaces")
    layer_fd = os.open(spec.layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=state.pool_fd)
    rootfs.assemble_and_pivot(target=image.CLONE_ROOT, lower=state.config.lower, layer=spec.layer,
                              frozen=spec.frozen,
                              image_binds=[(path, path) for _, path in state.config.image_binds],
                              runtime_binds=state.config.runtime_binds)
    os.close(state.layer_fd)
    state.layer_fd = layer_fd
    steps.mark("root")
    state.agents.become_clones(spec.cgroup_rel)
    state.apps.forget_all()  # the source's programs (a browser): the app starts its own in after_fork
    state.ctx.forget_in_clone()
    state.ws_id, state.frozen = spec.ws_id, spec.frozen
    state.ctx.ws_id = spec.ws_id
    state.ctx.borrowed = borrowed
    steps.mark("forget")
    if state.workers:
        pidfd = os.pidfd_open(os.getpid())  # the workers' clones enter our namespaces through it
        try:
            for w, end in zip(state.workers, worker_ends, strict=True):
                w.adopt(pidfd, end, ws_id=spec.ws_id, seed=derive_seed(spec.seed, "worker", w.index),
                        cgroup_rel=spec.cgroup_rel, reaper_pid=state.config.reaper_pid, frozen=spec.frozen)
        finally:
            os.close(pidfd)
        steps.mark("workers")
    if spec.frozen:
        state.ctx.suspend_after_fork()
    else:
        if shell_fd is None:  # a shell's loopback is up already
            namespaces.loopback_up()
            steps.mark("loopback")
        state.ctx.reseed(spec.seed)
        state.ctx.rebind_after_fork()
        steps.mark("reopen")
        state.app.after_fork(state.ctx)
        steps.mark("after_fork")
    state.ctx.borrowed = None  # the app took what it wanted of it; a later fork of this clone borrows its own
    state.reply(Ready(ws_id=state.ws_id, pid=os.getpid(), setup_s=time.monotonic() - started, steps_s=steps.took))
