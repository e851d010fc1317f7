"""The replay policy: re-issues the calls of recorded trajectories, step by step, then their final action.

Owns: finding a rollout's recording (by task, group and sample) and handing out its calls in order; ``refuses`` a
task with no recording at all (a group or sample without one is only found when it is asked for).
Must never: invent a call: a rollout without a recording, or asked for more steps than recorded, is a
``PolicyError``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from bunshin.engine.records import Trajectory, read_jsonl
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import SuiteTask

from .base import Decision, Policy, PolicyContext, PolicyError


class ReplayPolicy(Policy):
    name = "replay"

    def __init__(self, trajectories: Iterable[Trajectory], source: str = "the recording"):
        self.recorded: dict[tuple[str, str, int], Trajectory] = {}
        for t in trajectories:
            self.recorded[(t.task_id, t.group_id, t.sample)] = t
        self.task_ids = {task_id for task_id, _, _ in self.recorded}
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayPolicy:
        return cls(read_jsonl(path), source=str(path))

    def refuses(self, task: SuiteTask) -> str | None:
        if task.id in self.task_ids:
            return None
        return f"replay policy: {self.source} has no recorded trajectory of task {task.id}"

    def recording(self, ctx: PolicyContext) -> Trajectory:
        try:
            return self.recorded[(ctx.task_id, ctx.group_id, ctx.sample)]
        except KeyError as exc:
            raise PolicyError(f"no recorded trajectory for task {ctx.task_id} group {ctx.group_id!r} sample "
                              f"{ctx.sample}") from exc

    async def decide(self, ctx: PolicyContext) -> Decision:
        t = self.recording(ctx)
        if ctx.step < len(t.steps):
            return Decision(action=t.steps[ctx.step].call)
        if ctx.step == len(t.steps) and t.final is not None:
            return Decision(action=t.final)
        raise PolicyError(f"the recording of task {ctx.task_id} sample {ctx.sample} has {len(t.steps)} steps "
                          f"and {'a' if t.final else 'no'} final action; step {ctx.step} was asked for")

    def final_of(self, ctx: PolicyContext) -> ToolCall | None:
        return self.recording(ctx).final
