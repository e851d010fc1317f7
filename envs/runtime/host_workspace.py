"""The workspace made of Linux primitives: the ``Workspace`` contract (``envs/workspace.py``) over a host's socket.

Owns: sending one request at a time to a host and typing its reply, the deadline of every tool call (a host that
overruns it is stopped and the workspace reported broken with that reason), noticing a host that died or hit its
limits (and saying why), and closing (host, cgroup, layer, in that order). Forks, exit statuses, the removal of
what a workspace leaves, and the scope its background exchanges and teardown run in are asked of
``WorkspaceServices``, the small surface its runtime provides (``hosts.py``): a workspace never sees the runtime.
Must never: block the event loop on the host, or leave a workspace half-closed when ``close()`` is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from typing import Protocol, TypeVar

import msgspec

from ..errors import CallDeadlineExceeded, RequestRefused, WorkspaceBroken, WorkspaceClosed
from ..records import AppSpec, Limits, MemoryStats, Observation, ToolCall
from ..workspace import Snapshot, Workspace, WorkspaceImage, call_timeouts
from . import await_points, ports
from .cgroups import Cgroup
from .channel import ChannelClosed, async_recv_frame, async_send_frame
from .egress import EgressProxy
from .memory import processes_memory
from .protocol import Close, Execute, Executed, Failed, Reply, Request, encoder, reply_decoder
from .task_scope import TaskScope

R = TypeVar("R", bound=Reply)  # a kind of reply ``expect`` checks for
CLOSE_GRACE_S = 5.0  # how long a host may take to say goodbye before it is killed anyway


class WorkspaceServices(Protocol):
    """What a host workspace needs from whoever runs it (the runtime's ``Hosts``)."""

    limits: Limits
    tasks: TaskScope  # owns a workspace's in-flight exchange and its teardown; closed with the run

    async def fork(self, source: HostWorkspace, *, seed: int | None, frozen: bool) -> HostWorkspace:
        """A clone of ``source`` made by the run's fork backend."""

    async def image(self, source: HostWorkspace, name: str) -> WorkspaceImage:
        """A durable image of ``source``'s current state (``image_files.py``)."""

    async def wait_exit(self, pid: int, timeout: float) -> int | None:
        """The wait status of the workspace process ``pid``, or None if it did not exit within ``timeout``."""

    def stop(self, ws: HostWorkspace) -> None:
        """SIGKILL the workspace's host now (it overran a deadline); ``discard`` removes the rest later."""

    async def discard(self, ws: HostWorkspace) -> None:
        """After the host stopped serving: kill what is left of the workspace, remove its cgroup and layer."""


class HostWorkspace(Workspace):
    """A workspace whose state is a host process (and its workers and agents) in a cgroup, on a btrfs layer."""

    def __init__(self, services: WorkspaceServices, ws_id: str, *, pid: int, sock: socket.socket, cgroup: Cgroup,
                 layer: str, seed: int, app: AppSpec, parent: str | None, generation: int):
        super().__init__(ws_id, seed=seed, app=app, parent=parent, generation=generation)
        self.services = services
        self.pid = pid
        self.sock = sock
        self.cgroup = cgroup
        self.layer = layer
        self.forks = 0  # how many clones this workspace has made; feeds the clones' seeds
        self.calls = 0  # tool calls sent so far: the state changes only with them (a dump of it is valid until then)
        self._lock = asyncio.Lock()
        self._closing: asyncio.Task[None] | None = None
        self._limit_hits = (0, 0)
        self._inflight: asyncio.Task[bytes] | None = None
        # warm-pool slots this clone took over (their cgroup is its cgroup): removed with it
        self.companions: list[HostWorkspace] = []
        self.says_goodbye = True  # its host answers Close (a tree-fork snapshot, frozen for good, does not)
        self.egress: EgressProxy | None = None  # its way out, when its app declares one (``AppSpec.egress``)

    def __repr__(self) -> str:
        kind = "Snapshot" if self.frozen else "Workspace"
        return f"<{kind} {self.id} pid={self.pid} gen={self.generation}{' broken' if self.broken else ''}>"

    # -- requests ---------------------------------------------------------------------------------------------
    async def request(self, message: Request, fds: list[int] | None = None) -> Reply:
        """Send one request and return the host's reply; a ``Failed`` reply raises RequestRefused.

        Cancelling the caller does not cut a frame in half: the exchange runs to its end in the background (a task
        of ``services.tasks``) and the next request (or ``close()``) collects the orphaned reply first.
        """
        if self._closing is not None:
            raise WorkspaceClosed(self.id, "used after close()")
        if self.broken:
            raise WorkspaceBroken(self.id, self.broken)
        async with self._lock:
            try:
                await self._collect_orphan()
                self._inflight = self.services.tasks.start_soon(self._exchange(encoder.encode(message), fds),
                                                                name=f"exchange {self.id}")
                await await_points.reached("workspace.request.sent")
                body = await asyncio.shield(self._inflight)
                self._inflight = None
                reply = reply_decoder.decode(body)
            except ChannelClosed as exc:
                self._inflight = None
                if self.broken:  # we stopped it (a deadline): that is the reason, not its death
                    raise WorkspaceBroken(self.id, self.broken) from exc
                reason = await self._death_reason()
                self.broken = reason
                raise WorkspaceBroken(self.id, reason) from exc
            except (OSError, ValueError, msgspec.DecodeError) as exc:
                # The stream is in an unknown state: no later reply could be trusted to answer its request.
                self._inflight = None
                self.broken = f"channel out of step: {type(exc).__name__}: {exc}"
                raise WorkspaceBroken(self.id, self.broken) from exc
        if isinstance(reply, Failed):
            raise RequestRefused(self.id, reply.kind, reply.message)
        return reply

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """No request in flight while inside (a reply left by a cancelled caller collected first): the channel is
        quiet, the host waits in its ``recv`` (the tree fork reads it frozen there)."""
        if self._closing is not None:
            raise WorkspaceClosed(self.id, "used after close()")
        async with self._lock:
            try:
                await self._collect_orphan()
            except ChannelClosed as exc:
                self.broken = await self._death_reason()
                raise WorkspaceBroken(self.id, self.broken) from exc
            yield

    def expect(self, reply: Reply, kind: type[R]) -> R:
        """``reply``, if it is a ``kind``. A reply of the wrong kind means the host and the engine disagree about the
        protocol: the channel can no longer be trusted, so the workspace is broken (never an ``assert``: it must
        hold with ``python -O``)."""
        if not isinstance(reply, kind):
            self.broken = f"protocol error: expected {kind.__name__}, the host answered {type(reply).__name__}"
            raise WorkspaceBroken(self.id, self.broken)
        return reply

    async def _exchange(self, payload: bytes, fds: list[int] | None) -> bytes:
        await async_send_frame(self.sock, payload, fds)
        return await async_recv_frame(self.sock)

    async def _collect_orphan(self) -> None:
        """Wait for the reply of a request whose caller was cancelled, and drop it. Shielded: cancelling *this*
        wait leaves the orphan running and registered, so the next request still collects it first."""
        orphan = self._inflight
        if orphan is None:
            return
        try:
            await await_points.reached("workspace.request.orphan")
            await asyncio.shield(orphan)
        except asyncio.CancelledError:
            if not orphan.cancelled():
                raise  # we were cancelled; the orphan runs on and stays registered
            self._inflight = None  # only close() cancels an exchange, and then nothing is sent after it
            raise
        except ChannelClosed:
            self._inflight = None
            raise
        except Exception as exc:
            self._inflight = None
            raise ValueError(f"the reply to a cancelled request failed: {exc}") from exc
        self._inflight = None

    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        """Run one tool call within ``timeout_s`` (default: the runtime's ``Limits.command_timeout_s``).

        A shell command that runs out of time is stopped by the host and reported in the observation. Any tool
        that does not come back by the deadline (``deadline_s``) stops the host: the call raises
        ``CallDeadlineExceeded`` and the workspace is broken with that reason. A call that leaves the workspace
        over its limits raises WorkspaceBroken."""
        limits = self.services.limits
        timeout, deadline = call_timeouts(timeout_s, limits)
        self.calls += 1
        try:
            async with asyncio.timeout(deadline):
                reply = await self.request(Execute(call=call, timeout_s=timeout))
        except TimeoutError as exc:
            reason = (f"tool call {call.name!r} overran its deadline: asked to finish within {timeout:g}s, no "
                      f"answer after {deadline:g}s; the host was stopped")
            self._stop(reason)
            raise CallDeadlineExceeded(self.id, reason, tool=call.name, deadline_s=deadline) from exc
        executed = self.expect(reply, Executed)
        breach = await asyncio.to_thread(self._limit_breach)
        if breach is not None:
            self.broken = breach
            raise WorkspaceBroken(self.id, breach)
        return executed.observation

    def _stop(self, reason: str) -> None:
        """Mark the workspace broken and kill its host: it is stuck in a call nobody waits for any more."""
        self.broken = reason
        self.services.stop(self)

    # -- forks ------------------------------------------------------------------------------------------------
    async def fork(self, *, seed: int | None = None) -> HostWorkspace:
        """A live copy-on-write clone that runs on its own; this workspace keeps running."""
        return await self.services.fork(self, seed=seed, frozen=False)

    async def snapshot(self) -> HostSnapshot:
        """A frozen fork: it runs nothing and can be forked again later."""
        snap = await self.services.fork(self, seed=None, frozen=True)
        if not isinstance(snap, HostSnapshot):
            raise TypeError(f"the fork backend made a {type(snap).__name__} where a Snapshot was asked for")
        return snap

    async def image(self, name: str) -> WorkspaceImage:
        """A durable image of the current state (a Snapshot's too): every process's state image in the run's
        dumps tmpfs (the host's, then each worker's) and a read-only snapshot of the files, whose ``layer_upper``
        a checkpoint store diffs. ``name`` labels it (made unique). ``discard()`` it once stored; the run removes
        those left at its close. Restore one with ``WorkspaceRuntime.restore_image``. Raises ImageFailed (the
        app or a worker could not image its state), WorkspaceBroken, WorkspaceClosed; nothing is left then."""
        return await self.services.image(self, name)

    async def connect(self, port: int, timeout_s: float = 10.0) -> socket.socket:
        """A socket connected to 127.0.0.1:``port`` inside the workspace (a harness's way in to a program that
        listens there: Chromium's DevTools, VLC's HTTP interface); the agent has no way out by it. OSError when
        nothing listens; WorkspaceClosed after ``close()``."""
        if self._closing is not None:
            raise WorkspaceClosed(self.id, "used after close()")
        if self.broken:
            raise WorkspaceBroken(self.id, self.broken)
        return await asyncio.to_thread(ports.connect_inside, self.pid, port, timeout_s)

    # -- state ------------------------------------------------------------------------------------------------
    def memory(self) -> MemoryStats:
        """PSS, private and shared memory summed over the workspace's processes, and its cgroup's charge (blocking:
        it reads every process's smaps_rollup; call it in a thread)."""
        return processes_memory(self.cgroup.procs(), self.cgroup.memory_charge())

    def charge(self) -> int:
        """The bytes the workspace is charged for now (its cgroup's memory charge): cheap, one file read."""
        return self.cgroup.memory_charge()

    @property
    def closed(self) -> bool:
        return self._closing is not None

    def _limit_breach(self) -> str | None:
        ooms, pid_hits = self.cgroup.oom_kills(), self.cgroup.pids_limit_hits()
        before, self._limit_hits = self._limit_hits, (ooms, pid_hits)
        if ooms > before[0]:
            return "memory limit: the OOM killer ran in the workspace"
        if pid_hits > before[1]:
            return "process limit: forks were refused at pids.max"
        return None

    async def _death_reason(self) -> str:
        """Why the host went away: its wait status plus the cgroup's limit counters."""
        status = await self.services.wait_exit(self.pid, timeout=5.0)
        limit = self._limit_breach()
        if status is None:
            what = "host closed its channel but is still running"
        elif os.WIFSIGNALED(status):
            what = f"host killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            what = f"host exited with status {os.WEXITSTATUS(status)}"
        return f"{what}; {limit}" if limit else what

    # -- close ------------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop the host, kill whatever is left in the cgroup, delete the layer. Finishes even when the caller is
        cancelled (the teardown is a task of ``services.tasks``); a second call (concurrent or later) returns once
        the first one's teardown has finished."""
        if self._closing is None:
            self._closing = self.services.tasks.start_soon(self._teardown(), name=f"close {self.id}")
        await asyncio.shield(self._closing)

    async def _teardown(self) -> None:
        try:
            await await_points.reached("workspace.close")
            if not self.broken and self.says_goodbye:
                try:
                    async with asyncio.timeout(CLOSE_GRACE_S):
                        async with self._lock:
                            await self._collect_orphan()
                            await self._exchange(encoder.encode(Close()), None)
                except (TimeoutError, OSError, ValueError):  # a host that cannot say goodbye is killed anyway
                    pass
        finally:
            if self._inflight is not None:
                self._inflight.cancel()
            self.sock.close()
            await self.services.discard(self)


class HostSnapshot(Snapshot, HostWorkspace):
    """A frozen host workspace: its host answers no tool call (``Snapshot.execute`` refuses before asking)."""
