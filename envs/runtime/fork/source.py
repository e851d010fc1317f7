"""The live fork, source side (in the source workspace's host): a flat sequence of steps, each a named fault point,
whose failure path undoes exactly what was done, so the source always runs on.

Steps: freeze the agents; quiesce the application and its workers (``before_fork``: flush what they buffer); snapshot
the writable layer (btrfs, constant time; read-only for a snapshot); have each worker fork itself (``worker.py``),
keeping our end of each worker clone's socket; ``gc.freeze()`` (so the collector does not touch, and so copy,
every object page in the clone); fork the clone as a child of the run's nursery (``sibling.py``: in one step,
``clone(CLONE_PARENT)``, where the run allows it; else a fork whose child forks once more and exits, so the clone
is orphaned onto the nursery); the clone becomes itself in ``clone.py``. The parent thaws the agents and the
collector, reaps the middle process if there was one, and answers ``Forked`` with the freeze window: how long it
stopped serving.
Must never: return with the agents frozen, the collector frozen, or a descriptor of the clone's open.
"""

from __future__ import annotations

import gc
import os
import resource
import socket
import time

from ..channel import send_frame
from ..layers import snapshot_at
from ..protocol import CloneSpec, Failed, Forked, Reply, encoder
from . import clone
from .sibling import clone_pid, fork_to_reaper
from .state import ForkState


def fork(state: ForkState, spec: CloneSpec, fds: list[int]) -> Reply:
    """Fork the workspace of ``state`` live into ``spec``; ``fds`` carries the clone's end of its engine socket, then
    for a clone in a prepared shell a pidfd of the shell's holder (``shells.py``)."""
    wanted = 2 if spec.shell else 1
    if len(fds) != wanted:
        for fd in fds:
            os.close(fd)
        return Failed(kind="bad_request", message=f"fork needs exactly {wanted} descriptors, got {len(fds)}")
    clone_fd, shell_fd = fds[0], (fds[1] if spec.shell else None)
    started, cpu_started, children_before = time.monotonic_ns(), time.thread_time_ns(), _children_cpu_ns()
    worker_ends: list[socket.socket] = []
    agents_frozen = gc_frozen = False
    try:
        agents_frozen = state.agents.running  # before the call: a freeze that times out is undone
        state.agents.freeze()
        state.app.before_fork(state.ctx)
        for w in state.workers:
            w.before_fork()
        state.fault("fork.before_snapshot")
        snapshot_at(state.pool_fd, state.layer_fd, spec.layer, readonly=spec.frozen)
        state.fault("fork.after_snapshot")
        for w in state.workers:  # each worker forks itself; its clone waits on the end we keep for ours
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            worker_ends.append(ours)
            try:
                w.fork(theirs.fileno())
            finally:
                theirs.close()
        gc.freeze()
        gc_frozen = True
        state.fault("fork.before_fork")
        forking = fork_to_reaper(state.config.reaper_pid, one_step=state.config.one_step_clones)
    except BaseException:
        os.close(clone_fd)
        if shell_fd is not None:
            os.close(shell_fd)
        for end in worker_ends:
            end.close()  # a worker clone still waiting sees EOF and exits
        if gc_frozen:
            gc.unfreeze()
        if agents_frozen:
            state.agents.thaw()
        raise
    if forking.pid == 0:
        in_clone(state, spec, clone_fd, shell_fd, worker_ends)  # returns only in the clone, once it is ready
        raise clone.BecameClone
    os.close(clone_fd)
    if shell_fd is not None:
        os.close(shell_fd)
    for end in worker_ends:
        end.close()
    if agents_frozen:
        state.agents.thaw()
    gc.unfreeze()  # the source collects as before; only the clone keeps the heap out of the collector's way
    status = 0 if forking.one_step else os.waitpid(forking.pid, 0)[1]  # a one-step clone is the nursery's to reap
    pid = clone_pid(forking)
    frozen_for = time.monotonic_ns() - started
    if status != 0:
        return Failed(kind="fork", message=f"fork intermediate exited with status {status:#x}")
    cpu = time.thread_time_ns() - cpu_started + _children_cpu_ns() - children_before
    return Forked(freeze_ns=frozen_for, one_step=forking.one_step, cpu_ns=cpu, clone_pid=pid)


def _children_cpu_ns() -> int:
    """The CPU of our reaped children so far (a two-step fork's middle process is one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round((usage.ru_utime + usage.ru_stime) * 1e9)


def in_clone(state: ForkState, spec: CloneSpec, clone_fd: int, shell_fd: int | None,
             worker_ends: list[socket.socket]) -> None:
    """The clone becomes a workspace of its own (``clone.py``); a failure is told on its engine socket and ends it."""
    try:
        clone.become(state, spec, clone_fd, shell_fd, worker_ends)
    except BaseException as exc:
        try:
            send_frame(socket.socket(fileno=clone_fd),
                       encoder.encode(Failed(kind="fork", message=f"clone setup failed: {exc!r}")))
        finally:
            os._exit(71)
