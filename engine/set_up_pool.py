"""The base of a group whose suite does not fork live (``Suite.forks_live`` False: a real desktop): workspaces of
the task's application, each set up by the suite ahead of the sample that takes it.

Owns: ``SetUpPool``: ``start`` begins preparing one workspace per sample (at most ``parallel`` set-ups at once)
and returns the first observation of the first one set up (raising only when every set-up failed); ``fork`` hands the next prepared workspace to a sample (waiting for
its set-up; a set-up that failed is that sample's failure, raised there); ``first_of`` is the first observation of
the workspace a sample took (its own screen, not another's); ``close`` cancels what is still being prepared and
closes what no sample took. This is what a sample's "fork" is until the tree fork of the kernel module runs real
applications: a prepared workspace at the task's set-up state, named so in the trajectory's lineage
(``setup-pool:<task>``).
Must never: leave a prepared workspace open after ``close``, on any path (cancellation included).
"""

from __future__ import annotations

import asyncio

from bunshin.envs.records import Observation
from bunshin.envs.runtime.runtime import WorkspaceRuntime
from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace

from .errors import SetupTimeout


class SetUpPool:
    """``size`` set-up workspaces of ``task`` for one group; each set-up within ``setup_timeout_s``."""

    def __init__(self, runtime: WorkspaceRuntime, suite: Suite, task: SuiteTask, *, size: int, seed: int,
                 setup_timeout_s: float, parallel: int = 2):
        self.runtime, self.suite, self.task = runtime, suite, task
        self.size, self.seed, self.setup_timeout_s = size, seed, setup_timeout_s
        self.id = f"setup-pool:{task.id}"
        self._gate = asyncio.Semaphore(parallel)
        self._scope = TaskScope(self.id)  # the set-ups under way: ended by ``close`` whatever happens
        self._prepared: list[asyncio.Task[tuple[Workspace, Observation]]] = []
        self._taken = 0
        self._firsts: dict[str, Observation] = {}
        self._closed = False

    async def _prepare(self, i: int) -> tuple[Workspace, Observation]:
        async with self._gate:
            ws = await self.runtime.create(self.suite.app(self.task), seed=self.seed + i)
            try:
                async with asyncio.timeout(self.setup_timeout_s) as scope:
                    first = await self.suite.start(ws, self.task)
            except TimeoutError as exc:
                await ws.close()
                if not scope.expired():
                    raise
                raise SetupTimeout(self.setup_timeout_s, "a prepared workspace's task setup") from exc
            except BaseException:
                await ws.close()
                raise
            return ws, first

    async def start(self) -> Observation:
        """Begin preparing every workspace; the first observation of the first one set up (the group's, as a
        forked base's would be; each sample then starts from its own). Only when every set-up failed is the first
        failure raised: one failed set-up is the failure of the sample that takes it."""
        self._prepared = [self._scope.start_soon(self._prepare(i), name=f"{self.id}/{i}") for i in range(self.size)]
        failure: BaseException | None = None
        pending: set[asyncio.Task[tuple[Workspace, Observation]]] = set(self._prepared)
        while pending:  # (asyncio.wait never cancels what it waits for)
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=self._prepared.index):
                if not task.cancelled() and task.exception() is None:
                    return task.result()[1]
                failure = failure or (task.exception() if not task.cancelled() else asyncio.CancelledError())
        assert failure is not None
        raise failure

    async def fork(self, *, seed: int | None = None) -> Workspace:
        """The next prepared workspace (its set-up awaited); it is the caller's to close."""
        if self._closed or self._taken >= len(self._prepared):
            raise RuntimeError(f"{self.id}: no prepared workspace left ({self.size} made for the group)")
        task = self._prepared[self._taken]
        self._taken += 1
        ws, first = await asyncio.shield(task)
        self._firsts[ws.id] = first
        return ws

    def first_of(self, ws: Workspace) -> Observation | None:
        return self._firsts.get(ws.id)

    async def close(self) -> None:
        """Cancel the set-ups under way and close every prepared workspace no sample took."""
        self._closed = True
        untaken = self._prepared[self._taken:]
        for task in untaken:
            task.cancel()
        await self._scope.aclose()  # every set-up ended (one a sample gave up waiting for is cancelled too)
        for task in untaken:
            if not task.cancelled() and task.exception() is None:
                ws, _ = task.result()
                await ws.close()
