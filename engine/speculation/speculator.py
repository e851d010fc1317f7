"""The engine's speculation: the selector, the slots, tail priority and the figures, shared by every sample.

Owns: ``Speculator``, made by the engine with ``SpecSettings``: it opens the Spec Tool Selector (loading the model
saved in ``model_dir`` for this suite's namespace, learning ``train_file`` first), hands each sample its
``SampleSpeculation`` (``branch.py``), keeps the branches' workspaces in view to measure their private memory (the
slots' memory budget and ``branch_bytes_peak``, read every ``MEASURE_EVERY_S``), and reports
``statistics()`` (``settings.STATISTICS``). The selector's namespace is a digest of the suite, its knobs and the
environment's code (``prefix.cache.code_version``): a model learned on other tools is not used.
Must never: block the event loop (the selector trains and predicts off it), or outlive ``close``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
from typing import Any

import msgspec

from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace

from ..prefix.cache import code_version
from .branch import Execute, SampleSpeculation
from .selector import SpecToolSelector
from .settings import SpecSettings
from .slots import SpecSlots
from .tail import TailPredictor

MEASURE_EVERY_S = 0.5
INITIAL_ESTIMATE = 32 << 20  # a web-shop branch's charge after one page: 20 to 35 MiB measured


def selector_namespace(suite: Suite) -> str:
    """The suite, its knobs and the environment's code, as a digest (a model is kept per namespace)."""
    knobs = msgspec.json.encode(getattr(suite, "knobs", {}), order="sorted")
    digest = hashlib.sha256(b"\0".join([suite.name.encode(), knobs, code_version().encode()])).hexdigest()
    return f"{suite.name}:{digest[:16]}"


class Speculator:
    def __init__(self, settings: SpecSettings, suite: Suite):
        self.settings, self.suite = settings, suite
        self.selector = SpecToolSelector(selector_namespace(suite), model_dir=settings.model_dir,
                                         retrain_every=settings.retrain_every, top_k=settings.top_k)
        self.tail = TailPredictor()
        self.branches: dict[str, Workspace] = {}  # live branch workspaces by id
        self._bytes: dict[str, int] = {}
        self.slots = SpecSlots(settings.slots, settings.memory_budget, self.reserved_bytes)
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.bytes_peak = 0
        self.estimate = INITIAL_ESTIMATE  # what a branch comes to hold: the largest charge seen lately
        self._recent: collections.deque[int] = collections.deque(maxlen=64)
        self._measuring: asyncio.Task[None] | None = None

    async def open(self, tasks: list[SuiteTask]) -> None:
        await self.selector.open()
        if self.settings.train_file is not None:
            added = await asyncio.to_thread(self.selector.learn_file, self.settings.train_file,
                                            {t.id: t.template for t in tasks})
            if added:
                await self.selector.retrain_now()
        self._measuring = asyncio.ensure_future(self._measure())

    async def close(self) -> None:
        task, self._measuring = self._measuring, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        await self.selector.close()

    def sample(self, suite: Suite, *, sample: object, task: SuiteTask, seed: int, execute: Execute,
               call_timeout_s: float) -> SampleSpeculation:
        return SampleSpeculation(self, suite, sample=sample, task_id=task.id, template=task.template, seed=seed,
                                 execute=execute, call_timeout_s=call_timeout_s)

    # -- the branches' memory -------------------------------------------------------------------------------------
    def branch_opened(self, ws: Workspace) -> None:
        self.branches[ws.id] = ws
        self._bytes[ws.id] = 0

    def branch_closed(self, ws: Workspace | None) -> None:
        if ws is not None:
            self.branches.pop(ws.id, None)
            measured = self._bytes.pop(ws.id, 0)
            if measured:
                self._recent.append(measured)
                self.estimate = max(self._recent)

    def branch_bytes(self) -> int:
        """The branches' private memory at the last measurement (each branch's cgroup charge: the pages it has
        written since its fork, page tables and kernel memory; pages shared with the sample are not charged)."""
        return sum(self._bytes.values())

    def reserved_bytes(self) -> int:
        """What the memory budget counts: every live branch at its measured charge or, until it has grown to it,
        at what branches came to hold lately (a branch just forked holds nothing yet but will), plus one more
        such branch (the one asking)."""
        return sum(max(b, self.estimate) for b in self._bytes.values()) + self.estimate

    async def _measure(self) -> None:
        while True:
            await asyncio.sleep(MEASURE_EVERY_S)
            for ws_id, ws in list(self.branches.items()):
                with contextlib.suppress(Exception):
                    self._bytes[ws_id] = ws.cgroup.memory_charge() if ws_id in self.branches else 0
            self.bytes_peak = max(self.bytes_peak, self.branch_bytes())

    # -- figures ------------------------------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        c, s = self.counts, self.seconds
        decisions = c["decisions"]
        selector = self.selector.statistics()
        return {
            "decisions": decisions, "predicted": c["predicted"], "top1_hits": c["top1_hits"],
            "topk_hits": c["topk_hits"],
            "spec_top1": round(c["top1_hits"] / decisions, 4) if decisions else 0.0,
            "spec_topk": round(c["topk_hits"] / decisions, 4) if decisions else 0.0,
            "speculated": c["speculated"], "adopted": c["adopted"], "wasted": c["wasted"],
            "skipped_threshold": c["skipped_threshold"], "skipped_read_only": c["skipped_read_only"],
            "skipped_slots": c["skipped_slots"], "preempted": self.slots.preempted,
            "adopted_s": round(s["adopted_s"], 3), "hidden_s": round(s["hidden_s"], 3),
            "wasted_s": round(s["wasted_s"], 3),
            "branch_bytes_peak": self.bytes_peak, "branch_bytes": self.branch_bytes(),
            "branches_running": len(self.branches),
            "retrains": selector.get("retrains", 0), "examples": selector.get("examples", 0),
            "tail_rank_rho": self.tail.rho(),
        }
