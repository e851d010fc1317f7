"""The prefix cache in the real engine: trajectories, observations and rewards identical with and without it,
every epoch, with the grounded policy on both suites; cached steps skipping their tool time; a corrupt or truncated
checkpoint, a full disk and a crash in the middle of a write each leaving the tree consistent and the run going;
an engine killed mid-epoch resuming from its cache directory; non-deterministic calls never served."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bunshin.engine.bench.epoch import trajectories_sha256
from bunshin.engine.prefix.cache import PrefixCache, Served, served
from bunshin.engine.prefix.cold import TREE_FILE
from bunshin.engine.prefix.errors import NonDeterministicTool
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.prefix.walk import Walk
from bunshin.engine.records import Trajectory
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.base import Decision, Policy, PolicyContext
from bunshin.policies.grounded import GroundedPolicy

from .conftest import assert_no_leaks, host_processes, leftovers
from .quiet import all_tasks_blocked, settled, until
from .trajectory_diff import first_difference

TASKS, GROUP = 4, 4
Baseline = dict[int, list[Trajectory]]  # the trajectories of epochs 0 and 1 without the cache
pytestmark = pytest.mark.asyncio(loop_factories=["uvloop"])  # real engines: once is enough


def shop() -> WebShopSuite:
    return WebShopSuite(screenshots=False, keep_rasters=False, load_images=False, time_scale=0.0)


def desktop() -> DesktopSuite:
    return DesktopSuite(time_scale=0.0)


def grounded() -> GroundedPolicy:
    return GroundedPolicy(detour_p=0.3, time_scale=0.0)  # detours make samples of a group part ways


async def epochs(engine: RolloutEngine, seeds: list[int], tasks: int = TASKS,
                 group: int = GROUP, ids: list[str] | None = None) -> list[list[Trajectory]]:
    out = []
    for seed in seeds:
        results = await engine.run(engine.requests(ids, limit=tasks if ids is None else None, group_size=group,
                                                   seed=seed))
        out.append([r.trajectory for r in results])
    return out


def one_per_template(engine: RolloutEngine) -> list[str]:
    """The first task of every template."""
    firsts: dict[str, str] = {}
    for task in engine.tasks.values():
        firsts.setdefault(task.template, task.id)
    return list(firsts.values())


def sources(trajectories: list[Trajectory]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in trajectories:
        for s in t.steps:
            counts[s.source] = counts.get(s.source, 0) + 1
    return counts


def assert_same(with_cache: list[list[Trajectory]], without: list[list[Trajectory]]) -> None:
    for epoch, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert [t.error for t in a if t.error] == [], epoch
        assert trajectories_sha256(a) == trajectories_sha256(b), f"epoch {epoch} differs"


@pytest.mark.parametrize("suite_name", ["webshop", "desktop"])
async def test_trajectories_identical_with_and_without_the_cache_every_epoch(state_dir: Path,
                                                                             suite_name: str) -> None:
    """One task of every template, groups of 3 (the grounded policy's detours part them), three epochs. The
    desktop's project_tests runs print their duration: the workspace's virtual clock (envs/virtual_clock.py) makes
    it a count of clock reads, so they are in too; test_a_call_that_answers_differently_is_never_served covers
    calls that do answer differently."""
    make = shop if suite_name == "webshop" else desktop
    seeds = [0, 1, 2]
    async with RolloutEngine(make(), grounded(), concurrency=8, state_dir=state_dir) as engine:
        ids = one_per_template(engine)
        assert len(ids) >= 8
        without = await epochs(engine, seeds, group=3, ids=ids)
    async with RolloutEngine(make(), grounded(), concurrency=8, state_dir=state_dir,
                             prefix=PrefixSettings()) as engine:
        with_cache = await epochs(engine, seeds, group=3, ids=ids)
        stats = engine.prefix_statistics()
        assert stats is not None
        engine.prefix_cache.tree.check()  # type: ignore[union-attr]
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    assert_same(with_cache, without)
    later = [s for epoch in with_cache[1:] for s in sources(epoch).items()]
    assert dict(later).get("cached", 0) > 0, later  # later epochs are served from the tree
    cached = [s for epoch in with_cache for t in epoch for s in t.steps if s.source == "cached"]
    assert all(s.tool_s == 0.0 for s in cached)
    assert stats["hits"] == len(cached) and stats["admitted"] > 0 and stats["nodes_hot"] > 0


async def test_a_cached_step_skips_the_time_its_tool_took(state_dir: Path) -> None:
    """With the environment's latency on, a hit skips what the call took when it was executed."""
    suite = WebShopSuite(screenshots=False, keep_rasters=False, load_images=False, time_scale=0.05)
    policy = GroundedPolicy(detour_p=0.0, time_scale=0.0)  # a group's samples agree: epoch 0 admits their calls
    async with RolloutEngine(suite, policy, concurrency=4, state_dir=state_dir, prefix=PrefixSettings()) as engine:
        first, second = await epochs(engine, [0, 1], tasks=2, group=2)
        stats = engine.prefix_statistics()
    executed = {s.call.name: s.tool_s for t in first for s in t.steps if s.source == "executed"}
    cached = [s for t in second for s in t.steps if s.source == "cached"]
    assert cached and min(executed.values()) > 0.01
    assert all(s.saved_s > 0.01 for s in cached)
    assert stats is not None and stats["tool_s_skipped"] == pytest.approx(sum(s.saved_s for s in cached), abs=0.01)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Baseline]:
    """Epochs 0 and 1 of the web shop without the cache: what every cache-directory test must reproduce."""
    async def run() -> Baseline:
        async with RolloutEngine(shop(), grounded(), concurrency=8,
                                 state_dir=tmp_path_factory.mktemp("baseline-state")) as engine:
            runs = await epochs(engine, [0, 1])
            return dict(zip([0, 1], runs, strict=True))

    yield asyncio.run(run())


def assert_reproduces(got: list[Trajectory], expected: list[Trajectory]) -> None:
    assert trajectories_sha256(got) == trajectories_sha256(expected), first_difference(got, expected)


async def cached_run(state_dir: Path, cache_dir: Path, seeds: list[int], *,
                     restores_pay: bool = False) -> tuple[list[list[Trajectory]], dict]:
    """``restores_pay``: treat a restore as free, so that every checkpoint on a rebuilt path is read (at time scale
    0 a replay costs milliseconds, and the cache would rather replay than restore)."""
    async with RolloutEngine(shop(), grounded(), concurrency=8, state_dir=state_dir,
                             prefix=PrefixSettings(cache_dir=cache_dir)) as engine:
        cache = engine.prefix_cache
        assert cache is not None
        if restores_pay:
            cache.cold.restore_s = -1.0  # type: ignore[union-attr]
        out = await epochs(engine, seeds)
        await cache.cold.writers.wait_idle()  # type: ignore[union-attr]
        cache.tree.check()
        stats = engine.prefix_statistics()
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    return out, stats  # type: ignore[return-value]


async def test_a_corrupt_chunk_and_a_truncated_manifest_are_dropped_and_rebuilt(state_dir: Path, tmp_path: Path,
                                                                                baseline: Baseline) -> None:
    cache_dir = tmp_path / "cache"
    (first,), stats = await cached_run(state_dir, cache_dir, [0])
    assert_reproduces(first, baseline[0])
    assert stats["writes"] > 0 and 0 < stats["bytes_written"] < stats["full_bytes"]
    store = cache_dir / "store"
    chunks = sorted((p for p in (store / "chunks").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    biggest = chunks[-1]  # a chunk of the application's state that most checkpoints share
    data = bytearray(biggest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    biggest.write_bytes(bytes(data))
    manifests = sorted((store / "nodes").iterdir())
    truncated = manifests[len(manifests) // 2]
    truncated.write_bytes(truncated.read_bytes()[:20])

    (second,), stats = await cached_run(state_dir, cache_dir, [1], restores_pay=True)
    assert_reproduces(second, baseline[1])
    assert stats["cold_dropped_on_open"] >= 1  # the truncated manifest: never loaded
    assert stats["cold_corrupt"] >= 1  # the flipped chunk: found when a restore read it, dropped, replayed
    assert stats["cold_loaded_nodes"] > 0 and stats["hits"] > 0


async def test_a_full_disk_while_writing_leaves_the_run_going(state_dir: Path, tmp_path: Path,
                                                              baseline: Baseline) -> None:
    image, mount = tmp_path / "small.img", tmp_path / "small"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "8M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        (first, second), stats = await cached_run(state_dir, mount / "cache", [0, 1])
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert_reproduces(first, baseline[0])
    assert_reproduces(second, baseline[1])
    assert stats["writes_failed"] > 0  # a state is ~100 MiB; the disk holds 8
    assert stats["hits"] > 0  # the hot side serves on


async def victim(state_dir: Path, cache_dir: Path, mode: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.prefix_victim", str(state_dir),
                                                str(cache_dir), mode, stdout=subprocess.PIPE,
                                                cwd=Path(__file__).parent.parent)


async def line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    return (await asyncio.wait_for(proc.stdout.readline(), 300)).decode()


async def wait_gone() -> None:
    """Hosts die with their engine (parent-death signal)."""
    assert await settled(host_processes) == []


async def test_an_engine_killed_mid_epoch_resumes_from_its_cache_dir(state_dir: Path, tmp_path: Path,
                                                                     baseline: Baseline) -> None:
    cache_dir = tmp_path / "cache"
    proc = await victim(state_dir, cache_dir, "kill")
    try:
        _, run_id, run_dir = (await line(proc)).split()
        while (text := await line(proc)) and text.strip() != "epoch 0 done":
            pass
        for _ in range(3):  # epoch 1 under way
            assert (await line(proc)).startswith("result 1 ")
        # the victim saves the tree file once checkpoints have landed
        assert await until((cache_dir / TREE_FILE).exists, 60)
    finally:
        proc.kill()
        await proc.wait()
    await wait_gone()
    (again,), stats = await cached_run(state_dir, cache_dir, [1])
    assert_reproduces(again, baseline[1])
    assert stats["cold_loaded_nodes"] > 0 and stats["hits"] > 0
    assert sources(again).get("cached", 0) > 0
    assert leftovers(run_id, Path(run_dir)) == []  # the killed run's workspaces went at the next start


async def test_a_crash_in_the_middle_of_a_checkpoint_write_loses_nothing_else(state_dir: Path, tmp_path: Path,
                                                                              baseline: Baseline) -> None:
    cache_dir = tmp_path / "cache"
    proc = await victim(state_dir, cache_dir, "crash:40")  # inside the first state written
    _, run_id, run_dir = (await line(proc)).split()
    assert proc.stdout is not None
    output = (await asyncio.wait_for(proc.stdout.read(), 300)).decode()
    assert await proc.wait() == -9 and "crashing" in output
    await wait_gone()
    assert list((cache_dir / "store" / "tmp").iterdir())  # the write's temporary files, as the crash left them
    (first,), stats = await cached_run(state_dir, cache_dir, [0])
    assert_reproduces(first, baseline[0])
    assert not list((cache_dir / "store" / "tmp").iterdir()) and stats["writes"] > 0


class ClockReader(Policy):
    """Reads the clock in the terminal, then gives up: a call that answers differently every time."""

    name = "clock-reader"

    async def decide(self, context: PolicyContext) -> Decision:
        if context.step == 0:
            return Decision(action=ToolCall(name="terminal", args={"command": "date +%s%N"}))
        return Decision(action=ToolCall(name="FAIL", args={}))


async def test_a_call_that_answers_differently_is_never_served(state_dir: Path) -> None:
    async with RolloutEngine(desktop(), ClockReader(), concurrency=4, state_dir=state_dir,
                             prefix=PrefixSettings()) as engine:
        first, second = await epochs(engine, [0, 1], tasks=1, group=3)
        stats = engine.prefix_statistics()
        tree = engine.prefix_cache.tree  # type: ignore[union-attr]
        (root,) = tree.roots.values()
        (child,) = root.children.values()
        assert child.non_cacheable
    assert sources(first + second) == {"executed": 6}
    assert stats is not None and stats["cache_non_deterministic"] >= 1 and stats["hits"] == 0
    outputs = {t.steps[0].observation.output for t in first + second}
    assert len(outputs) == 6


async def test_a_replay_that_answers_differently_marks_the_node_and_fails_only_that_rollout(state_dir: Path) -> None:
    """A node whose recorded answer the workspace no longer gives (a tool that changed behind the cache's back):
    the replay that rebuilds it notices, the node stops serving, ``NonDeterministicTool`` names the call."""
    async with RolloutEngine(desktop(), ClockReader(), concurrency=2, state_dir=state_dir,
                             prefix=PrefixSettings()) as engine:
        cache = engine.prefix_cache
        assert cache is not None
        task = next(iter(engine.tasks.values()))
        got = await cache.root(task, seed=1)
        assert got is not None
        root, _ = got
        call = ToolCall(name="terminal", args={"command": "echo hello"})
        node = cache.tree.restore(root, call, Served(call=call, observation=Observation(output="goodbye\n")), 0.1)
        with cache.tree.pin(node), pytest.raises(NonDeterministicTool, match="echo hello"):
            await cache.workspace_at(node, seed=2)
        assert node.non_cacheable and cache.tree.child(root, call) is None
        assert served(node).observation.output == "goodbye\n"
        runtime = engine.runtime
    await assert_no_leaks(runtime)
    assert os.path.exists(state_dir)


async def test_a_changed_configuration_or_code_starts_a_new_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    from bunshin.engine.prefix import cache as cache_module

    def namespace(suite: WebShopSuite) -> object:
        pc = cache_module.PrefixCache(PrefixSettings(), suite, setup=None, call_timeout_s=1.0)  # type: ignore[arg-type]
        return pc.namespace(task)

    task = shop().tasks()[0]
    same = namespace(shop())
    assert namespace(shop()) == same
    assert namespace(WebShopSuite(screenshots=False, keep_rasters=False, load_images=False, time_scale=0.5)) != same
    assert namespace(WebShopSuite(screenshots=True, keep_rasters=False, load_images=False, time_scale=0.0)) != same
    monkeypatch.setattr(cache_module, "code_version", lambda: "another version of the environment")
    assert namespace(shop()) != same


async def test_closing_the_cache_finishes_its_deletions_saves_the_tree_and_leaves_no_task(tmp_path: Path) -> None:
    """The cold store's background work is its own: a deletion just asked for is finished by ``close`` (not cut
    before it started), the pending save gives way to the last one, and nothing is left running."""
    before = asyncio.all_tasks()
    cache = PrefixCache(PrefixSettings(cache_dir=tmp_path / "cache"), shop(), setup=None,  # type: ignore[arg-type]
                        call_timeout_s=1.0)
    await cache.open([])
    cold = cache.cold
    assert cold is not None
    await asyncio.to_thread(cold.store.write_node, "evicted", [b"a state"])
    cold.delete(["evicted"])  # in the background: a thread deleting it, and a save of the tree soon
    assert asyncio.all_tasks() - before
    await cache.close()
    assert asyncio.all_tasks() == before
    assert cold.counts["deleted"] == 1 and cold.counts["saves"] >= 1 and (tmp_path / "cache" / TREE_FILE).exists()


async def test_closing_a_walk_in_the_middle_of_its_catch_up_stops_it_and_leaves_nothing(state_dir: Path) -> None:
    """A hit on a node without a snapshot starts a catch-up in the background (fork the root, replay the call);
    closing the walk while it is under way cancels it, releases the pins, and leaks no workspace."""
    async with RolloutEngine(desktop(), ClockReader(), concurrency=2, state_dir=state_dir,
                             prefix=PrefixSettings()) as engine:
        cache = engine.prefix_cache
        assert cache is not None
        task = next(iter(engine.tasks.values()))
        got = await cache.root(task, seed=1)
        assert got is not None
        root, _ = got
        call = ToolCall(name="terminal", args={"command": "echo hello"})
        with cache.tree.pin(root):
            ws = await cache.workspace_at(root, seed=1)
        try:
            answer = await ws.execute(call, timeout_s=30.0)
        finally:
            await ws.close()
        node = cache.tree.restore(root, call, Served(call=call, observation=answer), answer.tool_seconds)
        before = asyncio.all_tasks()
        walk = Walk(cache, engine.suite, task, root, seed=2, issuer="test", execute=engine.execute_call,
                    call_timeout_s=30.0)
        assert (await walk.step(call)).source == "cached"
        catching_up = walk.catching_up
        assert catching_up is not None
        await all_tasks_blocked()  # the catch-up waits on the workspace (a fork, a call)
        assert not catching_up.done()
        await walk.close()
        assert catching_up.cancelled() and walk.ws is None and node.pins == root.pins == 0
        await all_tasks_blocked()
        assert asyncio.all_tasks() <= before
        runtime = engine.runtime
    await assert_no_leaks(runtime)
