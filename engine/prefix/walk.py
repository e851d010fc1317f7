"""One sample's walk down the prefix tree: served from nodes while its calls match, forked at the first miss.

Owns: the sample's position (its calls so far, the node standing for them when there is one, pinned), its own
workspace when it has one and how far behind the position that workspace is, the catch-up that brings it level in
the background (replaying cached calls while the model reasons), executing a missed call, offering it to the tree
(admission) and snapshotting an admitted node before the workspace moves on, and scoring at the end (a reward the
same final call earned on the same node is reused), and its background work: the catch-ups (a ``TaskScope``
cancelled in ``close``) and the snapshot and workspace closes (another, finished in ``close``).
Must never: answer a call with an observation the workspace would not give (every cached answer comes from a node
on the sample's exact path; every replay is checked), use a workspace while a snapshot of it is being taken, or
leave its workspace or pin behind (``close``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass

from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.runtime.task_scope import TaskScope, run_to_end
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace

from .cache import PrefixCache, Served, same_observation, served
from .errors import PrefixError
from .node import Node
from .tree import Pin

Execute = Callable[[Workspace, ToolCall, float], Awaitable[Observation]]


@dataclass(frozen=True)
class Taken:
    """How one call was carried out: ``source`` executed | cached | rebuilt (executed in a workspace rebuilt by
    replay); ``tool_s``: the tool's time in this sample's workspace; ``saved_s``: what a cached step skipped."""

    call: ToolCall
    observation: Observation
    source: str
    tool_s: float
    saved_s: float = 0.0


class Walk:
    def __init__(self, cache: PrefixCache, suite: Suite, task: SuiteTask, root: Node, *, seed: int,
                 issuer: Hashable, execute: Execute, call_timeout_s: float):
        self.cache, self.tree, self.suite, self.task = cache, cache.tree, suite, task
        self.seed, self.issuer, self.execute, self.call_timeout_s = seed, issuer, execute, call_timeout_s
        self.ns = root.ns
        self.path: list[ToolCall] = []
        self.node: Node | None = root  # the node standing for ``path``, pinned; None when the path is not a node
        self.pin: Pin | None = self.tree.pin(root)
        self.ws: Workspace | None = None
        self.ws_depth = 0  # how many calls of ``path`` the workspace has taken
        self.rebuilt = False  # the workspace was rebuilt by replay and has not executed a call of its own yet
        self._catch_ups = TaskScope("walk-catch-up")  # cancelled when the walk closes
        self._work = TaskScope("walk")  # snapshots and closes of this walk's workspaces: finished when it closes
        self.catching_up: asyncio.Task[None] | None = None
        self.snapshotting: asyncio.Task[None] | None = None
        self.lineage: list[str] = []
        self.fork_s = 0.0

    # -- a call -----------------------------------------------------------------------------------------------
    async def step(self, call: ToolCall) -> Taken:
        """Carry out ``call`` (the suite's normal form, before element names are resolved: the tree's key)."""
        if self.node is None:
            self._find_node()
        if self.node is not None:
            child = self.tree.walk(self.node, call)
            if child is not None:
                self.cache.hit(child)
                self._stand_on(child)
                self.path.append(call)
                record = served(child)
                self._start_catch_up()
                return Taken(record.call, record.observation, "cached", 0.0, child.tool_s)
        ws = await self.workspace()
        concrete = await self.suite.concrete(ws, call)
        parent = self.node
        obs = await self.execute(ws, concrete, self.call_timeout_s)
        source = "rebuilt" if self.rebuilt else "executed"
        self.rebuilt = False
        self.path.append(call)
        self.ws_depth = len(self.path)
        self._offer(parent, call, Served(call=concrete, observation=obs), ws)
        return Taken(concrete, obs, source, obs.tool_seconds)

    def serves(self, call: ToolCall) -> bool:
        """Whether ``step(call)`` would be served by the tree now (a hit), without counting it as one."""
        if self.node is None:
            self._find_node()
        return self.node is not None and self.tree.child(self.node, call) is not None

    def adopt(self, call: ToolCall, concrete: ToolCall, observation: Observation, ws: Workspace) -> None:
        """``call`` ran as ``concrete`` in ``ws``, a speculative fork of this walk's workspace at ``path`` (made
        after ``workspace()``): ``ws`` becomes the walk's workspace and the call is offered to the tree, as if it
        had been executed here."""
        parent = self.node
        old, self.ws = self.ws, ws
        if old is not None:
            self._close_later(old)
        self.rebuilt = False
        self.path.append(call)
        self.ws_depth = len(self.path)
        self.lineage.append(ws.id)
        self._offer(parent, call, Served(call=concrete, observation=observation), ws)

    def _offer(self, parent: Node | None, call: ToolCall, record: Served, ws: Workspace) -> None:
        """The executed call goes to the tree (admission); the sample stands on its node if there is one."""
        if parent is None:  # off the tree; someone may have made this path a node meanwhile
            self._find_node(record)
            return
        existed = self.tree.child(parent, call) is not None
        varies = self.suite.nondeterministic(record.call) or (
            not existed and not self.cache.answers_alike(parent, call, record.observation))
        node = self.tree.add(parent, call, record, record.observation.tool_seconds, issuer=self.issuer,
                             non_cacheable=varies)
        if node is not None and existed and not same_observation(served(node).observation, record.observation):
            self.tree.mark_non_cacheable(node)  # two executions of one call from one state answered differently
            self.cache.counts["non_deterministic"] += 1
            node = None
        if node is None:
            self._leave_tree()
            return
        self._stand_on(node)
        if not existed:
            self.cache.forget_answer(parent, call)
            self.cache.changed()
            self.snapshotting = self._work.start_soon(run_to_end(self.cache.keep(node, ws, proven=False)))

    def _find_node(self, record: Served | None = None) -> None:
        """Stand on the node for ``path`` if another sample made one (checking our answer against it)."""
        node = self.tree.lookup(self.ns, self.path)
        if node is None or node.depth != len(self.path) or node.dead:
            return
        if record is not None and not same_observation(served(node).observation, record.observation):
            self.tree.mark_non_cacheable(node)
            self.cache.counts["non_deterministic"] += 1
            return
        self._stand_on(node)

    def _stand_on(self, node: Node) -> None:
        if self.pin is None or self.pin.released:
            self.pin = self.tree.pin(node)
        else:
            self.pin.move(node)
        self.node = node

    def _leave_tree(self) -> None:
        if self.pin is not None:
            self.pin.release()
        self.pin, self.node = None, None

    # -- the sample's workspace -------------------------------------------------------------------------------
    async def workspace(self) -> Workspace:
        """A workspace of this sample's in the state of ``path``."""
        if self.catching_up is not None:
            task, self.catching_up = self.catching_up, None
            await task
        if self.snapshotting is not None:
            task, self.snapshotting = self.snapshotting, None
            await task
        if self.ws is not None and self.ws_depth == len(self.path):
            return self.ws
        await self._catch_up(len(self.path))
        return self.ws  # type: ignore[return-value]

    def _start_catch_up(self) -> None:
        """After a hit: a node with a snapshot forks in milliseconds when needed, so the stale workspace goes;
        otherwise start bringing the workspace level in the background, overlapping the model's reasoning."""
        node = self.node
        if node is not None and node.hot is not None:
            if self.catching_up is None and self.ws is not None:
                ws, self.ws = self.ws, None
                self._close_later(ws)
            return
        previous = self.catching_up
        depth = len(self.path)

        async def catch_up() -> None:
            if previous is not None:
                await previous
            await self._catch_up(depth)

        self.catching_up = self._catch_ups.start_soon(catch_up())

    async def _catch_up(self, depth: int) -> None:
        """Bring the sample's workspace to ``path[:depth]``: fork the node's snapshot, or replay the cached calls
        its own workspace has not taken, or have the cache rebuild the node's state."""
        if self.snapshotting is not None:
            task, self.snapshotting = self.snapshotting, None
            await task
        if self.ws is not None and self.ws_depth >= depth:
            return
        target = self._node_at(depth)
        started = time.monotonic()
        with self.tree.pin(target):
            fresh = await self.cache.fork_hot(target, self.seed)
            if fresh is None and self.ws is not None:  # replay the gap in our own workspace
                await self.cache.replay(self.ws, self.cache.path_between(self._node_at(self.ws_depth), target))
                self.ws_depth, self.rebuilt = depth, True
                return
            if fresh is None:
                fresh = await self.cache.workspace_at(target, self.seed)
                self.rebuilt = True
        self.fork_s += time.monotonic() - started
        if self.ws is not None:
            self._close_later(self.ws)
        self.ws, self.ws_depth = fresh, depth
        self.lineage.append(fresh.id)

    def _node_at(self, depth: int) -> Node:
        """The node standing for ``path[:depth]`` (the sample stands on, or below, it: it is pinned through it)."""
        if self.node is None:
            raise PrefixError("a walk off the tree has its own workspace at its position: no node to stand on")
        chain = list(self.node.ancestors())  # chain[k]: k calls above the node the sample stands on
        return chain[max(0, len(chain) - 1 - depth)]

    # -- the end ----------------------------------------------------------------------------------------------
    async def evaluate(self, final: ToolCall) -> float:
        """The reward for ending with ``final``: the one it earned on this node before, or scored in a workspace."""
        if self.ws is None or self.ws_depth != len(self.path):
            known = self.cache.reward(self.node, final)
            if known is not None:
                self.cache.counts["rewards_reused"] += 1
                return known
        ws = await self.workspace()
        reward = float(await self.suite.evaluate(ws, self.task, final))
        self.cache.keep_reward(self.node, final, reward)
        return reward

    def _close_later(self, ws: Workspace) -> None:
        """Close ``ws`` (a workspace this walk no longer uses) in the background; ``close`` waits for it."""
        self._work.start_soon(run_to_end(ws.close()))

    async def close(self) -> None:
        """Stop the catch-ups, finish the snapshot and the closes under way, release the pin, close the workspace
        (whatever happened; a cancellation of the caller is re-raised once all of it is done)."""
        try:
            try:
                await self._catch_ups.aclose()
            finally:
                try:
                    await self._work.join()
                finally:
                    await self._work.aclose()
        finally:
            self.catching_up = self.snapshotting = None
            if self.pin is not None:
                self.pin.release()
            if self.ws is not None:
                ws, self.ws = self.ws, None
                await run_to_end(ws.close())
