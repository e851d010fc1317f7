"""Where two epochs of the same rollouts first part: for the failure message of a test that expects them equal."""

from __future__ import annotations

import difflib

import msgspec

from bunshin.engine.bench.epoch import behaviour, rollout_key
from bunshin.engine.records import Step, Trajectory
from bunshin.envs.records import canonical
from bunshin.envs.suites.base import observation_text


def first_difference(got: list[Trajectory], expected: list[Trajectory]) -> str:
    """Where two epochs first part: the rollout, the step, where the engine's step came from, and the lines of the
    observations that differ."""
    expected_by_key = {rollout_key(t): t for t in expected}
    for t in sorted(got, key=rollout_key):
        other = expected_by_key[rollout_key(t)]
        if behaviour(t) == behaviour(other):
            continue
        errors = f"errors: got {t.error!r}, expected {other.error!r}\n" if t.error or other.error else ""
        for i, (x, y) in enumerate(zip(t.steps, other.steps, strict=False)):
            if _step_behaviour(x) != _step_behaviour(y):
                diff = difflib.unified_diff(observation_text(y.observation).splitlines(),
                                            observation_text(x.observation).splitlines(), "expected", "got", n=1,
                                            lineterm="")
                return errors + (f"{rollout_key(t)} step {i} ({x.call} from {x.source}; expected: {y.call}):\n"
                        + "\n".join(list(diff)[:40]))
        return errors + f"{rollout_key(t)}: {behaviour(t)} vs {behaviour(other)}"[:4000]
    return "no rollout differs"


def _step_behaviour(step: Step) -> tuple[bytes, object]:
    return canonical(step.call), msgspec.to_builtins(step.observation)
