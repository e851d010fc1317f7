"""The reasoning-time model of the simulated policies (scripted, grounded): how long a model would think.

Owns: ``ModelledPolicy``, a policy whose action is its ``plan(ctx)`` and whose reasoning time is drawn per step
from the sample's seed: a response of ``tokens ~ LogNormal(mu, sigma)`` tokens (heavy-tailed, as reasoning lengths
are) decoded at ``tokens_per_s``, times ``time_scale``. Defaults: median 180 tokens, sigma 0.7 (mean ~230, 1% above
~900), 60 tokens/s: about 3-4 s of reasoning per step at scale 1; ``decide`` awaits it as a model server's answer
would be awaited (``sleep=False`` only reports it).
Must never: depend on anything but the context (same seed, same times).
"""

from __future__ import annotations

import abc
import asyncio
import math
import random

from bunshin.envs.records import ToolCall

from .base import Decision, Policy, PolicyContext


class ModelledPolicy(Policy):
    def __init__(self, *, time_scale: float = 1.0, median_tokens: float = 180.0, sigma: float = 0.7,
                 tokens_per_s: float = 60.0, sleep: bool = True):
        if time_scale < 0 or tokens_per_s <= 0:
            raise ValueError(f"time_scale must be >= 0 and tokens_per_s > 0, got {time_scale}, {tokens_per_s}")
        self.time_scale, self.sleep = time_scale, sleep
        self.mu, self.sigma, self.tokens_per_s = math.log(median_tokens), sigma, tokens_per_s

    @abc.abstractmethod
    def plan(self, ctx: PolicyContext) -> str | ToolCall:
        """The action at ``ctx.step``."""

    def reasoning_time(self, ctx: PolicyContext) -> float:
        rng = random.Random(f"latency:{ctx.seed}:{ctx.task_id}:{ctx.sample}:{ctx.step}")
        tokens = rng.lognormvariate(self.mu, self.sigma)
        return tokens / self.tokens_per_s * self.time_scale

    async def decide(self, ctx: PolicyContext) -> Decision:
        action = self.plan(ctx)
        seconds = self.reasoning_time(ctx)
        if self.sleep and seconds > 0:
            await asyncio.sleep(seconds)
        return Decision(action=action, reasoning_s=seconds)
