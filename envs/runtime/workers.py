"""Worker processes: application state kept in child processes of a workspace's host (``WorkerApp``, see
``bunshin.envs.app``), forked with it.

Owns: spawning a worker (a fork of the host running a ``WorkerApp``), the host's synchronous handle on it
(``WorkerHandle``: calls, quiescing, its fork, checkpoint and restore), and the worker process's serve loop (the
host's requests, and the app's own sockets). How a worker forks with its workspace is ``fork/worker.py``.
For the private-restore backend a worker may implement ``checkpoint``/``restore``: it writes its own image (a
checkpoint file the host opens and hands it), and a restoring host re-spawns it from that image instead of setup.
Must never: keep a descriptor of the host's that the host did not mean it to keep (``close_in_child``).
"""

from __future__ import annotations

import importlib
import os
import random
import selectors
import signal
import socket
import traceback
from collections.abc import Callable
from typing import Any

import msgspec

from ..app import AppContext, WorkerApp, WorkerError
from . import checkpoint_file, syscalls
from .channel import ChannelClosed, recv_frame, send_frame
from .fork import worker as worker_fork
from .protocol import (
    WorkerAdopt,
    WorkerBeforeFork,
    WorkerCall,
    WorkerCheckpoint,
    WorkerFork,
    WorkerMessage,
    WorkerReply,
    encoder,
    worker_message_decoder,
    worker_reply_decoder,
)


class WorkerHandle:
    """The host's end of one worker. Calls are synchronous: the host is single-threaded."""

    def __init__(self, index: int, pid: int, sock: socket.socket):
        self.index, self.pid, self.sock = index, pid, sock

    def _exchange(self, message: msgspec.Struct, fds: list[int] | None = None) -> WorkerReply:
        send_frame(self.sock, encoder.encode(message), fds)
        body, _ = recv_frame(self.sock)
        reply = worker_reply_decoder.decode(body)
        if reply.error is not None:
            raise WorkerError(f"worker {self.index} (pid {self.pid}): {reply.error}")
        return reply

    def call(self, method: str, **args: Any) -> Any:
        return self._exchange(WorkerCall(method=method, args=args)).value

    def before_fork(self) -> None:
        self._exchange(WorkerBeforeFork())

    def fork(self, clone_end: int) -> None:
        self._exchange(WorkerFork(), fds=[clone_end])

    def checkpoint(self, image_fd: int) -> int:
        """The worker's ``before_fork``, then its ``checkpoint()`` written by the worker itself into ``image_fd``
        (a checkpoint file: the worker's image); the bytes written."""
        return int(self._exchange(WorkerCheckpoint(), fds=[image_fd]).value)

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


class Worker:
    """The worker process's side: serve the host's calls and the app's sockets; fork on request."""

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
            reply = self.handle(worker_message_decoder.decode(body), fds)
        except worker_fork.WorkerBecameClone as became:
            self.sock = became.sock  # this process is the worker's clone now, answering the clone's host
            return True
        except Exception as exc:
            traceback.print_exc()
            reply = WorkerReply(error=f"{type(exc).__name__}: {exc}")
        send_frame(self.sock, encoder.encode(reply))
        return True

    def handle(self, message: WorkerMessage, fds: list[int]) -> WorkerReply:
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
                if len(fds) != 1:
                    return WorkerReply(error=f"fork needs exactly one descriptor, got {len(fds)}")
                return worker_fork.fork(self.sock, fds[0], app=self.app, ctx=self.ctx, cgroup_fds=self.cgroup_fds)
            case WorkerCheckpoint():
                if len(fds) != 1:
                    return WorkerReply(error=f"checkpoint needs exactly one descriptor, got {len(fds)}")
                try:
                    self.app.before_fork(self.ctx)  # the workspace's files are snapshotted after this answer
                    state = self.app.checkpoint()
                    parts = state if isinstance(state, list) else [state]
                    return WorkerReply(value=checkpoint_file.write_fd(fds[0], parts))
                finally:
                    os.close(fds[0])
        return WorkerReply(error=f"unexpected {type(message).__name__}")


def spawn(target: str, kwargs: dict[str, Any], index: int, ws_id: str, seed: int, cgroup_fds: list[int],
          close_in_child: list[Callable[[], None]], image: tuple[int, str] | None = None) -> WorkerHandle:
    """Fork a worker from the host. ``close_in_child`` close what of the host the worker must not keep open.
    With ``image`` (an open checkpoint file and its name) the worker restores its state from it instead of
    running ``setup``: a restoring host re-spawning the source's workers."""
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
            if image is None:
                app.setup(ctx)
            else:
                _restore(app, ctx, *image)
            send_frame(theirs, encoder.encode(WorkerReply(value=os.getpid())))
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


def _restore(app: WorkerApp, ctx: AppContext, fd: int, name: str) -> None:
    mapping, payload = checkpoint_file.map_verified_fd(fd, name)
    os.close(fd)
    try:
        app.restore(ctx, payload)
    finally:
        payload.release()
        mapping.close()


def _no_agents(cmd: str, timeout_s: float) -> Any:
    raise WorkerError("workers do not run agent commands; the host does")
