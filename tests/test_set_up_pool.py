"""A suite that does not fork live (a real desktop): every sample gets a workspace of its own, set up ahead by the
suite, from the group's ``SetUpPool``; a failed set-up fails only the sample that would have taken it; the prefix
cache and speculation are refused; nothing stays open. On ``MemoryRuntime`` (any user) with the counter suite
made non-forking, so the engine's logic is what is tested; the real desktop runs it in test_osworld_suite.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from bunshin.engine.errors import NeedsLiveFork
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.records import Status
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.envs.memory_workspace import MemoryRuntime
from bunshin.envs.records import Observation
from bunshin.envs.suites.base import SuiteTask

from .test_engine_states import LIMITS, TASKS, CounterPolicy, CounterSuite, expected_reward

pytestmark = pytest.mark.asyncio


class UnforkableCounter(CounterSuite):
    forks_live: ClassVar[bool] = False

    def __init__(self, fail_setups: int = 0) -> None:
        self.started: list[str] = []
        self.fail_setups = fail_setups  # the n-th set-up (from 1) of each task fails

    async def start(self, ws: Any, task: SuiteTask) -> Observation:
        self.started.append(ws.id)
        if self.fail_setups and sum(1 for _ in self.started) % 3 == self.fail_setups:
            raise RuntimeError(f"set-up of {task.id} in {ws.id} broke")
        return await super().start(ws, task)


def _engine(suite: CounterSuite, tmp_path: Path, **kwargs: Any) -> RolloutEngine:
    return RolloutEngine(suite, CounterPolicy(steps=3, part=0.5), concurrency=4, call_timeout_s=30,
                         runtime=MemoryRuntime(state_dir=tmp_path, limits=LIMITS), **kwargs)


async def test_every_sample_has_a_set_up_workspace_of_its_own(tmp_path: Path) -> None:
    suite = UnforkableCounter()
    async with _engine(suite, tmp_path) as engine:
        results = await engine.run(engine.requests(sorted(TASKS), group_size=3, seed=7))
        runtime = engine.runtime
    trajectories = [r.trajectory for r in results]
    assert len(trajectories) == 9 and all(t.status is Status.OK for t in trajectories)
    for t in trajectories:
        assert t.lineage[0] == f"setup-pool:{t.task_id}" and t.reward == expected_reward(t)
    workspaces = [t.lineage[1] for t in trajectories]
    assert len(set(workspaces)) == 9 and set(workspaces) <= set(suite.started)  # none shared, each set up
    assert len(suite.started) == 9  # one set-up per sample: no root, no base forked
    assert runtime.workspaces == {}


async def test_a_failed_set_up_fails_only_the_sample_that_takes_it(tmp_path: Path) -> None:
    suite = UnforkableCounter(fail_setups=2)
    async with _engine(suite, tmp_path) as engine:
        results = await engine.run(engine.requests(["t0"], group_size=3, seed=1))
        runtime = engine.runtime
    statuses = sorted(r.trajectory.status.value for r in results)
    assert statuses.count(Status.OK.value) == 2 and len(statuses) == 3
    failed = next(r.trajectory for r in results if r.trajectory.status is not Status.OK)
    assert "broke" in (failed.error or "")
    assert runtime.workspaces == {}


async def test_the_prefix_cache_and_speculation_are_refused_for_a_suite_that_does_not_fork(tmp_path: Path) -> None:
    for kwargs, mode in (({"prefix": PrefixSettings()}, "prefix cache"),
                         ({"speculation": SpecSettings()}, "speculation")):
        with pytest.raises(NeedsLiveFork, match=f"suite counter: the {mode}|suite counter: {mode}"):
            _engine(UnforkableCounter(), tmp_path, **kwargs)


async def test_on_the_tree_fork_such_a_suite_forks_its_base_and_may_cache_and_speculate(tmp_path: Path) -> None:
    """The tree fork (``--backend kmod``) carries an application's programs, a real desktop's too: the groups fork
    their base as any suite's do, and the prefix cache and speculation are allowed."""
    suite = UnforkableCounter()
    async with _engine(suite, tmp_path, backend="kmod") as engine:
        results = await engine.run(engine.requests(["t0"], group_size=3, seed=7))
    assert all(r.trajectory.status is Status.OK for r in results)
    assert not any(r.trajectory.lineage[0].startswith("setup-pool:") for r in results)
    assert len(suite.started) == 1  # the base, set up once and forked for every sample
    for kwargs in ({"prefix": PrefixSettings()}, {"speculation": SpecSettings()}):
        assert _engine(UnforkableCounter(), tmp_path, backend="kmod", **kwargs).forks_live
