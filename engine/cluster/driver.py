"""The cluster driver: ``ClusterEngine``, the single-host engine's API over one node agent per Ray node.

Owns: connecting to Ray (``ray.init(address=...)`` unless already connected; it shuts down only what it started),
one ``NodeAgent`` per node (pinned by node affinity, never restarted), the node views it places by (each agent's
status polled every ``status_interval_s``), the batch's ``Ledger`` and the scheduling loop: waiting work is placed
(``placement.place``), each piece runs as one streaming call on its node's agent, every result is passed on once
(with ``Trajectory.attempts``); a node that dies puts its undelivered samples back to wait, in front, and they run
again elsewhere with the same request (so the same seeds); with no node left they end as ``Status.NODE_LOST``.
``requests``, ``stream``, ``run`` and ``async with`` are ``RolloutEngine``'s, and yield the same records;
``meter`` is a ``MemoryMeter`` of the live nodes' charges summed, ``node_peaks`` each node's peak. Its tasks: the
status poller in a ``TaskScope`` of its own, each stream's producer in the stream scope (both ended by closing the
engine, the streams first), and a batch's pieces in the producer's ``TaskGroup``.
Must never: lose or duplicate a rollout (each ends exactly once: delivered, retried-and-delivered, or a typed
failure), hold more than a bounded queue of finished results, or leave an agent running when it closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import msgspec

from bunshin.envs import derive_seed
from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.policies.base import Policy

from ..errors import EngineError, EngineNotStarted
from ..meter import MemoryMeter
from ..records import RolloutRequest, RolloutResult, Status, Trajectory, group_requests, in_request_order
from ..rollout import RolloutEngine
from .agent import AgentInfo, NodeAgent, NodeStatus
from .placement import ROOT_ESTIMATE, Ledger, NodeView, Work, app_key, place, works


class ClusterError(EngineError):
    """The root of ``bunshin.engine.cluster``'s errors."""


class NoNodes(ClusterError):
    """No Ray node to run an agent on (none alive, or none of the ones asked for)."""


class AgentStartFailed(ClusterError):
    """An agent could not start its engine on its node (``node_id``); the cause is chained."""

    def __init__(self, node_id: str, detail: str):
        super().__init__(f"the agent on node {node_id} did not start: {detail}")
        self.node_id = node_id


_result = msgspec.msgpack.Decoder(RolloutResult)
_info = msgspec.msgpack.Decoder(AgentInfo)
_status = msgspec.msgpack.Decoder(NodeStatus)
_encoder = msgspec.msgpack.Encoder()
log = logging.getLogger(__name__)


def _producer_failed(exc: BaseException) -> None:  # raised to the stream's consumer, if it is still there
    log.debug("a cluster stream's producer ended with %r", exc)


def _node_lost_errors() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rx

    return (rx.RayActorError, rx.NodeDiedError, rx.ActorUnavailableError)


def combine_statistics(reports: list[dict[str, Any] | None], ratios: dict[str, tuple[str, str]],
                       means: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """Several nodes' statistics as one: numbers summed, a ratio ``key: (part, whole)`` recomputed as
    ``part / whole`` (``part / (part + other)`` for the hit rate: ``(hits, misses)``), ``means`` averaged over the
    nodes that have one. None when no node reported any (the feature is off)."""
    present = [r for r in reports if r is not None]
    if not present:
        return None
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in present for k in r):
        values = [r[key] for r in present if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
        if key in means:
            out[key] = round(sum(values) / len(values), 4) if values else None
        else:
            out[key] = sum(values) if values else present[0].get(key)
    for key, (part, whole) in ratios.items():
        denominator = out.get(whole, 0) + (out.get(part, 0) if whole == "misses" else 0)
        out[key] = round(out.get(part, 0) / denominator, 4) if denominator else 0.0
    return out


class ClusterEngine:
    def __init__(self, suite: Suite, policy: Policy, *, address: str | None = None, nodes: list[str] | None = None,
                 concurrency: int = 8, memory_budget: int | None = None, backend: str = "cow",
                 root_estimate: int = ROOT_ESTIMATE, status_interval_s: float = 0.25, start_timeout_s: float = 300.0,
                 call_timeout_s: float = 60.0, **engine_kwargs: Any):
        """``address``: as ``ray.init(address=...)`` takes it (None: the cluster this process is connected to, or
        ``ray.init()``'s default). ``nodes``: the Ray node ids to run agents on (default: every alive node).
        ``concurrency`` and ``memory_budget`` are per node (each agent's engine's); ``engine_kwargs`` go to every
        agent's ``RolloutEngine`` (``state_dir``, ``max_steps``, timeouts...). ``call_timeout_s`` bounds a status
        or close call to an agent."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.suite, self.policy, self.backend = suite, policy, backend
        self.address, self.node_ids = address, nodes
        self.concurrency, self.memory_budget = concurrency, memory_budget
        self.root_estimate, self.status_interval_s = root_estimate, status_interval_s
        self.start_timeout_s, self.call_timeout_s = start_timeout_s, call_timeout_s
        self.engine_kwargs = {"backend": backend, "concurrency": concurrency, "memory_budget": memory_budget,
                              **engine_kwargs}
        self.tasks: dict[str, SuiteTask] = {}
        self.agents: dict[str, Any] = {}  # node id -> actor handle
        self.infos: dict[str, AgentInfo] = {}
        self.statuses: dict[str, NodeStatus] = {}
        self.dead: set[str] = set()
        self.node_peaks: dict[str, int] = {}
        self._sent_since_report: dict[str, int] = {}
        self._roots: dict[str, set[str]] = {}
        self._prefixes: dict[str, set[str]] = {}  # node -> task ids whose prefix tree it holds (cache on only)
        self._prefix_cache = engine_kwargs.get("prefix") is not None
        self._app_of: dict[str, str] = {}
        self._owns_ray = False
        self._started = False
        self._poller = TaskScope("cluster-status-poller")
        self._streams = TaskScope("cluster-streams", on_error=_producer_failed)  # each stream's producer
        self._wake: asyncio.Event | None = None
        self._on_loss: set[Any] = set()  # each stream's hook: a node died, put its samples back
        self._ledgers: set[Ledger] = set()  # the streams running now (a node's load is all of theirs)

    # -- life cycle ---------------------------------------------------------------------------------------------
    async def __aenter__(self) -> ClusterEngine:
        import ray

        if not ray.is_initialized():
            await asyncio.to_thread(ray.init, address=self.address, log_to_driver=False)
            self._owns_ray = True
        try:
            await self._start_agents()
            self.tasks = {t.id: t for t in await asyncio.to_thread(self.suite.tasks)}
            self._app_of = {i: app_key(msgspec.json.encode(self.suite.app(t))) for i, t in self.tasks.items()}
            self.meter = MemoryMeter(self._charge, self.status_interval_s)
            self.meter.start()
            self._wake = asyncio.Event()
            self._poller.start_soon(self._poll(), name="cluster-status-poller")
            self._started = True
        except BaseException:
            await self._close()
            raise
        return self

    async def _start_agents(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n["NodeID"] for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
        chosen = alive if self.node_ids is None else [n for n in self.node_ids if n in alive]
        if self.node_ids is not None and len(chosen) != len(self.node_ids):
            missing = sorted(set(self.node_ids) - set(alive))
            raise NoNodes(f"nodes not alive in the cluster: {missing}")
        if not chosen:
            raise NoNodes("the Ray cluster has no alive node")
        actor = ray.remote(NodeAgent)
        for node_id in chosen:
            self.agents[node_id] = actor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), num_cpus=0,
                max_restarts=0, max_task_retries=0, max_concurrency=1000,
            ).remote(node_id, self.suite, self.policy, self.engine_kwargs)
            self._sent_since_report[node_id] = 0
            self._roots[node_id] = set()
            self._prefixes[node_id] = set()
        starting = {node_id: h.start.remote() for node_id, h in self.agents.items()}
        for node_id, ref in starting.items():
            try:
                async with asyncio.timeout(self.start_timeout_s):
                    self.infos[node_id] = _info.decode(await ref)
            except Exception as exc:
                raise AgentStartFailed(node_id, f"{type(exc).__name__}: {exc}") from exc

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        import ray

        self._started = False
        await self._streams.aclose()
        await self._poller.aclose()
        try:
            closing = [(n, h.close.remote()) for n, h in self.agents.items() if n not in self.dead]
            for _, ref in closing:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(self.start_timeout_s):
                        await ref
            for handle in self.agents.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            if hasattr(self, "meter"):
                await self.meter.stop()
        finally:
            self.agents.clear()
            if self._owns_ray:
                self._owns_ray = False
                await asyncio.to_thread(ray.shutdown)

    # -- nodes --------------------------------------------------------------------------------------------------
    def _charge(self) -> int:
        return sum(s.charge for n, s in self.statuses.items() if n not in self.dead)

    async def _poll(self) -> None:
        while True:
            await asyncio.gather(*(self._poll_one(n) for n in list(self.agents) if n not in self.dead))
            await asyncio.sleep(self.status_interval_s)

    async def _poll_one(self, node_id: str) -> None:
        sent = self._sent_since_report[node_id]
        try:
            async with asyncio.timeout(self.call_timeout_s):
                status = _status.decode(await self.agents[node_id].status.remote())
        except _node_lost_errors():
            self._lose(node_id)
            return
        except TimeoutError:
            return  # slow, not dead: the views keep the last report
        except Exception:  # the agent's status raised (a bug of ours): keep the last report, keep polling
            return
        self.statuses[node_id] = status
        self.node_peaks[node_id] = max(self.node_peaks.get(node_id, 0), status.peak)
        self._sent_since_report[node_id] -= sent
        self._roots[node_id] |= set(status.roots)
        self._prefixes[node_id] |= set(status.prefixes)
        if self._wake is not None:
            self._wake.set()

    def _lose(self, node_id: str) -> None:
        if node_id not in self.dead:
            self.dead.add(node_id)
            for hook in list(self._on_loss):
                hook(node_id)
            if self._wake is not None:
                self._wake.set()

    def _views(self) -> list[NodeView]:
        views = []
        for node_id, info in self.infos.items():
            status = self.statuses.get(node_id)
            views.append(NodeView(node_id=node_id, slots=info.slots, alive=node_id not in self.dead,
                                  charge=status.charge if status else 0, budget=info.budget,
                                  estimate=status.estimate if status and status.estimate else 64 << 20,
                                  in_flight=sum(ledger.in_flight(node_id) for ledger in self._ledgers),
                                  sent_since_report=max(0, self._sent_since_report[node_id]),
                                  roots=frozenset(self._roots[node_id]),
                                  prefixes=frozenset(self._prefixes[node_id])))
        return views

    async def refresh(self) -> None:
        """Ask every live agent for its status now (what ``prefix_statistics`` and ``speculation_statistics`` sum):
        at the end of a batch, so that the figures count its last rollouts."""
        await asyncio.gather(*(self._poll_one(n) for n in list(self.agents) if n not in self.dead))

    def prefix_statistics(self) -> dict[str, Any] | None:
        """The nodes' prefix caches' counters summed, as of their last reports (``refresh``); None without the
        cache. ``hit_rate`` is the hits over all the nodes' lookups."""
        return combine_statistics([s.prefix for s in self.statuses.values()], {"hit_rate": ("hits", "misses")})

    def speculation_statistics(self) -> dict[str, Any] | None:
        """Speculation's figures of every node summed, as of their last reports (``refresh``); None without it.
        The top-1 and top-k rates are over all the nodes' decisions; a node's peak (``branch_bytes_peak``,
        ``run_bytes_high``) adds to the others' (the cluster's at most); ``tail_rank_rho`` and ``cpu_busy`` are the
        nodes' means."""
        return combine_statistics([s.speculation for s in self.statuses.values()],
                                  {"spec_top1": ("top1_hits", "decisions"), "spec_topk": ("topk_hits", "decisions")},
                                  means=("tail_rank_rho", "cpu_busy"))

    @property
    def alive_nodes(self) -> list[str]:
        return [n for n in self.infos if n not in self.dead]

    # -- the API --------------------------------------------------------------------------------------------------
    def requests(self, task_ids: Iterable[str] | None = None, *, limit: int | None = None, group_size: int = 1,
                 seed: int = 0) -> list[RolloutRequest]:
        """As ``RolloutEngine.requests``: one request (a GRPO group) per task."""
        return group_requests(self.suite.name, task_ids if task_ids is not None else self.tasks, limit=limit,
                              group_size=group_size, seed=seed)

    async def run(self, requests: Iterable[RolloutRequest]) -> list[RolloutResult]:
        """Every rollout of ``requests``; in request order, samples in order."""
        requests = list(requests)
        async with contextlib.aclosing(self.stream(requests)) as results:
            collected = [r async for r in results]
        return in_request_order(requests, collected)

    async def stream(self, requests: Iterable[RolloutRequest]) -> AsyncGenerator[RolloutResult, None]:
        """Results in completion order, each rollout exactly once; closing the iterator stops the rest."""
        if not self._started:
            raise EngineNotStarted("use `async with ClusterEngine(...) as engine` before running rollouts")
        batch = works(requests, self._app_of)
        ledger = Ledger()
        for work in batch:
            ledger.add(work)
        total = sum(len(w.samples) for w in batch)
        queue: asyncio.Queue[RolloutResult] = asyncio.Queue(maxsize=max(1, sum(i.slots for i in self.infos.values())))
        producer = self._streams.start_soon(self._produce(batch, ledger, queue), name="cluster-stream")
        try:
            for _ in range(total):
                yield await RolloutEngine._next(queue, producer)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)

    async def _produce(self, batch: list[Work], ledger: Ledger, queue: asyncio.Queue[RolloutResult]) -> None:
        waiting: collections.deque[Work] = collections.deque(batch)
        wake = self._wake
        assert wake is not None

        def lost(node_id: str) -> None:
            for work in reversed(ledger.lost(node_id)):
                waiting.appendleft(work)  # retries first: their group's other samples are done already

        self._on_loss.add(lost)
        self._ledgers.add(ledger)
        try:
            async with asyncio.TaskGroup() as pieces:
                while not ledger.done():
                    if not self.alive_nodes:
                        while waiting:
                            work = waiting.popleft()
                            for sample in ledger.abandon(work):
                                await queue.put(self._failed(work, sample, ledger, Status.NODE_LOST,
                                                             "every node of the cluster died before it could run"))
                        if ledger.done():
                            break
                    placed, _ = place(list(waiting), self._views(), self.root_estimate, self._prefix_cache)
                    for work, node_id in placed:
                        waiting.popleft()
                        ledger.send(work, node_id)
                        self._sent_since_report[node_id] += len(work.samples)
                        self._roots[node_id].add(work.app)
                        if self._prefix_cache:
                            self._prefixes[node_id].add(work.task_id)
                        pieces.create_task(self._piece(work, node_id, ledger, queue))
                    wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.status_interval_s):
                            await wake.wait()
        finally:
            self._on_loss.discard(lost)
            self._ledgers.discard(ledger)

    async def _piece(self, work: Work, node_id: str, ledger: Ledger, queue: asyncio.Queue[RolloutResult]) -> None:
        """One piece of work on its node: each result passed on once; the node's death puts the rest back."""
        import ray

        handle = self.agents[node_id]
        generator = handle.run_group.options(
            _generator_backpressure_num_objects=max(2, len(work.samples))).remote(_encoder.encode(work.as_request()))
        try:
            async for ref in generator:
                result = _result.decode(await ref)
                t = result.trajectory
                if ledger.deliver(t.group_id, t.sample, node_id):
                    t.attempts = ledger.attempts[(t.group_id, t.sample)]
                    await queue.put(result)
        except _node_lost_errors():
            self._lose(node_id)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.cancel(generator)
            raise
        except Exception as exc:  # the agent raised: a bug of ours, not the rollouts'; they end typed, the batch goes on
            for sample in ledger.close_sent(work, node_id):
                await queue.put(self._failed(work, sample, ledger, Status.ENGINE_ERROR,
                                             f"the agent on node {node_id} failed: {type(exc).__name__}: {exc}"))
        else:
            for sample in ledger.close_sent(work, node_id):  # the agent ended without them: never silently
                await queue.put(self._failed(work, sample, ledger, Status.ENGINE_ERROR,
                                             f"the agent on node {node_id} ended the group without this sample"))
        finally:
            if self._wake is not None:
                self._wake.set()

    def _failed(self, work: Work, sample: int, ledger: Ledger, status: Status, error: str) -> RolloutResult:
        request = work.request
        task = self.tasks.get(request.task.task_id)
        t = Trajectory(task_id=request.task.task_id, suite=self.suite.name, group_id=work.group_id, sample=sample,
                       seed=derive_seed(request.seed, request.task.task_id, sample), run_seed=request.seed,
                       instruction=task.instruction if task else "", backend=self.backend, status=status, error=error,
                       attempts=ledger.attempts[(work.group_id, sample)],
                       timings={"wall_s": 0.0})
        return RolloutResult(trajectory=t, peak_memory_bytes=self.meter.peak_bytes)

