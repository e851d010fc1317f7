"""Pull mode (``engine.pull`` / ``engine.get_batch``): the run-ahead rule as a property, the puller's hand-out
(oldest first, whole groups, exactly once, stamped) driven by a group runner of the test's, and a real engine on the
web shop pulled by a trainer-shaped loop: staleness bounded, every rollout once, the same trajectories as ``run``,
the policy version on every decision, nothing left behind when the engine closes mid-pull."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.engine.pull import Puller, PullError, RunAhead
from bunshin.engine.records import RolloutRequest, Status, TaskSpec, Trajectory
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.base import Decision, Policy, PolicyContext, ServerConfigError
from bunshin.policies.scripted import ScriptedPolicy
from tests.quiet import all_tasks_blocked

from .conftest import assert_no_leaks

# -- the rule ---------------------------------------------------------------------------------------------------


def test_run_ahead_refuses_bad_bounds() -> None:
    with pytest.raises(PullError, match="batch_size"):
        RunAhead(batch_size=0, max_staleness=1, start_version=0)
    with pytest.raises(PullError, match="max_staleness"):
        RunAhead(batch_size=4, max_staleness=-1, start_version=0)
    rule = RunAhead(batch_size=4, max_staleness=0, start_version=3)
    assert rule.capacity(3) == 4 and rule.capacity(5) == 12
    rule.start(4, 3)
    with pytest.raises(PullError, match="may not start"):
        rule.start(1, 3)


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 6), k=st.integers(0, 3), group=st.integers(1, 3), v0=st.integers(0, 5),
       seed=st.integers(0, 2**32 - 1))
def test_in_order_consumption_is_never_more_than_k_versions_stale(batch: int, k: int, group: int, v0: int,
                                                                  seed: int) -> None:
    """Start groups whenever the rule allows, hand out ``batch`` rollouts in start order and move the version on:
    no rollout is ever older than ``k`` versions when handed out, and starts never pass the capacity."""
    print(f"seed={seed}")
    rng = random.Random(seed)
    batch = max(batch, group)
    rule = RunAhead(batch_size=batch, max_staleness=k, start_version=v0)
    version, started_at, handed = v0, [], 0
    for _ in range(60):
        if rng.random() < 0.6 and rule.may_start(group, version):
            rule.start(group, version)
            started_at.extend([version] * group)
        elif len(started_at) - handed >= batch:
            for v in started_at[handed:handed + batch]:
                assert version - v <= k
            handed += batch
            version += 1
        assert rule.started <= rule.capacity(version)
        assert rule.started - handed <= (k + 1) * batch + batch  # what is kept stays bounded


# -- the puller, driven by a group runner of the test's ------------------------------------------------------------


def request(n: int, size: int) -> RolloutRequest:
    return RolloutRequest(task=TaskSpec(suite="t", task_id=str(n)), group_size=size, seed=0, group_id=f"g{n}")


def runner(delays: random.Random, log: list[tuple[str, int]], fail_on: str | None = None, scale_s: float = 0.02
           ) -> Callable[[RolloutRequest, Callable[[Trajectory], Awaitable[None]]], Awaitable[None]]:
    """Groups whose rollouts take a random time up to ``scale_s`` (modelled), noted in ``log`` as they finish."""
    async def run_group(req: RolloutRequest, finish: Callable[[Trajectory], Awaitable[None]]) -> None:
        async def one(sample: int) -> None:
            await asyncio.sleep(delays.random() * scale_s)  # a modelled run time: groups finish out of order
            if req.group_id == fail_on:
                raise RuntimeError(f"bug in {req.group_id}")
            log.append((req.group_id, sample))
            await finish(Trajectory(task_id=req.task.task_id, suite="t", group_id=req.group_id, sample=sample,
                                    seed=sample))

        async with asyncio.TaskGroup() as tg:
            for s in range(req.group_size):
                tg.create_task(one(s))

    return run_group


@pytest.mark.asyncio
@pytest.mark.parametrize("k", [0, 2])
async def test_the_puller_hands_out_every_rollout_once_in_whole_groups_oldest_first(k: int) -> None:
    rng = random.Random(k)
    version = [0]
    finished: list[tuple[str, int]] = []
    puller = Puller([request(n, 3) for n in range(12)], batch_size=6, max_staleness=k, whole_groups=True,
                    version=lambda: version[0], run_group=runner(rng, finished), peak_bytes=lambda: 0)
    puller.start()
    seen: Counter[tuple[str, int]] = Counter()
    try:
        while True:
            stats = puller.statistics()
            assert stats["started"] <= stats["capacity"]
            assert stats["started"] - stats["handed_out"] <= (k + 1) * 6
            batch = await puller.get_batch(6)
            if not batch:
                break
            assert len(batch) == 6
            groups = Counter(r.trajectory.group_id for r in batch)
            assert all(c == 3 for c in groups.values())  # whole groups only
            versions = [r.policy_version for r in batch]
            assert versions == sorted(versions)  # oldest first
            for r in batch:
                assert r.staleness == version[0] - r.policy_version
                seen[(r.trajectory.group_id, r.trajectory.sample)] += 1
            version[0] += 1
            puller.version_changed()
    finally:
        await puller.close()
    assert puller.done
    assert set(seen.values()) == {1} and len(seen) == 36 == len(finished)


@pytest.mark.asyncio
async def test_the_puller_refuses_batches_and_groups_that_cannot_fit() -> None:
    async def refused(requests: list[RolloutRequest], n: int, match: str) -> None:
        puller = Puller(requests, batch_size=8, max_staleness=0, whole_groups=True, version=lambda: 0,
                        run_group=runner(random.Random(0), []), peak_bytes=lambda: 0)
        puller.start()
        try:
            with pytest.raises(PullError, match=match):
                async with asyncio.timeout(10):
                    await puller.get_batch(n)
        finally:
            await puller.close()

    await refused([request(0, 4)], 6, "whole groups of 4 cannot make 6")
    await refused([request(0, 4), request(1, 2)], 8, "one group size; group g1 has 2, earlier groups 4")
    with pytest.raises(PullError, match="can never start with batch_size=8"):  # known at once: refused at once
        Puller([request(0, 9)], batch_size=8, max_staleness=0, whole_groups=True, version=lambda: 0,
               run_group=runner(random.Random(0), []), peak_bytes=lambda: 0)


@pytest.mark.asyncio
async def test_a_failing_group_runner_is_raised_by_get_batch_not_hung_on() -> None:
    puller = Puller([request(n, 2) for n in range(4)], batch_size=4, max_staleness=1, whole_groups=True,
                    version=lambda: 0, run_group=runner(random.Random(1), [], fail_on="g1"), peak_bytes=lambda: 0)
    puller.start()
    try:
        with pytest.raises(RuntimeError, match="bug in g1"):
            async with asyncio.timeout(10):
                while await puller.get_batch(2):
                    pass
    finally:
        await puller.close()


@pytest.mark.asyncio
async def test_a_model_server_not_set_up_ends_the_pull_with_that_one_error() -> None:
    async def run_group(req: RolloutRequest, finish: Callable[[Trajectory], Awaitable[None]]) -> None:
        async def one(sample: int) -> None:
            if sample == 1:
                raise ServerConfigError("http://x/v1: add --enable-auto-tool-choice")
            await asyncio.Event().wait()  # a sample that never ends: the error must end the pull, not it

        async with asyncio.TaskGroup() as tg:
            for s in range(req.group_size):
                tg.create_task(one(s))

    puller = Puller([request(n, 2) for n in range(3)], batch_size=6, max_staleness=0, whole_groups=True,
                    version=lambda: 0, run_group=run_group, peak_bytes=lambda: 0)
    puller.start()
    try:
        with pytest.raises(ServerConfigError, match="enable-auto-tool-choice"):
            async with asyncio.timeout(10):
                await puller.get_batch(2)
    finally:
        await puller.close()


@pytest.mark.asyncio
async def test_the_run_ahead_bound_stops_starts_until_the_version_moves() -> None:
    version = [0]
    finished: list[tuple[str, int]] = []
    puller = Puller((request(n, 2) for n in itertools.count()), batch_size=4, max_staleness=1, whole_groups=True,
                    version=lambda: version[0], run_group=runner(random.Random(2), finished, scale_s=0.0),
                    peak_bytes=lambda: 0)
    puller.start()
    try:
        await all_tasks_blocked()  # an endless source: only (k + 1) * batch_size may start at version 0
        assert puller.statistics()["started"] == 8 and len(finished) == 8
        batch = await puller.get_batch(4)
        await all_tasks_blocked()
        assert puller.statistics()["started"] == 8  # handing out alone does not let more start: the version does
        version[0] = 1
        puller.version_changed()
        await all_tasks_blocked()
        assert puller.statistics()["started"] == 12
        assert [r.staleness for r in batch] == [0] * 4
    finally:
        await puller.close()


@pytest.mark.asyncio
async def test_closing_the_puller_ends_its_producer_and_every_running_group() -> None:
    """An endless source whose rollouts never end: ``close`` cancels the producer and its groups, and no task of
    the pull is left; a group's cleanup runs before ``close`` returns."""
    started, cleaned = [], []

    async def run_group(req: RolloutRequest, finish: Callable[[Trajectory], Awaitable[None]]) -> None:
        started.append(req.group_id)
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that itself awaits
            cleaned.append(req.group_id)

    before = set(asyncio.all_tasks())
    puller = Puller((request(n, 2) for n in itertools.count()), batch_size=4, max_staleness=0, whole_groups=True,
                    version=lambda: 0, run_group=run_group, peak_bytes=lambda: 0)
    puller.start()
    await all_tasks_blocked()
    assert started == ["g0", "g1"] and cleaned == []
    await puller.close()
    assert sorted(cleaned) == ["g0", "g1"]
    assert {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()} == set()


# -- a real engine ------------------------------------------------------------------------------------------------

CATALOG = 2000
TASKS = ["0", "14", "42", "49"]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pull-tasks")
    generator.write(directory, [t for t in generator.generate(CATALOG, 0) if str(t["task_id"]) in TASKS])
    return directory


class VersionWitness(Policy):
    """The scripted policy, noting the policy version each decision was asked under."""

    def __init__(self) -> None:
        self.inner = ScriptedPolicy(time_scale=0.0)
        self.seen: dict[tuple[str, int], list[int]] = {}

    async def decide(self, ctx: PolicyContext) -> Decision:
        self.seen.setdefault((ctx.group_id, ctx.sample), []).append(ctx.policy_version)
        return await self.inner.decide(ctx)


@pytest.mark.asyncio
async def test_a_trainer_pulling_from_the_engine_gets_every_rollout_once_within_the_bound(state_dir, task_dir
                                                                                          ) -> None:
    suite = WebShopSuite(catalog_size=CATALOG, tasks_dir=task_dir, time_scale=0.0)
    policy = VersionWitness()
    async with RolloutEngine(suite, ScriptedPolicy(time_scale=0.0), concurrency=4, state_dir=state_dir) as engine:
        reference = {(r.trajectory.group_id, r.trajectory.sample): r.trajectory
                     for r in await engine.run(engine.requests(TASKS, group_size=2, seed=5))}
    await assert_no_leaks(engine.runtime)

    engine = RolloutEngine(suite, policy, concurrency=4, state_dir=state_dir)
    async with engine:
        engine.pull(engine.requests(TASKS, group_size=2, seed=5), batch_size=4, max_staleness=0)
        with pytest.raises(PullError, match="already pulling"):
            engine.pull([], batch_size=4)
        got: dict[tuple[str, int], object] = {}
        step = 0
        while batch := await engine.get_batch(4):
            assert len(batch) == 4 and all(r.staleness == 0 for r in batch)
            for r in batch:
                key = (r.trajectory.group_id, r.trajectory.sample)
                assert key not in got
                got[key] = r
                assert min(policy.seen[key]) >= r.policy_version == step  # asked under its group's version or newer
            step += 1
            engine.set_policy_version(step)
        with pytest.raises(ValueError, match="older"):
            engine.set_policy_version(0)
    await assert_no_leaks(engine.runtime)
    assert set(got) == set(reference)
    for key, r in got.items():
        t, ref = r.trajectory, reference[key]
        assert t.status == ref.status == Status.OK
        assert (t.reward, [s.call for s in t.steps], t.final) == (ref.reward, [s.call for s in ref.steps], ref.final)


@pytest.mark.asyncio
async def test_closing_the_engine_mid_pull_leaves_nothing_behind(state_dir, task_dir) -> None:
    suite = WebShopSuite(catalog_size=CATALOG, tasks_dir=task_dir, time_scale=0.0)
    engine = RolloutEngine(suite, ScriptedPolicy(time_scale=0.02), concurrency=4, state_dir=state_dir)
    before = set(asyncio.all_tasks())
    async with engine:
        endless = (r for n in itertools.count() for r in engine.requests(TASKS, group_size=2, seed=n))
        engine.pull(endless, batch_size=4, max_staleness=1)
        first = await engine.get_batch(4)
        assert len(first) == 4
        stats = engine.pull_statistics()
        assert stats is not None and stats["started"] <= 8
    assert {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()} == set()
    await assert_no_leaks(engine.runtime)
