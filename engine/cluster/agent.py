"""The node agent: the one Ray actor per host that owns that host's rollout engine.

Owns: ``NodeAgent`` (made a Ray actor by the driver, pinned to its node, async): its ``RolloutEngine`` (the host's
workspace runtime, application roots, fork backend, admission by the host's memory budget), the guardian process
that removes the run if this process dies (``guardian.py``), ``run_group`` (a streaming generator: the samples of
a request it is given, each result yielded as it finishes, msgpack-encoded, stamped with this node's id),
``status`` (the memory charge, budget, admission estimate and roots the driver places by) and ``close``;
``echo`` and ``probe_calls`` for ``bunshin bench scale`` (a Ray round trip against a local tool call).
Why a generator per group: results flow to the driver as they finish, with Ray's generator back-pressure bounding
what waits unconsumed; a dead node ends the generator with an error, so the driver knows exactly which results of
the group it already has.
Must never: run a sample the driver did not ask for (a request's ``samples`` are honoured), or leave a workspace
behind: ``close`` closes the engine, and a process killed before that is cleaned up by its guardian.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from bunshin.envs.suites.base import Suite
from bunshin.policies.base import Policy

from ..records import RolloutRequest, RolloutResult
from ..rollout import RolloutEngine
from .guardian import spawn_guardian, stop_guardian
from .placement import app_key


class AgentInfo(msgspec.Struct, frozen=True, kw_only=True):
    node_id: str
    pid: int
    run_id: str
    run_dir: str
    guardian_pid: int
    slots: int
    budget: int | None


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    charge: int  # the run's memory charge now (every workspace of this host's run)
    peak: int
    budget: int | None
    estimate: int  # what one more rollout may take here (the admission's estimate)
    roots: list[str]  # application keys (``placement.app_key``) whose root this host holds
    prefixes: list[str] = []  # task ids whose prefix tree this host's cache holds (none without the cache)
    prefix: dict[str, Any] | None = None  # the prefix cache's statistics (``RolloutEngine.prefix_statistics``)
    speculation: dict[str, Any] | None = None  # speculation's (``RolloutEngine.speculation_statistics``)


_encoder = msgspec.msgpack.Encoder()
_request = msgspec.msgpack.Decoder(RolloutRequest)


class NodeAgent:
    def __init__(self, node_id: str, suite: Suite, policy: Policy, engine_kwargs: dict[str, Any]):
        self.node_id = node_id
        self.engine = RolloutEngine(suite, policy, **engine_kwargs)
        self.guardian_pid: int | None = None
        self.closed = False

    async def start(self) -> bytes:
        """Start the engine, then its guardian (it needs the run's id; a death in between is cleaned up by the next
        engine start on this machine, as on one host); the agent's ``AgentInfo``."""
        engine = self.engine
        await engine.__aenter__()
        try:
            self.guardian_pid = await asyncio.to_thread(spawn_guardian, os.getpid(), engine.runtime.state_dir,
                                                        engine.runtime.run_id)
        except BaseException:
            await engine.__aexit__(None, None, None)
            raise
        return _encoder.encode(AgentInfo(node_id=self.node_id, pid=os.getpid(), run_id=engine.runtime.run_id,
                                         run_dir=str(engine.runtime.run_dir), guardian_pid=self.guardian_pid,
                                         slots=engine.concurrency, budget=engine.memory_budget))

    async def status(self) -> bytes:
        engine = self.engine
        gate = engine.gate
        return _encoder.encode(NodeStatus(
            charge=engine.meter.now(), peak=engine.meter.peak_bytes, budget=engine.memory_budget,
            estimate=gate.admission.estimate if gate is not None else 0,
            roots=[app_key(key) for key in engine._roots],
            prefixes=sorted({ns.task_id for ns in engine.prefix_cache.tree.roots}) if engine.prefix_cache else [],
            prefix=engine.prefix_statistics(), speculation=engine.speculation_statistics()))

    async def run_group(self, request: bytes) -> AsyncIterator[bytes]:
        """The request's samples (its ``samples``, or the whole group), each result as it finishes."""
        async with contextlib.aclosing(self.engine.stream([_request.decode(request)])) as results:
            async for result in results:
                yield _encoder.encode(RolloutResult(trajectory=result.trajectory,
                                                    peak_memory_bytes=result.peak_memory_bytes, node=self.node_id))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self.engine.__aexit__(None, None, None)
        finally:
            if self.guardian_pid is not None:
                stop_guardian(self.guardian_pid)

    def pid(self) -> int:
        return os.getpid()

    # -- for ``bunshin bench scale`` ------------------------------------------------------------------------------
    def echo(self, payload: bytes) -> bytes:
        """A round trip carrying ``payload`` (what a tool call and its observation would cost to cross Ray)."""
        return payload

    async def probe_calls(self, n: int, timeout_s: float = 30.0) -> list[float]:
        """Seconds of ``n`` trivial tool calls on a workspace of this host (made, used and closed here)."""
        from bunshin.envs import AppSpec, ToolCall

        ws = await self.engine.runtime.create(AppSpec())
        try:
            took = []
            for _ in range(n):
                started = time.perf_counter()
                await ws.execute(ToolCall(name="shell", args={"cmd": "true"}), timeout_s=timeout_s)
                took.append(time.perf_counter() - started)
            return took
        finally:
            await ws.close()
