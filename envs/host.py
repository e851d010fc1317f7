"""The workspace host: the one process inside a workspace that owns its application state and answers the engine.

Owns: building the workspace (cgroup, namespaces, root file system) at start, serving the engine's requests over
its Unix socket one at a time, running agent commands as the unprivileged user in the workspace's PID namespace,
and the source and clone sides of a live fork. It runs single-threaded, which is what makes ``fork()`` safe.
Must never: let an agent command inherit a descriptor of ours, run after the engine has died, or stop serving
because of one bad request.

Run as ``python -m bunshin.envs.host --channel FD --pool FD --cgroups FD[,FD...]``; the first frame on the
channel is a HostConfig.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any

import msgspec

from . import checkpoint_file, image, namespaces, rootfs, syscalls, workers
from .app import AppContext, ToolError, WorkspaceApp
from .cgroups import AGENT_GROUP, freeze_by_fds, join_by_fds
from .channel import ChannelClosed, recv_frame, send_frame
from .layers import snapshot_at
from .seeds import derive_seed
from .records import (
    Checkpoint,
    Checkpointed,
    CloneSpec,
    Close,
    Closed,
    Execute,
    Executed,
    Failed,
    Fork,
    Forked,
    HostConfig,
    Observation,
    Ping,
    Pong,
    Ready,
    Reply,
    Request,
    config_decoder,
    encoder,
    request_decoder,
)

MAX_OUTPUT = 64 << 10
AGENT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": image.AGENT_HOME,
    "USER": image.AGENT_USER,
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}
HOST_OOM_SCORE_ADJ = -500  # the OOM killer takes an agent's memory hog before the host
AGENT_OOM_SCORE_ADJ = 800


class BecameClone(Exception):
    """Raised in a freshly forked clone to unwind the source's request handler back to the serve loop."""


class InjectedFault(RuntimeError):
    pass


class Host:
    def __init__(self, sock: socket.socket, pool_fd: int, cgroup_fds: list[int], config: HostConfig):
        self.sock = sock
        self.pool_path_fd = pool_fd  # O_PATH, keeps the detached pool mount alive
        self.pool_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pool_fd)
        self.cgroup_fds = cgroup_fds
        self.config = config
        self.ws_id = config.ws_id
        self.frozen = False
        self.state_version = 0
        self.own_pidns_fd = namespaces.open_ns("pid")  # the engine's PID namespace, shared by every host
        self.layer_fd = -1
        self.agent_init_pid: int | None = None
        self.agent_pidns_fd: int | None = None
        app_cls = workers.load(config.app.target)
        if not (isinstance(app_cls, type) and issubclass(app_cls, WorkspaceApp)):
            raise TypeError(f"{config.app.target} is not a WorkspaceApp subclass")
        self.app: WorkspaceApp = app_cls(**config.app.kwargs)
        self.ctx = AppContext(ws_id=config.ws_id, seed=config.seed, rng=random.Random(config.seed),
                              run_agent=self.run_agent, spawner=self.spawn_worker)
        self.workers: list[workers.WorkerHandle] = []
        self.agent_group = f"{config.cgroup_rel}/{AGENT_GROUP}"

    # -- faults (named steps a test can make fail) ------------------------------------------------------------
    def fault(self, name: str) -> None:
        """A named step tests can break: ``name`` raises, ``name:exit`` exits, ``name:hang`` never returns."""
        faults = self.config.faults
        if name in faults:
            raise InjectedFault(f"injected fault at {name}")
        if f"{name}:exit" in faults:
            os._exit(66)
        if f"{name}:hang" in faults:
            while True:
                time.sleep(3600)

    # -- start ------------------------------------------------------------------------------------------------
    def build(self) -> None:
        """Join the cgroup, enter fresh namespaces, assemble the root and pivot into it; then set up the app."""
        start = time.monotonic()
        cfg = self.config
        join_by_fds(self.cgroup_fds, cfg.cgroup_rel)
        try:  # lowering needs CAP_SYS_RESOURCE, which some sandboxes drop; agents are raised regardless
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(HOST_OOM_SCORE_ADJ))
        except PermissionError:
            pass
        namespaces.enter_new_workspace_namespaces(cfg.hostname)
        os.fchdir(self.pool_fd)
        self.layer_fd = os.open(cfg.layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.pool_fd)
        rootfs.assemble_and_pivot(target=cfg.mount_target, lower=cfg.lower, layer=cfg.layer, frozen=False,
                                  image_binds=cfg.image_binds, runtime_binds=cfg.runtime_binds)
        namespaces.loopback_up()
        if cfg.restore_from is not None:
            mapping, payload = checkpoint_file.map_verified(self.pool_fd, cfg.restore_from)
            try:
                self.app.restore(self.ctx, payload)
            finally:
                payload.release()
                mapping.close()
        else:
            self.app.setup(self.ctx)
        self.fault("start.after_setup")
        self.reply(Ready(ws_id=self.ws_id, pid=os.getpid(), setup_s=time.monotonic() - start))

    # -- serving ----------------------------------------------------------------------------------------------
    def reply(self, message: Reply) -> None:
        send_frame(self.sock, encoder.encode(message))

    def serve(self) -> None:
        while True:
            try:
                body, fds = recv_frame(self.sock)
            except ChannelClosed:
                self.shutdown()
                return
            try:
                request = request_decoder.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                for fd in fds:
                    os.close(fd)
                self.reply(Failed(kind="bad_request", message=f"cannot decode request: {exc}"))
                continue
            try:
                reply = self.handle(request, fds)
            except BecameClone:
                continue  # this process is now the clone; it already announced itself on its own channel
            except InjectedFault as exc:
                reply = Failed(kind="fault", message=str(exc))
            except Exception as exc:  # one bad request never stops the host
                traceback.print_exc()
                reply = Failed(kind="internal", message=f"{type(exc).__name__}: {exc}")
            self.reply(reply)
            if isinstance(request, Close):
                return

    def handle(self, request: Request, fds: list[int]) -> Reply:
        if not isinstance(request, Fork):
            for fd in fds:
                os.close(fd)
        match request:
            case Execute(call=call, timeout_s=timeout_s):
                if self.frozen:
                    return Failed(kind="bad_request", message=f"{self.ws_id} is a snapshot: it runs no tools")
                return Executed(observation=self.execute(call.name, call.args, timeout_s))
            case Fork(clone=spec):
                return self.fork(spec, fds)
            case Checkpoint(path=path, layer=layer):
                return self.checkpoint(path, layer)
            case Ping():
                return Pong(pid=os.getpid(), state_version=self.state_version)
            case Close():
                self.shutdown()
                return Closed()
        return Failed(kind="bad_request", message=f"unhandled request {type(request).__name__}")

    def spawn_worker(self, target: str, kwargs: dict[str, Any]) -> workers.WorkerHandle:
        index = len(self.workers)
        handle = workers.spawn(
            target, kwargs, index, self.ws_id, derive_seed(self.ctx.seed, "worker", index), self.cgroup_fds,
            close_in_child=[self.sock.close, *(w.close for w in self.workers), self._close_agent_ns_fd,
                            *(f.close for f in self.ctx.files), *(s.close for s in self.ctx.sockets),
                            *(lambda fd=fd: os.close(fd) for fd in self._private_fds())],
        )
        self.workers.append(handle)
        return handle

    def _private_fds(self) -> list[int]:
        """Descriptors of the host's that nothing it starts may keep: the pool, its layer, its PID namespace."""
        return [fd for fd in (self.pool_fd, self.pool_path_fd, self.layer_fd, self.own_pidns_fd) if fd >= 0]

    def _close_agent_ns_fd(self) -> None:
        if self.agent_pidns_fd is not None:
            os.close(self.agent_pidns_fd)
            self.agent_pidns_fd = None

    def shutdown(self) -> None:
        for w in self.workers:
            w.close()  # a worker exits when its socket closes
        for w in self.workers:
            try:
                os.waitpid(w.pid, 0)  # ours if we spawned it; a clone's adopted workers are the engine's
            except ChildProcessError:
                pass
        self.kill_agents()
        try:
            self.app.close()
        except Exception:
            pass

    # -- tools ------------------------------------------------------------------------------------------------
    def execute(self, name: str, args: dict[str, Any], timeout_s: float) -> Observation:
        started = time.monotonic()
        self.state_version += 1
        try:
            if name == "shell":
                cmd = args.get("cmd")
                if not isinstance(cmd, str):
                    raise ToolError("shell needs a string argument 'cmd'")
                unknown = set(args) - {"cmd", "timeout_s"}
                if unknown:
                    raise ToolError(f"shell got unknown arguments {sorted(unknown)}")
                asked = args.get("timeout_s", timeout_s)
                if not isinstance(asked, int | float) or not 0 < asked < float("inf"):
                    raise ToolError(f"shell timeout_s must be a positive number, got {asked!r}")
                obs = self.run_agent(cmd, min(float(asked), timeout_s))  # the engine's limit is the ceiling
            else:
                tools = self.app.tools()
                if name not in tools:
                    raise ToolError(f"unknown tool {name!r} (available: {sorted(['shell', *tools])})")
                obs = tools[name](args)
        except ToolError as exc:
            obs = Observation(error=str(exc))
        except Exception as exc:
            obs = Observation(error=f"tool {name!r} failed: {type(exc).__name__}: {exc}")
        return msgspec.structs.replace(obs, tool_seconds=time.monotonic() - started)

    def run_agent(self, cmd: str, timeout_s: float) -> Observation:
        """Run ``cmd`` with /bin/sh as the agent user in the workspace's PID namespace."""
        self._ensure_agent_namespace()
        assert self.agent_pidns_fd is not None
        syscalls.setns(self.agent_pidns_fd, syscalls.CLONE_NEWPID)
        try:
            private = [self.sock.fileno(), *self._private_fds(), *(w.sock.fileno() for w in self.workers)]
            proc = subprocess.Popen(
                ["/bin/sh", "-c", cmd], cwd=image.AGENT_HOME, env=AGENT_ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: _agent_preexec(self.cgroup_fds, self.agent_group, private),
            )
        finally:
            syscalls.setns(self.own_pidns_fd, syscalls.CLONE_NEWPID)
        out, timed_out = _read_bounded(proc, timeout_s)
        if timed_out:
            # A timed-out command takes the whole agent namespace with it (its background jobs too).
            self.kill_agents()
        proc.wait()
        text = out.decode("utf-8", "replace")
        if timed_out:
            return Observation(output=text, exit_code=-signal.SIGKILL,
                               error=f"command timed out after {timeout_s:g}s")
        return Observation(output=text, exit_code=proc.returncode)

    def _ensure_agent_namespace(self) -> None:
        if self.agent_init_pid is not None:
            return
        syscalls.unshare(syscalls.CLONE_NEWPID)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            _agent_init(ready_w, self.cgroup_fds, self.agent_group)
        os.close(ready_w)
        ok = os.read(ready_r, 1)
        os.close(ready_r)
        syscalls.setns(self.own_pidns_fd, syscalls.CLONE_NEWPID)
        if ok != b"1":
            os.waitpid(pid, 0)
            raise ToolError("could not start the workspace's agent PID namespace")
        self.agent_init_pid = pid
        # Our own /proc view now is the agent namespace's: PID 1 there is the init we just made.
        self.agent_pidns_fd = os.open("/proc/1/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def kill_agents(self) -> None:
        """SIGKILL the agent namespace's init, which takes every agent process with it.

        The namespace is gone only once all its processes are reaped, and the commands themselves are our
        children: so reap any child until the init is among them (waiting for the init alone would deadlock).
        """
        init, self.agent_init_pid = self.agent_init_pid, None
        self._close_agent_ns_fd()
        if init is None:
            return
        try:
            os.kill(init, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                if os.waitpid(-1, 0)[0] == init:
                    return
            except ChildProcessError:
                return

    # -- live fork ---------------------------------------------------------------------------------------------
    def fork(self, spec: CloneSpec, fds: list[int]) -> Reply:
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return Failed(kind="bad_request", message=f"fork needs exactly one descriptor, got {len(fds)}")
        clone_fd = fds[0]
        started = time.monotonic_ns()
        worker_ends: list[socket.socket] = []
        agents_frozen = False
        try:
            if self.agent_init_pid is not None:
                # Agent jobs left running in the background must not write while the files are snapshotted.
                agents_frozen = True  # before the call: a freeze that times out must still be undone
                freeze_by_fds(self.cgroup_fds, self.agent_group, True)
            self.app.before_fork(self.ctx)
            for w in self.workers:
                w.before_fork()
            self.fault("fork.before_snapshot")
            snapshot_at(self.pool_fd, self.layer_fd, spec.layer, readonly=spec.frozen)
            self.fault("fork.after_snapshot")
            for w in self.workers:  # each worker forks itself; its clone waits on the end we keep for ours
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                worker_ends.append(ours)
                try:
                    w.fork(theirs.fileno())
                finally:
                    theirs.close()
            gc.freeze()  # keep the collector from touching (and so copying) every object page in the clone
            pid = os.fork()
        except BaseException:
            os.close(clone_fd)
            for end in worker_ends:
                end.close()  # a worker clone still waiting sees EOF and exits
            if agents_frozen:
                freeze_by_fds(self.cgroup_fds, self.agent_group, False)
            raise
        if pid == 0:
            self._fork_intermediate(spec, clone_fd, worker_ends)  # returns only in the clone
            raise BecameClone
        os.close(clone_fd)
        for end in worker_ends:
            end.close()
        if agents_frozen:
            freeze_by_fds(self.cgroup_fds, self.agent_group, False)
        gc.unfreeze()  # the source collects as before; only the clone keeps the heap out of the collector's way
        _, status = os.waitpid(pid, 0)
        frozen_for = time.monotonic_ns() - started
        if status != 0:
            return Failed(kind="fork", message=f"fork intermediate exited with status {status:#x}")
        return Forked(freeze_ns=frozen_for)

    def _fork_intermediate(self, spec: CloneSpec, clone_fd: int, worker_ends: list[socket.socket]) -> None:
        """Fork once more and exit, so the clone is orphaned onto the engine (a child subreaper), not onto us."""
        try:
            if os.fork() != 0:
                os._exit(0)
        except BaseException:
            os._exit(70)
        try:
            self._become_clone(spec, clone_fd, worker_ends)
        except BaseException as exc:
            try:
                send_frame(socket.socket(fileno=clone_fd),
                           encoder.encode(Failed(kind="fork", message=f"clone setup failed: {exc!r}")))
            finally:
                os._exit(71)

    def _become_clone(self, spec: CloneSpec, clone_fd: int, worker_ends: list[socket.socket]) -> None:
        started = time.monotonic()
        self.sock.close()  # the source's channel; the clone answers on its own
        self.sock = socket.socket(fileno=clone_fd)
        os.setsid()
        workers.die_with(self.config.reaper_pid)
        join_by_fds(self.cgroup_fds, spec.cgroup_rel)
        self.fault("clone.after_cgroup")
        namespaces.enter_new_workspace_namespaces(spec.hostname)
        os.fchdir(self.pool_fd)
        layer_fd = os.open(spec.layer, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.pool_fd)
        rootfs.assemble_and_pivot(target=image.CLONE_ROOT, lower=self.config.lower, layer=spec.layer,
                                  frozen=spec.frozen, image_binds=self.config.image_binds,
                                  runtime_binds=self.config.runtime_binds)
        os.close(self.layer_fd)
        self.layer_fd = layer_fd
        # The source's agent namespace is not ours; ours starts with the first agent command.
        if self.agent_pidns_fd is not None:
            os.close(self.agent_pidns_fd)
        self.agent_pidns_fd = None
        self.agent_init_pid = None
        self.ws_id, self.frozen = spec.ws_id, spec.frozen
        self.agent_group = f"{spec.cgroup_rel}/{AGENT_GROUP}"
        self.ctx.ws_id = spec.ws_id
        if self.workers:
            pidfd = os.pidfd_open(os.getpid())  # the workers' clones enter our namespaces through it
            try:
                for w, end in zip(self.workers, worker_ends):
                    w.adopt(pidfd, end, ws_id=spec.ws_id, seed=derive_seed(spec.seed, "worker", w.index),
                            cgroup_rel=spec.cgroup_rel, reaper_pid=self.config.reaper_pid, frozen=spec.frozen)
            finally:
                os.close(pidfd)
        if spec.frozen:
            self.ctx.suspend_after_fork()
        else:
            namespaces.loopback_up()
            self.ctx.reseed(spec.seed)
            self.ctx.rebind_after_fork()
            self.app.after_fork(self.ctx)
        self.reply(Ready(ws_id=self.ws_id, pid=os.getpid(), setup_s=time.monotonic() - started))

    # -- checkpoint (private-restore baseline) ------------------------------------------------------------------
    def checkpoint(self, path: str, layer: str) -> Reply:
        if self.workers and type(self.app).checkpoint is WorkspaceApp.checkpoint:
            # An application with workers checkpoints (and restores) their state in its own checkpoint/restore.
            return Failed(kind="checkpoint", message="the private-restore backend checkpoints the host's state "
                          f"only, and this application keeps state in {len(self.workers)} worker process(es) "
                          "without checkpointing them (WorkspaceApp.checkpoint is not overridden)")
        started = time.monotonic_ns()
        agents = self.agent_init_pid is not None
        if agents:
            freeze_by_fds(self.cgroup_fds, self.agent_group, True)
        try:
            self.app.before_fork(self.ctx)
            state = self.app.checkpoint()
            parts = state if isinstance(state, list) else [state]
            written = checkpoint_file.write(self.pool_fd, path, parts)
            snapshot_at(self.pool_fd, self.layer_fd, layer, readonly=True)
        finally:
            if agents:
                freeze_by_fds(self.cgroup_fds, self.agent_group, False)
        return Checkpointed(bytes_written=written, freeze_ns=time.monotonic_ns() - started)


def _read_bounded(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bool]:
    """The command's output up to MAX_OUTPUT bytes (the rest is read and dropped, so a chatty command neither
    blocks nor fills the host's memory), and whether it timed out."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    kept = bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.stdout.close()
                return bytes(kept), True
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                proc.stdout.close()
                return bytes(kept), False
            if len(kept) < MAX_OUTPUT:
                kept += chunk[: MAX_OUTPUT - len(kept)]


def _agent_preexec(cgroup_fds: list[int], agent_group: str, private: list[int]) -> None:
    """In the agent command's child, before exec: join the agents' cgroup, make it the OOM killer's first pick,
    close the host's private descriptors, then drop to the agent user for good (the score must be written while
    we still own our /proc entry; the descriptors must be gone before anything runs as the agent)."""
    join_by_fds(cgroup_fds, agent_group)
    for fd in [*private, *cgroup_fds]:
        try:
            os.close(fd)
        except OSError:
            pass
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(AGENT_OOM_SCORE_ADJ))
    os.setgroups([])
    os.setresgid(image.AGENT_GID, image.AGENT_GID, image.AGENT_GID)
    os.setresuid(image.AGENT_UID, image.AGENT_UID, image.AGENT_UID)
    syscalls.prctl(syscalls.PR_SET_NO_NEW_PRIVS, 1)


# PID 1 of the agent namespace after its exec: reaps orphans until killed. Blocking SIGCHLD and waiting for it
# with sigwait leaves no window in which a child could exit unnoticed.
AGENT_INIT_CODE = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    signal.sigwait({signal.SIGCHLD})
"""


def _agent_init(ready_w: int, cgroup_fds: list[int], agent_group: str) -> None:
    """PID 1 of the agent namespace: mount its /proc, then exec a tiny reaper. Never returns.

    It execs (rather than staying a fork of the host) so that it holds none of the application's memory: a
    workspace's memory is then the host's alone, and the init costs well under 1 MiB.
    """
    try:
        join_by_fds(cgroup_fds, agent_group)
        os.closerange(3, ready_w)
        os.closerange(ready_w + 1, 65536)
        syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
        try:
            syscalls.umount("/proc", syscalls.MNT_DETACH)
        except OSError:
            pass
        rootfs.mount_proc()
        os.write(ready_w, b"1")
        os.close(ready_w)
        os.execv(sys.executable, [sys.executable, "-S", "-I", "-c", AGENT_INIT_CODE])
    except BaseException:
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bunshin.envs.host")
    parser.add_argument("--channel", type=int, required=True)
    parser.add_argument("--pool", type=int, required=True)
    parser.add_argument("--cgroups", required=True)
    args = parser.parse_args(argv)
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
    sock = socket.socket(fileno=args.channel)
    sock.setblocking(True)
    body, _ = recv_frame(sock)
    config = config_decoder.decode(body)
    if os.getppid() != config.reaper_pid:
        return 73
    cgroup_fds = [int(x) for x in args.cgroups.split(",") if x]
    try:
        host = Host(sock, args.pool, cgroup_fds, config)
        host.build()
    except BaseException as exc:
        traceback.print_exc()
        try:
            send_frame(sock, encoder.encode(Failed(kind="start", message=f"{type(exc).__name__}: {exc}")))
        finally:
            os._exit(74)
    host.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
