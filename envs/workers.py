"""Worker processes: application state kept in child processes of a workspace's host, forked with it.

Owns: spawning a worker (a fork of the host running a ``WorkerApp``), calling it over its socketpair, and both
sides of its live fork. When the workspace forks, each worker forks itself while the source is frozen; the worker's
clone waits until the clone's host has built its namespaces, then enters them through a pidfd of that host
(``setns(pidfd, NEWNS|NEWNET|NEWUTS|NEWIPC)``), joins the clone's cgroup, reseeds, re-opens its files, re-creates
its sockets, and answers the clone's host. Kernel parenthood cannot be rebuilt by ``fork()`` (a clone is the child
of the process that forked it): a worker's clone is re-parented onto the engine like every clone, and the clone's
host owns it logically (it is the only one holding its socket, and the worker dies with the workspace's cgroup).
For the private-restore backend a worker may implement ``checkpoint``/``restore``; the host application carries
its workers' checkpoints in its own and, when restored, spawns them again and hands each its bytes.
Must never: keep a descriptor of the source workspace in a clone (the source's engine channel above all).
"""

from __future__ import annotations

import importlib
import mmap
import os
import random
import selectors
import signal
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import msgspec

from . import syscalls
from .app import AppContext
from .cgroups import join_by_fds
from .channel import ChannelClosed, recv_frame, send_frame

_NAMESPACES = syscalls.CLONE_NEWNS | syscalls.CLONE_NEWNET | syscalls.CLONE_NEWUTS | syscalls.CLONE_NEWIPC


class WorkerCall(msgspec.Struct, frozen=True, tag="call"):
    method: str
    args: dict[str, Any] = {}


class WorkerBeforeFork(msgspec.Struct, frozen=True, tag="before_fork"):
    pass


class WorkerFork(msgspec.Struct, frozen=True, tag="fork"):
    """Carries one descriptor: the socket end the worker's clone will answer on."""


class WorkerAdopt(msgspec.Struct, frozen=True, kw_only=True, tag="adopt"):
    """To a worker's clone, from the clone's host; carries a pidfd of that host."""

    ws_id: str
    seed: int
    cgroup_rel: str
    reaper_pid: int
    frozen: bool = False


class WorkerCheckpoint(msgspec.Struct, frozen=True, tag="checkpoint"):
    """For the private-restore backend: quiesce (``before_fork``) and answer ``WorkerApp.checkpoint()``."""


class WorkerRestore(msgspec.Struct, frozen=True, tag="restore"):
    """To a worker freshly spawned by a restoring host: ``WorkerApp.restore(ctx, data)``."""

    data: bytes


class WorkerReply(msgspec.Struct, frozen=True, kw_only=True, tag="reply"):
    value: Any = None
    error: str | None = None


_Message = WorkerCall | WorkerBeforeFork | WorkerFork | WorkerAdopt | WorkerCheckpoint | WorkerRestore
_encoder = msgspec.msgpack.Encoder()
_message_decoder = msgspec.msgpack.Decoder(_Message)
_reply_decoder = msgspec.msgpack.Decoder(WorkerReply)


class WorkerApp:
    """State in a worker process. RPC methods are named ``rpc_<method>`` and take keyword arguments."""

    def setup(self, ctx: AppContext) -> None:
        pass

    def readers(self) -> dict[Any, Callable[[], None]]:
        """Sockets to watch (e.g. a listening socket from ``ctx.listen``) and what to call when one is readable.
        Asked again after every request, so sockets re-created in a clone are picked up."""
        return {}

    def before_fork(self, ctx: AppContext) -> None:
        ctx.flush_files()

    def after_fork(self, ctx: AppContext) -> None:
        pass

    def checkpoint(self) -> bytes:
        """The worker's state for the private-restore backend (the CRIU-like baseline), called after
        ``before_fork``. Optional: a worker that does not override it refuses (``WorkerError`` in the host), and
        so does the restore backend for its workspace. The host application asks for it in its own
        ``WorkspaceApp.checkpoint`` (``handle.checkpoint()``) and carries the bytes in its checkpoint."""
        raise NotImplementedError(f"{type(self).__name__} does not checkpoint its state")

    def restore(self, ctx: AppContext, data: bytes) -> None:
        """In a worker the restoring host spawned anew (``ctx.spawn`` in ``WorkspaceApp.restore``, so ``setup``
        already ran, in the restored workspace, on its files): rebuild the rest of the state from
        ``checkpoint()``'s bytes, in this process's private memory. Asked through ``handle.restore(data)``."""
        raise NotImplementedError(f"{type(self).__name__} does not restore state")

    def close(self) -> None:
        pass


class WorkerError(RuntimeError):
    """A worker call failed in the worker; the message carries the worker's exception."""


class WorkerHandle:
    """The host's end of one worker. Calls are synchronous: the host is single-threaded."""

    def __init__(self, index: int, pid: int, sock: socket.socket):
        self.index, self.pid, self.sock = index, pid, sock

    def _exchange(self, message: msgspec.Struct, fds: list[int] | None = None) -> WorkerReply:
        send_frame(self.sock, _encoder.encode(message), fds)
        body, _ = recv_frame(self.sock)
        reply = _reply_decoder.decode(body)
        if reply.error is not None:
            raise WorkerError(f"worker {self.index} (pid {self.pid}): {reply.error}")
        return reply

    def call(self, method: str, **args: Any) -> Any:
        return self._exchange(WorkerCall(method=method, args=args)).value

    def before_fork(self) -> None:
        self._exchange(WorkerBeforeFork())

    def fork(self, clone_end: int) -> None:
        self._exchange(WorkerFork(), fds=[clone_end])

    def checkpoint(self) -> bytes:
        """The worker's ``before_fork`` then ``checkpoint()``: its state for the private-restore backend."""
        value = self._exchange(WorkerCheckpoint()).value
        if not isinstance(value, bytes):
            raise WorkerError(f"worker {self.index} (pid {self.pid}): checkpoint() returned "
                              f"{type(value).__name__}, not bytes")
        return value

    def restore(self, data: bytes) -> None:
        """The worker's ``restore(ctx, data)`` (a worker just spawned by a restoring host)."""
        self._exchange(WorkerRestore(data=bytes(data)))

    def adopt(self, pidfd: int, new_sock: socket.socket, **fields: Any) -> None:
        """Hand the worker's clone (answering on ``new_sock``) to the calling clone host; this handle then
        speaks to the clone. ``fields`` are WorkerAdopt's."""
        self.sock.close()  # the source's worker
        self.sock = new_sock
        self.pid = int(self._exchange(WorkerAdopt(**fields), fds=[pidfd]).value)

    def close(self) -> None:
        self.sock.close()


def load(target: str) -> Any:
    """The object named ``module:qualname``."""
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class _BecameClone(Exception):
    pass


class Worker:
    """The worker process's side: serve calls; fork on request; in a clone, move into the clone's workspace."""

    def __init__(self, sock: socket.socket, app: WorkerApp, ctx: AppContext, cgroup_fds: list[int]):
        self.sock, self.app, self.ctx, self.cgroup_fds = sock, app, ctx, cgroup_fds

    def serve(self) -> None:
        """Answer the host, and call the app's readers when their sockets are readable (a worker can serve a
        network protocol on the workspace's loopback while the host waits on it)."""
        selector = selectors.DefaultSelector()
        registered: dict[int, Any] = {}
        try:
            while True:
                wanted = {id(s): (s, cb) for s, cb in [(self.sock, None), *self.app.readers().items()]
                          if s.fileno() >= 0}  # a snapshot's sockets are closed until its clones re-create them
                if wanted.keys() != registered.keys():  # after a fork the sockets are new objects
                    selector.close()
                    selector = selectors.DefaultSelector()
                    for s, cb in wanted.values():
                        selector.register(s, selectors.EVENT_READ, cb)
                    registered = wanted
                for key, _ in selector.select():
                    if key.data is not None:
                        try:
                            key.data()
                        except Exception:
                            traceback.print_exc()  # one bad connection never stops the worker
                    elif not self._answer_host():
                        return
        finally:
            selector.close()

    def _answer_host(self) -> bool:
        try:
            body, fds = recv_frame(self.sock)
        except ChannelClosed:
            return False
        try:
            reply = self.handle(_message_decoder.decode(body), fds)
        except _BecameClone:
            return True
        except Exception as exc:
            traceback.print_exc()
            reply = WorkerReply(error=f"{type(exc).__name__}: {exc}")
        send_frame(self.sock, _encoder.encode(reply))
        return True

    def handle(self, message: _Message, fds: list[int]) -> WorkerReply:
        match message:
            case WorkerCall(method=method, args=args):
                fn = getattr(self.app, f"rpc_{method}", None)
                if fn is None:
                    return WorkerReply(error=f"no method {method!r}")
                return WorkerReply(value=fn(**args))
            case WorkerBeforeFork():
                self.app.before_fork(self.ctx)
                return WorkerReply()
            case WorkerFork():
                return self.fork(fds[0])
            case WorkerCheckpoint():
                self.app.before_fork(self.ctx)  # the workspace's files are snapshotted after this answer
                return WorkerReply(value=bytes(self.app.checkpoint()))
            case WorkerRestore(data=data):
                self.app.restore(self.ctx, data)
                return WorkerReply()
        return WorkerReply(error=f"unexpected {type(message).__name__}")

    def fork(self, clone_end: int) -> WorkerReply:
        pid = os.fork()
        if pid == 0:
            try:
                if os.fork() != 0:
                    os._exit(0)
                self._become_clone(clone_end)
            except BaseException:
                traceback.print_exc()
                os._exit(71)
            raise _BecameClone
        os.close(clone_end)
        _, status = os.waitpid(pid, 0)
        return WorkerReply(error=None if status == 0 else f"fork intermediate status {status:#x}")

    def _become_clone(self, clone_end: int) -> None:
        self.sock.close()  # the source host's end: never ours again
        self.sock = socket.socket(fileno=clone_end)
        os.setsid()
        body, fds = recv_frame(self.sock)  # waits until the clone's host has built its workspace
        adopt = _message_decoder.decode(body)
        assert isinstance(adopt, WorkerAdopt) and len(fds) == 1
        syscalls.setns(fds[0], _NAMESPACES)
        os.close(fds[0])
        os.chdir("/")
        join_by_fds(self.cgroup_fds, adopt.cgroup_rel)
        die_with(adopt.reaper_pid)
        self.ctx.ws_id = adopt.ws_id
        if adopt.frozen:  # a snapshot's worker waits; its clones rebind when they are made
            self.ctx.suspend_after_fork()
        else:
            self.ctx.reseed(adopt.seed)
            self.ctx.rebind_after_fork()
            self.app.after_fork(self.ctx)
        send_frame(self.sock, _encoder.encode(WorkerReply(value=os.getpid())))


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


def spawn(target: str, kwargs: dict[str, Any], index: int, ws_id: str, seed: int, cgroup_fds: list[int],
          close_in_child: list[Callable[[], None]]) -> WorkerHandle:
    """Fork a worker from the host. ``close_in_child`` close what of the host the worker must not keep open."""
    cls = load(target)
    if not (isinstance(cls, type) and issubclass(cls, WorkerApp)):
        raise TypeError(f"{target} is not a WorkerApp subclass")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            for close in close_in_child:
                close()
            syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
            ctx = AppContext(ws_id=ws_id, seed=seed, rng=random.Random(seed), run_agent=_no_agents)
            app = cls(**kwargs)
            app.setup(ctx)
            send_frame(theirs, _encoder.encode(WorkerReply(value=os.getpid())))
            Worker(theirs, app, ctx, cgroup_fds).serve()
            app.close()
        except BaseException:
            traceback.print_exc()
            os._exit(70)
        os._exit(0)
    theirs.close()
    try:
        body, _ = recv_frame(ours)
    except ChannelClosed as exc:
        ours.close()
        os.waitpid(pid, 0)
        raise WorkerError(f"worker {target} exited during setup") from exc
    return WorkerHandle(index, pid, ours)


def dont_fork_into_workers(payload: Any) -> None:
    """For ``WorkspaceApp.restore`` before it spawns workers: keep the host's mapping of the checkpoint file (what
    ``payload`` views) out of them (``MADV_DONTFORK``). A worker forked with it would keep the checkpoint file,
    unlinked once the clone is ready, mapped and its pages cached for the worker's whole life."""
    mapping = payload.obj if isinstance(payload, memoryview) else None
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTFORK"):
        mapping.madvise(mmap.MADV_DONTFORK)


def _no_agents(cmd: str, timeout_s: float) -> Any:
    raise RuntimeError("workers do not run agent commands; the host does")
