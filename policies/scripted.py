"""The scripted policy: follows the task's reference solution with seeded deviations and a model of reasoning time.

Owns: the deviation rules. Deviations, drawn from the sample's seed, make a GRPO group
explore and earn different rewards: at each step a detour with probability ``detour_p`` (an extra step that
leaves the task solvable: a scroll, a ``WAIT``), and once per rollout, with probability ``fail_p``, giving up at a
random step of the reference (an early ``stop []`` / ``FAIL``: reward 0 but for the tasks where giving up is
right). The reasoning time is ``latency.py``'s model.
A task without a reference solution (a real OSWorld or WebArena file) cannot be played: ``refuses`` names it, and
``decide`` on it raises ``PolicyError`` with the same reason (giving up at once would score infeasible tasks 1).
Must never: depend on anything but the context (same seed, same decisions).
"""

from __future__ import annotations

import random

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import SuiteTask

from .base import PolicyContext, PolicyError
from .latency import ModelledPolicy

DETOURS = {
    "webshop": ["scroll [down]", "scroll [up]"],
    "desktop": ["WAIT", "terminal: pwd", "terminal: ls"],
    "osworld": ["WAIT", "pyautogui.moveTo(960, 540)"],  # the pointer only: keys go where the focus is
}
GIVE_UP = {"webshop": "stop []", "desktop": "FAIL", "osworld": "FAIL"}


def no_reference(task_id: str) -> str:
    return (f"scripted policy: task {task_id} has no reference solution (the scripted policy replays a task's "
            "reference; use --policy grounded, replay:PATH or openai:URL)")


class ScriptedPolicy(ModelledPolicy):
    name = "scripted"

    def __init__(self, *, detour_p: float = 0.15, fail_p: float = 0.25, time_scale: float = 1.0,
                 median_tokens: float = 180.0, sigma: float = 0.7, tokens_per_s: float = 60.0,
                 sleep: bool = True):
        if not 0 <= detour_p < 1 or not 0 <= fail_p <= 1:
            raise ValueError(f"detour_p must be in [0, 1) and fail_p in [0, 1], got {detour_p}, {fail_p}")
        super().__init__(time_scale=time_scale, median_tokens=median_tokens, sigma=sigma, tokens_per_s=tokens_per_s,
                         sleep=sleep)
        self.detour_p, self.fail_p = detour_p, fail_p

    def _rng(self, ctx: PolicyContext) -> random.Random:
        return random.Random(f"scripted:{ctx.seed}:{ctx.task_id}:{ctx.sample}:{ctx.step}")

    def refuses(self, task: SuiteTask) -> str | None:
        return None if task.reference else no_reference(task.id)

    def plan(self, ctx: PolicyContext) -> str | ToolCall:
        """The action at ``ctx.step``: the reference's next step, a detour, or giving up."""
        reference = ctx.reference
        if not reference:
            raise PolicyError(no_reference(ctx.task_id))
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
