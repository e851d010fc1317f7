"""``bunshin replay``: re-execute recorded trajectories in fresh workspaces and compare, step by step.

Owns: turning a recording back into requests (one per recorded group, with its run seed and size) and the
comparison ``{"trajectories", "identical_observations", "identical_rewards", "differences"}``.
Must never: call a trajectory reproduced unless its first observation, every step's observation and its reward are
equal to the recording's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bunshin.envs.suites.base import Suite

from ..records import RolloutRequest, TaskSpec, read_jsonl
from ..rollout import RolloutEngine


async def run_replay(suite: Suite, path: Path, *, backend: str = "cow", concurrency: int = 8) -> dict[str, Any]:
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
    async with RolloutEngine(suite, policy, backend=backend, concurrency=concurrency) as engine:
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
