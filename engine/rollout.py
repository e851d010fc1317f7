"""The rollout engine: GRPO groups of rollouts on forked workspaces, on one asyncio event loop.

Owns: ``RolloutEngine`` (an async context manager a trainer embeds: ``await engine.run(requests)`` for every
result, ``async for r in engine.stream(requests)`` in completion order), admission (a concurrency count and a
memory budget: a rollout waits rather than pushing the host into swap or OOM), per-call and per-rollout
timeouts, failure containment (each failure ends only its own rollout, with a typed status in its trajectory),
and the run's memory timeline (peak bytes, GiB*s).

Per engine, one root workspace per application (the suite's heavy state is built once); per group, a fork of it
(the base) runs the task's setup once; every sample forks the base (live copy-on-write with the
``cow`` backend, a private restore with ``restore``), then loops observe -> ``await policy.decide`` ->
execute -> ... -> the suite's final action -> evaluate. Tool execution goes through one seam, ``execute_call``,
where the prefix tree and speculation (later issues) plug in.
Must never: leave a workspace behind: every path (failure, timeout, cancellation of ``run`` or of a ``stream``
consumer) closes what it made; ``async with`` closes the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs import Limits, WorkspaceRuntime, derive_seed
from bunshin.envs.errors import WorkspaceError
from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.suites.base import ActionError, Suite, SuiteTask, observation_text
from bunshin.envs.workspace import Workspace
from bunshin.policies.base import Policy, PolicyContext

from .records import RolloutRequest, RolloutResult, Status, Step, StepObservation, TaskSpec, Trajectory

MiB = 1 << 20


class MemoryMeter:
    """Samples the run's memory (its cgroup's charge: every workspace, shared pages counted once) on a timer."""

    def __init__(self, runtime: WorkspaceRuntime, interval_s: float):
        self.runtime, self.interval_s = runtime, interval_s
        self.timeline: list[tuple[float, int]] = []
        self.peak_bytes = 0
        self.gib_s = 0.0
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def now(self) -> int:
        return self.runtime.cgroup.memory_charge()

    def sample(self) -> int:
        t, value = time.monotonic() - self._started, self.now()
        if self.timeline:
            t0, v0 = self.timeline[-1]
            self.gib_s += (t - t0) * (v0 + value) / 2 / (1 << 30)
        self.timeline.append((t, value))
        self.peak_bytes = max(self.peak_bytes, value)
        return value

    async def _run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._started = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self.sample()


class RolloutEngine:
    def __init__(self, suite: Suite, policy: Policy, *, backend: str = "cow", concurrency: int = 8,
                 memory_budget: int | None = None, decide_timeout_s: float = 300.0, call_timeout_s: float = 120.0,
                 rollout_timeout_s: float = 1800.0, max_steps: int = 40, limits: Limits | None = None,
                 state_dir: str | Path | None = None, meter_interval_s: float = 0.25):
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.suite, self.policy, self.backend = suite, policy, backend
        self.concurrency, self.memory_budget = concurrency, memory_budget
        self.decide_timeout_s, self.call_timeout_s = decide_timeout_s, call_timeout_s
        self.rollout_timeout_s, self.max_steps = rollout_timeout_s, max_steps
        # Many hosts may start at once on few cores (a private restore recomputes its application's state): a
        # start is given as long as a rollout may take to decide, not the runtime's default minute.
        kwargs: dict[str, Any] = {"backend": backend, "start_timeout_s": max(60.0, decide_timeout_s),
                                  "limits": limits or Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=120)}
        if state_dir is not None:
            kwargs["state_dir"] = Path(state_dir)
        self.runtime = WorkspaceRuntime(**kwargs)
        self.meter_interval_s = meter_interval_s
        self.tasks: dict[str, SuiteTask] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._active = 0
        self._estimate = 64 * MiB  # memory one more rollout may take: the largest seen so far
        self._admission = asyncio.Condition()
        self._roots: dict[bytes, Workspace] = {}
        self._roots_lock = asyncio.Lock()
        self._running: set[asyncio.Future[None]] = set()

    # -- life cycle -------------------------------------------------------------------------------------------
    async def __aenter__(self) -> RolloutEngine:
        await self.runtime.start()
        try:
            self.tasks = {t.id: t for t in await asyncio.to_thread(self.suite.tasks)}
            self.meter = MemoryMeter(self.runtime, self.meter_interval_s)
            self.meter.start()
        except BaseException:
            await self.runtime.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for g in self._running:  # streams whose consumer left without closing them
            g.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        try:
            if hasattr(self, "meter"):
                await self.meter.stop()
        finally:
            await self.runtime.close()

    def requests(self, task_ids: Iterable[str] | None = None, *, limit: int | None = None, group_size: int = 1,
                 seed: int = 0) -> list[RolloutRequest]:
        """One request (a GRPO group) per task: ``task_ids`` in order, or the suite's first ``limit`` tasks."""
        ids = list(task_ids) if task_ids is not None else list(self.tasks)
        return [RolloutRequest(task=TaskSpec(suite=self.suite.name, task_id=i), group_size=group_size, seed=seed,
                               group_id=f"{seed}:{i}") for i in ids[:limit]]

    # -- the API ----------------------------------------------------------------------------------------------
    async def run(self, requests: Iterable[RolloutRequest]) -> list[RolloutResult]:
        """Every rollout of ``requests``; in request order, samples in order."""
        requests = list(requests)
        order = {(r.group_id or r.task.task_id, s): (n, s) for n, r in enumerate(requests) for s in range(r.group_size)}
        results = [r async for r in self.stream(requests)]
        return sorted(results, key=lambda r: order.get((r.trajectory.group_id, r.trajectory.sample), (0, 0)))

    async def stream(self, requests: Iterable[RolloutRequest]) -> AsyncIterator[RolloutResult]:
        """Results in completion order. Closing the iterator (``contextlib.aclosing``, or cancelling its consumer)
        stops and cleans up the rest at once; a consumer that just leaves the loop has them stopped when the
        engine closes."""
        queue: asyncio.Queue[RolloutResult] = asyncio.Queue()
        requests = list(requests)
        total = sum(r.group_size for r in requests)
        # Groups open at once (each holds a base workspace) are as many as the rollout slots can serve, plus one
        # being set up, so bases do not pile up in memory waiting for slots.
        largest = max((r.group_size for r in requests), default=1)
        open_groups = asyncio.Semaphore(max(2, -(-self.concurrency // largest) + 1))
        groups = [asyncio.ensure_future(self._group(r, queue, open_groups)) for r in requests]
        self._running.update(groups)
        try:
            for _ in range(total):
                yield await queue.get()
        finally:
            for g in groups:
                g.cancel()
            await asyncio.gather(*groups, return_exceptions=True)
            self._running.difference_update(groups)

    # -- a group ----------------------------------------------------------------------------------------------
    async def _group(self, request: RolloutRequest, queue: asyncio.Queue[RolloutResult],
                     open_groups: asyncio.Semaphore) -> None:
        group_id = request.group_id or request.task.task_id
        task = self.tasks.get(request.task.task_id)
        trajectories = [Trajectory(task_id=request.task.task_id, suite=self.suite.name, group_id=group_id,
                                   sample=i, seed=derive_seed(request.seed, request.task.task_id, i),
                                   run_seed=request.seed,
                                   instruction=task.instruction if task else "", backend=self.backend)
                        for i in range(request.group_size)]

        def finish(t: Trajectory) -> None:
            queue.put_nowait(RolloutResult(trajectory=t, peak_memory_bytes=self.meter.peak_bytes))

        if task is None:
            for t in trajectories:
                t.status, t.error = Status.SETUP_FAILED, f"unknown task {request.task.task_id!r}"
                finish(t)
            return
        async with open_groups:  # bases wait for their turn, not in memory
            await self._group_body(request, task, trajectories, finish)

    async def _group_body(self, request: RolloutRequest, task: SuiteTask, trajectories: list[Trajectory],
                          finish: Any) -> None:
        base: Workspace | None = None
        try:
            root = await self._root(task)
            async with self._admit():
                base = await root.fork(seed=derive_seed(request.seed, task.id, "base"))
                first = await asyncio.wait_for(self.suite.start(base, task), self.call_timeout_s)
        except BaseException as exc:
            if base is not None:
                await base.close()  # cancelled or failed while its task was being set up
            if not isinstance(exc, Exception):
                raise
            for t in trajectories:
                t.status, t.error = Status.SETUP_FAILED, f"{type(exc).__name__}: {exc}"
                finish(t)
            return
        forked = 0
        all_forked = asyncio.Event()

        def one_forked() -> None:
            nonlocal forked
            forked += 1
            if forked == len(trajectories):
                all_forked.set()

        async def base_closer() -> None:
            await all_forked.wait()
            await base.close()  # every sample has its own workspace now

        closer = asyncio.ensure_future(base_closer())
        samples: list[asyncio.Future[None]] = []
        try:
            samples = [asyncio.ensure_future(self._sample(task, base, first, t, one_forked, finish))
                       for t in trajectories]
            await asyncio.gather(*samples)
        finally:
            for s in samples:
                s.cancel()
            await asyncio.gather(*samples, return_exceptions=True)
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer
            await base.close()

    async def _root(self, task: SuiteTask) -> Workspace:
        """The initialised application a task runs on, made once per engine and kept: every group's base is a
        fork of it (the suite's heavy state, a catalog or a desktop session, is built once, not per group)."""
        spec = self.suite.app(task)
        key = msgspec.json.encode(spec)
        async with self._roots_lock:
            if key not in self._roots:
                self._roots[key] = await self.runtime.create(spec, seed=derive_seed("root", key))
            return self._roots[key]

    @contextlib.asynccontextmanager
    async def _admit(self) -> AsyncIterator[float]:
        """A slot: at most ``concurrency`` at once, and within the memory budget (one always runs)."""
        started = time.monotonic()
        async with self._slots:
            async with self._admission:
                while (self.memory_budget is not None and self._active > 0
                       and self.meter.now() + self._estimate > self.memory_budget):
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._admission.wait(), 0.5)  # memory also falls on its own
                self._active += 1
            try:
                yield time.monotonic() - started
            finally:
                async with self._admission:
                    self._active -= 1
                    self._admission.notify_all()

    # -- a sample ---------------------------------------------------------------------------------------------
    async def _sample(self, task: SuiteTask, base: Workspace, first: Observation, t: Trajectory,
                      forked: Any, finish: Any) -> None:
        started = time.monotonic()
        ws: Workspace | None = None
        told_forked = False
        try:
            async with self._admit() as waited:
                t.timings["admission_wait_s"] = round(waited, 4)
                try:
                    async with asyncio.timeout(self.rollout_timeout_s):
                        fork_started = time.monotonic()
                        try:
                            ws = await base.fork(seed=t.seed)
                        finally:
                            forked()
                            told_forked = True
                        t.timings["fork_s"] = round(time.monotonic() - fork_started, 4)
                        t.lineage = [base.id, ws.id]
                        before = ws.cgroup.memory_charge()
                        await self._loop(task, ws, first, t)
                        self._estimate = max(self._estimate, ws.cgroup.memory_charge() - before, 16 * MiB)
                except TimeoutError:
                    t.status, t.error = Status.ROLLOUT_TIMEOUT, f"the rollout took over {self.rollout_timeout_s}s"
        except WorkspaceError as exc:
            t.status, t.error = Status.WORKSPACE_FAILED, str(exc)
        except Exception as exc:  # one rollout's failure is that rollout's
            t.status, t.error = Status.WORKSPACE_FAILED, f"{type(exc).__name__}: {exc}"
        finally:
            if not told_forked:
                forked()
            if ws is not None:
                await ws.close()
            t.timings["wall_s"] = round(time.monotonic() - started, 4)
            t.timings["reasoning_s"] = round(sum(s.reasoning_s for s in t.steps), 4)
            t.timings["tool_s"] = round(sum(s.tool_s for s in t.steps), 4)
        finish(t)

    async def _loop(self, task: SuiteTask, ws: Workspace, first: Observation, t: Trajectory) -> None:
        t.first_observation = StepObservation.of(first)
        ctx = PolicyContext(suite=self.suite.name, task_id=task.id, group_id=t.group_id, sample=t.sample,
                            seed=t.seed, instruction=task.instruction, reference=task.reference,
                            observations=[observation_text(first)])
        final: ToolCall | None = None
        for step in range(self.max_steps + 1):
            ctx.step = step
            try:
                async with asyncio.timeout(self.decide_timeout_s):
                    decision = await self.policy.decide(ctx)
            except TimeoutError:
                t.status, t.error = Status.POLICY_TIMEOUT, f"no decision within {self.decide_timeout_s}s"
                return
            except Exception as exc:
                t.status, t.error = Status.POLICY_ERROR, f"{type(exc).__name__}: {exc}"
                return
            if t.prompt_token_ids is None and decision.prompt_token_ids is not None:
                t.prompt_token_ids = decision.prompt_token_ids
            text = decision.action if isinstance(decision.action, str) else None
            try:
                call = self.suite.parse_action(text) if text is not None else decision.action
            except ActionError as exc:
                t.status, t.error = Status.MALFORMED_ACTION, str(exc)
                return
            assert isinstance(call, ToolCall)
            if self.suite.is_final(call):
                final = call
                t.final, t.final_text = call, text
                t.final_token_ids, t.final_logprobs = decision.token_ids, decision.logprobs
                break
            if step == self.max_steps:
                t.status, t.error = Status.MAX_STEPS, f"no final action within {self.max_steps} steps"
                final = self.suite.null_action()
                break
            try:
                call = await self.suite.concrete(ws, call)
            except WorkspaceError:
                raise
            except Exception as exc:  # names an element the page does not have
                t.status, t.error = Status.MALFORMED_ACTION, f"{type(exc).__name__}: {exc}"
                return
            call_started = time.monotonic()
            try:
                async with asyncio.timeout(self.call_timeout_s):
                    obs = await self.execute_call(ws, call)
            except TimeoutError:
                t.status, t.error = Status.CALL_TIMEOUT, f"{call.name} took over {self.call_timeout_s}s"
                return
            t.steps.append(Step(index=step, call=call, observation=StepObservation.of(obs),
                                reasoning_s=round(decision.reasoning_s, 4),
                                tool_s=round(obs.tool_seconds or time.monotonic() - call_started, 4),
                                action_text=text, token_ids=decision.token_ids, logprobs=decision.logprobs))
            ctx.observations.append(observation_text(obs))
            ctx.actions.append(text if text is not None else call.name)
        evaluate_started = time.monotonic()
        try:
            t.reward = float(await self.suite.evaluate(ws, task, final))
        except WorkspaceError:
            raise
        except Exception as exc:
            t.status, t.error = Status.EVALUATOR_ERROR, f"{type(exc).__name__}: {exc}"
            t.reward = 0.0
        t.timings["evaluate_s"] = round(time.monotonic() - evaluate_started, 4)

    async def execute_call(self, ws: Workspace, call: ToolCall) -> Observation:
        """The one seam every tool call goes through (the prefix tree and speculation plug in here)."""
        return await ws.execute(call)
