"""The engine's speculation: the selector, the slots, tail priority and the figures, shared by every sample.

Owns: ``Speculator``, made by the engine with ``SpecSettings``: it opens the Spec Tool Selector (loading the model
saved in ``model_dir`` for this suite's namespace, or else learning the history of a prefix tree loaded from disk;
then ``train_file``), makes the ``SpeculationShared`` record (``shared.py``: the selector, slots, tail priority, the
branches' memory and the figures) and hands each sample a ``SampleSpeculation`` (``branch.py``) of it, measures the
live branches' memory every ``MEASURE_EVERY_S`` in a task of its own scope (``memory.py`` decides from it whether a
slot may take one more branch), and reports ``statistics()`` (``settings.STATISTICS``). The selector's namespace is a digest of the suite, its knobs and the
environment's code (``bunshin.envs.code_version``): a model learned on other tools is not used.
Must never: block the event loop (the selector trains and predicts off it), or outlive ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import msgspec

from bunshin.envs.code_version import code_version
from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.envs.suites.base import Suite, SuiteTask, observation_text

from ..history import Turn
from .branch import Execute, SampleSpeculation
from .cpu import CpuLoad
from .features import Situation, label_of
from .memory import BranchMemory
from .selector import SpecToolSelector
from .settings import SpecSettings
from .shared import SpeculationShared
from .slots import SpecSlots
from .tail import TailPredictor

MEASURE_EVERY_S = 0.5
HISTORY_USES = 8  # a tree node's uses an example counts at most (its share among its siblings is what matters)


def selector_namespace(suite: Suite) -> str:
    """The suite, its knobs and the environment's code, as a digest (a model is kept per namespace)."""
    knobs = msgspec.json.encode(suite.knobs, order="sorted")
    digest = hashlib.sha256(b"\0".join([suite.name.encode(), knobs, code_version().encode()])).hexdigest()
    return f"{suite.name}:{digest[:16]}"


class Speculator:
    def __init__(self, settings: SpecSettings, suite: Suite, run_memory: Callable[[], int]):
        """``run_memory()``: the run's memory now (its cgroup's charge), which the headroom rule reads."""
        self.settings, self.suite = settings, suite
        self.selector = SpecToolSelector(selector_namespace(suite), model_dir=settings.model_dir,
                                         retrain_every=settings.retrain_every, top_k=settings.top_k)
        memory = BranchMemory(budget=settings.memory_budget, headroom=settings.memory_headroom,
                              run_memory=run_memory)
        self.cpu = CpuLoad(settings.cpu_limit)
        self.shared = SpeculationShared(settings=settings, selector=self.selector, tail=TailPredictor(),
                                        memory=memory,
                                        slots=SpecSlots(settings.slots, lambda: memory.allows() and self.cpu.allows()))
        self._scope = TaskScope("speculator")  # the memory measurement

    async def open(self, tasks: list[SuiteTask], history: Iterable[Turn] = ()) -> None:
        """Load the saved selector, then learn ``train_file``; ``history`` (a loaded prefix tree's turns) is
        learned only by a selector that starts with no example (a saved one already holds what made the tree)."""
        await self.selector.open()
        added = 0
        if self.selector.statistics()["examples"] == 0:  # off the loop: a big tree is many pages to encode
            added += await asyncio.to_thread(self.learn_history, history)
        if self.settings.train_file is not None:
            added += await asyncio.to_thread(self.selector.learn_file, self.settings.train_file,
                                             {t.id: t.template for t in tasks})
        if added:
            await self.selector.retrain_now()
        self._scope.start_soon(self._measure(), name="spec-measure")

    def learn_history(self, turns: Iterable[Turn]) -> int:
        """Each turn as an example, as many times as its node was used (up to ``HISTORY_USES``); the examples
        added."""
        added = 0
        for turn in turns:
            situation = Situation(suite=self.suite.name, template=turn.task.template,
                                  instruction=turn.task.instruction, step=len(turn.calls),
                                  calls=tuple(label_of(c) for c in turn.calls),
                                  observation=observation_text(turn.observation))
            for _ in range(min(turn.uses, HISTORY_USES)):
                self.selector.learn(situation, label_of(turn.call))
                added += 1
        return added

    async def close(self) -> None:
        try:
            await self._scope.aclose()
        finally:
            await self.selector.close()

    def sample(self, suite: Suite, *, sample: object, task: SuiteTask, seed: int, execute: Execute,
               call_timeout_s: float) -> SampleSpeculation:
        return SampleSpeculation(self.shared, suite, sample=sample, task_id=task.id, template=task.template, seed=seed,
                                 execute=execute, call_timeout_s=call_timeout_s)

    # -- the branches' memory -------------------------------------------------------------------------------------
    async def _measure(self) -> None:
        shared = self.shared
        while True:
            await asyncio.sleep(MEASURE_EVERY_S)
            charges: dict[Hashable, int] = {}
            for ws_id, ws in list(shared.branches.items()):
                with contextlib.suppress(Exception):  # a branch closing meanwhile
                    charges[ws_id] = ws.charge()
            shared.memory.measure(charges)

    # -- figures ------------------------------------------------------------------------------------------------
    def statistics(self) -> dict[str, Any]:
        c, s, memory = self.shared.counts, self.shared.seconds, self.shared.memory
        decisions = c["decisions"]
        selector = self.selector.statistics()
        return {
            "decisions": decisions, "predicted": c["predicted"], "late_predictions": c["late_predictions"],
            "top1_hits": c["top1_hits"],
            "topk_hits": c["topk_hits"],
            "spec_top1": round(c["top1_hits"] / decisions, 4) if decisions else 0.0,
            "spec_topk": round(c["topk_hits"] / decisions, 4) if decisions else 0.0,
            "speculated": c["speculated"], "adopted": c["adopted"], "wasted": c["wasted"],
            "skipped_threshold": c["skipped_threshold"], "skipped_read_only": c["skipped_read_only"],
            "skipped_slots": c["skipped_slots"], "preempted": self.shared.slots.preempted,
            "cpu_refused": self.cpu.refused, "cpu_busy": round(self.cpu.busy, 4),
            "adopted_s": round(s["adopted_s"], 3), "hidden_s": round(s["hidden_s"], 3),
            "wasted_s": round(s["wasted_s"], 3),
            "branch_bytes_peak": memory.peak, "branch_bytes": memory.held(),
            "run_bytes_high": memory.high,
            "branches_running": len(self.shared.branches),
            "retrains": selector.get("retrains", 0), "examples": selector.get("examples", 0),
            "tail_rank_rho": self.shared.tail.rho(),
        }
