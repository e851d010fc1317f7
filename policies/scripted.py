"""The scripted policy: follows the task's reference solution with seeded deviations and a model of reasoning time.

Owns: the deviation rules and the latency model. Deviations, drawn from the sample's seed, make a GRPO group
explore and earn different rewards: at each step a detour with probability ``detour_p`` (an extra step that
leaves the task solvable: a scroll, a ``WAIT``), and once per rollout, with probability ``fail_p``, giving up at a
random step of the reference (an early ``stop []`` / ``FAIL``: reward 0 but for the tasks where giving up is
right). The latency model: a response of
``tokens ~ LogNormal(mu, sigma)`` tokens (heavy-tailed, as reasoning lengths are) decoded at ``tokens_per_s``,
times ``time_scale``. Defaults: median 180 tokens, sigma 0.7 (mean ~230, 1% above ~900), 60 tokens/s: about 3-4
s of reasoning per step at scale 1; the engine awaits it as a model server's answer would be awaited.
Must never: depend on anything but the context (same seed, same decisions).
"""

from __future__ import annotations

import asyncio
import math
import random

from bunshin.envs.records import ToolCall

from .base import Decision, Policy, PolicyContext

DETOURS = {
    "webshop": ["scroll [down]", "scroll [up]"],
    "desktop": ["WAIT", "terminal: pwd", "terminal: ls"],
}
GIVE_UP = {"webshop": "stop []", "desktop": "FAIL"}


class ScriptedPolicy(Policy):
    name = "scripted"

    def __init__(self, *, detour_p: float = 0.15, fail_p: float = 0.25, time_scale: float = 1.0,
                 median_tokens: float = 180.0, sigma: float = 0.7, tokens_per_s: float = 60.0,
                 sleep: bool = True):
        if not 0 <= detour_p < 1 or not 0 <= fail_p <= 1:
            raise ValueError(f"detour_p must be in [0, 1) and fail_p in [0, 1], got {detour_p}, {fail_p}")
        if time_scale < 0 or tokens_per_s <= 0:
            raise ValueError(f"time_scale must be >= 0 and tokens_per_s > 0, got {time_scale}, {tokens_per_s}")
        self.detour_p, self.fail_p, self.time_scale = detour_p, fail_p, time_scale
        self.mu, self.sigma, self.tokens_per_s = math.log(median_tokens), sigma, tokens_per_s
        self.sleep = sleep

    def _rng(self, ctx: PolicyContext) -> random.Random:
        return random.Random(f"scripted:{ctx.seed}:{ctx.task_id}:{ctx.sample}:{ctx.step}")

    def plan(self, ctx: PolicyContext) -> str | ToolCall:
        """The action at ``ctx.step``: the reference's next step, a detour, or giving up."""
        reference = ctx.reference
        if not reference:
            return GIVE_UP.get(ctx.suite, "stop []")
        whole = random.Random(f"scripted:{ctx.seed}:{ctx.task_id}:{ctx.sample}")
        gives_up_at = whole.randrange(len(reference)) if whole.random() < self.fail_p else None
        rng = self._rng(ctx)
        detours = ctx.extra.setdefault("scripted_detours", 0)
        at = ctx.step - detours  # where in the reference this sample is
        if at == gives_up_at:
            return GIVE_UP.get(ctx.suite, "stop []")
        if at >= len(reference) - 1:  # the final action
            return reference[-1]
        if rng.random() < self.detour_p:
            ctx.extra["scripted_detours"] = detours + 1
            return rng.choice(DETOURS.get(ctx.suite, ["WAIT"]))
        return reference[at]

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
