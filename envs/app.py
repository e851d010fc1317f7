"""The contract for applications that live in a workspace, and the helpers that make their state forkable.

Owns: ``WorkspaceApp`` (state kept in the host process: Python objects, huge-page heaps, open files, listening
sockets), ``WorkerApp`` (state kept in a worker process the host spawns, forked with the workspace),
``AppContext`` (what the runtime gives an app: its workspace id and seed, a seeded random stream, files and sockets
that the runtime re-opens or re-creates in a clone), the after-fork sequence for an app, and the errors an app
raises (``ToolError``: the agent's call was refused; ``WorkerError``: a worker call failed).
Must never: assume it runs in a particular workspace across a fork: everything tied to the source's file system
or network namespace goes through the context, which rebinds it in the clone.
"""

from __future__ import annotations

import math
import mmap
import pickle
import random
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from .errors import EnvsError
from .records import Observation

Tool = Callable[[dict[str, Any]], Observation]


class ReopenableFile:
    """A file the app keeps open; after a fork the clone's copy is re-opened in the clone's file system at the
    same offset (the inherited descriptor would still point into the source's files)."""

    def __init__(self, path: str, mode: str):
        self.path, self.mode = path, mode
        self.file: IO[Any] = open(path, mode)  # noqa: SIM115 (kept open: this object owns the file)
        self._position = 0

    def reopen(self) -> None:
        position = self._position if self.file.closed else self.file.tell()
        self.file.close()
        mode = self.mode.replace("w", "r+").replace("x", "r+")  # never truncate the clone's copy
        self.file = open(self.path, mode)  # noqa: SIM115 (kept open, as in __init__)
        self.file.seek(position)

    def suspend(self) -> None:
        """Close, remembering the offset (a snapshot must not hold its source's files open)."""
        if not self.file.closed:
            self._position = self.file.tell()
            self.file.close()

    def close(self) -> None:
        self.file.close()


class RebindableSocket:
    """A TCP listening socket on the workspace's loopback; a clone gets a new one bound in its own network
    namespace (the inherited one stays bound in the source's)."""

    def __init__(self, port: int, backlog: int = 64):
        self.port, self.backlog = port, backlog
        self.sock = self._listen()

    def _listen(self) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(self.backlog)
        self.port = s.getsockname()[1]
        return s

    def rebind(self) -> None:
        self.sock.close()
        self.sock = self._listen()

    def close(self) -> None:
        self.sock.close()


class HugeHeap:
    """Anonymous memory for large application state, advised to use transparent huge pages.

    Why: forking copies page tables; a 1 GiB heap in 4 KiB pages costs ~28 ms to fork here, in 2 MiB pages
    ~1.6 ms, and a write after the fork still copies only 4 KiB (the kernel splits the huge page).
    """

    def __init__(self, size: int, huge_pages: bool = True):
        """``huge_pages=False``: 4 KiB pages, asked for explicitly (``MADV_NOHUGEPAGE``, whatever the system's THP
        mode): what an application that never advises its memory gets, as ``bench fork --pages 4k`` measures."""
        self.size = size
        self.huge_pages = huge_pages
        self.map = mmap.mmap(-1, max(size, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advice = "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE"
        if hasattr(mmap, advice):
            self.map.madvise(getattr(mmap, advice))

    def close(self) -> None:
        self.map.close()

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        """Pickled out of band (protocol 5): a state image (``state_image.dump``) writes the heap's bytes straight
        from its memory, and ``state_image.load`` hands back fresh heap memory that the heap adopts."""
        if protocol < 5:
            raise pickle.PicklingError("a HugeHeap pickles with protocol 5 only (its bytes go out of band)")
        return _adopt_heap, (self.size, pickle.PickleBuffer(memoryview(self.map)[:self.size]), self.huge_pages)


def _adopt_heap(size: int, buffer: Any, huge_pages: bool = True) -> HugeHeap:
    """A heap around ``buffer``: adopted when it is a view of fresh anonymous memory, copied otherwise."""
    view = memoryview(buffer)
    owner = view.obj
    if isinstance(owner, mmap.mmap) and len(owner) >= size:
        heap = HugeHeap.__new__(HugeHeap)
        heap.size, heap.map, heap.huge_pages = size, owner, huge_pages
        return heap
    heap = HugeHeap(size, huge_pages)
    heap.map[:size] = view[:size]
    return heap


@dataclass
class Lending:
    """What a warm-pool slot's app hands over (``WorkspaceApp.lend``: descriptor numbers of its own and data), and
    what the clone that took the slot finds in ``ctx.borrowed`` before its ``after_fork`` (the same names, the
    clone's own copies of the descriptors, the same data)."""

    fds: dict[str, int]
    data: dict[str, Any]


@dataclass
class AppContext:
    """What the runtime hands an application. ``rng`` and the global ``random`` are reseeded in every clone."""

    ws_id: str
    seed: int
    rng: random.Random
    # an agent's command (``shell``): past its timeout every agent process is killed, background jobs too
    run_agent: Callable[[str, float], Observation]
    files: list[ReopenableFile] = field(default_factory=list)
    sockets: list[RebindableSocket] = field(default_factory=list)
    spawner: Callable[..., Any] | None = None
    launcher: Callable[..., Any] | None = None
    # what the app holds that is its source's in a clone (a browser's pipe): let go of in every clone, snapshot or not
    in_clones: list[Callable[[], None]] = field(default_factory=list)
    # when the call being served must have answered (time.monotonic()); the host sets it before every tool call
    deadline: float = math.inf
    # in a running clone that took a warm-pool slot, during ``after_fork``: what the slot's app lent (else None)
    borrowed: Lending | None = None
    # the app's own command as the agent user (a VM API's, an observation's): past its timeout only it is killed,
    # with its session (what it started with ``setsid``, the application a task set up, lives on); None: no agents
    run_command: Callable[[str, float], Observation] | None = None

    def launch(self, name: str, argv: list[str], **options: Any) -> Any:
        """Start a long-lived program in the workspace as the agent user (a browser, a display server):
        ``runtime/app_processes.py``'s ``AppProcesses.start`` (descriptors at chosen numbers, private tmpfs
        mounts, KSM opt-in). It is not forked with the workspace: a clone's app starts its own in ``after_fork``
        (but on the tree fork, ``--backend kmod``, which clones it with the rest: the clone keeps its copy)."""
        if self.launcher is None:
            raise WorkerError("only a workspace host's application can launch programs")
        return self.launcher(name, argv, **options)

    def spawn(self, target: str, **kwargs: Any) -> Any:
        """Start a worker process (``module:WorkerAppSubclass``) holding state of its own; it is forked with
        the workspace. Returns a ``WorkerHandle``: ``handle.call("method", **args)``."""
        if self.spawner is None:
            raise WorkerError("only a workspace host's application can spawn workers")
        return self.spawner(target, kwargs)

    def open(self, path: str, mode: str = "r") -> ReopenableFile:
        f = ReopenableFile(path, mode)
        self.files.append(f)
        return f

    def listen(self, port: int = 0) -> RebindableSocket:
        s = RebindableSocket(port)
        self.sockets.append(s)
        return s

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self.rng.seed(seed)
        random.seed(seed)
        np_random = sys.modules.get("numpy.random")  # only if the app uses it: importing it costs MiBs
        if np_random is not None:
            np_random.seed(seed % (1 << 32))

    def flush_files(self) -> None:
        for f in self.files:
            if not f.file.closed:
                f.file.flush()

    def on_clone(self, forget: Callable[[], None]) -> None:
        """Have ``forget`` run first thing in every clone (a snapshot too): it lets go of what is the source's,
        such as the pipe to a program ``launch`` started, without touching it."""
        self.in_clones.append(forget)

    def forget_in_clone(self) -> None:
        for forget in self.in_clones:
            forget()

    def rebind_after_fork(self) -> None:
        for f in self.files:
            f.reopen()
        for s in self.sockets:
            s.rebind()

    def suspend_after_fork(self) -> None:
        """In a snapshot: let go of the source's files and network; its clones re-open and re-create them."""
        for f in self.files:
            f.suspend()
        for s in self.sockets:
            s.sock.close()


class WorkspaceApp:
    """Base class: an application whose state lives in the workspace host process.

    Subclasses override what they need. Tools take a dict of arguments and return an Observation; raising
    ``ToolError`` gives the agent an observation with the error and leaves the workspace running.
    """

    def __init__(self, **kwargs: Any):
        if kwargs:
            raise TypeError(f"{type(self).__name__} takes no arguments, got {sorted(kwargs)}")

    def setup(self, ctx: AppContext) -> None:
        """Build the initial state (runs once, inside the workspace, after its root is in place)."""

    def tools(self) -> dict[str, Tool]:
        return {}

    def before_fork(self, ctx: AppContext) -> None:
        """Quiesce: flush buffered writes so the file snapshot taken next is consistent with memory."""
        ctx.flush_files()

    def after_fork(self, ctx: AppContext) -> None:
        """Runs in the clone after the runtime re-opened files, re-created sockets and reseeded random state."""

    def lend(self, ctx: AppContext) -> Lending:
        """A warm-pool slot's app (``AppSpec.warm`` names it): hand over what it started ahead (a browser's pipe)
        to the clone about to take the slot. Called at most once; the app never touches what it lent again (the
        slot lives on, unused, until the clone closes)."""
        raise ToolError(f"{type(self).__name__} has nothing to lend: it is not a warm-pool slot's app")

    def checkpoint(self) -> bytes | list[Any]:
        """The host process's state for the private-restore backend (the CRIU-like baseline), called after
        ``before_fork`` and before the workspace's files are snapshotted: bytes, or a list of bytes-like parts
        written one after the other. Faithful to a process dump: everything the process holds, so that ``restore``
        reads it back instead of recomputing it; ``state_image.dump(obj)`` images a whole object graph with its
        large buffers out of band. Workers image themselves (``WorkerApp.checkpoint``), one image per process."""
        return b""

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        """Rebuild state from ``checkpoint()`` output in a fresh workspace, in private memory (``data`` is the
        concatenated parts, a read-only view of the mapped checkpoint file, valid during this call only).

        Runs instead of ``setup``, in the restored workspace (its files are the source's snapshot, the seed and
        ``ctx.rng`` the clone's). Workers are spawned again here, in the source's order (``ctx.spawn``, with what
        the source spawned them with): each restores from its own image instead of running ``setup``. Call
        ``dont_fork_into_workers(data)`` first so they do not inherit the checkpoint's mapping."""

    def close(self) -> None:
        """Release resources; called before the host exits."""


class ToolError(EnvsError):
    """A tool refused its arguments or failed; the agent sees the message, the workspace goes on."""


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

    def checkpoint(self) -> bytes | list[Any]:
        """The worker process's state for the private-restore backend (the CRIU-like baseline), called after
        ``before_fork``; bytes or a list of parts (``state_image.dump``), written by the worker into its own image
        file. Optional: a worker that does not override it refuses, and so does the restore backend for its
        workspace."""
        raise NotImplementedError(f"{type(self).__name__} does not checkpoint its state")

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        """Instead of ``setup``, in a worker a restoring host spawned (``ctx.spawn`` in ``WorkspaceApp.restore``):
        rebuild the state from ``checkpoint()``'s bytes (a view of the image, valid during this call only) in this
        process's private memory, on the restored workspace's files. Nothing that was imaged is recomputed."""
        raise NotImplementedError(f"{type(self).__name__} does not restore state")

    def close(self) -> None:
        pass


class WorkerError(EnvsError):
    """A worker call failed in the worker; the message carries the worker's exception."""


def dont_fork_into_workers(payload: Any) -> None:
    """For ``WorkspaceApp.restore`` before it spawns workers: keep the host's mapping of the checkpoint file (what
    ``payload`` views) out of them (``MADV_DONTFORK``). A worker forked with it would keep the checkpoint file,
    unlinked once the clone is ready, mapped and its pages cached for the worker's whole life."""
    mapping = payload.obj if isinstance(payload, memoryview) else None
    if isinstance(mapping, mmap.mmap) and hasattr(mmap, "MADV_DONTFORK"):
        mapping.madvise(mmap.MADV_DONTFORK)
