"""A trainer-style loop on BunshinRL: roll out GRPO groups on the embedded web shop and consume the results as
they finish, the way an asynchronous trainer does (compute group-relative advantages as soon as a whole group is
in, and go on training while the rest still runs).

    sudo .venv/bin/python examples/trainer_loop.py --groups 4 --group-size 4

Root is needed (workspaces use namespaces, mounts and cgroups). Swap ``ScriptedPolicy`` for
``OpenAIPolicy("http://127.0.0.1:8000/v1")`` to roll out a model served by vLLM or SGLang; its decisions carry
token ids and log-probs, kept in every step of the trajectory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from collections import defaultdict

from bunshin.engine.records import Trajectory
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.suites.registry import get_suite
from bunshin.policies.scripted import ScriptedPolicy


def advantages(group: list[Trajectory]) -> list[float]:
    """GRPO: each sample's reward minus its group's mean, over the group's standard deviation."""
    rewards = [t.reward for t in group]
    mean, spread = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
    return [(r - mean) / spread for r in rewards]


async def main(groups: int, group_size: int, suite_name: str, time_scale: float) -> None:
    suite = get_suite(suite_name)
    policy = ScriptedPolicy(time_scale=time_scale)
    async with RolloutEngine(suite, policy, concurrency=8) as engine:
        requests = engine.requests(limit=groups, group_size=group_size, seed=0)
        pending: dict[str, list[Trajectory]] = defaultdict(list)
        async with contextlib.aclosing(engine.stream(requests)) as results:
            async for result in results:
                t = result.trajectory
                pending[t.group_id].append(t)
                print(f"rollout done: task {t.task_id} sample {t.sample} status {t.status} reward {t.reward} "
                      f"steps {len(t.steps)}")
                if len(pending[t.group_id]) == group_size:  # a whole group: ready for a policy-gradient step
                    group = sorted(pending.pop(t.group_id), key=lambda x: x.sample)
                    adv = ", ".join(f"{a:+.2f}" for a in advantages(group))
                    print(f"  group {t.group_id} complete: advantages [{adv}] -> train on it now")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--suite", default="webshop")
    parser.add_argument("--time-scale", type=float, default=0.05)
    args = parser.parse_args()
    asyncio.run(main(args.groups, args.group_size, args.suite, args.time_scale))
