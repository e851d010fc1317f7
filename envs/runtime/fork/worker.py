"""The live fork, worker side: a worker process forks itself with its workspace, and its clone moves into the
clone workspace.

When the source host forks, it first asks each worker to fork (``WorkerFork``, carrying the socket end the worker's
clone will answer on). The worker forks twice (the clone is orphaned onto the run's nursery, like a host's clone);
the clone waits on that socket until the clone's host has built its namespaces and sends ``WorkerAdopt`` with a
pidfd of itself; the worker's clone then enters those namespaces (``setns(pidfd, NEWNS|NEWNET|NEWUTS|NEWIPC)``),
joins the clone's cgroup, reseeds, re-opens its files, re-creates its sockets, runs ``after_fork`` and answers.
Kernel parenthood cannot be rebuilt by ``fork()``: the clone host owns its worker clones logically (it alone holds
their sockets; they die with the workspace's cgroup and with the nursery).
Must never: keep a descriptor of the source workspace in a clone (the source host's socket above all).
"""

from __future__ import annotations

import os
import signal
import socket
import time
import traceback

from ...app import AppContext, WorkerApp
from .. import syscalls
from ..cgroups import join_by_fds
from ..channel import recv_frame, send_frame
from ..protocol import WorkerAdopt, WorkerReply, encoder, worker_message_decoder
from .sibling import clone_pid, fork_to_reaper

_NAMESPACES = syscalls.CLONE_NEWNS | syscalls.CLONE_NEWNET | syscalls.CLONE_NEWUTS | syscalls.CLONE_NEWIPC


class WorkerBecameClone(Exception):
    """Raised in a worker's fresh clone to unwind the source worker's request handler back to its serve loop;
    ``sock`` is the clone's channel to its own host, which the serve loop answers from now on."""

    def __init__(self, sock: socket.socket):
        super().__init__("this process is the worker's clone")
        self.sock = sock


def fork(sock: socket.socket, clone_end: int, *, app: WorkerApp, ctx: AppContext, cgroup_fds: list[int]) -> WorkerReply:
    """Fork the worker serving the host on ``sock``; in the source, the reply to the host. In the clone it raises
    ``WorkerBecameClone`` once the clone is in its workspace."""
    forking = fork_to_reaper(0, one_step=False)  # a first worker's parent is its host, not the nursery: two steps
    if forking.pid == 0:
        try:
            clone_sock = become(sock, clone_end, app=app, ctx=ctx, cgroup_fds=cgroup_fds)
        except BaseException:
            traceback.print_exc()
            os._exit(71)
        raise WorkerBecameClone(clone_sock)
    os.close(clone_end)
    _, status = os.waitpid(forking.pid, 0)
    clone_pid(forking)  # (its pipe closed; the host finds its worker clones through their sockets)
    return WorkerReply(error=None if status == 0 else f"fork intermediate status {status:#x}")


def become(sock: socket.socket, clone_end: int, *, app: WorkerApp, ctx: AppContext,
           cgroup_fds: list[int]) -> socket.socket:
    """In the worker's clone: wait for the clone host's ``WorkerAdopt``, move into its workspace and answer; the
    clone's channel (on ``clone_end``)."""
    sock.close()  # the source host's end: never ours again
    sock = socket.socket(fileno=clone_end)
    os.setsid()
    body, fds = recv_frame(sock)  # waits until the clone's host has built its workspace
    adopt = worker_message_decoder.decode(body)
    if not isinstance(adopt, WorkerAdopt) or len(fds) != 1:
        raise RuntimeError(f"a worker's clone expected WorkerAdopt with one pidfd, got {type(adopt).__name__} "
                           f"with {len(fds)} descriptor(s)")
    syscalls.setns(fds[0], _NAMESPACES)
    os.close(fds[0])
    os.chdir("/")
    join_by_fds(cgroup_fds, adopt.cgroup_rel)
    die_with(adopt.reaper_pid)
    ctx.ws_id = adopt.ws_id
    ctx.forget_in_clone()
    if adopt.frozen:  # a snapshot's worker waits; its clones rebind when they are made
        ctx.suspend_after_fork()
    else:
        ctx.reseed(adopt.seed)
        ctx.rebind_after_fork()
        app.after_fork(ctx)
    send_frame(sock, encoder.encode(WorkerReply(value=os.getpid())))
    return sock


def die_with(reaper_pid: int) -> None:
    """For a clone: get SIGKILL when the run's nursery dies. Only once re-parented onto it: death signals also
    fire on re-parenting, so arming it while the fork's intermediate still lives would kill us."""
    deadline = time.monotonic() + 5
    while os.getppid() != reaper_pid:
        if time.monotonic() > deadline:
            os._exit(72)
        time.sleep(0.0001)
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != reaper_pid:
        os._exit(73)
