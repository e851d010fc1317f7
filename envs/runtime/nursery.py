"""The nursery: one small process per run that spawns first hosts and reaps every workspace process.

Owns: being the run's child subreaper (a clone is orphaned by the fork's double fork and lands here, and so does
every worker's clone), spawning hosts with the descriptors the engine passes it, forking prepared shells' holders
(``shells.py``: a fork of this small process, no exec), reaping whatever exits and telling the engine each exit's
wait status. Why a process of its own: a subreaper adopts every orphan below it,
and the engine often lives inside a trainer whose own grandchildren must not be adopted by us (nor we by them).
Must never: outlive the engine (parent-death signal), let a child of ours stay a zombie, or leave a process
running that it spawned for a caller who was cancelled meanwhile.

Engine side: ``Nursery`` (asyncio). Process side: ``python -m bunshin.envs.runtime.nursery --control FD``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import EnvsError
from . import await_points, namespaces, rootfs, syscalls
from .cgroups import join_by_fds
from .channel import ChannelClosed, async_recv_frame, async_send_frame, recv_frame, send_frame
from .faults import fault
from .protocol import (
    NurseryExited,
    NurseryFailed,
    NurseryShell,
    NurserySpawn,
    NurserySpawned,
    RootSpec,
    encoder,
    nursery_decoder,
)
from .task_scope import TaskScope, run_to_end

CPU_KEPT = 4096  # exits whose CPU time the engine side remembers
UNSPAWN_TIMEOUT_S = 10.0  # a process killed before it did anything exits at once, unless the machine is swamped

# -- the nursery process ------------------------------------------------------------------------------------------


def serve(control: socket.socket) -> None:
    """Spawn on request; report every exit. Returns when the engine closes the control socket. A shell's holder is
    answered for once it says it is ready (or fails, or overruns its timeout); meanwhile exits are still reported,
    and no request is read (the engine sends one at a time, each awaiting its answer)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    popen: dict[int, subprocess.Popen[bytes]] = {}
    holder: _Holder | None = None  # forked, not yet answered for
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, "control")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        timeout = None if holder is None else max(0.0, holder.deadline - time.monotonic())
        events = sel.select(timeout)
        for key, _ in events:
            if key.data == "child":
                os.read(wake_r, 4096)
                _reap(control, popen, holder)
            elif key.data == "holder" and holder is not None:
                _answer_holder(control, sel, holder)
                holder = None
            elif key.data == "control":
                try:
                    body, fds = recv_frame(control)
                except ChannelClosed:
                    return
                holder = _serve_request(control, sel, body, fds, popen)
        if holder is not None and time.monotonic() >= holder.deadline:
            _answer_holder(control, sel, holder)
            holder = None
        _reap(control, popen, holder)  # a SIGCHLD may have raced the select


def _serve_request(control: socket.socket, sel: selectors.BaseSelector, body: bytes, fds: list[int],
                   popen: dict[int, subprocess.Popen[bytes]]) -> _Holder | None:
    """Answer one request, but a shell's: its holder is forked and answered for later (``_answer_holder``)."""
    try:
        request = nursery_decoder.decode(body)
        if isinstance(request, NurserySpawn):
            proc = _spawn(request, fds)
            popen[proc.pid] = proc
            send_frame(control, encoder.encode(NurserySpawned(pid=proc.pid, fds=fds)))
        elif isinstance(request, NurseryShell):
            holder = _fork_holder(request, fds)
            sel.unregister(control)  # no request until this one is answered
            sel.register(holder.ready_r, selectors.EVENT_READ, "holder")
            return holder
        else:
            raise NurseryError(f"the nursery takes spawn and shell requests, got {type(request).__name__}")
    except Exception as exc:
        send_frame(control, encoder.encode(NurseryFailed(message=f"{type(exc).__name__}: {exc}")))
    finally:
        for fd in fds:
            os.close(fd)
    return None


def _spawn(request: NurserySpawn, fds: list[int]) -> subprocess.Popen[bytes]:
    # The request's argv names descriptors as {0}, {1}, ...: the numbers they got here.
    argv = [arg.format(*fds) for arg in request.argv]
    hierarchies = [fds[i] for i in request.cgroup_fds]
    root = request.root

    def before_exec() -> None:
        if request.cgroup_rel is not None:  # before the program runs: everything it allocates is charged there
            join_by_fds(hierarchies, request.cgroup_rel)
        if root is not None:
            _assemble_root(root)

    stdin = fds[request.stdin] if request.stdin >= 0 else subprocess.DEVNULL
    env = dict(os.environ, **request.env) if request.env else None
    with open(request.log_path, "ab") as log, _pid_namespace(request.pid_namespace):
        stdout = fds[request.stdout] if request.stdout >= 0 else log
        return subprocess.Popen(argv, pass_fds=fds, stdin=stdin, stdout=stdout, stderr=log, cwd=request.cwd,
                                env=env, start_new_session=True,
                                preexec_fn=before_exec if request.cgroup_rel is not None or root else None)


@contextlib.contextmanager
def _pid_namespace(wanted: bool) -> Iterator[None]:
    """With ``wanted``, the children started inside are each pid 1 of a new PID namespace (ours stays ours: the
    nursery is single-threaded, and only its children's namespace changes)."""
    if not wanted:
        yield
        return
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        syscalls.unshare(syscalls.CLONE_NEWPID)
        try:
            yield
        finally:
            syscalls.setns(own, syscalls.CLONE_NEWPID)
    finally:
        os.close(own)


def _assemble_root(root: RootSpec) -> None:
    """In a spawned child, before its exec: a mount namespace of its own with the workspace root ``root`` at its
    target (the tree-fork builder enters it; the mounts go with the last process of that namespace)."""
    syscalls.unshare(syscalls.CLONE_NEWNS)
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_PRIVATE)
    cwd = os.getcwd()
    os.chdir(root.pool_path)  # the pool's mount in this namespace (6.1 takes no detached one as an overlay layer)
    rootfs.assemble(target=root.target, lower=root.lower, layer=root.layer, frozen=False,
                    image_binds=root.image_binds, runtime_binds=root.runtime_binds)
    os.chdir(cwd)


HOLDER_NAME = b"bunshin-shell"
_HOLDER_NAME = ctypes.create_string_buffer(HOLDER_NAME)


@dataclass
class _Holder:
    """A prepared shell's holder the nursery forked and has not answered for yet."""

    pid: int
    ready_r: int  # it writes b"R" here once its namespaces are made, or why it failed
    deadline: float
    timeout_s: float
    reaped: bool = False  # it exited and was reaped already (its exit is not reported: the engine never had its pid)


def _fork_holder(request: NurseryShell, hierarchies: list[int]) -> _Holder:
    """Fork a prepared shell's holder: in group ``request.cgroup_rel`` below ``hierarchies``, with the namespaces
    ``namespaces.make_shell_namespaces`` makes, named ``HOLDER_NAME``; it says on a pipe when it is ready."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: whatever happens, it never returns into the nursery's loop
        try:
            os.close(ready_r)
            _become_holder(request, hierarchies, ready_w)
        finally:
            os._exit(70)
    os.close(ready_w)
    return _Holder(pid=pid, ready_r=ready_r, deadline=time.monotonic() + request.ready_timeout_s,
                   timeout_s=request.ready_timeout_s)


def _become_holder(request: NurseryShell, hierarchies: list[int], ready_w: int) -> None:
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the nursery died before the parent-death signal was armed
            return
        syscalls.prctl(syscalls.PR_SET_NAME, ctypes.addressof(_HOLDER_NAME))  # ps tells it from the nursery
        os.setsid()
        fault(request.faults, "shell.holder")
        join_by_fds(hierarchies, request.cgroup_rel)
        namespaces.make_shell_namespaces(request.hostname)
        os.write(ready_w, b"R")
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(ready_w, f"{type(exc).__name__}: {exc}".encode()[:4000])
        return
    os.closerange(3, 1 << 20)  # the nursery's control socket above all (close_range: one system call)
    while True:
        signal.pause()  # until the engine kills it, or the nursery dies (parent-death signal)


def _answer_holder(control: socket.socket, sel: selectors.BaseSelector, holder: _Holder) -> None:
    """The holder said something, or its time is up: answer its request. One that failed, or is not ready in
    time, is killed and reaped here, and the error names what it said."""
    said: bytes | None = None  # None: nothing yet (its time is up); b"": it exited without a word
    with contextlib.suppress(BlockingIOError):
        os.set_blocking(holder.ready_r, False)
        said = os.read(holder.ready_r, 4096)
    sel.unregister(holder.ready_r)
    os.close(holder.ready_r)
    sel.register(control, selectors.EVENT_READ, "control")
    if said == b"R" and not holder.reaped:
        send_frame(control, encoder.encode(NurserySpawned(pid=holder.pid)))
        return
    if not holder.reaped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(holder.pid, 0)  # reaped here: the engine never learned its pid
    reason = (f"not ready within {holder.timeout_s} s" if said is None
              else "it exited once ready" if said == b"R"
              else said.decode(errors="replace") or "it exited before it was ready")
    send_frame(control, encoder.encode(NurseryFailed(message=f"NurseryError: a prepared shell's holder failed: "
                                                             f"{reason}")))


def _reap(control: socket.socket, popen: dict[int, subprocess.Popen[bytes]], holder: _Holder | None) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if holder is not None and pid == holder.pid:  # a holder not yet answered for: the engine knows no such pid
            holder.reaped = True
            continue
        proc = popen.pop(pid, None)
        if proc is not None:
            proc.returncode = status  # reaped here; keep Popen from waiting again
        try:
            cpu_ns = round((usage.ru_utime + usage.ru_stime) * 1e9)
            send_frame(control, encoder.encode(NurseryExited(pid=pid, status=status, cpu_ns=cpu_ns)))
        except OSError:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bunshin.envs.runtime.nursery")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--engine-pid", type=int, required=True)
    args = parser.parse_args(argv)
    syscalls.prctl(syscalls.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != args.engine_pid:
        return 73
    syscalls.prctl(syscalls.PR_SET_CHILD_SUBREAPER, 1)
    control = socket.socket(fileno=args.control)
    control.setblocking(True)
    send_frame(control, encoder.encode(NurserySpawned(pid=os.getpid())))
    serve(control)
    return 0


# -- the engine's side --------------------------------------------------------------------------------------------


class NurseryError(EnvsError):
    pass


class Nursery:
    """Asyncio client: ``spawn`` hosts through it, ``wait_exit`` for any workspace process's wait status."""

    def __init__(self, log_path: str, cwd: str):
        self.log_path, self.cwd = log_path, cwd
        self.pid = 0
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tasks = TaskScope("nursery")  # its one task: the reader of the control socket
        self._replies: asyncio.Queue[NurserySpawned | NurseryFailed] = asyncio.Queue(maxsize=1)
        self._exits: dict[int, int] = {}
        self._cpu_ns: collections.OrderedDict[int, int] = collections.OrderedDict()  # the last CPU_KEPT exits
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._lock = asyncio.Lock()
        self._read_ended = False  # the reader has stopped: no reply will come

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "bunshin.envs.runtime.nursery", "--control", str(theirs.fileno()),
                 "--engine-pid", str(os.getpid())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.cwd,
                start_new_session=True)
        theirs.close()
        ours.setblocking(False)
        self._sock = ours
        try:
            async with asyncio.timeout(30):
                hello = nursery_decoder.decode(await async_recv_frame(ours))
        except (ChannelClosed, TimeoutError) as exc:
            await self.close()
            raise NurseryError("the nursery process did not start") from exc
        if not isinstance(hello, NurserySpawned):
            await self.close()
            raise NurseryError(f"the nursery's first message was {type(hello).__name__}, not its pid")
        self.pid = hello.pid
        self._tasks.start_soon(self._read(), name="nursery reader")

    async def _read(self) -> None:
        sock = self._control()
        try:
            while True:
                message = nursery_decoder.decode(await async_recv_frame(sock))
                if isinstance(message, NurseryExited):
                    self._exits[message.pid] = message.status
                    self._cpu_ns[message.pid] = message.cpu_ns
                    self._cpu_ns.move_to_end(message.pid)
                    if len(self._cpu_ns) > CPU_KEPT:
                        self._cpu_ns.popitem(last=False)
                    waiter = self._waiters.pop(message.pid, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message.status)
                else:
                    if isinstance(message, NurserySpawned):
                        self._exits.pop(message.pid, None)  # an exit kept for an earlier process of that pid
                    await self._replies.put(message)
        except ChannelClosed:
            pass
        finally:  # no reply comes any more: the spawn waiting for one (cancelled or not) must not wait forever
            self._read_ended = True
            with contextlib.suppress(asyncio.QueueFull):
                self._replies.put_nowait(NurseryFailed(message="the nursery's channel closed before it replied"))

    def _control(self) -> socket.socket:
        if self._sock is None:
            raise NurseryError("the nursery is not running")
        return self._sock

    async def spawn(self, argv: list[str], fds: list[int], log_path: str, cwd: str, *,
                    cgroup_rel: str | None = None, cgroup_fds: list[int] | None = None,
                    pid_namespace: bool = False) -> int:
        """Start ``argv`` (descriptors named ``{0}``, ``{1}``... in it) as a child of the nursery, in cgroup
        ``cgroup_rel`` below the hierarchies ``cgroup_fds`` (indexes into ``fds``) from its first instruction
        (``pid_namespace``: as pid 1 of a new PID namespace). A cancelled
        caller leaves nothing behind: the exchange runs to its end (a reply left in the queue would be the next
        caller's), and a process it spawned is killed and reaped before the cancellation is re-raised (left to
        itself it would live on after the caller removed its cgroup: as a child between fork and exec, or as a
        host waiting for its configuration)."""
        spawned = await self.spawn_request(NurserySpawn(argv=argv, log_path=log_path, cwd=cwd, cgroup_rel=cgroup_rel,
                                                        cgroup_fds=cgroup_fds or [], pid_namespace=pid_namespace),
                                           fds)
        return spawned.pid

    async def shell(self, cgroup_rel: str, cgroup_fds: list[int], hostname: str, *, faults: list[str] | None = None,
                    ready_timeout_s: float = 10.0) -> int:
        """Fork a prepared shell's holder (``NurseryShell``) in group ``cgroup_rel`` below the hierarchies
        ``cgroup_fds``; its pid. A cancelled caller leaves nothing behind, as with ``spawn``."""
        request = NurseryShell(cgroup_rel=cgroup_rel, hostname=hostname, faults=faults or [],
                               ready_timeout_s=ready_timeout_s)
        return (await self._request(encoder.encode(request), cgroup_fds)).pid

    async def spawn_request(self, request: NurserySpawn, fds: list[int]) -> NurserySpawned:
        """``spawn`` with every option of ``NurserySpawn`` (its standard streams, environment, a root made for it);
        the reply names the numbers ``fds`` got in the process."""
        return await self._request(encoder.encode(request), fds)

    async def _request(self, payload: bytes, fds: list[int]) -> NurserySpawned:
        if self._sock is None:
            raise NurseryError("the nursery is not running")
        reply = await run_to_end(self._spawn_exchange(payload, fds), undo=self._unspawn)
        if isinstance(reply, NurseryFailed):
            raise NurseryError(reply.message)
        return reply

    async def _unspawn(self, reply: NurserySpawned | NurseryFailed) -> None:
        """Undo a spawn whose caller was cancelled meanwhile: SIGKILL the process and wait until it is reaped."""
        if isinstance(reply, NurseryFailed):
            return  # nothing runs: the nursery's Popen waited for the child that failed before its exec
        if not self.exited(reply.pid):  # not yet reaped, so the pid is still that process's
            with contextlib.suppress(ProcessLookupError):
                os.kill(reply.pid, signal.SIGKILL)
        await self.wait_exit(reply.pid, timeout=UNSPAWN_TIMEOUT_S)
        self.forget(reply.pid)

    async def _spawn_exchange(self, payload: bytes, fds: list[int]) -> NurserySpawned | NurseryFailed:
        async with self._lock:
            if self._read_ended:
                raise NurseryError("the nursery's channel is closed")
            await async_send_frame(self._control(), payload, fds)
            await await_points.reached("nursery.request.sent")
            return await self._replies.get()

    def exited(self, pid: int) -> bool:
        return pid in self._exits

    def exit_cpu_ns(self, pid: int) -> int | None:
        """The CPU time process ``pid`` used in its life, its exit included (its reaped children's too), once it
        exited; kept for the last ``CPU_KEPT`` exits (a benchmark's reading, not forgotten with the status)."""
        return self._cpu_ns.get(pid)

    async def wait_exit(self, pid: int, timeout: float) -> int | None:
        """The wait status of workspace process ``pid`` once it exited, or None after ``timeout``. The status
        is kept (a workspace may ask twice: why it died, then at close) until ``forget(pid)``."""
        if pid in self._exits:
            return self._exits[pid]
        waiter = self._waiters.setdefault(pid, asyncio.get_running_loop().create_future())
        try:
            async with asyncio.timeout(timeout):
                status = await asyncio.shield(waiter)
        except TimeoutError:
            return None
        return status

    def forget(self, pid: int) -> None:
        self._exits.pop(pid, None)
        self._waiters.pop(pid, None)

    async def close(self) -> None:
        """Close the control socket; the nursery exits, and with it (parent-death signal) anything left."""
        await self._tasks.aclose()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            proc, self._proc = self._proc, None
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait), 10)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)


if __name__ == "__main__":
    sys.exit(main())
