"""The grounded policy: a deterministic agent that decides only from the instruction and its observations.

Owns: ``GroundedPolicy`` (``--policy grounded``): the choice between a seeded detour and the suite's reader, and
the reasoning time. A reader (``webshop.py``, ``desktop.py``: ``act(ctx) -> str | ToolCall``) is a function of the
instruction, the observations, the actions so far and the step, with per-rollout memory in ``ctx.extra`` under
``grounded_`` keys; it knows the suite's action language and common conventions (as a prompt would tell a model),
never a task's answer. The detours (``DETOURS``: a scroll, a ``WAIT``...) are the scripted policy's
(``scripted.py``) and the reasoning time is the same model (``latency.py``), drawn from the sample's seed, so a group explores and is timed the same way; a reader
copes with a detour by reading the page (or screen) it leaves.
Must never: read ``ctx.reference`` or anything of a task but its instruction: every answer is read off an
observation. Same context, same decisions.
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable

from bunshin.envs.records import ToolCall

from ..base import PolicyContext, PolicyError
from ..latency import ModelledPolicy
from ..scripted import DETOURS

READERS = {"webshop": "webshop", "desktop": "desktop"}  # suite -> reader module in this package

Reader = Callable[[PolicyContext], "str | ToolCall"]


def reader(suite: str) -> Reader:
    """The suite's reader, imported on first use; ``PolicyError`` for a suite this policy cannot read."""
    module = READERS.get(suite)
    if module is None:
        raise PolicyError(f"the grounded policy has no reader for suite {suite!r} (it reads: {sorted(READERS)})")
    return importlib.import_module(f"{__package__}.{module}").act


class GroundedPolicy(ModelledPolicy):
    name = "grounded"

    def __init__(self, *, detour_p: float = 0.15, time_scale: float = 1.0, median_tokens: float = 180.0,
                 sigma: float = 0.7, tokens_per_s: float = 60.0, sleep: bool = True):
        if not 0 <= detour_p < 1:
            raise ValueError(f"detour_p must be in [0, 1), got {detour_p}")
        super().__init__(time_scale=time_scale, median_tokens=median_tokens, sigma=sigma, tokens_per_s=tokens_per_s,
                         sleep=sleep)
        self.detour_p = detour_p

    def plan(self, ctx: PolicyContext) -> str | ToolCall:
        """The action at ``ctx.step``: a seeded detour, or what the suite's reader makes of the observations."""
        act = reader(ctx.suite)
        rng = random.Random(f"grounded:{ctx.seed}:{ctx.task_id}:{ctx.sample}:{ctx.step}")
        if rng.random() < self.detour_p:
            return rng.choice(DETOURS.get(ctx.suite, ["WAIT"]))
        return act(ctx)
