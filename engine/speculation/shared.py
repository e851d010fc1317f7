"""What every sample's speculation shares: the selector, the slots, tail priority, the branches' memory, the figures.

Owns: ``SpeculationShared``, the record the ``Speculator`` (``speculator.py``) makes and keeps and hands to each
``SampleSpeculation`` (``branch.py``) in its place: a sample's speculation asks the selector, the slots and the tail
predictor through it, adds to its figures (``counts``, ``seconds``) and says when a branch's workspace opens and closes
(``branch_opened``/``branch_closed``: the live branches whose memory the speculator measures). And ``Predictor``, the
two calls a sample's speculation makes of the selector.
Must never: hold a sample's state, or do I/O (the speculator measures and reports; the samples run the branches).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Protocol, cast

from bunshin.envs.workspace import Workspace

from .features import Situation
from .memory import BranchMemory
from .selector import Prediction
from .settings import SpecSettings
from .slots import SpecSlots
from .tail import TailPredictor


class Predictor(Protocol):
    """What a sample's speculation asks of the selector (``selector.SpecToolSelector``)."""

    async def predict(self, situation: Situation) -> list[Prediction]: ...

    def learn(self, situation: Situation, label: str) -> None: ...


@dataclass(eq=False)
class SpeculationShared:
    settings: SpecSettings
    selector: Predictor
    tail: TailPredictor
    memory: BranchMemory
    slots: SpecSlots
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    # tool-seconds by figure: a Counter (a figure not yet counted reads 0) of floats
    seconds: dict[str, float] = field(default_factory=lambda: cast("dict[str, float]", collections.Counter()))
    branches: dict[str, Workspace] = field(default_factory=dict)  # live branch workspaces by id

    def branch_opened(self, ws: Workspace) -> None:
        self.branches[ws.id] = ws
        self.memory.opened(ws.id)

    def branch_closed(self, ws: Workspace | None) -> None:
        if ws is not None:
            self.branches.pop(ws.id, None)
            self.memory.closed(ws.id)
