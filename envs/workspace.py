"""The engine's handle on one workspace: the Workspace contract of docs/design.md section 3, over a host's socket.

Owns: sending one request at a time to a host and typing its reply, the deadline of every tool call (a host that
overruns it is stopped and the workspace reported broken with that reason), noticing a host that died or hit its
limits (and saying why), and closing (host, cgroup, layer, in that order). Forks, exit statuses and the removal of
what a workspace leaves are asked of ``WorkspaceServices``, the small surface its runtime provides: a workspace
never sees the runtime class.
Must never: block the event loop on the host, or leave a workspace half-closed when ``close()`` is cancelled.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from .errors import CallDeadlineExceeded, RequestRefused, WorkspaceBroken, WorkspaceClosed
from .records import AppSpec, Limits, MemoryStats, Observation, ToolCall
from .runtime import await_points
from .runtime.cgroups import Cgroup
from .runtime.channel import ChannelClosed, async_recv_frame, async_send_frame
from .runtime.memory import processes_memory
from .runtime.protocol import (
    Checkpoint,
    Checkpointed,
    Close,
    Execute,
    Executed,
    Failed,
    Ping,
    Pong,
    Reply,
    Request,
    encoder,
    reply_decoder,
)

if TYPE_CHECKING:
    from .runtime.image_files import WorkspaceImage

CLOSE_GRACE_S = 5.0  # how long a host may take to say goodbye before it is killed anyway


@dataclass(frozen=True)
class ForkTiming:
    """``freeze_s``: how long the source stopped for this fork; ``ready_s``: from the fork request until the clone
    answered Ready (the clone's cgroup, layer and process included, for every backend). ``dump_reused``: a
    private restore from a dump an earlier fork of the same source state made (no freeze; not in ``ready_s``)."""

    freeze_s: float
    ready_s: float
    dump_reused: bool = False


class WorkspaceServices(Protocol):
    """What a workspace needs from whoever runs it (the runtime's ``Hosts``)."""

    limits: Limits

    async def fork(self, source: Workspace, *, seed: int | None, frozen: bool) -> Workspace:
        """A clone of ``source`` made by the run's fork backend."""

    async def image(self, source: Workspace, name: str) -> WorkspaceImage:
        """A durable image of ``source``'s current state (``runtime/image_files.py``)."""

    async def wait_exit(self, pid: int, timeout: float) -> int | None:
        """The wait status of the workspace process ``pid``, or None if it did not exit within ``timeout``."""

    def stop(self, ws: Workspace) -> None:
        """SIGKILL the workspace's host now (it overran a deadline); ``discard`` removes the rest later."""

    async def discard(self, ws: Workspace) -> None:
        """After the host stopped serving: kill what is left of the workspace, remove its cgroup and layer."""


def deadline_s(timeout_s: float, limits: Limits) -> float:
    """How long the runtime waits for a tool call asked to finish within ``timeout_s``: the call's own time, plus
    the grace a host needs to stop a command that ran out of time and to answer (observations, screenshots)."""
    return timeout_s + max(limits.deadline_grace_s, 0.25 * timeout_s)


class Workspace:
    """A running, isolated computer. Create it with ``WorkspaceRuntime.create``; fork it with ``fork()``."""

    frozen = False

    def __init__(self, services: WorkspaceServices, ws_id: str, *, pid: int, sock: socket.socket, cgroup: Cgroup,
                 layer: str, seed: int, app: AppSpec, parent: str | None, generation: int):
        self.services = services
        self.app_spec = app
        self.id = ws_id
        self.pid = pid
        self.sock = sock
        self.cgroup = cgroup
        self.layer = layer
        self.seed = seed
        self.parent = parent
        self.generation = generation
        self.forks = 0  # how many clones this workspace has made; feeds the clones' seeds
        self.calls = 0  # tool calls sent so far: the state changes only with them (a dump of it is valid until then)
        self._lock = asyncio.Lock()
        self._closing: asyncio.Future[None] | None = None
        self.broken: str | None = None
        self._limit_hits = (0, 0)
        self.last_fork: ForkTiming | None = None  # set on clones: how their fork went
        self._inflight: asyncio.Future[bytes] | None = None

    def __repr__(self) -> str:
        kind = "Snapshot" if self.frozen else "Workspace"
        return f"<{kind} {self.id} pid={self.pid} gen={self.generation}{' broken' if self.broken else ''}>"

    # -- requests ---------------------------------------------------------------------------------------------
    async def request(self, message: Request, fds: list[int] | None = None) -> Reply:
        """Send one request and return the host's reply; a ``Failed`` reply raises RequestRefused.

        Cancelling the caller does not cut a frame in half: the exchange runs to its end in the background and
        the next request (or ``close()``) collects the orphaned reply first.
        """
        if self._closing is not None:
            raise WorkspaceClosed(self.id, "used after close()")
        if self.broken:
            raise WorkspaceBroken(self.id, self.broken)
        async with self._lock:
            try:
                await self._collect_orphan()
                self._inflight = asyncio.ensure_future(self._exchange(encoder.encode(message), fds))
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

    def expect(self, reply: Reply, kind: type[Reply]) -> None:
        """A reply of the wrong kind means the host and the engine disagree about the protocol: the channel can no
        longer be trusted, so the workspace is broken (never an ``assert``: it must hold with ``python -O``)."""
        if not isinstance(reply, kind):
            self.broken = f"protocol error: expected {kind.__name__}, the host answered {type(reply).__name__}"
            raise WorkspaceBroken(self.id, self.broken)

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
        timeout = limits.command_timeout_s if timeout_s is None else float(timeout_s)
        if not 0 < timeout < math.inf:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        deadline = deadline_s(timeout, limits)
        self.calls += 1
        try:
            async with asyncio.timeout(deadline):
                reply = await self.request(Execute(call=call, timeout_s=timeout))
        except TimeoutError as exc:
            reason = (f"tool call {call.name!r} overran its deadline: asked to finish within {timeout:g}s, no "
                      f"answer after {deadline:g}s; the host was stopped")
            self._stop(reason)
            raise CallDeadlineExceeded(self.id, reason, tool=call.name, deadline_s=deadline) from exc
        self.expect(reply, Executed)
        reason = await asyncio.to_thread(self._limit_breach)
        if reason is not None:
            self.broken = reason
            raise WorkspaceBroken(self.id, reason)
        return reply.observation  # type: ignore[union-attr]

    def _stop(self, reason: str) -> None:
        """Mark the workspace broken and kill its host: it is stuck in a call nobody waits for any more."""
        self.broken = reason
        self.services.stop(self)

    async def ping(self) -> Pong:
        reply = await self.request(Ping())
        self.expect(reply, Pong)
        return reply  # type: ignore[return-value]

    # -- forks ------------------------------------------------------------------------------------------------
    async def fork(self, *, seed: int | None = None) -> Workspace:
        """A live copy-on-write clone that runs on its own; this workspace keeps running."""
        return await self.services.fork(self, seed=seed, frozen=False)

    async def snapshot(self) -> Snapshot:
        """A frozen fork: it runs nothing and can be forked again later."""
        snap = await self.services.fork(self, seed=None, frozen=True)
        if not isinstance(snap, Snapshot):
            raise TypeError(f"the fork backend made a {type(snap).__name__} where a Snapshot was asked for")
        return snap

    async def checkpoint(self, path: str) -> int:
        """Write the application state to ``path`` (relative to the run's pool) and snapshot the files beside it
        (``<path>.layer``); returns the bytes written."""
        reply = await self.request(Checkpoint(path=path, layer=f"{os.path.basename(path)}.layer"))
        self.expect(reply, Checkpointed)
        return reply.bytes_written  # type: ignore[union-attr]

    async def image(self, name: str) -> WorkspaceImage:
        """A durable image of the current state (a Snapshot's too): every process's state image in the run's
        dumps tmpfs (the host's, then each worker's) and a read-only snapshot of the files, whose ``layer_upper``
        a checkpoint store diffs. ``name`` labels it (made unique). ``discard()`` it once stored; the run removes
        those left at its close. Restore one with ``WorkspaceRuntime.restore_image``. Raises ImageFailed (the
        app or a worker could not image its state), WorkspaceBroken, WorkspaceClosed; nothing is left then."""
        return await self.services.image(self, name)

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
        cancelled; a second call (concurrent or later) returns once the first one's teardown has finished."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._teardown())
        await asyncio.shield(self._closing)

    async def _teardown(self) -> None:
        try:
            await await_points.reached("workspace.close")
            if not self.broken:
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


class Snapshot(Workspace):
    """A frozen fork. Its processes wait, its files are read-only; ``fork()`` makes running clones of it."""

    frozen = True

    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        raise RequestRefused(self.id, "bad_request", "a snapshot runs no tools; fork it first")
