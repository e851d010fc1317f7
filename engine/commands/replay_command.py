"""``bunshin replay``: re-execute recorded trajectories in fresh workspaces and compare, step by step.

Owns: turning a recording back into requests (one per recorded group, with its run seed and size), the suite's
knobs as recorded (``recorded_knobs``), and the comparison ``{"trajectories", "identical_observations", "identical_rewards", "differences"}``.
Must never: call a trajectory reproduced unless its first observation, every step's observation and its reward are
equal to the recording's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bunshin.envs.suites.base import Suite

from ..errors import CommandError
from ..records import RolloutRequest, TaskSpec, read_jsonl
from ..rollout import RolloutEngine


def recorded_knobs(path: Path, given: Iterable[str]) -> dict[str, Any]:
    """The suite knobs the recording ``path`` was made with, from the ``summary.json`` ``bunshin eval`` wrote beside
    it ({} without one, or from an older eval that did not record them), less the knobs in ``given`` (what the
    command line names wins): a recording made in Chromium replays in Chromium without being told."""
    summary = path.parent / "summary.json"
    try:
        knobs = json.loads(summary.read_text()).get("knobs") or {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, AttributeError) as exc:
        raise CommandError(f"{summary}: cannot read the recording's knobs from it ({exc}); move it away or name "
                           f"the knobs with --set") from exc
    if not isinstance(knobs, dict):
        raise CommandError(f"{summary}: its knobs are not a mapping of name to value")
    skip = set(given)
    return {str(k): v for k, v in knobs.items() if k not in skip}


async def run_replay(suite: Suite, path: Path, *, backend: str = "cow", concurrency: int = 8,
                     image: str | None = None, runtime_kind: str = "native") -> dict[str, Any]:
    """Re-execute recorded trajectories in fresh workspaces; compare observations and rewards step by step."""
    from bunshin.policies.replay import ReplayPolicy

    recorded = list(read_jsonl(path))
    policy = ReplayPolicy.from_file(path)
    requests, seen = [], set()
    for t in recorded:
        if t.group_id not in seen:
            seen.add(t.group_id)
            size = sum(1 for u in recorded if u.group_id == t.group_id)
            requests.append(RolloutRequest(task=TaskSpec(suite=t.suite, task_id=t.task_id), group_size=size,
                                           seed=t.run_seed, group_id=t.group_id))
    async with RolloutEngine(suite, policy, backend=backend, concurrency=concurrency, image=image,
                             runtime_kind=runtime_kind) as engine:
        replayed = {(r.trajectory.group_id, r.trajectory.sample): r.trajectory
                    for r in await engine.run(requests)}
    same_obs = same_reward = 0
    differences = []
    for t in recorded:
        again = replayed.get((t.group_id, t.sample))
        if again is None:
            differences.append({"task": t.task_id, "sample": t.sample, "what": "not replayed"})
            continue
        obs_equal = (again.first_observation == t.first_observation
                     and [s.observation for s in again.steps] == [s.observation for s in t.steps])
        same_obs += obs_equal
        same_reward += again.reward == t.reward
        if not obs_equal or again.reward != t.reward:
            differences.append({"task": t.task_id, "sample": t.sample, "observations_equal": obs_equal,
                                "reward": [t.reward, again.reward], "status": [t.status, again.status]})
    return {"trajectories": len(recorded), "identical_observations": same_obs, "identical_rewards": same_reward,
            "differences": differences[:20]}
