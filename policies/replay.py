"""The replay policy: re-issues the calls of recorded trajectories, step by step, then their final action.

Owns: ``Recording`` (what replaying needs of a recorded trajectory: its task, group and sample, each step's call,
its final action; read from the JSON Lines a run writes, every other field ignored), finding a rollout's recording
(by task, group and sample) and handing out its calls in order; ``refuses`` a task with no recording at all (a
group or sample without one is only found when it is asked for).
Must never: invent a call: a rollout without a recording, or asked for more steps than recorded, is a
``PolicyError``; nor import the engine (its ``Trajectory`` decodes the same lines, this module reads only its part).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import msgspec

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import SuiteTask

from .base import Decision, Policy, PolicyContext, PolicyError


class RecordedStep(msgspec.Struct, frozen=True, kw_only=True):
    call: ToolCall  # as the workspace took it


class Recording(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded rollout, as far as replaying it goes."""

    task_id: str
    group_id: str
    sample: int
    steps: list[RecordedStep] = []
    final: ToolCall | None = None


_decoder = msgspec.json.Decoder(Recording)


def read_recordings(path: str | Path) -> Iterator[Recording]:
    """The recordings of a JSON Lines file of trajectories; a bad line raises ``msgspec.ValidationError`` naming
    the file, the line and the field."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield _decoder.decode(line)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    raise msgspec.ValidationError(f"{path}:{number}: {exc}") from exc


class ReplayPolicy(Policy):
    name = "replay"

    def __init__(self, recordings: Iterable[Recording], source: str = "the recording"):
        self.recorded: dict[tuple[str, str, int], Recording] = {}
        for r in recordings:
            self.recorded[(r.task_id, r.group_id, r.sample)] = r
        self.task_ids = {task_id for task_id, _, _ in self.recorded}
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayPolicy:
        return cls(read_recordings(path), source=str(path))

    def refuses(self, task: SuiteTask) -> str | None:
        if task.id in self.task_ids:
            return None
        return f"replay policy: {self.source} has no recorded trajectory of task {task.id}"

    def recording(self, ctx: PolicyContext) -> Recording:
        try:
            return self.recorded[(ctx.task_id, ctx.group_id, ctx.sample)]
        except KeyError as exc:
            raise PolicyError(f"no recorded trajectory for task {ctx.task_id} group {ctx.group_id!r} sample "
                              f"{ctx.sample}") from exc

    async def decide(self, ctx: PolicyContext) -> Decision:
        r = self.recording(ctx)
        if ctx.step < len(r.steps):
            return Decision(action=r.steps[ctx.step].call)
        if ctx.step == len(r.steps) and r.final is not None:
            return Decision(action=r.final)
        raise PolicyError(f"the recording of task {ctx.task_id} sample {ctx.sample} has {len(r.steps)} steps "
                          f"and {'a' if r.final else 'no'} final action; step {ctx.step} was asked for")
