"""Scale-out on a real Ray cluster: several raylets on this machine (``ray.cluster_utils.Cluster``), one node agent
each. The same seeds give the same trajectories and rewards as one host; a second group of a task goes to the node
holding its root; a node killed mid-epoch loses only its rollouts, which run again elsewhere with the same seeds,
each rollout ending exactly once, and nothing of the dead node's run is left on the machine."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path

import msgspec
import pytest

ray = pytest.importorskip("ray", reason="the cluster tests need Ray: the `trainers` extra (ray[default]==2.60.0)")

from bunshin.engine.cluster.driver import ClusterEngine
from bunshin.engine.cluster.local import local_cluster, ray_processes
from bunshin.engine.cluster.placement import app_key
from bunshin.engine.records import RolloutResult, Status, Trajectory, read_jsonl
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.runtime.cleanup import process_start_time
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import host_processes, leftovers
from .quiet import settled, until

pytestmark = pytest.mark.slow

CATALOG = 200
TASKS = 4
GiB = 1 << 30


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cluster-tasks")
    generator.write(directory, generator.generate(CATALOG, 0)[:TASKS])
    return directory


@pytest.fixture(scope="module")
def cluster():
    """A head and two more raylets; the test process is the driver (connected to the head, which is never
    killed). Afterwards: no Ray process of the cluster is left (``local_cluster`` checks it)."""
    with local_cluster(3) as c:
        session = c.head_node.get_session_dir_path()
        ray.init(address=c.address, log_to_driver=False)
        try:
            yield c
        finally:
            ray.shutdown()
    assert ray_processes(session) == []
    assert not Path(session).exists()  # Ray's logs and sockets of the cluster: removed with it
    assert host_processes() == []  # no workspace host or nursery of any agent's run


def shop(task_dir: Path) -> WebShopSuite:
    return WebShopSuite(catalog_size=CATALOG, tasks_dir=task_dir, time_scale=0.0)


def policy(time_scale: float = 0.0) -> ScriptedPolicy:
    return ScriptedPolicy(time_scale=time_scale)


def digest(t: Trajectory) -> str:
    """What must not depend on the node: the calls, the observations, the final answer and the reward."""
    data = msgspec.to_builtins({"first": t.first_observation, "calls": [s.call for s in t.steps],
                                "observations": [s.observation for s in t.steps], "final": t.final,
                                "reward": t.reward, "status": t.status, "seed": t.seed})
    return hashlib.sha256(msgspec.json.encode(data)).hexdigest()


def by_sample(results: list[RolloutResult]) -> dict[tuple[str, int], str]:
    keyed = {(r.trajectory.group_id, r.trajectory.sample): digest(r.trajectory) for r in results}
    assert len(keyed) == len(results), "a rollout was delivered twice"
    return keyed


async def one_host(task_dir: Path, state_dir: Path, seed: int, group_size: int) -> dict[tuple[str, int], str]:
    async with RolloutEngine(shop(task_dir), policy(), concurrency=4, state_dir=state_dir) as engine:
        results = await engine.run(engine.requests(group_size=group_size, seed=seed))
    return by_sample(results)


AGENTS_S = 30.0  # how long the agents (Ray actors: other processes) get to report, or to close their runs


def run_leftovers(run_id: str, run_dir: str) -> list[str]:
    """What is left of one run on this machine: mounts, cgroups, its directory and engine record (its processes
    are in its cgroups: a cgroup gone means they are)."""
    return [x for x in leftovers(run_id, Path(run_dir)) if not x.startswith(("host process", "unreaped"))]


@pytest.mark.asyncio
async def test_the_same_seeds_give_the_same_trajectories_on_one_host_and_on_the_cluster(cluster, task_dir,
                                                                                       state_dir) -> None:
    reference = await one_host(task_dir, state_dir, seed=7, group_size=2)
    before = set(asyncio.all_tasks())
    async with ClusterEngine(shop(task_dir), policy(), concurrency=2, state_dir=state_dir) as engine:
        assert len(engine.infos) == 3
        results = await engine.run(engine.requests(group_size=2, seed=7))
        infos = list(engine.infos.values())
    # the status poller, the meter's reader and the stream's producer ended with the engine
    assert {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()} == set()
    assert by_sample(results) == reference
    assert all(r.trajectory.status == Status.OK and not r.retried for r in results)
    assert len({r.node for r in results}) >= 2  # the batch did spread over the cluster
    rewards = [r.trajectory.reward for r in results]
    assert 0 < sum(rewards) < len(rewards)  # the scripted policy's deviations: not a trivially equal batch
    for info in infos:  # every agent closed its run (and stopped its guardian)
        assert await settled(lambda info=info: run_leftovers(info.run_id, info.run_dir), AGENTS_S) == []
        assert await settled(lambda info=info: [p for p in (info.pid, info.guardian_pid) if _alive(p)], AGENTS_S) == []


@pytest.mark.asyncio
async def test_a_second_group_of_a_task_goes_to_the_node_holding_its_root(cluster, task_dir, state_dir) -> None:
    # With a budget, a group without a root to fork would go where memory is most free: a node without one.
    async with ClusterEngine(shop(task_dir), policy(), concurrency=4, memory_budget=8 * GiB,
                             state_dir=state_dir) as engine:
        ids = list(engine.tasks)
        first = await engine.run(engine.requests(ids[:1], group_size=2, seed=1))
        home = {r.node for r in first}
        assert len(home) == 1
        key = app_key(msgspec.json.encode(engine.suite.app(engine.tasks[ids[0]])))
        (node,) = home

        def reported() -> bool:  # the agents' status reports have the root and its charge (its memory)
            home_status, others = engine.statuses.get(node), [s for n, s in engine.statuses.items() if n != node]
            return home_status is not None and key in home_status.roots and all(
                home_status.charge > s.charge for s in others)

        assert await until(reported, AGENTS_S), engine.statuses
        second = await engine.run(engine.requests(ids[:1], group_size=2, seed=2))
        third = await engine.run(engine.requests(ids[1:2], group_size=2, seed=1))  # same application, other task
    assert {r.node for r in second} == home and {r.node for r in third} == home
    assert all(r.trajectory.status == Status.OK for r in first + second + third)


@pytest.mark.asyncio
async def test_the_prefix_cache_and_speculation_on_the_cluster_change_no_trajectory(cluster, task_dir, state_dir,
                                                                                     tmp_path) -> None:
    """Two epochs on the cluster with every node's prefix cache and speculation (a selector trained on a recorded
    run): the same trajectories as one host without either; each task's second group goes to the node holding its
    prefix tree, whose cache serves it; the figures are the nodes' summed."""
    from bunshin.engine.prefix.settings import PrefixSettings
    from bunshin.engine.records import write_jsonl
    from bunshin.engine.speculation.settings import SpecSettings

    reference: dict[tuple[str, int], str] = {}
    recorded: list[Trajectory] = []
    async with RolloutEngine(shop(task_dir), policy(), concurrency=4, state_dir=state_dir) as engine:
        for seed in (7, 8):
            results = await engine.run(engine.requests(group_size=3, seed=seed))
            reference.update(by_sample(results))
            recorded += [r.trajectory for r in results]
    train = tmp_path / "recorded.jsonl"
    write_jsonl(train, recorded)
    # two groups' worth of slots per node: a task's home node has room for its second group (placement prefers
    # the prefix among the nodes with room; a full home would send it elsewhere)
    async with ClusterEngine(shop(task_dir), policy(0.02), concurrency=6, state_dir=state_dir,
                             prefix=PrefixSettings(), speculation=SpecSettings(train_file=train)) as engine:
        first = await engine.run(engine.requests(group_size=3, seed=7))
        second = await engine.run(engine.requests(group_size=3, seed=8))
        await engine.refresh()
        cache, spec = engine.prefix_statistics(), engine.speculation_statistics()
        held = {n: set(s.prefixes) for n, s in engine.statuses.items()}
    assert {**by_sample(first), **by_sample(second)} == reference
    home = {r.trajectory.task_id: r.node for r in first}
    assert len(set(home.values())) >= 2  # the first epoch spread over the cluster
    assert {(r.trajectory.task_id, r.node) for r in second} == set(home.items())  # each task back to its prefix
    for task, node in home.items():
        assert task in held[node]  # the node reports the task's prefix tree
    assert cache is not None and cache["hits"] > 0 and cache["hit_rate"] == round(
        cache["hits"] / (cache["hits"] + cache["misses"]), 4)
    assert spec is not None and spec["decisions"] > 0 and spec["spec_top1"] == round(
        spec["top1_hits"] / spec["decisions"], 4)


def _alive(pid: int) -> bool:
    return process_start_time(pid) is not None and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def victim(cluster):
    """A raylet of its own for a test to kill (Ray starts a node from the main thread only: not in the test's
    event loop); removed afterwards if the test did not."""
    node = cluster.add_node(num_cpus=1, object_store_memory=100 << 20)
    cluster.wait_for_nodes()
    yield node
    if node in cluster.worker_nodes:
        cluster.remove_node(node, allow_graceful=False)


@pytest.mark.asyncio
async def test_a_node_killed_mid_epoch_loses_only_its_rollouts(cluster, victim, task_dir, state_dir) -> None:
    """The victim is first in the node order, so it is given work first; once one of its results has arrived it
    is killed (raylet and workers, no grace). Its finished result is kept, its unfinished samples run again on
    the other nodes with the same seeds (the trajectories equal one host's), marked retried; every rollout ends
    exactly once; its run is removed from the machine by its guardian."""
    reference = await one_host(task_dir, state_dir, seed=11, group_size=3)
    others = [n["NodeID"] for n in await asyncio.to_thread(ray.nodes) if n["Alive"] and n["NodeID"] != victim.node_id]
    async with ClusterEngine(shop(task_dir), policy(time_scale=0.1), concurrency=3, state_dir=state_dir,
                             nodes=[victim.node_id, *others[:1]]) as engine:
        dead = engine.infos[victim.node_id]
        results: list[RolloutResult] = []
        killed_at = None
        async with contextlib.aclosing(engine.stream(engine.requests(group_size=3, seed=11))) as stream:
            async for result in stream:
                results.append(result)
                if killed_at is None and result.node == victim.node_id:
                    killed_at = len(results)
                    await asyncio.to_thread(cluster.remove_node, victim, False)
        assert killed_at is not None, "the victim delivered nothing before the batch ended"
        assert victim.node_id in engine.dead
        # nothing of the dead agent's run is left (its guardian removed it), while the others run on
        assert await settled(lambda: run_leftovers(dead.run_id, dead.run_dir), AGENTS_S) == []
        assert not _alive(dead.pid)
        assert await settled(lambda: [p for p in [dead.guardian_pid] if _alive(p)], AGENTS_S) == []
        survivors = [i for n, i in engine.infos.items() if n != victim.node_id]
    assert by_sample(results) == reference  # all of them, once each, the same as on one host
    retried = [r for r in results if r.retried]
    assert retried, "the victim had unfinished rollouts when it was killed"
    assert all(r.node != victim.node_id and r.trajectory.attempts == 2 for r in retried)
    assert all(r.trajectory.status == Status.OK for r in results)
    # what the victim delivered (before the kill, or finished while it was being killed) is kept, not run again
    assert all(not r.retried for r in results if r.node == victim.node_id)
    for info in survivors:
        assert await settled(lambda info=info: run_leftovers(info.run_id, info.run_dir), AGENTS_S) == []


@pytest.mark.asyncio
async def test_with_no_node_left_the_rest_end_as_node_lost(cluster, victim, task_dir, state_dir) -> None:
    async with ClusterEngine(shop(task_dir), policy(time_scale=0.1), concurrency=2, state_dir=state_dir,
                             nodes=[victim.node_id]) as engine:
        dead = engine.infos[victim.node_id]
        results: list[RolloutResult] = []
        async with contextlib.aclosing(engine.stream(engine.requests(group_size=2, seed=3))) as stream:
            async for result in stream:
                results.append(result)
                if len(results) == 1:
                    await asyncio.to_thread(cluster.remove_node, victim, False)
    assert len(by_sample(results)) == 2 * TASKS
    lost = [r for r in results if r.trajectory.status == Status.NODE_LOST]
    # each ends once, typed: those the victim had when it died were started once, the rest never
    assert lost and all(r.trajectory.error and r.trajectory.attempts <= 1 for r in lost)
    assert all(r.trajectory.status in (Status.OK, Status.NODE_LOST) for r in results)
    assert results[0].trajectory.status == Status.OK
    assert await settled(lambda: run_leftovers(dead.run_id, dead.run_dir), AGENTS_S) == []


def test_no_raylet_of_this_session_but_the_clusters(cluster) -> None:
    """Sanity of the leak check itself: it sees the live cluster's processes (so its empty answer after the
    module means something)."""
    assert ray_processes(cluster.head_node.get_session_dir_path())
    assert os.geteuid() == 0


def test_bunshin_eval_runs_the_same_job_on_a_cluster(cluster, task_dir, tmp_path) -> None:
    """``bunshin eval --ray ADDRESS`` (a separate driver process joining the cluster) writes the trajectories one
    host's ``bunshin eval`` writes, and says how the cluster ran them; so does ``--ray local:2 --prefix-cache
    --speculate`` (each node's cache and selector; a ``--cache-dir`` is refused on a cluster)."""
    import subprocess
    import sys

    def run(out: Path, *extra: str) -> list[Trajectory]:
        subprocess.run([sys.executable, "-m", "bunshin.engine.cli", "eval", "--suite", "webshop", "--catalog-size",
                        str(CATALOG), "--set", f"tasks_dir={task_dir}", "--policy", "scripted", "--time-scale", "0",
                        "--group-size", "2", "--concurrency", "2", "--seed", "5", "--out", str(out), *extra],
                       check=True, timeout=240, capture_output=True)
        return list(read_jsonl(out / "trajectories.jsonl"))

    here = run(tmp_path / "one")
    there = run(tmp_path / "cluster", "--ray", cluster.address)
    key = lambda t: (t.group_id, t.sample)  # noqa: E731
    assert [digest(t) for t in sorted(there, key=key)] == [digest(t) for t in sorted(here, key=key)]
    summary = msgspec.json.decode((tmp_path / "cluster" / "summary.json").read_bytes())
    assert summary["rollouts"] == 2 * TASKS and summary["cluster"]["nodes"] == 3
    assert summary["cluster"]["retried"] == 0 and len(summary["cluster"]["peak_bytes_per_node"]) == 3
    # two simulated nodes of its own, each with its prefix cache and speculation: the same trajectories
    both = run(tmp_path / "local2", "--ray", "local:2", "--prefix-cache", "--speculate")
    assert [digest(t) for t in sorted(both, key=key)] == [digest(t) for t in sorted(here, key=key)]
    summary = msgspec.json.decode((tmp_path / "local2" / "summary.json").read_bytes())
    assert summary["cluster"]["nodes"] == 2 and summary["prefix"] is not None and summary["speculation"] is not None
    assert summary["speculation"]["decisions"] > 0
    refused = subprocess.run([sys.executable, "-m", "bunshin.engine.cli", "eval", "--suite", "webshop", "--ray",
                              "local:2", "--prefix-cache", "--cache-dir", str(tmp_path / "c"), "--out",
                              str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "--cache-dir is not supported on a cluster" in refused.stderr
