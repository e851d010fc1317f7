"""An in-memory workspace: a second implementation of the Workspace contract, in the engine's own process, without
root, namespaces, cgroups or processes. Tests of everything above the workspace (``SampleRun``, ``Walk``,
``SampleSpeculation``) run on it as any user; ``tests/test_workspace_contract.py`` holds it to the real one.

Owns: ``MemoryRuntime`` (a run of in-memory workspaces: create, close, the run's memory figures),
``MemoryWorkspace`` and ``MemorySnapshot`` (execute within the runtime's deadlines, fork, snapshot, memory, charge,
close), ``MemoryAppContext`` (what the application is given instead of a host's context), ``Latency`` (the
modelled costs) and ``NeedsRealWorkspace`` (what only a real workspace can do). Decisions, each kept close to what a
host does:
- The application is the very ``WorkspaceApp`` an ``AppSpec`` names, constructed with its kwargs and set up with a
  ``MemoryAppContext``: a seeded random stream (``ctx.rng``), files only below the workspace's own directory
  (``ctx.directory``); a shell command, a listening socket, a worker process, a file elsewhere, an image or a
  checkpoint raise ``NeedsRealWorkspace`` naming the application and the call.
- A tool runs in a worker thread, one call at a time per workspace, with the host's dispatch (unknown tool,
  ``ToolError`` and any other exception become the same observations, ``tool_seconds`` measured the same way); the
  call and its observation make the MessagePack round trip a host's request and reply make (the tool sees the
  types a host's tool sees, the engine gets the types it gets from a host), and a reply over the channel's frame
  bound breaks the workspace as it breaks a real one. A call over its deadline (``deadline_s``) raises
  ``CallDeadlineExceeded`` and leaves the workspace broken; its thread cannot be stopped, so it runs to its end
  and its answer is dropped. A call whose caller was cancelled runs to its end and the next request waits for it,
  as a host's does.
- A fork is ``copy.deepcopy`` of the application together with its context, taken under the source's lock (no call
  runs meanwhile) after its ``before_fork``, with the workspace's directory copied and its open files re-opened in
  the clone's copy; then, as in a host's clone, the clone's seed (the caller's, else ``derive_seed(source seed,
  "fork", source forks)``), ``ctx.rng`` reseeded, files re-opened and ``after_fork``; a snapshot lets go of its
  files instead and runs nothing. deepcopy, not a pickle round trip: it copies what a process fork copies (objects
  pickle refuses, bound methods), and an object it cannot copy (a lock, a socket, a huge-page heap) makes the fork
  fail with ``ForkFailed``, the source unchanged. Functions are atoms to deepcopy: a closure kept in the state is
  shared with the clone, not copied.
- Memory is a model (``memory()``): the state's size is the application object graph's ``sys.getsizeof`` sum,
  measured after setup, a fork and every call (in the tool's thread). A workspace that was created, or a clone
  that has run a call, holds its state privately; a clone or snapshot that has not run one yet shares all of it
  with its source (copy-on-write, page = the whole state). ``charge()`` is the private part (a clone's cgroup is
  charged only for what it wrote); PSS counts shared bytes half (one other sharer). A state over
  ``Limits.memory_bytes`` after a call breaks the workspace ("memory limit: ...").
- Modelled latency (``Latency``) is slept on the event loop: ``create_s`` per create, ``fork_s``/``snapshot_s`` per
  fork (in ``ForkTiming.ready_s``; ``freeze_s`` is the measured copy) and ``call_s`` per call, inside its deadline.
  All 0 by default.
Must never: need root or a privilege of any kind, block the event loop on an application (setup, tools, copies and
close run in threads), run two calls of one workspace at once, let a clone share a mutable object with its source
(closures aside, as said), reseed the process's global random streams (every workspace shares them here; an
application that draws from ``random`` itself gets one stream for all), or leave a workspace's directory behind once
``close()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import io
import math
import os
import random
import secrets
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec

from .app import AppContext, ReopenableFile, ToolError, WorkspaceApp
from .errors import (
    CallDeadlineExceeded,
    EnvsError,
    ForkFailed,
    WorkspaceBroken,
    WorkspaceClosed,
    WorkspaceStartFailed,
)
from .records import AppSpec, Limits, MemoryStats, Observation, ToolCall
from .runtime.channel import MAX_FRAME, FrameTooLarge
from .runtime.memory import RunMemory
from .runtime.task_scope import run_to_end
from .runtime.workers import load
from .seeds import derive_seed
from .workspace import ForkTiming, Snapshot, Workspace, WorkspaceImage, call_timeouts

CLOSE_GRACE_S = 5.0  # how long a close waits for a call still running (as a host is given to say goodbye)


class NeedsRealWorkspace(EnvsError):
    """The application asked the in-memory workspace for what only a real workspace has (a shell, a socket, a
    worker process, a file outside its directory, a durable image). ``app`` is the application's target, ``call``
    what it called."""

    def __init__(self, app: str, call: str, why: str):
        super().__init__(f"{app}: {call} needs a real workspace ({why}); the in-memory workspace runs applications "
                         f"whose state is Python objects (and files below ctx.directory) only")
        self.app, self.call = app, call


@dataclass(frozen=True)
class Latency:
    """Modelled costs, seconds, slept on the event loop: a create, a live fork, a snapshot, and each tool call's
    round trip (inside its deadline). The tool's own time is whatever it takes."""

    create_s: float = 0.0
    fork_s: float = 0.0
    snapshot_s: float = 0.0
    call_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("create_s", "fork_s", "snapshot_s", "call_s"):
            value = getattr(self, name)
            if not 0.0 <= value < math.inf:
                raise ValueError(f"Latency.{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass
class MemoryAppContext(AppContext):
    """A host's ``AppContext`` for an application in memory: ``directory`` is the workspace's own (files may be
    opened below it, relative paths resolve there); what needs a real workspace raises ``NeedsRealWorkspace``."""

    run_agent: Callable[[str, float], Observation] | None = None  # type: ignore[assignment]
    directory: str = ""
    app_target: str = ""

    def __post_init__(self) -> None:
        if self.run_agent is None:
            self.run_agent = self.agent

    def refuse(self, call: str, why: str) -> NeedsRealWorkspace:
        return NeedsRealWorkspace(self.app_target, call, why)

    def spawn(self, target: str, **kwargs: Any) -> Any:
        raise self.refuse(f"ctx.spawn({target!r})", "a worker process")

    def listen(self, port: int = 0) -> Any:
        raise self.refuse(f"ctx.listen({port})", "a listening socket in the workspace's network namespace")

    def open(self, path: str, mode: str = "r") -> ReopenableFile:
        full = os.path.realpath(os.path.join(self.directory, path))
        if os.path.commonpath([full, os.path.realpath(self.directory)]) != os.path.realpath(self.directory):
            raise self.refuse(f"ctx.open({path!r})", f"a file outside the workspace's directory {self.directory}")
        return super().open(full, mode)

    def agent(self, cmd: str, timeout_s: float) -> Observation:
        raise self.refuse(f"ctx.run_agent({cmd!r})", "a shell in the workspace")

    def reseed(self, seed: int) -> None:
        """Only the context's own stream: ``random`` and numpy's are the whole process's here."""
        self.seed = seed
        self.rng.seed(seed)


def state_bytes(root: object) -> int:
    """The model's size of an application's state: ``sys.getsizeof`` summed over the objects reachable from
    ``root`` (code, classes, modules and functions are not state)."""
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
            types.CodeType, types.FrameType)
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


@dataclass
class MemoryRun:
    """What a run's workspaces share (and all they see of it): limits, latency, the id counter, the live ones."""

    limits: Limits
    latency: Latency
    run_dir: Path
    live: dict[str, MemoryWorkspace] = field(default_factory=dict)
    counter: int = 0
    closing: bool = False  # the runtime is closing: a fork that ends now leaves no clone

    def new_id(self) -> str:
        self.counter += 1
        return f"{self.counter:04d}{secrets.token_hex(2)}"


_encoder = msgspec.msgpack.Encoder()
_call_decoder = msgspec.msgpack.Decoder(ToolCall)
_observation_decoder = msgspec.msgpack.Decoder(Observation)


class _Broke(Exception):
    """Raised in a tool's thread: the reply cannot reach the engine (``reason``); the workspace breaks."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class MemoryWorkspace(Workspace):
    """A workspace whose application lives in this process. Make one with ``MemoryRuntime.create``."""

    def __init__(self, run: MemoryRun, ws_id: str, *, seed: int, app: AppSpec, parent: str | None,
                 generation: int, state: WorkspaceApp, ctx: MemoryAppContext, nbytes: int, written: bool):
        super().__init__(ws_id, seed=seed, app=app, parent=parent, generation=generation)
        self.forks = 0  # clones made so far: feeds the clones' seeds
        self.calls = 0
        self.run = run
        self.app: WorkspaceApp | None = state
        self.ctx = ctx
        self.nbytes = nbytes  # the state's modelled size, measured after setup, a fork and every call
        self.written = written  # holds its state privately (see the module's memory model)
        self._lock = asyncio.Lock()
        self._inflight: asyncio.Future[bytes] | None = None
        self._closing: asyncio.Event | None = None

    def __repr__(self) -> str:
        kind = "MemorySnapshot" if self.frozen else "MemoryWorkspace"
        return f"<{kind} {self.id} gen={self.generation}{' broken' if self.broken else ''}>"

    @property
    def directory(self) -> str:
        return self.ctx.directory

    # -- tool calls -------------------------------------------------------------------------------------------
    async def execute(self, call: ToolCall, timeout_s: float | None = None) -> Observation:
        """Run one tool call within ``timeout_s`` (default: the run's ``Limits.command_timeout_s``); the contract's
        errors as the real workspace raises them (``CallDeadlineExceeded``, ``WorkspaceBroken``,
        ``WorkspaceClosed``), and ``NeedsRealWorkspace`` for ``shell`` or a tool that asks for what is not here."""
        limits = self.run.limits
        timeout, deadline = call_timeouts(timeout_s, limits)
        self.calls += 1
        try:
            async with asyncio.timeout(deadline):
                body = await self._request(call)
        except TimeoutError as exc:
            reason = (f"tool call {call.name!r} overran its deadline: asked to finish within {timeout:g}s, no "
                      f"answer after {deadline:g}s; its thread was abandoned")
            self.broken = reason
            raise CallDeadlineExceeded(self.id, reason, tool=call.name, deadline_s=deadline) from exc
        if limits.memory_bytes is not None and self.nbytes > limits.memory_bytes:
            self.broken = (f"memory limit: the state's modelled {self.nbytes} bytes are over the limit of "
                           f"{limits.memory_bytes}")
            raise WorkspaceBroken(self.id, self.broken)
        return _observation_decoder.decode(body)

    def _usable(self) -> None:
        if self._closing is not None:
            raise WorkspaceClosed(self.id, "used after close()")
        if self.broken:
            raise WorkspaceBroken(self.id, self.broken)

    async def _request(self, call: ToolCall) -> bytes:
        """The call's reply, encoded; one at a time. A cancelled caller leaves the call running (``_inflight``):
        the next request, fork or close waits for it first."""
        self._usable()
        async with self._lock:
            await self._collect_orphan()
            self._usable()
            if self.run.latency.call_s:
                await _take(self.run.latency.call_s)  # the round trip; cancelled here, nothing ran
            loop = asyncio.get_running_loop()
            self._inflight = loop.run_in_executor(None, self._run_tool, _encoder.encode(call))
            try:
                body = await asyncio.shield(self._inflight)
            except (_Broke, NeedsRealWorkspace) as exc:
                self._inflight = None
                if isinstance(exc, NeedsRealWorkspace):
                    raise
                self.broken = exc.reason
                raise WorkspaceBroken(self.id, exc.reason) from exc
            self._inflight = None
        return body

    async def _collect_orphan(self) -> None:
        """Wait for a call whose caller was cancelled, and drop its answer (shielded: cancelling this wait leaves
        it registered). One that failed leaves the state unknown: the workspace breaks."""
        orphan = self._inflight
        if orphan is None:
            return
        try:
            await asyncio.shield(orphan)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._inflight = None
            self.broken = f"the call a cancelled caller left running failed: {type(exc).__name__}: {exc}"
            raise WorkspaceBroken(self.id, self.broken) from exc
        self._inflight = None

    def _run_tool(self, request: bytes) -> bytes:
        """In a worker thread: a host's dispatch of one call (``runtime/host.py``), its reply encoded."""
        app = self.app
        if app is None:
            raise _Broke("closed while a call waited")
        call = _call_decoder.decode(request)
        started = time.monotonic()
        try:
            if call.name == "shell":
                raise self.ctx.refuse("the tool 'shell'", "a shell in the workspace")
            tools = app.tools()
            if call.name not in tools:
                raise ToolError(f"unknown tool {call.name!r} (available: {sorted(['shell', *tools])})")
            obs = tools[call.name](call.args)
        except NeedsRealWorkspace:
            raise
        except ToolError as exc:
            obs = Observation(error=str(exc))
        except Exception as exc:
            obs = Observation(error=f"tool {call.name!r} failed: {type(exc).__name__}: {exc}")
        obs = msgspec.structs.replace(obs, tool_seconds=time.monotonic() - started)
        self.written = True
        self.nbytes = state_bytes(app)
        try:
            body = _encoder.encode(obs)
        except (TypeError, ValueError, OverflowError) as exc:  # a host dies on a reply it cannot encode
            raise _Broke(f"the host could not encode its reply: {type(exc).__name__}: {exc}") from exc
        if len(body) > MAX_FRAME:
            raise _Broke(f"channel out of step: FrameTooLarge: {FrameTooLarge(f'frame of {len(body)} bytes')}")
        return body

    # -- forks ------------------------------------------------------------------------------------------------
    async def fork(self, *, seed: int | None = None) -> MemoryWorkspace:
        """A live clone (a deep copy of the state) that runs on its own; this workspace keeps running."""
        return await self._fork(seed, frozen=False)

    async def snapshot(self) -> MemorySnapshot:
        """A frozen fork: it runs nothing and can be forked again later."""
        return cast(MemorySnapshot, await self._fork(None, frozen=True))

    async def _fork(self, seed: int | None, *, frozen: bool) -> MemoryWorkspace:
        started = time.monotonic()
        self.forks += 1  # before anything can fail, as the runtime's fork backends count
        clone_seed = derive_seed(self.seed, "fork", self.forks) if seed is None else seed
        clone_id = self.run.new_id()
        self._usable()
        async with self._lock:  # the source serves one request at a time: a fork waits behind a call
            await self._collect_orphan()
            self._usable()
            copying = time.monotonic()
            try:
                state, ctx, nbytes = await run_to_end(
                    asyncio.to_thread(self._copy_state, clone_id, clone_seed, frozen), _discard_copy)
            except Exception as exc:
                raise ForkFailed(self.id, f"fork to {clone_id} failed: {self.app_spec.target}'s state could not "
                                          f"be copied in memory: {type(exc).__name__}: {exc}") from exc
            freeze_s = time.monotonic() - copying
        if self.run.closing:
            await asyncio.to_thread(_discard_copy, (state, ctx, nbytes))
            raise WorkspaceClosed(self.id, "the runtime closed while it forked")
        cls = MemorySnapshot if frozen else MemoryWorkspace
        clone = cls(self.run, clone_id, seed=clone_seed, app=self.app_spec, parent=self.id,
                    generation=self.generation + 1, state=state, ctx=ctx, nbytes=nbytes, written=False)
        self.run.live[clone_id] = clone
        try:
            modelled = self.run.latency.snapshot_s if frozen else self.run.latency.fork_s
            if modelled:
                await _take(modelled)
        except BaseException:
            await clone.close()  # a cancelled fork leaves no clone behind
            raise
        clone.last_fork = ForkTiming(freeze_s=freeze_s, ready_s=time.monotonic() - started)
        return clone

    def _copy_state(self, clone_id: str, seed: int, frozen: bool) -> tuple[WorkspaceApp, MemoryAppContext, int]:
        """In a worker thread, the source's lock held: its ``before_fork``, its directory and state copied, then
        the clone side of a host's fork (``runtime/fork/clone.py``)."""
        app, ctx = self.app, self.ctx
        assert app is not None
        app.before_fork(ctx)
        directory = str(self.run.run_dir / f"ws-{clone_id}")
        shutil.copytree(ctx.directory, directory, symlinks=True)
        try:
            memo: dict[int, Any] = {id(f): _moved(f, ctx.directory, directory) for f in ctx.files}
            state, clone_ctx = copy.deepcopy((app, ctx), memo)
            clone_ctx.ws_id, clone_ctx.directory = clone_id, directory
            if frozen:
                clone_ctx.suspend_after_fork()
            else:
                clone_ctx.reseed(seed)
                clone_ctx.rebind_after_fork()
                state.after_fork(clone_ctx)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return state, clone_ctx, state_bytes(state)

    # -- what only a real workspace has -------------------------------------------------------------------------
    async def image(self, name: str) -> WorkspaceImage:
        raise self.ctx.refuse(f"image({name!r})", "a durable image is a run pool's state images and file layer")

    async def checkpoint(self, path: str) -> int:
        raise self.ctx.refuse(f"checkpoint({path!r})", "a checkpoint is a file in a run's pool")

    # -- state ------------------------------------------------------------------------------------------------
    def memory(self) -> MemoryStats:
        """The modelled figures (the module's docstring says the model)."""
        if self.app is None:
            return MemoryStats()
        private, shared = (self.nbytes, 0) if self.written else (0, self.nbytes)
        return MemoryStats(pss=private + shared // 2, private=private, shared=shared, rss=self.nbytes,
                           cgroup_charge=private, processes=1)

    def charge(self) -> int:
        """The bytes the workspace is charged for: its private state (0 once closed)."""
        return self.nbytes if self.written and self.app is not None else 0

    @property
    def closed(self) -> bool:
        return self._closing is not None

    # -- close ------------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Drop the state, close the application, remove the directory. Finishes even when the caller is cancelled;
        a second call (concurrent or later) returns once the first one's teardown has finished."""
        if self._closing is not None:
            await self._closing.wait()
            return
        self._closing = asyncio.Event()
        try:
            await run_to_end(self._teardown())
        finally:
            self._closing.set()

    async def _teardown(self) -> None:
        try:
            if not self.broken:
                try:
                    async with asyncio.timeout(CLOSE_GRACE_S):
                        async with self._lock:  # a call still running ends first, as a host answers before Close
                            await self._collect_orphan()
                except (TimeoutError, WorkspaceBroken):
                    pass
        finally:
            self.run.live.pop(self.id, None)
            app, self.app = self.app, None
            await asyncio.to_thread(_release, app, self.ctx)


class MemorySnapshot(Snapshot, MemoryWorkspace):
    """A frozen fork: it runs no tools (``Snapshot.execute`` refuses them, as for a real snapshot); ``fork()`` makes
    running clones."""


def _moved(f: ReopenableFile, source_dir: str, clone_dir: str) -> ReopenableFile:
    """The clone's copy of an open file: the same file in the clone's directory, at the same offset, re-opened by
    the clone's ``rebind_after_fork`` (a snapshot keeps it closed until its own clones re-open it)."""
    moved = ReopenableFile.__new__(ReopenableFile)
    moved.path = os.path.join(clone_dir, os.path.relpath(f.path, source_dir))
    moved.mode = f.mode
    moved._position = f._position if f.file.closed else f.file.tell()
    placeholder = io.BytesIO()
    placeholder.close()
    moved.file = placeholder
    return moved


async def _take(seconds: float) -> None:
    """Sleep at least ``seconds`` by ``time.monotonic`` (what the timings are measured with): a loop's timer may fire
    a little early by that clock (uvloop's has millisecond resolution), and a modelled cost is never less than
    itself."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        await asyncio.sleep(left)


def _release(app: WorkspaceApp | None, ctx: MemoryAppContext) -> None:
    """In a thread: what a host's shutdown does, then the directory goes."""
    try:
        if app is not None:
            with contextlib.suppress(Exception):
                app.close()
        for f in ctx.files:
            f.close()
    finally:
        shutil.rmtree(ctx.directory, ignore_errors=True)


def _discard_copy(copied: tuple[WorkspaceApp, MemoryAppContext, int]) -> None:
    """A copy whose fork was cancelled while it was made: released as a closed clone is."""
    _release(copied[0], copied[1])


class MemoryRuntime:
    """Async context manager, as ``WorkspaceRuntime``: ``async with MemoryRuntime() as rt: ws = await
    rt.create(app)``. ``limits``: the deadlines (``command_timeout_s``, ``deadline_grace_s``) and the memory
    limit of the model; ``state_dir``: where the run's directory goes (default: the system's temporary one)."""

    backend_name = "memory"

    def __init__(self, *, latency: Latency | None = None, limits: Limits | None = None, seed: int = 0,
                 state_dir: str | Path | None = None):
        self.limits = limits or Limits()
        self.latency = latency or Latency()
        self.seed = seed
        self.state_dir = Path(state_dir or tempfile.gettempdir())
        self.run_id = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
        self.run_dir = self.state_dir / f"bunshin-memory-{self.run_id}"
        self.run = MemoryRun(limits=self.limits, latency=self.latency, run_dir=self.run_dir)
        self._started = False

    @property
    def workspaces(self) -> dict[str, MemoryWorkspace]:
        """Every live workspace of the run, by id."""
        return self.run.live

    async def __aenter__(self) -> MemoryRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        await asyncio.to_thread(self.run_dir.mkdir, parents=True)
        self._started = True

    async def close(self) -> None:
        """Close every workspace, then remove the run's directory. Finishes under cancellation."""
        if not self._started:
            return
        self._started = False
        await run_to_end(self._teardown())

    async def _teardown(self) -> None:
        self.run.closing = True
        try:
            while self.run.live:  # a fork that was under way when the close began registers no clone
                for ws in list(self.run.live.values()):
                    await ws.close()
        finally:
            await asyncio.to_thread(shutil.rmtree, self.run_dir, ignore_errors=True)

    def prepare(self, app: AppSpec) -> None:
        """The real runtime's warm pool has nothing to fill here: the apps run in-process and fork whole."""

    async def create(self, app: AppSpec | None = None, *, seed: int | None = None,
                     hostname: str | None = None) -> MemoryWorkspace:
        """A new workspace running ``app`` (set up in a thread); ``seed`` defaults as the real runtime's does.
        Raises ``WorkspaceStartFailed`` (the app could not be loaded or set up; its error is the cause) or
        ``NeedsRealWorkspace``."""
        if not self._started:
            raise RuntimeError("the runtime is not started (use `async with MemoryRuntime(...)` or start())")
        spec = app or AppSpec()
        ws_id = self.run.new_id()
        seed = derive_seed(self.seed, ws_id) if seed is None else seed
        directory = self.run_dir / f"ws-{ws_id}"
        ctx = MemoryAppContext(ws_id=ws_id, seed=seed, rng=random.Random(seed), directory=str(directory),
                               app_target=spec.target)
        if self.latency.create_s:
            await _take(self.latency.create_s)
        try:
            state, nbytes = await run_to_end(asyncio.to_thread(_set_up, spec, ctx), lambda made: _release(made[0], ctx))
        except NeedsRealWorkspace:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
            raise
        except Exception as exc:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)
            raise WorkspaceStartFailed(ws_id, f"{type(exc).__name__}: {exc}") from exc
        ws = MemoryWorkspace(self.run, ws_id, seed=seed, app=spec, parent=None, generation=0, state=state, ctx=ctx,
                             nbytes=nbytes, written=True)
        self.run.live[ws_id] = ws
        return ws

    async def restore_image(self, app: AppSpec, parts: Sequence[Any] | None, fill_layer: Callable[..., Any], *,
                            seed: int | None = None, frozen: bool = False) -> MemoryWorkspace:
        raise NeedsRealWorkspace(app.target, "restore_image()", "a durable image is a run pool's state images and "
                                 "file layer; a prefix cache with a cache directory needs the real runtime")

    def memory(self) -> MemoryStats:
        """Every workspace of the run together (the model's figures summed)."""
        total = MemoryStats()
        for ws in list(self.run.live.values()):
            total = total + ws.memory()
        return total

    def memory_charge(self) -> int:
        """The run's charge: every workspace's private state."""
        return sum(ws.charge() for ws in list(self.run.live.values()))

    def memory_detail(self) -> RunMemory:
        """The run's memory in ``RunMemory``'s fields, from the model (no page tables, engine or nursery)."""
        total = self.memory()
        return RunMemory(cgroup_charge=total.cgroup_charge, pss=total.pss, private=total.private,
                         processes=total.processes)


def _set_up(spec: AppSpec, ctx: MemoryAppContext) -> tuple[WorkspaceApp, int]:
    """In a thread: the application a host would run, constructed and set up in ``ctx``'s directory."""
    cls = load(spec.target)
    if not (isinstance(cls, type) and issubclass(cls, WorkspaceApp)):
        raise TypeError(f"{spec.target} is not a WorkspaceApp subclass")
    os.makedirs(ctx.directory)
    state = cls(**spec.kwargs)
    state.setup(ctx)
    return state, state_bytes(state)
