"""A suite task's episodes behind a synchronous face, for trainers whose environment API is synchronous
(gymnasium, skyrl-gym) or runs on its own event loop (verl's agent loops).

Owns: ``TaskSession``: a background thread running its own event loop (uvloop when installed) with a
``WorkspaceRuntime``, the task's set-up workspace (created and set up once, on first use), and its episodes, each
named and each in its own copy-on-write fork of the set-up workspace: ``reset(seed)`` closes the episode's previous
workspace and forks a fresh one; ``step(text)`` parses the text in the suite's action language, runs it (or, for the
final action, scores it with the suite's evaluator) and returns an ``EpisodeStep``; ``areset``/``astep``/... do the
same from another event loop; ``expose(port)`` carries a loopback port to a port inside the episode's workspace.
Several episodes may run at once (a GRPO group). Every call has a deadline enforced
on the runtime's loop; ``close()`` (also run when the session is garbage-collected or the interpreter exits) closes
every workspace and the runtime (processes, mounts, cgroups, the run's directory) and stops the thread.
``SessionPool``: sessions shared by the users of one task and configuration open at once, closed with the last.
Must never: run the runtime on the caller's loop or thread (the synchronous APIs block it), let a malformed action
escape as an exception (it is the agent's mistake: an observation with the error, as the engine treats it), or
leave a workspace behind on any path.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # noqa: F401  (imported before the exit hook below is registered: see there)
import json
import threading
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bunshin.engine.errors import EngineError
from bunshin.envs.records import Limits, Observation, ToolCall
from bunshin.envs.runtime.host_workspace import HostWorkspace
from bunshin.envs.runtime.port_forward import PortForward
from bunshin.envs.runtime.runtime import WorkspaceRuntime
from bunshin.envs.suites.base import ActionError, Suite, SuiteTask, observation_text
from bunshin.envs.workspace import Workspace

T = TypeVar("T")


class AdapterError(EngineError):
    """The root of the trainer adapters' errors."""


class SessionClosed(AdapterError):
    """The session was closed (by ``close()`` or at exit); we closed it, the caller used it afterwards."""


class EpisodeNotStarted(AdapterError):
    """``step`` before ``reset``, or after the episode ended: the caller's mistake."""


class AdapterTimeout(AdapterError, TimeoutError):
    """A runtime call did not finish within its deadline; names the call."""


@dataclass(frozen=True)
class EpisodeStep:
    observation: str  # what a text policy reads next (the error first if the action failed)
    reward: float  # the suite's score at the final action, else 0.0
    terminated: bool  # the final action was taken (scored)
    truncated: bool  # the step limit was reached without a final action (scored as the suite's null action)
    info: dict[str, Any] = field(default_factory=dict)


MAIN = "main"  # the episode the synchronous face runs


@dataclass
class _Episode:
    ws: Workspace
    max_steps: int
    steps: int = 0
    forwards: list[PortForward] = field(default_factory=list)  # closed before the workspace


class RuntimeLoop:
    """The thread and loop a runtime lives on, for a synchronous face over it (a session, OSWorld's DesktopEnv).
    Separate from its user so a finalizer can stop it without keeping the user alive; registered in ``track``
    so that one nobody closed is closed at exit."""

    def __init__(self, use_uvloop: bool) -> None:
        self.loop: asyncio.AbstractEventLoop
        if use_uvloop:
            try:
                import uvloop
                self.loop = uvloop.new_event_loop()
            except ImportError:
                self.loop = asyncio.new_event_loop()
        else:
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="bunshin-adapter-loop", daemon=True)
        self.thread.start()
        self.runtime: WorkspaceRuntime | None = None
        self.workspaces: set[Workspace] = set()
        self.forwards: set[PortForward] = set()  # closed before the workspaces they lead into
        self.closed = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self.closed:
            coro.close()
            raise SessionClosed("the session is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def _teardown(self) -> None:
        try:
            for forward in list(self.forwards):
                await forward.close()
                self.forwards.discard(forward)
            for ws in list(self.workspaces):
                await ws.close()
                self.workspaces.discard(ws)
        finally:
            if self.runtime is not None:
                await self.runtime.close()  # closes whatever is still open, then the run's cgroup, pool, directory

    def shutdown(self, timeout_s: float = 120.0) -> None:
        """Close every workspace and the runtime, then stop the loop and join the thread. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._teardown(), self.loop).result(timeout_s)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.loop.close()


_LIVE: weakref.WeakSet[RuntimeLoop] = weakref.WeakSet()


def track(loop: RuntimeLoop) -> RuntimeLoop:
    """Have ``loop`` shut down at the interpreter's exit if nobody did before."""
    _LIVE.add(loop)
    return loop


def _shutdown_all() -> None:
    for loop in list(_LIVE):
        loop.shutdown()


# At exit, sessions nobody closed are closed before concurrent.futures refuses new work (closing a workspace uses
# the loop's default executor): threading's exit hooks run newest first, and concurrent.futures registered its own
# when concurrent.futures.thread was imported, above.
threading._register_atexit(_shutdown_all)  # type: ignore[attr-defined]


class TaskSession:
    """Episodes of one suite task, each in a fresh copy-on-write fork of the task's set-up workspace."""

    def __init__(self, suite: Suite, task: SuiteTask, *, backend: str = "cow", state_dir: Path | None = None,
                 limits: Limits | None = None, max_steps: int = 30, call_timeout_s: float = 60.0,
                 setup_timeout_s: float = 300.0, use_uvloop: bool = True):
        self.suite, self.task, self.max_steps = suite, task, max_steps
        self.call_timeout_s, self.setup_timeout_s = call_timeout_s, setup_timeout_s
        self._runtime_kwargs: dict[str, Any] = {"backend": backend, "limits": limits}
        if state_dir is not None:
            self._runtime_kwargs["state_dir"] = state_dir
        self._loop = track(RuntimeLoop(use_uvloop))
        self._finalizer = weakref.finalize(self, self._loop.shutdown)
        self._base: Workspace | None = None
        self._first: Observation | None = None
        self._base_lock: asyncio.Lock | None = None
        self._episodes: dict[str, _Episode] = {}

    # -- the synchronous face -------------------------------------------------------------------------------
    # Episodes are named; the runtime's loop runs them, so several threads may drive different episodes at once.
    def reset(self, seed: int | None = None, *, episode: str = MAIN, max_steps: int | None = None) -> str:
        """Start a new episode in a fresh fork (seeded with ``seed``); returns the first observation's text."""
        return self._call(self._reset(seed, episode, max_steps), self.setup_timeout_s, "reset")

    def step(self, action: str, *, episode: str = MAIN) -> EpisodeStep:
        return self._call(self._step(action, episode), self.call_timeout_s + self.setup_timeout_s, "step")

    def end(self, *, episode: str = MAIN) -> None:
        """Close an episode's workspace (the set-up workspace stays for the next reset)."""
        self._call(self._end(episode), self.setup_timeout_s, "end")

    def expose(self, port: int, *, episode: str = MAIN) -> int:
        """A port on the engine's loopback carried to ``port`` inside the episode's workspace, and to nothing else
        (a client of the engine's side reaches the application there: a BrowserGym browser the web shop); closed
        when the episode ends."""
        return self._call(self._expose(port, episode), self.call_timeout_s, "expose")

    def close(self) -> None:
        """Close every workspace and the runtime; later calls raise ``SessionClosed``."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._loop.closed

    @property
    def runtime(self) -> WorkspaceRuntime | None:
        return self._loop.runtime

    # -- the same from another event loop (verl's agent loops are coroutines) ------------------------------
    # Several episodes may run at once, each named (``episode``), each in its own fork of the one set-up workspace.
    async def areset(self, seed: int | None = None, *, episode: str = MAIN, max_steps: int | None = None) -> str:
        return await self._acall(self._reset(seed, episode, max_steps), self.setup_timeout_s, "reset")

    async def astep(self, action: str, *, episode: str = MAIN) -> EpisodeStep:
        return await self._acall(self._step(action, episode), self.call_timeout_s + self.setup_timeout_s, "step")

    async def agive_up(self, *, episode: str = MAIN) -> EpisodeStep:
        """End the episode without a final action from the agent (out of turns or tokens): scored as the suite's
        null action, ``truncated``."""
        return await self._acall(self._give_up(episode), self.call_timeout_s + self.setup_timeout_s, "give up")

    async def aend(self, *, episode: str = MAIN) -> None:
        """Close an episode's workspace (the set-up workspace stays for the next reset)."""
        await self._acall(self._end(episode), self.setup_timeout_s, "end")

    # -- plumbing -------------------------------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        if self._loop.closed:
            coro.close()
            raise SessionClosed("the session is closed")
        future = self._loop.submit(self._deadline(coro, timeout_s, what))
        return future.result()

    async def _acall(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        if self._loop.closed:
            coro.close()
            raise SessionClosed("the session is closed")
        future = self._loop.submit(self._deadline(coro, timeout_s, what))
        return await asyncio.wrap_future(future)  # cancelling the caller cancels it on the runtime's loop

    @staticmethod
    async def _deadline(coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        try:
            async with asyncio.timeout(timeout_s):
                return await coro
        except TimeoutError as exc:
            raise AdapterTimeout(f"{what} did not finish within {timeout_s:g}s") from exc

    def _track(self, ws: Workspace) -> Workspace:
        self._loop.workspaces.add(ws)
        return ws

    async def _close_ws(self, ws: Workspace | None) -> None:
        if ws is not None:
            try:
                await ws.close()
            finally:
                self._loop.workspaces.discard(ws)

    async def _ensure_base(self) -> tuple[Workspace, Observation]:
        if self._base_lock is None:  # made on the runtime's loop, where every caller of this runs
            self._base_lock = asyncio.Lock()
        async with self._base_lock:  # concurrent first resets set the task up once
            if self._loop.runtime is None:
                rt = WorkspaceRuntime(**self._runtime_kwargs)
                await rt.start()
                self._loop.runtime = rt
            if self._base is None:
                ws = self._track(await self._loop.runtime.create(self.suite.app(self.task)))
                try:
                    self._first = await self.suite.start(ws, self.task)
                except BaseException:
                    await self._close_ws(ws)
                    raise
                self._base = ws
        assert self._first is not None
        return self._base, self._first

    def _episode(self, name: str, what: str) -> _Episode:
        episode = self._episodes.get(name)
        if episode is None:
            raise EpisodeNotStarted(f"{what}() needs reset() first (or the episode has ended)")
        return episode

    async def _end(self, name: str) -> None:
        episode = self._episodes.pop(name, None)
        if episode is not None:
            try:
                for forward in episode.forwards:
                    await forward.close()
                    self._loop.forwards.discard(forward)
            finally:
                await self._close_ws(episode.ws)

    async def _expose(self, port: int, name: str) -> int:
        episode = self._episode(name, "expose")
        if not isinstance(episode.ws, HostWorkspace):
            raise AdapterError(f"the {self._runtime_kwargs['backend']} backend's workspaces have no ports to expose")
        forward = PortForward(episode.ws, port)
        episode.forwards.append(forward)
        self._loop.forwards.add(forward)
        return await forward.start()

    async def _reset(self, seed: int | None, name: str = MAIN, max_steps: int | None = None) -> str:
        await self._end(name)
        base, first = await self._ensure_base()
        ws = self._track(await base.fork(seed=seed))
        self._episodes[name] = _Episode(ws=ws, max_steps=self.max_steps if max_steps is None else max_steps)
        return observation_text(first)

    async def _finish(self, name: str, final: ToolCall, truncated: bool, info: dict[str, Any]) -> EpisodeStep:
        episode = self._episode(name, "step")
        try:
            reward = float(await self.suite.evaluate(episode.ws, self.task, final))
        finally:
            await self._end(name)
        info.update(final=final.name, reward=reward)
        return EpisodeStep(observation="", reward=reward, terminated=not truncated, truncated=truncated, info=info)

    async def _give_up(self, name: str = MAIN) -> EpisodeStep:
        episode = self._episode(name, "give_up")
        return await self._finish(name, self.suite.null_action(), True, {"step": episode.steps})

    async def _step(self, action: str, name: str = MAIN) -> EpisodeStep:
        episode = self._episode(name, "step")
        info: dict[str, Any] = {"step": episode.steps}
        try:
            call = self.suite.normalize(self.suite.parse_action(action))
        except ActionError as exc:  # the agent's mistake: it reads the error and tries again
            call, info["action_error"] = None, str(exc)
        truncated = False
        if call is not None and self.suite.is_final(call):
            final = call
        elif episode.steps >= episode.max_steps:
            final, truncated = self.suite.null_action(), True
        else:
            final = None
        episode.steps += 1
        if final is not None:
            return await self._finish(name, final, truncated, info)
        if call is None:
            return EpisodeStep(observation=f"ERROR: {info['action_error']}", reward=0.0, terminated=False,
                               truncated=False, info=info)
        concrete = await self.suite.concrete(episode.ws, call)
        obs = await episode.ws.execute(concrete, timeout_s=self.call_timeout_s)
        info["call"] = ToolCall(name=concrete.name, args=concrete.args)
        return EpisodeStep(observation=observation_text(obs), reward=0.0, terminated=False, truncated=False,
                           info=info)


class SessionPool:
    """Sessions shared by the environments or rollouts of one task and configuration that are open at once in this
    process (``key``): the samples of a GRPO group fork one set-up workspace, each its own episode. A session is
    closed when the last user releases it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[TaskSession, int]] = {}

    def acquire(self, key: str, make: Callable[[], TaskSession]) -> TaskSession:
        with self._lock:
            session, users = self._sessions.get(key, (None, 0))
            if session is None or session.closed:
                session, users = make(), 0
            self._sessions[key] = (session, users + 1)
            return session

    def _drop(self, key: str, session: TaskSession) -> bool:
        """One user fewer; whether ``session`` is to be closed now (it was the last, or is no longer pooled)."""
        with self._lock:
            current, users = self._sessions.get(key, (None, 0))
            if current is not session:
                return True
            if users <= 1:
                del self._sessions[key]
                return True
            self._sessions[key] = (session, users - 1)
            return False

    def release(self, key: str, session: TaskSession, episode: str) -> None:
        """Close ``episode``'s workspace, and the session if no one else uses it."""
        try:
            if not session.closed:
                session.end(episode=episode)
        finally:
            if self._drop(key, session):
                session.close()

    async def arelease(self, key: str, session: TaskSession, episode: str) -> None:
        try:
            if not session.closed:
                await session.aend(episode=episode)
        finally:
            if self._drop(key, session):
                await asyncio.to_thread(session.close)


def pool_key(config: dict[str, Any]) -> str:
    """A configuration as a pool key (plain values; anything else by its text)."""
    return json.dumps(config, sort_keys=True, default=str)
