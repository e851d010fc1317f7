"""Speculative tool execution in the real engine: rewards and observations identical in every mode (base, spec,
spec-readonly, prefix, full) with the grounded policy; wrong predictions of state-changing calls (a cart add, a file
write) never reaching a sample's workspace or observations; cancelling rollouts with branches in flight leaving no
workspace, process, cgroup or task behind."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bunshin.engine.bench.epoch import trajectories_sha256
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.records import Trajectory, canonical, write_jsonl
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.records import ToolCall
from bunshin.envs.runtime import await_points
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.webshop.suite import READ_ONLY, WebShopSuite
from bunshin.envs.workspace import Workspace
from bunshin.policies.grounded import GroundedPolicy

from .conftest import assert_no_leaks

pytestmark = pytest.mark.asyncio(loop_factories=["uvloop"])  # real engines: once is enough


def shop(time_scale: float = 0.0) -> WebShopSuite:
    return WebShopSuite(screenshots=False, keep_rasters=False, load_images=False, time_scale=time_scale)


def one_per_template(engine: RolloutEngine) -> list[str]:
    firsts: dict[str, str] = {}
    for task in engine.tasks.values():
        firsts.setdefault(task.template, task.id)
    return list(firsts.values())


async def run_epochs(suite: Suite, mode: str, state_dir: Path, ids: list[str] | None, seeds: list[int],
                     group: int, policy: GroundedPolicy, spec: SpecSettings | None = None,
                     ) -> tuple[list[list[Trajectory]], dict[str, Any] | None]:
    kwargs: dict[str, Any] = {}
    if mode in ("prefix", "full"):
        kwargs["prefix"] = PrefixSettings()
    if mode in ("spec", "spec-readonly", "full"):
        kwargs["speculation"] = spec or SpecSettings(read_only=mode == "spec-readonly")
    out = []
    async with RolloutEngine(suite, policy, concurrency=8, state_dir=state_dir, **kwargs) as engine:
        for seed in seeds:
            results = await engine.run(engine.requests(ids, group_size=group, seed=seed))
            out.append([r.trajectory for r in results])
        stats = engine.speculation_statistics()
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    return out, stats


async def test_rewards_and_observations_identical_in_every_mode(state_dir: Path) -> None:
    """One web-shop task of every template, groups of 2, two epochs; the policy reasons long enough for branches
    to run. Speculation is adopted (so the identity is not vacuous) and read-only mode adopts only read-only calls."""
    policy = GroundedPolicy(detour_p=0.15, time_scale=0.05)
    async with RolloutEngine(shop(), policy, state_dir=state_dir) as engine:
        ids = one_per_template(engine)
    runs = {mode: await run_epochs(shop(0.02), mode, state_dir, ids, [0, 1], 2, policy)
            for mode in ("base", "spec", "spec-readonly", "prefix", "full")}
    base = runs["base"][0]
    for mode, (epochs, _stats) in runs.items():
        for epoch, (mine, theirs) in enumerate(zip(epochs, base, strict=True)):
            assert [t.error for t in mine if t.error] == [], (mode, epoch)
            assert trajectories_sha256(mine) == trajectories_sha256(theirs), f"{mode} epoch {epoch} differs"
    for mode in ("spec", "full"):
        stats = runs[mode][1]
        assert stats is not None and stats["adopted"] > 0 and stats["decisions"] > 0, (mode, stats)
        speculated = [s for epoch in runs[mode][0] for t in epoch for s in t.steps if s.source == "speculated"]
        assert len(speculated) == stats["adopted"] - stats["branches_running"]
        assert all(s.saved_s >= 0 and s.tool_s >= 0 for s in speculated)
    readonly = [s for epoch in runs["spec-readonly"][0] for t in epoch for s in t.steps if s.source == "speculated"]
    assert all(s.call.name in READ_ONLY for s in readonly)


class StateRecorder:
    """A suite whose scoring first records the sample's workspace state: the shop's state and its latency chain
    (which hashes every call the workspace took), or the desktop's file."""

    states: dict[tuple[int, str], str]

    async def record_state(self, ws: Workspace, task: SuiteTask) -> None:
        parts = []
        for tool, args in self.state_tools:  # type: ignore[attr-defined]
            obs = await ws.execute(ToolCall(name=tool, args=args))
            parts.append(obs.output + msgspec.json.encode(obs.data).decode())
        self.states[(ws.seed, task.id)] = "\n".join(parts)


class RecordingShop(StateRecorder, WebShopSuite):
    state_tools = [("_shop_json", {}), ("_url", {}), ("_latency", {})]

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        await self.record_state(ws, task)
        return await super().evaluate(ws, task, final)


class RecordingDesktop(StateRecorder, DesktopSuite):
    state_tools = [("_read_file", {"path": "~/config/queue.ini"}), ("_latency", {})]

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        await self.record_state(ws, task)
        return await super().evaluate(ws, task, final)


def poisoned(trajectories: list[Trajectory], wrong: ToolCall) -> list[Trajectory]:
    """The recorded trajectories with every call and final replaced by ``wrong``: a selector trained on them
    predicts ``wrong`` everywhere, with certainty."""
    out = []
    for t in trajectories:
        steps = [msgspec.structs.replace(s, call=wrong) for s in t.steps]
        out.append(msgspec.structs.replace(t, steps=steps, final=wrong))
    return out


@pytest.mark.parametrize("case", ["cart_add", "file_write"])
async def test_a_wrong_prediction_never_leaks_into_a_trajectory(state_dir: Path, tmp_path: Path, case: str) -> None:
    """The selector is trained to predict one state-changing call everywhere (adding the product to the cart; a
    terminal command overwriting the file the task edits); every branch that runs it elsewhere is thrown away, and
    the samples' final workspace state and every observation equal the run without speculation."""
    policy = GroundedPolicy(detour_p=0.0, time_scale=0.1)  # reasoning of ~0.3 s a step: branches run meanwhile

    def make() -> StateRecorder:
        suite: Any = RecordingShop(screenshots=False, keep_rasters=False, load_images=False, time_scale=0.0) \
            if case == "cart_add" else RecordingDesktop(time_scale=0.0)
        suite.states = {}
        return suite

    clean_suite = make()
    async with RolloutEngine(clean_suite, policy, concurrency=4, state_dir=state_dir) as engine:  # type: ignore[arg-type]
        task = next(t for t in engine.tasks.values()
                    if t.template == ("add_to_cart" if case == "cart_add" else "ini_setting"))
        clean = [r.trajectory for r in await engine.run(engine.requests([task.id], group_size=2, seed=0))]
    assert all(t.reward == 1.0 for t in clean), [(t.reward, t.error) for t in clean]
    if case == "cart_add":  # the product page's "Add to Cart" click (the clean run's last call), as it made it
        wrong = clean[0].steps[-1].call
        assert wrong.name == "click" and "cart" in clean[0].steps[-1].observation.output.casefold()
    else:
        wrong = ToolCall(name="terminal", args={"command": "echo poisoned > ~/config/queue.ini", "timeout_s": 30.0})
    train = tmp_path / "poisoned.jsonl"
    write_jsonl(train, poisoned(clean, wrong) * 4)

    spec_suite = make()
    settings = SpecSettings(train_file=train, retrain_every=10**6, threshold=0.5, depth=2)
    async with RolloutEngine(spec_suite, policy, concurrency=4, state_dir=state_dir,  # type: ignore[arg-type]
                             speculation=settings) as engine:
        spec = [r.trajectory for r in await engine.run(engine.requests([task.id], group_size=2, seed=0))]
        stats = engine.speculation_statistics()
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    assert stats is not None and stats["wasted"] > 0 and stats["wasted_s"] > 0, stats
    assert stats["top1_hits"] < stats["decisions"]  # it was wrong, and its branches ran
    assert trajectories_sha256(spec) == trajectories_sha256(clean)
    assert spec_suite.states == clean_suite.states and len(clean_suite.states) == 2
    wrong_key = canonical(wrong)
    adopted = [s for t in spec for s in t.steps if s.source == "speculated"]
    assert all(canonical(s.call) == wrong_key for s in adopted)  # only the call it predicted, where it was right


async def test_cancelling_rollouts_with_branches_in_flight_leaves_nothing_behind(state_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """Tools that take a while (the shop's modelled latency) and a selector trained on a recorded run: branches
    are running when the consumer goes away; every branch and sample workspace is closed at once, and after the
    engine no task, process, mount or cgroup of the run remains."""
    policy = GroundedPolicy(detour_p=0.0, time_scale=0.3)
    async with RolloutEngine(shop(), GroundedPolicy(detour_p=0.0, time_scale=0.0), concurrency=4,
                             state_dir=state_dir) as engine:
        ids = one_per_template(engine)[:4]
        recorded = [r.trajectory for r in await engine.run(engine.requests(ids, group_size=2, seed=0))]
    train = tmp_path / "recorded.jsonl"
    write_jsonl(train, recorded)
    before = set(asyncio.all_tasks())
    branch_call = asyncio.Event()
    async with RolloutEngine(shop(0.5), policy, concurrency=8, state_dir=state_dir,
                             speculation=SpecSettings(train_file=train)) as engine:
        stream = engine.stream(engine.requests(ids, group_size=2, seed=0))
        with await_points.hook(lambda name: branch_call.set(), "speculation.branch.call"):
            consumer = asyncio.ensure_future(anext(stream))
            async with asyncio.timeout(60):
                await branch_call.wait()  # a branch has forked and is about to run its call
        assert engine.speculation_statistics()["branches_running"] > 0  # type: ignore[index]
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await stream.aclose()
        live = [ws for ws in engine.runtime.workspaces.values() if not ws.closed]
        assert live == engine.roots
        assert engine.speculation_statistics()["branches_running"] == 0  # type: ignore[index]
        runtime = engine.runtime
    assert {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()} == set()
    await assert_no_leaks(runtime)


async def test_a_selector_without_a_saved_model_learns_the_history_of_a_loaded_prefix_tree(state_dir: Path,
                                                                                           tmp_path: Path) -> None:
    """A cache directory written by a run without speculation holds the tree, not a selector: the next run's
    selector learns the tree's calls before its first rollout and predicts from the first decision; once a
    selector is saved there, it is loaded instead (the tree is not learned twice)."""
    policy = GroundedPolicy(detour_p=0.0, time_scale=0.0)
    prefix = PrefixSettings(cache_dir=tmp_path / "cache")
    async with RolloutEngine(shop(), policy, concurrency=4, state_dir=state_dir, prefix=prefix) as engine:
        ids = one_per_template(engine)[:2]
        first = [r.trajectory for r in await engine.run(engine.requests(ids, group_size=2, seed=0))]
    calls = sum(len(t.steps) for t in first)
    spec = SpecSettings(retrain_every=10**6)
    async with RolloutEngine(shop(), policy, concurrency=4, state_dir=state_dir, prefix=prefix,
                             speculation=spec) as engine:
        learned = engine.speculation_statistics()["examples"]  # type: ignore[index]
        assert 0 < learned <= calls * 8, (learned, calls)  # every node, weighted by its uses
        await engine.run(engine.requests(ids, group_size=2, seed=1))
        stats = engine.speculation_statistics()
        assert stats is not None and stats["top1_hits"] > 0 and stats["retrains"] >= 1
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    async with RolloutEngine(shop(), policy, concurrency=4, state_dir=state_dir, prefix=prefix,
                             speculation=spec) as engine:
        again = engine.speculation_statistics()["examples"]  # type: ignore[index]
    assert again == learned + stats["decisions"]  # what was saved: the history once, and the run's decisions


@pytest.mark.asyncio
async def test_the_cpu_rule_starts_no_branch_on_busy_cores_and_changes_no_trajectory(state_dir: Path,
                                                                                    tmp_path: Path) -> None:
    """A selector trained on a recorded run predicts well; with a CPU limit no machine can be under (a billionth
    busy), every prediction that clears the threshold waits for the cores and none is speculated; the trajectories
    are the recorded ones, and the figures say why."""
    policy = GroundedPolicy(detour_p=0.0, time_scale=0.05)
    async with RolloutEngine(shop(), policy, concurrency=4, state_dir=state_dir) as engine:
        ids = one_per_template(engine)[:3]
        recorded = [r.trajectory for r in await engine.run(engine.requests(ids, group_size=2, seed=0))]
    train = tmp_path / "recorded.jsonl"
    write_jsonl(train, recorded)
    settings = SpecSettings(train_file=train, retrain_every=10**6, cpu_limit=1e-9)
    async with RolloutEngine(shop(), policy, concurrency=4, state_dir=state_dir, speculation=settings) as engine:
        held = [r.trajectory for r in await engine.run(engine.requests(ids, group_size=2, seed=0))]
        stats = engine.speculation_statistics()
    assert stats is not None
    assert stats["speculated"] == 0 and stats["cpu_refused"] > 0 and stats["skipped_slots"] > 0
    assert 0 < stats["cpu_busy"] <= 1
    assert trajectories_sha256(held) == trajectories_sha256(recorded)
