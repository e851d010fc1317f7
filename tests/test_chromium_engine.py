"""The whole engine on the web shop in Chromium (``--browser chromium``): the prefix cache and speculation give the
trajectories the plain engine gives, later epochs served from the tree; a recorded run replays step for step; the
gymnasium adapter plays a reference episode; each leaves no Chromium behind. Speculation on a browser action forks
the Chromium workspace the way a sample's fork does (a clone with its browser restored or taken from the pool)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bunshin.engine.bench.epoch import trajectories_sha256
from bunshin.engine.commands.replay_command import run_replay
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.records import Trajectory, write_jsonl
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.envs.webshop.browser.actions import format_action
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.grounded import GroundedPolicy

from .conftest import assert_no_leaks
from .test_chromium_shop import chromium_processes
from .trajectory_diff import first_difference

TEMPLATES = ("search_for", "checkout")  # a search; an order: a cart add (a POST), then a form (a POST)
GROUP = 2


def chromium_shop() -> WebShopSuite:
    return WebShopSuite(catalog_size=500, time_scale=0.0, browser="chromium", screenshots=False)


def task_ids(suite: WebShopSuite) -> list[str]:
    firsts: dict[str, str] = {}
    for task in suite.tasks():
        firsts.setdefault(task.template, task.id)
    missing = [t for t in TEMPLATES if t not in firsts]
    assert not missing, f"templates {missing} are gone from the web shop: pick others"
    return [firsts[t] for t in TEMPLATES]


def sources(epoch: list[Trajectory]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in epoch:
        for s in t.steps:
            counts[s.source] = counts.get(s.source, 0) + 1
    return counts


async def epochs(state_dir: Path, seeds: list[int], **kwargs) -> tuple[list[list[Trajectory]], dict | None]:
    """Every seed's epoch in one engine, and speculation's figures read before it closes. The policy reasons a
    little (0.1 of its modelled time) so that speculative branches have time to start."""
    suite = chromium_shop()
    out = []
    async with RolloutEngine(suite, GroundedPolicy(detour_p=0.3, time_scale=0.1), concurrency=4,
                             state_dir=state_dir, **kwargs) as engine:
        for seed in seeds:
            results = await engine.run(engine.requests(task_ids(suite), group_size=GROUP, seed=seed))
            out.append([r.trajectory for r in results])
        spec = engine.speculation_statistics()
    await assert_no_leaks(engine.runtime)
    assert not chromium_processes(engine.runtime.run_id)
    return out, spec


@pytest.mark.timeout(900)  # two Chromium epochs each way, every prediction speculated: 1.5 to 3 min here
@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_prefix_cache_and_speculation_give_the_plain_engine_trajectories(state_dir: Path,
                                                                            tmp_path: Path) -> None:
    seeds = [0, 1]
    plain, _ = await epochs(state_dir, seeds)
    for epoch in plain:
        assert [t.error for t in epoch if t.error] == []
        assert sum(t.reward for t in epoch) > 0  # the grounded policy solves some in Chromium
    # every prediction speculated (threshold 0): what is checked is that speculation never changes a trajectory, and
    # it must happen whether or not the selector's model got confident in time (a busy CI machine once retrained
    # it too late: all 80 predictions under 0.5, nothing speculated)
    full, spec = await epochs(state_dir, seeds, prefix=PrefixSettings(), speculation=SpecSettings(threshold=0.0))
    for k, (a, b) in enumerate(zip(full, plain, strict=True)):
        assert trajectories_sha256(a) == trajectories_sha256(b), (f"epoch {k} differs with the cache and "
                                                                  f"speculation: {first_difference(a, b)}")
    assert sources(full[1]).get("cached", 0) > 0, sources(full[1])  # the second epoch is served from the tree
    assert spec is not None and spec["speculated"] > 0, f"{spec}"  # browser actions were speculated: Chromium forks
    # the recording replays step for step in fresh Chromium workspaces
    recorded = tmp_path / "trajectories.jsonl"
    write_jsonl(recorded, plain[0])
    report = await run_replay(chromium_shop(), recorded, concurrency=4)
    assert report["trajectories"] == len(plain[0])
    assert report["identical_observations"] == report["identical_rewards"] == len(plain[0]), report


_LINE = re.compile(r"\[(\d+)\] (\w+) '((?:[^'\\]|\\.)*)'")


def find(observation: str, target: str) -> int | None:
    """The id of a symbolic element (``@link 'Name'``) in the page the agent sees, or None."""
    role, name = target[1:].split(" ", 1)
    found = [int(i) for i, r, n in _LINE.findall(observation) if r == role and n == name.strip("'")]
    return found[0] if found else None


def agent_step(env, observation: str, call) -> str:
    """A reference step as an agent would take it: its symbolic element looked for in the viewport the agent sees,
    scrolling down until it shows; the observation after it."""
    target = call.args.get("element_id")
    if isinstance(target, str):
        for _ in range(6):
            if (element := find(observation, target)) is not None:
                break
            observation = env.step("scroll [down]")[0]
        assert element is not None, f"{target} never came into the page the agent sees:\n{observation[:3000]}"
        call = type(call)(name=call.name, args={**call.args, "element_id": element})
    observation, *rest = env.step(format_action(call))
    return observation, *rest


def test_the_gym_adapter_plays_a_reference_episode_in_chromium(state_dir: Path) -> None:
    gymnasium = pytest.importorskip("gymnasium", reason="the trainers extra (./scripts/setup.sh --trainers)")
    from bunshin.engine.adapters.gym import ENV_ID, env_class

    suite = chromium_shop()
    task = next(t for t in suite.tasks() if t.template == "add_to_cart")
    env_class()
    env = gymnasium.make(ENV_ID, suite=suite, task_id=task.id, state_dir=state_dir, max_steps=20)
    try:
        obs, _ = env.reset(seed=1)
        reward, terminated = 0.0, False
        for call in task.reference:
            obs, reward, terminated, truncated, _ = agent_step(env, obs, call)
            assert not obs.startswith("ERROR"), obs
        assert (reward, terminated) == (1.0, True)
        env.reset(seed=2)  # a fresh fork: the cart add above is not in it, stopping now scores 0
        assert env.step("stop []")[1:3] == (0.0, True)
        rt = env.unwrapped.session.runtime
    finally:
        env.close()
    assert not chromium_processes(rt.run_id)
