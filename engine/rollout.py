"""The rollout engine: GRPO groups of rollouts on forked workspaces, on one asyncio event loop.

Owns: ``RolloutEngine``, the async context manager a trainer embeds: ``await engine.run(requests)`` for every
result, ``async for r in engine.stream(requests)`` in completion order. Per engine, one root workspace per
application (the suite's heavy state is built once); per group, a fork of it (the base) runs the task's setup
once, in a TaskGroup of its own with its samples (``sample.py``); every sample forks the base (live copy-on-write
with the ``cow`` backend, a private restore with ``restore``). Admission (``admission.py``) bounds the rollouts
at once by a count and a memory budget; groups open at once are bounded by what the slots can serve, so bases do not
pile up; results go through a bounded queue (a consumer that reads slowly holds finished samples back instead of
letting them pile up). Tool calls go through one seam, ``execute_call``, where the prefix tree and speculation plug in.
A model server that is not set up for the policy (``ServerConfigError``: the policy's ``check()`` at start, or the
first decision) ends the run with that one error, the other rollouts cancelled, instead of failing every rollout.
Its tasks: a group's samples run in a TaskGroup, a run's groups in another; each ``stream``'s producer is a task of
the engine's stream scope (a ``TaskScope``), which closing the engine ends. ``async with`` enters one
``AsyncExitStack``: what ``__aenter__`` starts pushes its close (the runtime, the meter, the prefix cache, the
speculator, the streams, the pull), and ``__aexit__`` (or a failed ``__aenter__``) closes them in reverse order,
every one even when one before it failed.
Must never: leave a workspace behind: every path (failure, timeout, cancellation of ``run`` or of a ``stream``
consumer) closes what it made; ``async with`` closes the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs import Limits, WorkspaceRuntime, derive_seed
from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.runtime import await_points
from bunshin.envs.runtime.fork.registry import forks_live
from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace
from bunshin.policies.base import Policy, ServerConfigError

from .admission import Admission, AdmissionGate
from .errors import EngineError, EngineNotStarted, NeedsLiveFork, SetupTimeout, UnknownTask, first_exception
from .meter import MemoryMeter
from .outcomes import Phase, classify, describe
from .prefix.cache import PrefixCache
from .prefix.settings import PrefixSettings
from .prefix.walk import Walk
from .pull import Puller, PullError
from .records import RolloutRequest, RolloutResult, Trajectory, group_requests, in_request_order
from .sample import SampleRun, SampleSettings
from .set_up_pool import SetUpPool
from .speculation.branch import SampleSpeculation
from .speculation.settings import SpecSettings
from .speculation.speculator import Speculator

Finish = Callable[[Trajectory], Any]
log = logging.getLogger(__name__)
# ready browsers by default: every idle slot is a browser's memory (~200 MiB) held for the whole run, and on few
# cores a slot's launch takes the same CPU as the clone's own would (BENCHMARKS.md, "The web shop in Chromium":
# eight slots cost 0.04 of the peak ratio at 16 rollouts and hit 13 forks in 60); raise it where fork latency
# matters more than memory (speculation on many cores)
WARM_POOL = 2


def _producer_failed(exc: BaseException) -> None:  # raised to the stream's consumer, if it is still there
    log.debug("a rollout stream's producer ended with %r", exc)


class RolloutEngine:
    def __init__(self, suite: Suite, policy: Policy, *, backend: str = "cow", concurrency: int = 8,
                 memory_budget: int | None = None, decide_timeout_s: float = 300.0, call_timeout_s: float = 120.0,
                 setup_timeout_s: float | None = None, rollout_timeout_s: float = 1800.0, max_steps: int = 40,
                 limits: Limits | None = None, state_dir: str | Path | None = None, meter_interval_s: float = 0.25,
                 memory_detail_s: float | None = None, prefix: PrefixSettings | None = None,
                 speculation: SpecSettings | None = None, runtime: Any = None, warm_pool: int | None = None,
                 image: str | None = None, runtime_kind: str = "native"):
        """``runtime``: the workspaces' runtime, made by the caller (``bunshin.envs.memory_workspace.MemoryRuntime``
        runs an engine without root); its own settings then stand instead of ``backend``, ``limits`` and
        ``state_dir`` (default: a ``WorkspaceRuntime`` made from those). ``prefix``: serve tool calls from a prefix tree of workspace snapshots (``engine/prefix``; None: execute
        every call). ``speculation``: run predicted calls in forks while the policy reasons (``engine/speculation``;
        its model is kept in the prefix cache's directory unless ``speculation.model_dir`` says otherwise). ``call_timeout_s`` is each tool call's deadline (the runtime stops a workspace whose call overruns it);
        ``setup_timeout_s`` bounds a group's fork and task setup (default: ``call_timeout_s``; never less than the
        suite's ``setup_timeout_s``);
        ``memory_detail_s``: also read the run's memory in detail at this interval (``RunMemory``: PSS sum beside
        the cgroup charge, page tables, engine and nursery), for benchmarks; it costs a read of every process.
        ``warm_pool``: ready warm-pool slots per warm app (a Chromium workspace's clones take their browser from
        one, ``envs/runtime/warm_pool.py``; None: ``WARM_POOL`` or ``concurrency`` if less; 0: every clone starts
        its own), within ``memory_budget`` (None: the pool's own
        default). The slots are the run's memory: every figure of the run includes them. ``image``: the image every
        workspace stands on instead of the suite's (a directory, a tarball, or ``docker:NAME[:TAG]``, a local
        Docker image; ``WorkspaceRuntime``'s). ``runtime_kind="docker"``: every workspace a Docker container, forked
        by a fresh container from the committed files plus the app's state restored (``WorkspaceRuntime``'s
        ``runtime``); the backend is then ``docker``."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if runtime_kind == "docker":
            backend = "docker"  # a fresh container and a restore: as "live" as the suite's own forks are
        self.forks_live = suite.forks_live if backend == "docker" else forks_live(suite.forks_live, backend)
        self._exclusive = asyncio.Lock()  # held by the group running, when the suite's groups must not overlap
        if not self.forks_live and (prefix is not None or speculation is not None):
            raise NeedsLiveFork(suite.name, "the prefix cache" if prefix is not None else "speculation")
        self.suite, self.policy, self.backend = suite, policy, backend
        self.concurrency, self.memory_budget = concurrency, memory_budget
        self.settings = SampleSettings(decide_timeout_s=decide_timeout_s, call_timeout_s=call_timeout_s,
                                       rollout_timeout_s=rollout_timeout_s, max_steps=max_steps)
        self.setup_timeout_s = call_timeout_s if setup_timeout_s is None else setup_timeout_s
        self.setup_timeout_s = max(self.setup_timeout_s, suite.setup_timeout_s or 0.0)  # what the suite needs
        # Many hosts may start at once on few cores (64 private restores each read a dump and start an
        # interpreter): a start is given as long as a rollout may take to decide, not the runtime's default minute.
        kwargs: dict[str, Any] = {"backend": backend, "start_timeout_s": max(60.0, decide_timeout_s),
                                  "limits": limits or Limits(memory_bytes=4 << 30, pids=512,
                                                             command_timeout_s=call_timeout_s)}
        if state_dir is not None:
            kwargs["state_dir"] = Path(state_dir)
        if image is not None:
            kwargs["image"] = image
        if runtime_kind != "native":
            kwargs["runtime"] = runtime_kind
            kwargs.pop("backend")
        if warm_pool is not None and warm_pool < 0:
            raise ValueError(f"warm_pool is a count of slots, got {warm_pool}")
        kwargs.update(warm_pool=min(concurrency, WARM_POOL) if warm_pool is None else warm_pool,
                      warm_budget_bytes=memory_budget)
        self.runtime = runtime if runtime is not None else WorkspaceRuntime(**kwargs)
        self.meter_interval_s, self.memory_detail_s = meter_interval_s, memory_detail_s
        self.tasks: dict[str, SuiteTask] = {}
        self._roots: dict[bytes, Workspace] = {}
        self._roots_lock = asyncio.Lock()
        self._streams = TaskScope("rollout-streams", on_error=_producer_failed)  # each stream's producer
        self._exit: contextlib.AsyncExitStack | None = None  # what __aenter__ started, closed by __aexit__
        self.gate: AdmissionGate | None = None
        self.prefix = prefix
        self.prefix_cache: PrefixCache | None = None
        if speculation is not None and speculation.model_dir is None and prefix is not None and prefix.cache_dir:
            speculation = dataclasses.replace(speculation, model_dir=prefix.cache_dir)
        self.speculation = speculation
        self.speculator: Speculator | None = None
        self.policy_version = 0  # the trainer's: stamped on every decision and result (``set_policy_version``)
        self._puller: Puller | None = None

    # -- life cycle -------------------------------------------------------------------------------------------
    async def __aenter__(self) -> RolloutEngine:
        await self.runtime.start()
        stack = contextlib.AsyncExitStack()
        stack.push_async_callback(self.runtime.close)  # callbacks run last pushed, first: the runtime closes last
        try:
            await self.policy.check()  # a model server that is not there or not set up fails the run here
            self.tasks = {t.id: t for t in await asyncio.to_thread(self.suite.tasks)}
            self.runtime.prepare(self.suite.app())  # the warm pool fills while the first groups set up
            self.meter = MemoryMeter(self.runtime.memory_charge, self.meter_interval_s,
                                     detail=self.runtime.memory_detail if self.memory_detail_s else None,
                                     detail_interval_s=self.memory_detail_s or 1.0)
            self.meter.start()
            stack.push_async_callback(self.meter.stop)
            self.gate = AdmissionGate(Admission(self.concurrency, self.memory_budget, memory=self.meter.now,
                                                clock=time.monotonic))
            if self.prefix is not None:
                self.prefix_cache = PrefixCache(self.prefix, self.suite, self._make_base,
                                                call_timeout_s=self.settings.call_timeout_s,
                                                restore=self.runtime.restore_image, run_memory=self.meter.now)
                stack.push_async_callback(self._close_cache)
                await self.prefix_cache.open(list(self.tasks.values()))
            if self.speculation is not None:
                self.speculator = Speculator(self.speculation, self.suite, self.meter.now)
                stack.push_async_callback(self._close_speculator)
                history = self.prefix_cache.history() if self.prefix_cache is not None else ()
                await self.speculator.open(list(self.tasks.values()), history)
            stack.push_async_callback(self._streams.aclose)  # streams whose consumer left without closing them
            stack.push_async_callback(self._close_puller)
        except BaseException:
            await stack.aclose()
            raise
        self._exit = stack
        return self

    async def _close_puller(self) -> None:
        puller, self._puller = self._puller, None
        if puller is not None:
            await puller.close()

    async def _close_speculator(self) -> None:
        speculator, self.speculator = self.speculator, None
        if speculator is not None:
            await speculator.close()

    async def _close_cache(self) -> None:
        cache, self.prefix_cache = self.prefix_cache, None
        if cache is not None:
            await cache.close()

    async def __aexit__(self, *exc: object) -> None:
        stack, self._exit = self._exit, None
        if stack is not None:
            await stack.aclose()

    def requests(self, task_ids: Iterable[str] | None = None, *, limit: int | None = None, group_size: int = 1,
                 seed: int = 0) -> list[RolloutRequest]:
        """One request (a GRPO group) per task: ``task_ids`` in order, or the suite's first ``limit`` tasks."""
        return group_requests(self.suite.name, task_ids if task_ids is not None else self.tasks, limit=limit,
                              group_size=group_size, seed=seed)

    # -- the API ----------------------------------------------------------------------------------------------
    async def run(self, requests: Iterable[RolloutRequest]) -> list[RolloutResult]:
        """Every rollout of ``requests``; in request order, samples in order."""
        requests = list(requests)
        async with contextlib.aclosing(self.stream(requests)) as results:
            collected = [r async for r in results]
        return in_request_order(requests, collected)

    async def stream(self, requests: Iterable[RolloutRequest]) -> AsyncGenerator[RolloutResult, None]:
        """Results in completion order. Closing the iterator (``contextlib.aclosing``, or cancelling its consumer)
        stops and cleans up the rest at once; a consumer that just leaves the loop has them stopped when the
        engine closes."""
        self._gate()
        requests = list(requests)
        total = sum(len(r.sample_indices()) for r in requests)  # BadRequest before anything starts
        queue: asyncio.Queue[RolloutResult] = asyncio.Queue(maxsize=max(1, self.concurrency))
        producer = self._streams.start_soon(self._produce(requests, queue), name="rollout-stream")
        try:
            for _ in range(total):
                yield await self._next(queue, producer)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)

    # -- pull mode --------------------------------------------------------------------------------------------------
    def set_policy_version(self, version: int) -> None:
        """The trainer's policy is now ``version`` (it updated the weights the policy serves): decisions asked for
        from now on are stamped with it, and pull mode may run further ahead. Versions never go back."""
        if not isinstance(version, int) or isinstance(version, bool):
            raise TypeError(f"a policy version is an int, got {version!r}")
        if version < self.policy_version:
            raise ValueError(f"policy version {version} is older than the current {self.policy_version}")
        self.policy_version = version
        if self._puller is not None:
            self._puller.version_changed()

    def pull(self, source: Iterable[RolloutRequest], *, batch_size: int, max_staleness: int = 1,
             whole_groups: bool = True) -> None:
        """Start rolling out the groups of ``source`` (an iterable of requests, possibly endless) for a trainer
        that pulls with ``get_batch``: at most ``(versions since now + max_staleness + 1) * batch_size`` rollouts
        are ever started (``engine/pull.py`` says why that bounds staleness), whole groups only. One pull per
        engine; it stops when the engine closes."""
        self._gate()
        if self._puller is not None:
            raise PullError("this engine is already pulling; one pull per engine")
        open_groups: list[asyncio.Semaphore] = []  # sized by the first group, as ``_produce`` sizes it

        async def run_group(request: RolloutRequest, finish: Finish) -> None:
            if not open_groups:
                open_groups.append(asyncio.Semaphore(max(2, -(-self.concurrency // request.group_size) + 1)))
            await self._group(request, open_groups[0], finish)

        self._puller = Puller(source, batch_size=batch_size, max_staleness=max_staleness, whole_groups=whole_groups,
                              version=lambda: self.policy_version, run_group=run_group,
                              peak_bytes=lambda: self.meter.peak_bytes)
        self._puller.start()

    async def get_batch(self, n: int) -> list[RolloutResult]:
        """The next ``n`` finished rollouts of the pull, oldest first (lowest starting policy version, then
        finishing order), each stamped with ``policy_version`` and ``staleness``; whole groups unless the pull
        said otherwise. Fewer than ``n`` only once the source is used up (``[]`` when all were handed out)."""
        if self._puller is None:
            raise PullError("get_batch() before pull(source, batch_size=...)")
        return await self._puller.get_batch(n)

    def pull_statistics(self) -> dict[str, int] | None:
        """Pull mode's counters: rollouts started, running, ready, handed out, and the current capacity."""
        return self._puller.statistics() if self._puller is not None else None

    @staticmethod
    async def _next(queue: asyncio.Queue[RolloutResult], producer: asyncio.Future[None]) -> RolloutResult:
        """The next result; if the producer ended without giving one (a bug of ours), its exception."""
        while True:
            if not queue.empty():
                return queue.get_nowait()
            if producer.done():
                producer.result()  # raises what ended it
                raise EngineError("the rollout producer ended before every result was delivered")
            async with asyncio.TaskGroup() as waiting:  # the get ends with this block: taken, or cancelled
                getting = waiting.create_task(queue.get())
                either: list[asyncio.Future[Any]] = [getting, producer]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
            if not getting.cancelled():
                return getting.result()

    async def _produce(self, requests: list[RolloutRequest], queue: asyncio.Queue[RolloutResult]) -> None:
        # Groups open at once (each holds a base workspace) are as many as the rollout slots can serve, plus one
        # being set up, so bases do not pile up in memory waiting for slots.
        largest = max((len(r.sample_indices()) for r in requests), default=1)
        open_groups = asyncio.Semaphore(max(2, -(-self.concurrency // largest) + 1))

        started = self.policy_version

        async def finish(t: Trajectory) -> None:
            await queue.put(RolloutResult(trajectory=t, peak_memory_bytes=self.meter.peak_bytes,
                                          policy_version=started))

        try:
            async with asyncio.TaskGroup() as groups:
                for request in requests:
                    groups.create_task(self._group(request, open_groups, finish))
        except BaseExceptionGroup as group:  # a model server not set up for the policy ends the run, once
            config = first_exception(group, ServerConfigError)
            if config is None:
                raise
            raise config from None

    # -- a group ----------------------------------------------------------------------------------------------
    async def _group(self, request: RolloutRequest, open_groups: asyncio.Semaphore, finish: Finish) -> None:
        group_id = request.group_id or request.task.task_id
        task = self.tasks.get(request.task.task_id)
        trajectories = [Trajectory(task_id=request.task.task_id, suite=self.suite.name, group_id=group_id,
                                   sample=i, seed=derive_seed(request.seed, request.task.task_id, i),
                                   run_seed=request.seed, instruction=task.instruction if task else "",
                                   backend=self.backend)
                        for i in request.sample_indices()]
        # A group holds an open-group place while it holds a base (bases wait for their turn, not in memory): until
        # every sample has forked it (then the base is closed), or, with the prefix cache, until its root is there.
        await open_groups.acquire()
        held, alone = True, False

        def let_go() -> None:
            nonlocal held
            if held:
                held = False
                open_groups.release()

        try:
            if self.suite.exclusive_groups:  # one group at a time: its suite's state is outside the workspaces
                await self._exclusive.acquire()
                alone = True
            if task is not None:
                try:
                    await self.suite.before_group(task)  # a deployment's reset, say
                except Exception as exc:
                    await self._fail_group(trajectories, exc, finish)
                    return
            if self.prefix_cache is not None and task is not None and \
                    await self._cached_group(request, task, trajectories, finish, let_go):
                return
            base, first = await self._setup(request, task, trajectories, finish)
            if base is None:
                return
            assert task is not None and first is not None  # a base: _setup had the task and set it up
            try:
                await self._samples(task, base, first, trajectories, finish, let_go)
            finally:
                await base.close()
        finally:
            let_go()
            if alone:
                self._exclusive.release()

    async def _setup(self, request: RolloutRequest, task: SuiteTask | None, trajectories: list[Trajectory],
                     finish: Finish) -> tuple[Workspace | SetUpPool | None, Observation | None]:
        """The group's base (a fork of the application's root) with the task set up, and its first observation;
        (None, None) once every trajectory of the group has been finished with the failure. A suite that does not
        fork live gets a ``SetUpPool``: one workspace per sample, each set up ahead of the sample that takes it."""
        try:
            if task is None:
                raise UnknownTask(request.task.task_id, self.suite.name)
            seed = derive_seed(request.seed, task.id, "base")
            if not self.forks_live:
                pool = SetUpPool(self.runtime, self.suite, task, size=request.group_size, seed=seed,
                                 setup_timeout_s=self.setup_timeout_s)
                try:
                    async with self._gate().slot():
                        await await_points.reached("group.setup")
                        return pool, await pool.start()
                except BaseException:
                    await pool.close()
                    raise
            async with self._gate().slot():
                await await_points.reached("group.setup")
                base, first = await self._make_base(task, seed)
            return base, first
        except BaseException as exc:
            if not isinstance(exc, Exception):
                raise
            await self._fail_group(trajectories, exc, finish)
            return None, None

    @staticmethod
    async def _fail_group(trajectories: list[Trajectory], exc: Exception, finish: Finish) -> None:
        status, error = classify(Phase.SETUP, exc), describe(exc)
        for t in trajectories:
            t.status, t.error = status, error
            await finish(t)

    async def _make_base(self, task: SuiteTask, seed: int) -> tuple[Workspace, Observation]:
        """A fork of the task's application root with the task set up, and its first observation, within the
        setup deadline; nothing is left behind on failure or cancellation."""
        root = await self._root(task)
        base: Workspace | None = None
        try:
            async with asyncio.timeout(self.setup_timeout_s) as scope:
                base = await root.fork(seed=seed)
                first = await self.suite.start(base, task)
        except TimeoutError as exc:
            if base is not None:
                await base.close()
            if not scope.expired():
                raise
            raise SetupTimeout(self.setup_timeout_s, "the group's fork and task setup") from exc
        except BaseException:
            if base is not None:
                await base.close()  # cancelled or failed while its task was being set up
            raise
        return base, first

    async def _cached_group(self, request: RolloutRequest, task: SuiteTask, trajectories: list[Trajectory],
                            finish: Finish, set_up: Callable[[], None]) -> bool:
        """The group on the prefix cache: its samples walk the tree from the task's root (set up only when no
        entry holds it). False when the namespace can no longer be cached (the group then runs as without it)."""
        cache = self.prefix_cache
        assert cache is not None
        try:
            async with self._gate().slot():
                await await_points.reached("group.setup")
                got = await cache.root(task, derive_seed(request.seed, task.id, "base"))
        except Exception as exc:
            await self._fail_group(trajectories, exc, finish)
            return True
        if got is None:
            return False
        root, first = got
        with cache.tree.pin(root):
            set_up()  # the root is the cache's: the group holds no base
            async def one(t: Trajectory) -> None:
                def walk() -> Walk:
                    return Walk(cache, self.suite, task, root, seed=t.seed, issuer=(t.run_seed, t.group_id, t.sample),
                                execute=self.execute_call, call_timeout_s=self.settings.call_timeout_s)

                await SampleRun(self.suite, self.policy, self._gate(), self.settings, self.execute_call, task, None,
                                first, t, walk=walk, speculation=self._speculation(t, task),
                                policy_version=self._version).run(lambda: None)
                await finish(t)

            async with asyncio.TaskGroup() as samples:
                for t in trajectories:
                    samples.create_task(one(t))
        return True

    async def _samples(self, task: SuiteTask, base: Workspace | SetUpPool, first: Observation,
                       trajectories: list[Trajectory],
                       finish: Finish, closed: Callable[[], None]) -> None:
        """Every sample of the group, in a TaskGroup; the base is closed as soon as every sample has forked (then
        ``closed()``)."""
        gate = self._gate()
        waiting = len(trajectories)
        all_forked = asyncio.Event()

        def one_forked() -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0:
                all_forked.set()

        async def one(t: Trajectory) -> None:
            await SampleRun(self.suite, self.policy, gate, self.settings, self.execute_call, task, base, first,
                            t, speculation=self._speculation(t, task), policy_version=self._version).run(one_forked)
            await finish(t)

        async def close_base_when_forked() -> None:
            await all_forked.wait()
            await base.close()  # every sample has its own workspace now
            closed()

        async with asyncio.TaskGroup() as samples:
            samples.create_task(close_base_when_forked())
            for t in trajectories:
                samples.create_task(one(t))

    async def _root(self, task: SuiteTask) -> Workspace:
        """The initialised application a task runs on, made once per engine and kept: every group's base is a
        fork of it (the suite's heavy state, a catalog or a desktop session, is built once, not per group)."""
        spec = self.suite.app(task)
        key = msgspec.json.encode(spec)
        async with self._roots_lock:
            if key not in self._roots:
                self._roots[key] = await self.runtime.create(spec, seed=derive_seed("root", key))
            return self._roots[key]

    def _version(self) -> int:
        return self.policy_version

    def _gate(self) -> AdmissionGate:
        if self.gate is None:
            raise EngineNotStarted("use `async with RolloutEngine(...) as engine` before running rollouts")
        return self.gate

    @property
    def roots(self) -> list[Workspace]:
        """The root workspaces made so far (one per application): kept open until the engine closes."""
        return list(self._roots.values())

    def _speculation(self, t: Trajectory, task: SuiteTask) -> SampleSpeculation | None:
        if self.speculator is None:
            return None
        return self.speculator.sample(self.suite, sample=(t.run_seed, t.group_id, t.sample), task=task, seed=t.seed,
                                      execute=self.execute_call, call_timeout_s=self.settings.call_timeout_s)

    def speculation_statistics(self) -> dict[str, Any] | None:
        """Speculation's figures since the engine started (None without speculation): top-1 and top-k of the
        selector, branches started, adopted and wasted, their tool-seconds and memory (``speculation.settings``'
        ``STATISTICS`` says what each is)."""
        return self.speculator.statistics() if self.speculator is not None else None

    def prefix_statistics(self) -> dict[str, Any] | None:
        """The prefix cache's counters since the engine started (None without the cache): hits, misses, hit rate,
        tool-seconds skipped and replayed, nodes hot/cold/absent, bytes hot/cold, bytes written, writer backlog."""
        return self.prefix_cache.statistics() if self.prefix_cache is not None else None

    async def execute_call(self, ws: Workspace, call: ToolCall, timeout_s: float) -> Observation:
        """The one seam every tool call goes through (the prefix tree and speculation plug in here)."""
        return await ws.execute(call, timeout_s=timeout_s)

