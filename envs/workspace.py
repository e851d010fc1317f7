"""The engine's handle on one workspace: the Workspace contract of DESIGN.md section 3, over a host's socket.

Owns: sending one request at a time to a host and typing its reply, noticing a host that died or hit its limits
(and saying why), forking through the runtime's backend, and closing: host, cgroup, layer, in that order.
Must never: block the event loop on the host, or leave a workspace half-closed when ``close()`` is cancelled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass

import msgspec
from typing import TYPE_CHECKING

from .channel import ChannelClosed, async_recv_frame, async_send_frame
from .cgroups import Cgroup
from .errors import RequestRefused, WorkspaceBroken, WorkspaceClosed
from .memory import processes_memory
from .records import (
    Close,
    Execute,
    Failed,
    MemoryStats,
    Observation,
    Ping,
    Pong,
    Reply,
    Request,
    AppSpec,
    ToolCall,
    encoder,
    reply_decoder,
)

if TYPE_CHECKING:
    from .runtime import WorkspaceRuntime


@dataclass(frozen=True)
class ForkTiming:
    """``freeze_s``: how long the source stopped; ``ready_s``: from the fork request until the clone answered."""

    freeze_s: float
    ready_s: float


class Workspace:
    """A running, isolated computer. Create it with ``WorkspaceRuntime.create``; fork it with ``fork()``."""

    frozen = False

    def __init__(self, runtime: WorkspaceRuntime, ws_id: str, *, pid: int, sock: socket.socket, cgroup: Cgroup,
                 layer: str, seed: int, app: AppSpec, parent: str | None, generation: int):
        self.runtime = runtime
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
        self._lock = asyncio.Lock()
        self._closed = False
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
        if self._closed:
            raise WorkspaceClosed(self.id, "used after close()")
        if self.broken:
            raise WorkspaceBroken(self.id, self.broken)
        async with self._lock:
            try:
                await self._collect_orphan()
                self._inflight = asyncio.ensure_future(self._exchange(encoder.encode(message), fds))
                body = await asyncio.shield(self._inflight)
                self._inflight = None
                reply = reply_decoder.decode(body)
            except ChannelClosed as exc:
                self._inflight = None
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
        """Run one tool call. A call that leaves the workspace over its limits raises WorkspaceBroken."""
        timeout = self.runtime.limits.command_timeout_s if timeout_s is None else timeout_s
        reply = await self.request(Execute(call=call, timeout_s=timeout))
        reason = await asyncio.to_thread(self._limit_breach)
        if reason is not None:
            self.broken = reason
            raise WorkspaceBroken(self.id, reason)
        return reply.observation  # type: ignore[union-attr]

    async def ping(self) -> Pong:
        reply = await self.request(Ping())
        assert isinstance(reply, Pong)
        return reply

    # -- forks ------------------------------------------------------------------------------------------------
    async def fork(self, *, seed: int | None = None) -> Workspace:
        """A live copy-on-write clone that runs on its own; this workspace keeps running."""
        return await self.runtime.backend.fork(self, seed=seed, frozen=False)

    async def snapshot(self) -> Snapshot:
        """A frozen fork: it runs nothing and can be forked again later."""
        snap = await self.runtime.backend.fork(self, seed=None, frozen=True)
        assert isinstance(snap, Snapshot)
        return snap

    async def checkpoint(self, path: str) -> int:
        """Write the application state to ``path`` (relative to the run's pool); returns bytes written."""
        return await self.runtime.checkpoint(self, path)

    # -- state ------------------------------------------------------------------------------------------------
    def memory(self) -> MemoryStats:
        return processes_memory(self.cgroup.procs(), self.cgroup.memory_charge())

    @property
    def closed(self) -> bool:
        return self._closed

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
        status = await self.runtime.nursery.wait_exit(self.pid, timeout=5.0)
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
        """Stop the host, kill whatever is left in the cgroup, delete the layer. Safe to call twice; finishes
        even when the caller is cancelled."""
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(self._teardown())

    async def _teardown(self) -> None:
        try:
            if not self.broken:
                try:
                    async with asyncio.timeout(5):
                        async with self._lock:
                            await self._collect_orphan()
                            await self._exchange(encoder.encode(Close()), None)
                except (TimeoutError, OSError, ValueError):  # a host that cannot say goodbye is killed anyway
                    pass
        finally:
            if self._inflight is not None:
                self._inflight.cancel()
            self.sock.close()
            await self.runtime.discard(self)


class Snapshot(Workspace):
    """A frozen fork. Its processes wait, its files are read-only; ``fork()`` makes running clones of it."""

    frozen = True

    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        raise RequestRefused(self.id, "bad_request", "a snapshot runs no tools; fork it first")

    async def snapshot(self) -> Snapshot:
        return await self.runtime.backend.fork(self, seed=None, frozen=True)  # type: ignore[return-value]
