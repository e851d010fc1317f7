"""The prefix cache of one engine: the tree (``tree.py``) and the workspaces behind its entries.

Owns: the namespace of a task (suite, task, a digest of the workspace configuration and of the environment's code),
each namespace's root (the task's initialised workspace, kept as the root's hot entry, so a later group or epoch of
the task skips its setup), hot entries (frozen snapshots of a sample's workspace, taken after an admitted call),
workspaces at a node (fork its snapshot; restore its checkpoint; else replay from the nearest ancestor that has an
entry, checking every replayed observation: the tree's ``RebuildPlan``, executed), cached rewards (a final call
scored on a node's state), eviction (closing the snapshots and deleting the checkpoints the tree gives up), cold
checkpoints (``cold.py``), its background work (a ``TaskScope``: measuring snapshots, closing them; finished in
``close``) and the run's statistics. The per-sample walk is ``walk.py``.
Must never: make a sample wait for a disk write, close a snapshot while someone forks it (forks hold a pin), or
let a node whose replay answered differently serve again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import msgspec

from bunshin.envs.code_version import code_version
from bunshin.envs.records import Observation, ToolCall, canonical
from bunshin.envs.runtime.image_files import FillLayer
from bunshin.envs.runtime.task_scope import TaskScope, run_to_end
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace

from ..history import Turn
from .cold import ColdStore, RestoreAt
from .errors import NonDeterministicTool
from .eviction import LRU, CostAware
from .node import Namespace, Node, State
from .settings import PrefixSettings
from .tree import Admission, ForkHot, PrefixTree, RestoreCold, SetUp

log = logging.getLogger(__name__)
Setup = Callable[[SuiteTask, int], Awaitable[tuple[Workspace, Observation]]]
MIN_HOT_BYTES = 1 << 20
MEASURE_EVERY_S = 2.0


class Served(msgspec.Struct, frozen=True, kw_only=True):
    """What a node's call answered: ``call`` as the workspace took it (element names resolved) and its observation."""

    call: ToolCall
    observation: Observation


def served(node: Node) -> Served:
    """A node's ``Served`` (a tree loaded from disk gives it back in its MessagePack form)."""
    value = node.observation
    return value if isinstance(value, Served) else msgspec.convert(value, Served)


def same_observation(a: Observation, b: Observation) -> bool:
    """Equal as a trajectory records them: everything but the time the tool took."""
    return msgspec.structs.replace(a, tool_seconds=0.0) == msgspec.structs.replace(b, tool_seconds=0.0)


class PrefixCache:
    def __init__(self, settings: PrefixSettings, suite: Suite, setup: Setup, *, call_timeout_s: float,
                 restore: Callable[..., Awaitable[Workspace]] | None = None,
                 clock: Callable[[], float] = time.monotonic, run_memory: Callable[[], int] | None = None):
        """``setup(task, seed)``: a new workspace with ``task`` set up and its first observation (the engine's
        group setup); the cache calls it for a namespace whose root has no entry. ``restore``: the runtime's
        ``restore_image`` (a workspace from a checkpoint's parts and layer), needed with a cache directory.
        ``run_memory()``: the run's memory now (its cgroup's charge), which a relative hot budget reads."""
        self.settings, self.suite, self.setup, self.call_timeout_s = settings, suite, setup, call_timeout_s
        self.runtime_restore = restore
        if settings.hot_share is not None and run_memory is None:
            raise ValueError("a relative hot budget (hot_share) needs the run's memory (run_memory)")
        self.run_memory = run_memory
        self.high_without_hot = 0  # the most the run has held without its hot entries, as measured
        self.tree = PrefixTree(hot_budget=settings.hot_budget, cold_budget=settings.disk_budget, clock=clock,
                               strategy=LRU() if settings.strategy == "lru" else CostAware(),
                               admission=Admission(settings.min_issuers))
        self.tasks: dict[Namespace, SuiteTask] = {}
        self.rewards: dict[tuple[int, bytes], float] = {}
        self.counts: Counter[str] = Counter()
        self.replayed_s = 0.0
        self._root_locks: dict[Namespace, asyncio.Lock] = {}
        self._rebuilding: dict[int, asyncio.Lock] = {}
        self._first_answers: dict[tuple[int, bytes], bytes] = {}
        self._scope = TaskScope("prefix-cache")
        self._measuring: asyncio.Task[None] | None = None
        self._closed = False
        self.cold: ColdStore | None = None  # when the run has a cache directory

    # -- life cycle -----------------------------------------------------------------------------------------------
    async def open(self, tasks: list[SuiteTask]) -> None:
        for task in tasks:
            self.tasks[self.namespace(task)] = task
        if self.settings.cache_dir is not None:
            self.cold, self.tree = await ColdStore.open(
                self.settings.cache_dir, self.tree, namespaces=self.tasks.keys(), writers=self.settings.writers,
                backlog=self.settings.backlog, restore=self._restore_at(), apply_budgets=self.evict)
            self.evict()  # the loaded tree may hold more than the budgets
        self._share_budget()
        self._measuring = self._scope.start_soon(self._measure_hot(), name="prefix-measure-hot")

    def _restore_at(self) -> RestoreAt | None:
        """How the cold store starts a workspace of a namespace's task from a checkpoint: the runtime's restore."""
        restore = self.runtime_restore
        if restore is None:
            return None

        async def restore_at(ns: Namespace, fill_layer: FillLayer, seed: int) -> Workspace:
            return await restore(self.suite.app(self.tasks[ns]), None, fill_layer, seed=seed)

        return restore_at

    async def _measure_hot(self) -> None:
        """Every ``MEASURE_EVERY_S``: each snapshot's private memory (the pages no other process maps: what dropping
        it frees), which grows as the workspaces forked from it diverge; then the hot budget applied."""
        while True:
            await asyncio.sleep(MEASURE_EVERY_S)
            await self.measure_hot()

    async def measure_hot(self) -> None:
        """One pass of ``_measure_hot``."""
        nodes = [n for n in self.tree.nodes.values() if n.hot is not None]
        sizes = await asyncio.to_thread(_private_memory_of, [(n, n.hot.handle) for n in nodes])  # type: ignore[union-attr]
        for node, handle, nbytes in sizes:
            if node.hot is not None and node.hot.handle is handle:
                self.tree.resize_hot(node, max(MIN_HOT_BYTES, nbytes))
        self._share_budget()
        self.evict()

    def _share_budget(self) -> None:
        """With a relative hot budget: the tree's hot budget becomes ``hot_share`` of the most the run has held
        without its hot entries (and within ``hot_budget`` if that is set too). The mark only rises, so the budget
        does not shrink as the run's last rollouts finish; it starts at the run's memory when the cache opens."""
        share = self.settings.hot_share
        if share is None or self.run_memory is None:
            return
        self.high_without_hot = max(self.high_without_hot, self.run_memory() - self.tree.bytes_hot)
        relative = round(share * self.high_without_hot)
        absolute = self.settings.hot_budget
        self.tree.hot_budget = relative if absolute is None else min(relative, absolute)

    async def close(self) -> None:
        """Close every snapshot; with a cache directory, finish or abandon the writes and save the tree."""
        self._closed = True
        if self._measuring is not None:
            self._measuring.cancel()
        try:
            if self.cold is not None:
                await self.cold.close()  # its last writes may still evict: the scope is open until they landed
        finally:
            try:
                await self._scope.join()  # closing the snapshots given up: short, never cut
            finally:
                await self._scope.aclose()
            handles = [n.hot.handle for n in self.tree.nodes.values() if n.hot is not None]
            for node in self.tree.nodes.values():
                if node.hot is not None:
                    self.tree.drop_hot(node)
            await asyncio.gather(*(h.close() for h in handles), return_exceptions=True)  # type: ignore[attr-defined]

    def _close_later(self, handle: Workspace) -> None:
        """Close ``handle`` (a snapshot given up) in the background; ``close`` waits for it."""
        self._scope.start_soon(run_to_end(handle.close()))

    # -- namespaces and roots -------------------------------------------------------------------------------------
    def namespace(self, task: SuiteTask) -> Namespace:
        config = Namespace.digest(self.suite.app(task), self.suite.knobs, task.path, code_version())
        return Namespace(suite=self.suite.name, task_id=task.id, config=config)

    async def root(self, task: SuiteTask, seed: int) -> tuple[Node, Observation] | None:
        """The root of ``task``'s namespace, pinned by the caller right away, and the task's first observation; its
        state is set up (``setup``) when no entry holds it. None when the setup answered another first observation
        than the one the tree recorded (the namespace is then dead: the group runs without the cache)."""
        ns = self.namespace(task)
        self.tasks.setdefault(ns, task)
        lock = self._root_locks.setdefault(ns, asyncio.Lock())
        async with lock:
            node = self.tree.roots.get(ns)
            if node is not None and node.dead:
                return None
            if node is not None and node.state is not State.ABSENT:
                self.counts["roots_reused"] += 1
                return node, node.observation  # type: ignore[return-value]
            ws, first = await self.setup(task, seed)
            if node is not None and not same_observation(node.observation, first):  # type: ignore[arg-type]
                self.tree.mark_non_cacheable(node)
                await ws.close()
                return None
            node = self.tree.root(ns, first)
            await self._keep_as_hot(node, ws)
            return node, first

    # -- workspaces at a node -------------------------------------------------------------------------------------
    async def fork_hot(self, node: Node, seed: int) -> Workspace | None:
        """A running fork of ``node``'s snapshot, or None if it has none (or the snapshot broke: it is dropped)."""
        if node.hot is None:
            return None
        handle: Workspace = node.hot.handle  # type: ignore[assignment]
        try:
            ws = await handle.fork(seed=seed)
        except Exception as exc:
            log.warning("prefix tree: the snapshot of node %s broke, dropped: %s: %s", node.id, type(exc).__name__,
                        exc)
            self.counts["broken_snapshots"] += 1
            if node.hot is not None and node.hot.handle is handle:
                self.tree.drop_hot(node)
                self._close_later(handle)
            return None
        self.tree.touch(node)
        self.counts["forks"] += 1
        return ws

    async def workspace_at(self, node: Node, seed: int) -> Workspace:
        """A running workspace in ``node``'s state: its snapshot forked, its checkpoint restored, or the nearest
        ancestor's state with the calls below it replayed (``NonDeterministicTool`` when a replayed call answers
        differently). The caller holds a pin on ``node``."""
        ws = await self.fork_hot(node, seed)
        if ws is not None:
            return ws
        lock = self._rebuilding.setdefault(node.id, asyncio.Lock())
        try:
            async with lock:  # samples missing at one node at once: one restores or replays, the others fork it
                ws = await self.fork_hot(node, seed)
                return ws if ws is not None else await self._rebuild(node, seed)
        finally:
            if not lock.locked() and self._rebuilding.get(node.id) is lock:
                del self._rebuilding[node.id]

    async def _rebuild(self, node: Node, seed: int) -> Workspace:
        """``node``'s state as the tree plans it (``PrefixTree.plan_rebuild``: a snapshot forked, else a checkpoint
        restored where that pays, else the task set up afresh; then the calls below replayed). A start that fails
        lost its entry: the tree plans again."""
        while True:
            plan = self.tree.plan_rebuild(node, restore_s=self.cold.restore_estimate_s if self.cold else None)
            ws = await self._start(plan.start, seed)
            if ws is not None:
                break
        try:
            await self.replay(ws, list(plan.replay))
            await self.keep(node, ws)  # rebuilt once: the next sample missing here forks it
        except BaseException:
            await ws.close()
            raise
        return ws

    async def _start(self, start: ForkHot | RestoreCold | SetUp, seed: int) -> Workspace | None:
        """A workspace in the state of ``start.node``, or None when its snapshot broke or its checkpoint could not
        be read (the entry is gone from the tree). A set-up answering another first observation than recorded
        marks the namespace dead (``NonDeterministicTool``)."""
        match start:
            case ForkHot(node=source):
                with self.tree.pin(source):
                    return await self.fork_hot(source, seed)
            case RestoreCold(node=source):
                assert self.cold is not None  # planned only with a cold store
                with self.tree.pin(source):
                    return await self.cold.restore(source, seed)
            case SetUp(node=root):
                ws, first = await self.setup(self.tasks[root.ns], seed)
                if not same_observation(root.observation, first):  # type: ignore[arg-type]
                    self.tree.mark_non_cacheable(root)
                    await ws.close()
                    raise NonDeterministicTool(ToolCall(name="(task setup)"), 0)
                self.counts["setups_replayed"] += 1
                return ws

    async def replay(self, ws: Workspace, nodes: list[Node]) -> None:
        """Execute each node's call in ``ws`` (which is in the state of the first node's parent), checking that it
        answers as recorded; a node that does not is marked non-cacheable (``NonDeterministicTool``)."""
        for node in nodes:
            record = served(node)
            obs = await ws.execute(record.call, timeout_s=self.call_timeout_s)
            self.counts["calls_replayed"] += 1
            self.replayed_s += obs.tool_seconds
            if not same_observation(obs, record.observation):
                self.tree.mark_non_cacheable(node)
                self.counts["non_deterministic"] += 1
                raise NonDeterministicTool(record.call, node.depth)

    @staticmethod
    def path_between(source: Node, node: Node) -> list[Node]:
        """The nodes strictly below ``source`` down to ``node``, in order."""
        path = []
        while node is not source:
            path.append(node)
            if node.parent is None:
                raise ValueError(f"{source!r} is not an ancestor of {node!r}")
            node = node.parent
        return path[::-1]

    # -- entries --------------------------------------------------------------------------------------------------
    async def keep(self, node: Node, ws: Workspace, *, proven: bool = True) -> None:
        """Take a frozen snapshot of ``ws`` (in ``node``'s state) as the node's hot entry, if the budget allows and
        it has none. ``proven``: a sample needed a workspace here (a branch point), which may evict others; a node
        just admitted is kept only where the budget has room, so new nodes do not churn proven ones out. The sample
        awaits this before its next call in ``ws``; a failure only leaves the node absent."""
        budget, hot = self.tree.hot_budget, [n.hot.nbytes for n in self.tree.nodes.values() if n.hot is not None]
        room = budget is None or self.tree.bytes_hot + max(MIN_HOT_BYTES, sum(hot) // max(1, len(hot))) <= budget
        if (node.hot is not None or node.dead or self._closed or not self.tree.fits_hot(MIN_HOT_BYTES)
                or not (proven or room)):
            self.counts["snapshots_skipped"] += 1
            return
        try:
            snap = await ws.snapshot()
        except Exception:
            self.counts["snapshots_failed"] += 1
            return
        await self._keep_as_hot(node, snap)

    async def _keep_as_hot(self, node: Node, handle: Workspace) -> None:
        """``handle`` (a snapshot, or a root's set-up workspace) becomes ``node``'s hot entry, sized by its private
        memory (re-measured as it grows: ``_measure_hot``). Cancelled while it measures, ``handle`` is closed: it is
        nobody's yet."""
        try:
            nbytes = max(MIN_HOT_BYTES, (await asyncio.to_thread(handle.memory)).private)
        except asyncio.CancelledError:
            await run_to_end(handle.close())
            raise
        except Exception:
            nbytes = MIN_HOT_BYTES
        if self._closed or node.dead:
            await handle.close()
            return
        old = self.tree.set_hot(node, handle, nbytes)
        self.counts["snapshots"] += 1
        if old is not None:
            self._close_later(old.handle)  # type: ignore[arg-type]
        if self.cold is not None and node.parent is None:
            self.cold.submit(node)  # a root: every rebuild starts from it
        self.evict()

    def hit(self, node: Node) -> None:
        """A sample was served by ``node``: a node that serves is worth a checkpoint (written once, in the
        background, if it has a snapshot: nodes nobody came back to cost no disk and no imaging)."""
        if self.cold is not None and node.hot is not None and node.cold is None:
            self.cold.submit(node)

    def changed(self) -> None:
        """The tree gained a node: with a cache directory, the tree file is saved soon (a killed engine's successor
        finds the observations even of nodes without a checkpoint)."""
        if self.cold is not None:
            self.cold.save_soon()

    def evict(self) -> None:
        """Apply the tree's evictions: close the snapshots, delete the checkpoints (in the background)."""
        out = self.tree.evict()
        for _, entry in out.hot:
            self._close_later(entry.handle)  # type: ignore[arg-type]
        if out.cold and self.cold is not None:
            self.cold.delete([entry.checkpoint_id for _, entry in out.cold])

    def answers_alike(self, parent: Node, call: ToolCall, observation: Observation) -> bool:
        """Whether ``call`` from ``parent`` answered as it did the first time it was executed there (by any sample
        before admission): two executions from one state that differ mark the call non-deterministic before it is
        ever cached. Remembered until the call is admitted or found to vary."""
        key = (parent.id, canonical(call))
        digest = hashlib.sha256(msgspec.msgpack.encode(msgspec.structs.replace(observation, tool_seconds=0.0)))
        first = self._first_answers.setdefault(key, digest.digest())
        if first != digest.digest():
            del self._first_answers[key]
            self.counts["non_deterministic"] += 1
            return False
        return True

    def forget_answer(self, parent: Node, call: ToolCall) -> None:
        self._first_answers.pop((parent.id, canonical(call)), None)

    # -- rewards --------------------------------------------------------------------------------------------------
    def reward(self, node: Node | None, final: ToolCall) -> float | None:
        if node is None or node.dead:
            return None
        return self.rewards.get((node.id, canonical(final)))

    def keep_reward(self, node: Node | None, final: ToolCall, reward: float) -> None:
        if node is not None and not node.dead:
            self.rewards[(node.id, canonical(final))] = reward

    # -- history --------------------------------------------------------------------------------------------------
    def history(self) -> Iterator[Turn]:
        """Every call the tree holds, as the turn it was: the task, the calls before it, the observation they led
        to, and how often the call's node was served (what the Spec Tool Selector learns from a loaded tree; a
        tree records no final actions). Only namespaces of this run's tasks."""
        for ns, root in self.tree.roots.items():
            task = self.tasks.get(ns)
            if task is None or root.dead:
                continue
            stack: list[tuple[Node, tuple[ToolCall, ...], Observation]] = [
                (root, (), msgspec.convert(root.observation, Observation))]
            while stack:
                node, calls, seen = stack.pop()
                for child in node.children.values():
                    if child.dead or child.call is None:
                        continue
                    yield Turn(task=task, calls=calls, observation=seen, call=child.call, uses=1 + child.hits)
                    stack.append((child, (*calls, child.call), served(child).observation))

    # -- metrics --------------------------------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = dict(vars(self.tree.statistics()))
        stats.update({f"cache_{k}": v for k, v in sorted(self.counts.items())})
        stats["tool_s_replayed"] = round(self.replayed_s, 4)
        stats["hot_budget"] = self.tree.hot_budget  # bytes, None: unbounded (relative: what it is now)
        stats["tool_s_skipped"] = round(stats["tool_s_skipped"], 4)
        if self.cold is not None:
            stats.update(self.cold.statistics())
        else:
            stats.update(bytes_written=0, full_bytes=0, writer_backlog=0)
        return stats


def _private_memory_of(entries: list[tuple[Node, object]]) -> list[tuple[Node, object, int]]:
    """Each snapshot's private memory now (blocking: a thread); a snapshot that went meanwhile is left out."""
    out = []
    for node, handle in entries:
        with contextlib.suppress(Exception):
            out.append((node, handle, handle.memory().private))  # type: ignore[attr-defined]
    return out
