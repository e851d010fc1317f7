"""A trainer that pulls: ask the engine for a batch of whole GRPO groups, "train" on it, move the policy version on,
and ask again, while the engine keeps rolling out at most ``--max-staleness`` versions ahead.

    sudo .venv/bin/python examples/pull_trainer.py --steps 4 --batch 8 --group-size 4

Root is needed (workspaces use namespaces, mounts and cgroups). The requests never run out (the task list is cycled
with a new seed each pass): the pull stops when the engine closes. Each batch line shows the versions the rollouts
started under and their staleness when handed out.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics

from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.suites.registry import get_suite
from bunshin.policies.scripted import ScriptedPolicy


async def main(steps: int, batch: int, group_size: int, max_staleness: int, suite_name: str,
               time_scale: float) -> None:
    async with RolloutEngine(get_suite(suite_name), ScriptedPolicy(time_scale=time_scale), concurrency=8) as engine:
        endless = (r for epoch in itertools.count()
                   for r in engine.requests(group_size=group_size, seed=epoch))
        engine.pull(endless, batch_size=batch, max_staleness=max_staleness)
        for step in range(steps):
            results = await engine.get_batch(batch)
            rewards = [r.trajectory.reward for r in results]
            print(f"step {step}: {len(results)} rollouts, mean reward {statistics.fmean(rewards):.2f}, "
                  f"started under versions {sorted({r.policy_version for r in results})}, "
                  f"staleness {sorted({r.staleness for r in results})}, engine {engine.pull_statistics()}")
            engine.set_policy_version(engine.policy_version + 1)  # the trainer updated the served weights


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--suite", default="webshop")
    parser.add_argument("--time-scale", type=float, default=0.05)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.batch, args.group_size, args.max_staleness, args.suite, args.time_scale))
