"""The workspace host: the one process inside a workspace that owns its application state and answers the engine.

Owns: building the workspace (cgroup, namespaces, root file system) at start, serving the engine's requests over
its Unix socket one at a time, dispatching tool calls (the built-in ``shell`` to ``agents.py``, the rest to the
application), and starting workers. The live fork's host side is ``fork/source.py`` and ``fork/clone.py``; the
checkpoint and restore of the private-restore baseline are ``fork/checkpoint.py``; they are handed the host's
``ForkState`` (``fork/state.py``), never the host. It runs single-threaded, which is what makes ``fork()`` safe.
Must never: let an agent command inherit a descriptor of ours, run after the engine has died, or stop serving
because of one bad request.

Run as ``python -m bunshin.envs.runtime.host --channel FD --pool FD --cgroups FD[,FD...]``, or in a Docker
container as ``... --container DIR`` (it connects to ``DIR/io/host.sock`` and keeps dumps in ``DIR/dumps``); the
first frame on the channel is a HostConfig.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import math
import os
import random
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import msgspec

from ..app import AppContext, ToolError, WorkspaceApp
from ..records import Observation
from ..seeds import derive_seed
from . import image, namespaces, rootfs, syscalls, workers
from .agents import Agents
from .app_processes import AppProcesses
from .cgroups import join_by_fds
from .channel import ChannelClosed, recv_frame, send_frame
from .faults import InjectedFault
from .fork import checkpoint, clone, source
from .fork.state import ForkState
from .protocol import (
    TREE_CGROUP_FD,
    TREE_CHANNEL_FD,
    TREE_POOL_FD,
    Become,
    Checkpoint,
    Close,
    Closed,
    Execute,
    Executed,
    Failed,
    Fork,
    HostConfig,
    Lend,
    Lent,
    Ping,
    Pong,
    Ready,
    Reply,
    Request,
    config_decoder,
    encoder,
    request_decoder,
)

HOST_OOM_SCORE_ADJ = -500  # the OOM killer takes an agent's memory hog before the host


class Host:
    """The host process's own part: building the workspace, serving, tools, workers, shutdown. What the fork,
    checkpoint and restore steps share with it is ``self.state`` (``fork/state.py``)."""

    def __init__(self, sock: socket.socket, pool_fd: int, cgroup_fds: list[int], config: HostConfig):
        self.engine_pid = int(os.readlink("/proc/self"))  # as the engine sees it (pid 1 in a tree-fork host's own)
        self.pool_path_fd = pool_fd  # O_PATH, keeps the detached pool mount alive
        # the engine's PID namespace, shared by every host (a tree-fork host's own is for it and its agents only)
        self.own_pidns_fd = -1 if config.tree or config.container else namespaces.open_ns("pid")
        app_cls = workers.load(config.app.target)
        if not (isinstance(app_cls, type) and issubclass(app_cls, WorkspaceApp)):
            raise TypeError(f"{config.app.target} is not a WorkspaceApp subclass")
        self.state_version = 0
        agents = Agents(cgroup_fds, config.cgroup_rel, self.own_pidns_fd, self._agent_private_fds,
                        namespace=not (config.tree or config.container), image_env=config.image_env,
                        image_cwd=config.image_cwd)
        apps = AppProcesses(self.own_pidns_fd, self._agent_private_fds, cgroup_fds, config.cgroup_rel,
                            refuse="a workspace under --runtime docker starts no application processes yet"
                            if config.container else "")
        self.state = ForkState(
            ws_id=config.ws_id, frozen=False, sock=sock,
            pool_fd=os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pool_fd), layer_fd=-1,
            cgroup_fds=cgroup_fds, config=config, app=app_cls(**config.app.kwargs),
            ctx=AppContext(ws_id=config.ws_id, seed=config.seed, rng=random.Random(config.seed),
                           run_agent=agents.run, run_command=agents.run_alone, spawner=self.spawn_worker, launcher=apps.start),
            agents=agents, workers=[], apps=apps)

    # -- start ------------------------------------------------------------------------------------------------
    def build(self) -> None:
        """Join the cgroup, enter fresh namespaces, assemble the root and pivot into it; then set up the app."""
        start = time.monotonic()
        state = self.state
        cfg = state.config
        if cfg.container:
            self._build_in_container(start)
            return
        join_by_fds(state.cgroup_fds, cfg.cgroup_rel)
        if cfg.merge_memory:  # before the app's memory exists: the host, its workers and agents inherit it
            syscalls.prctl(syscalls.PR_SET_MEMORY_MERGE, 1)
        try:  # lowering needs CAP_SYS_RESOURCE, which some sandboxes drop; agents are raised regardless
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(HOST_OOM_SCORE_ADJ))
        except PermissionError:
            pass
        namespaces.enter_new_workspace_namespaces(cfg.hostname)
        if cfg.pool_path:  # the pool's mount in our namespace (6.1 takes no detached one as an overlay layer)
            os.chdir(cfg.pool_path)
        else:
            os.fchdir(state.pool_fd)
        state.layer_fd = os.open(cfg.layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=state.pool_fd)
        rootfs.assemble_and_pivot(target=cfg.mount_target, lower=cfg.lower, layer=cfg.layer, frozen=False,
                                  image_binds=cfg.image_binds, runtime_binds=cfg.runtime_binds)
        if cfg.tree:  # pid 1 of its own namespace: its /proc, and nothing of the pool kept (its clone has none)
            rootfs.mount_proc()
            for fd in (state.pool_fd, self.pool_path_fd, state.layer_fd):
                os.close(fd)
            state.pool_fd = self.pool_path_fd = state.layer_fd = -1
        namespaces.loopback_up()
        self._start_app(start)

    def _start_app(self, start: float) -> None:
        """The app set up, or restored from its dump; then Ready."""
        state, cfg = self.state, self.state.config
        if cfg.restore_from is not None:
            checkpoint.restore_app(state, cfg.restore_from, cfg.restore_workers)
        else:
            state.app.setup(state.ctx)
        state.fault("start.after_setup")
        state.reply(Ready(ws_id=state.ws_id, pid=self.engine_pid, setup_s=time.monotonic() - start))

    def _build_in_container(self, start: float) -> None:
        """In a Docker container: its namespaces, root, cgroup and network are the daemon's; the app is set up (or
        restored) in place."""
        if self.state.config.merge_memory:
            syscalls.prctl(syscalls.PR_SET_MEMORY_MERGE, 1)
        with contextlib.suppress(PermissionError), open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(HOST_OOM_SCORE_ADJ))
        os.chdir("/")
        image.add_agent_user(Path("/"))  # a Docker image knows no agent user (a clone's committed files have it)
        self._start_app(start)

    # -- serving ----------------------------------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            if self.state.config.tree or self.state.config.container:  # pid 1: orphans are ours to reap
                self.state.agents.reap_orphans(keep=tuple(w.pid for w in self.state.workers))
            try:
                body, fds = recv_frame(self.state.sock)
            except ChannelClosed:
                self.shutdown()
                return
            try:
                request = request_decoder.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                for fd in fds:
                    os.close(fd)
                self.state.reply(Failed(kind="bad_request", message=f"cannot decode request: {exc}"))
                continue
            try:
                reply = self.handle(request, fds)
            except clone.BecameClone:
                continue  # this process is now the clone; it already announced itself on its own channel
            except InjectedFault as exc:
                reply = Failed(kind="fault", message=str(exc))
            except Exception as exc:  # one bad request never stops the host
                traceback.print_exc()
                reply = Failed(kind="internal", message=f"{type(exc).__name__}: {exc}")
            self.state.reply(reply)
            if isinstance(request, Close):
                return

    def handle(self, request: Request, fds: list[int]) -> Reply:
        if not isinstance(request, Fork):
            for fd in fds:
                os.close(fd)
        match request:
            case Execute(call=call, timeout_s=timeout_s):
                if self.state.frozen:
                    return Failed(kind="bad_request", message=f"{self.state.ws_id} is a snapshot: it runs no tools")
                return Executed(observation=self.execute(call.name, call.args, timeout_s))
            case Fork(clone=spec):
                return source.fork(self.state, spec, fds)
            case Checkpoint(path=path, layer=layer):
                return checkpoint.write(self.state, path, layer)
            case Ping():
                return Pong(pid=os.getpid(), state_version=self.state_version)
            case Lend():
                lending = self.state.app.lend(self.state.ctx)
                return Lent(pid=os.getpid(), fds=lending.fds, data=lending.data)
            case Close():
                self.shutdown()
                return Closed()
            case Become():
                return self.become(request)
        return Failed(kind="bad_request", message=f"unhandled request {type(request).__name__}")
    def become(self, request: Become) -> Reply:
        """A tree-fork clone (``fork/kmod.py``), told on its own channel which workspace it now is: the rest of its
        state is its source's, as it was when the source froze."""
        state = self.state
        if not state.config.tree:
            return Failed(kind="bad_request", message="only a tree-fork clone becomes another workspace")
        started = time.monotonic()
        state.ws_id = state.ctx.ws_id = request.ws_id
        state.config = msgspec.structs.replace(state.config, ws_id=request.ws_id, layer=request.layer,
                                               cgroup_rel=request.cgroup_rel, seed=request.seed)
        state.agents.become_clones(request.cgroup_rel)
        state.apps.become_clones(request.cgroup_rel)
        state.ctx.reseed(request.seed)
        self.state_version = 0
        return Ready(ws_id=request.ws_id, pid=self.engine_pid, setup_s=time.monotonic() - started)

    # -- tools ------------------------------------------------------------------------------------------------
    def execute(self, name: str, args: dict[str, Any], timeout_s: float) -> Observation:
        started = time.monotonic()
        self.state_version += 1
        self.state.ctx.deadline = started + timeout_s
        try:
            if name == "shell":
                obs = self._shell(args, timeout_s)
            else:
                tools = self.state.app.tools()
                if name not in tools:
                    raise ToolError(f"unknown tool {name!r} (available: {sorted(['shell', *tools])})")
                obs = tools[name](args)
        except ToolError as exc:
            obs = Observation(error=str(exc))
        except Exception as exc:
            obs = Observation(error=f"tool {name!r} failed: {type(exc).__name__}: {exc}")
        finally:
            self.state.ctx.deadline = math.inf
        return msgspec.structs.replace(obs, tool_seconds=time.monotonic() - started)

    def _shell(self, args: dict[str, Any], timeout_s: float) -> Observation:
        """The built-in ``shell`` tool: {"cmd": str, "timeout_s"?: number}; the call's timeout is the ceiling."""
        cmd = args.get("cmd")
        if not isinstance(cmd, str):
            raise ToolError("shell needs a string argument 'cmd'")
        unknown = set(args) - {"cmd", "timeout_s"}
        if unknown:
            raise ToolError(f"shell got unknown arguments {sorted(unknown)}")
        asked = args.get("timeout_s", timeout_s)
        if isinstance(asked, bool) or not isinstance(asked, int | float) or not 0 < asked < math.inf:
            raise ToolError(f"shell timeout_s must be a positive number, got {asked!r}")
        return self.state.agents.run(cmd, min(float(asked), timeout_s))

    # -- workers ------------------------------------------------------------------------------------------------
    def spawn_worker(self, target: str, kwargs: dict[str, Any]) -> workers.WorkerHandle:
        state = self.state
        index = len(state.workers)
        image = checkpoint.worker_image(state, index)  # restoring: the source's worker at this index, imaged
        try:
            handle = workers.spawn(
                target, kwargs, index, state.ws_id, derive_seed(state.ctx.seed, "worker", index), state.cgroup_fds,
                close_in_child=[state.sock.close, *(w.close for w in state.workers), state.agents.close_namespace_fd,
                                *(f.close for f in state.ctx.files), *(s.close for s in state.ctx.sockets),
                                *(lambda fd=fd: os.close(fd) for fd in self.private_fds())],
                image=image,
            )
        finally:
            if image is not None:
                os.close(image[0])
        state.workers.append(handle)
        return handle

    def private_fds(self) -> list[int]:
        """Descriptors of the host's that nothing it starts may keep: the pool, its layer, its PID namespace."""
        return [fd for fd in (self.state.pool_fd, self.pool_path_fd, self.state.layer_fd, self.own_pidns_fd)
                if fd >= 0]

    def _agent_private_fds(self) -> list[int]:
        return [self.state.sock.fileno(), *self.private_fds(), *(w.sock.fileno() for w in self.state.workers)]

    def shutdown(self) -> None:
        state = self.state
        for w in state.workers:
            w.close()  # a worker exits when its socket closes
        for w in state.workers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(w.pid, 0)  # ours if we spawned it; a clone's adopted workers are the engine's
        state.agents.kill_all()
        with contextlib.suppress(Exception):
            state.app.close()
        state.apps.kill_all()  # after the app's close: it may say goodbye to its programs first


def _parent_is(pid: int) -> bool:
    """Whether our parent is ``pid``, read in the engine's /proc (still ours before the root changes)."""
    me = os.readlink("/proc/self")
    with open(f"/proc/{me}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1]) == pid


def _tree_numbers(sock: socket.socket, pool: int, cgroups: list[int]) -> tuple[socket.socket, int, list[int]]:
    """A tree-fork host's descriptors from the engine at fixed numbers (the engine hands its clones theirs at the
    same ones): the channel, the pool, the cgroup hierarchies."""
    given = [sock.detach(), pool, *cgroups]
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in given]
    for fd in given:
        os.close(fd)
    wanted = [TREE_CHANNEL_FD, TREE_POOL_FD, *range(TREE_CGROUP_FD, TREE_CGROUP_FD + len(cgroups))]
    for fd, number in zip(moved, wanted, strict=True):
        os.dup2(fd, number)
        os.close(fd)
    channel = socket.socket(fileno=TREE_CHANNEL_FD)
    channel.setblocking(True)
    return channel, TREE_POOL_FD, wanted[2:]


def _container_channel(directory: str) -> tuple[int, int, list[int]]:
    """A container host's channel (connected to the engine's socket in the bound directory) and its pool: the
    directory, where the dumps are."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.path.join(directory, "io", "host.sock"))
    return sock.detach(), os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), []


def _descriptors(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


MALLOC_MMAP_THRESHOLD = 128 << 10  # glibc's own starting value, kept fixed


def fork_friendly_malloc() -> None:
    """Allocations of ``MALLOC_MMAP_THRESHOLD`` and more get pages of their own, given back when freed. glibc
    otherwise raises the threshold to the largest block freed so far (up to 32 MiB), and a page's render buffers
    come from the heap and are reused: a live fork that renders once more rewrites those shared pages and pays a
    copy of each (measured on the web shop: a branch's charge after one click 43 -> 26 MiB, after a typed text
    16 -> 7 MiB). Workers are forks of the host and keep the setting."""
    syscalls.mallopt(syscalls.M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)


def main(argv: list[str] | None = None) -> int:
    """The host process: its descriptors come from the nursery; it dies with it (parent-death signal)."""
    parser = argparse.ArgumentParser(prog="bunshin.envs.runtime.host", description=__doc__)
    for flag, kind in (("--channel", int), ("--pool", int), ("--cgroups", _descriptors)):
        parser.add_argument(flag, type=kind)
    parser.add_argument("--container", default=None, help="the bound directory of a host in a Docker container")
    args = parser.parse_args(argv)
    if args.container is not None:
        args.channel, args.pool, args.cgroups = _container_channel(args.container)
    elif None in (args.channel, args.pool, args.cgroups):
        parser.error("--channel, --pool and --cgroups are required (or --container)")
    else:
        syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
    for pool in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # before an app imports numpy: a
        os.environ.setdefault(pool, "1")  # host runs one thread (a BLAS pool would make it fork in two steps)
    fork_friendly_malloc()
    sock = socket.socket(fileno=args.channel)
    sock.setblocking(True)
    body, _ = recv_frame(sock)
    config = config_decoder.decode(body)
    if config.container != (args.container is not None):
        return 73
    # a container host is pid 1 of its container, with no parent to check: the engine dies, its channel closes,
    # and the host ends
    if config.tree:  # pid 1 of its own namespace: its parent is outside it (getppid() says 0)
        if not _parent_is(config.reaper_pid):
            return 73
        sock, args.pool, args.cgroups = _tree_numbers(sock, args.pool, args.cgroups)
    elif not config.container and os.getppid() != config.reaper_pid:
        return 73
    try:
        host = Host(sock, args.pool, args.cgroups, config)
        host.build()
    except BaseException as exc:
        traceback.print_exc()
        try:
            send_frame(sock, encoder.encode(Failed(kind="start", message=f"{type(exc).__name__}: {exc}")))
        finally:
            os._exit(74)
    host.serve()
    # Closed: its app is closed and its layer goes with it, so nothing is left for the interpreter's finalization
    # to do but free every object one by one (milliseconds of CPU for each thrown-away clone, more with a big heap).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
