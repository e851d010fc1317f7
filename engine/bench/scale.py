"""``bunshin bench scale``: the same batch on 1, 2, 3... Ray nodes, and what a Ray hop costs beside a tool call.

Owns: per node count, a local cluster of that many simulated nodes (``engine/cluster/local.py``: raylets on this
machine, sharing its cores and memory, so only ratios mean anything), one ``ClusterEngine`` run of the batch and
its figures: ``{"nodes", "rollouts", "wall_s", "rollouts_per_s", "peak_bytes_per_node", "rewards_sha256",
"retried"}`` (the rewards' digest must be the same at every node count: the same seeds, the same results); then,
on the last cluster, the hop: the round trip of a Ray actor call carrying a tool call's observation (the batch's
mean observation size) against a trivial tool call on a workspace of that node. In this design tool calls never
cross Ray (the policy and the workspaces are on the same node; one message per finished rollout does), so the hop
is what a split (a policy on another node) would add per call. A table on stdout, JSON and a PNG on request.
Must never: report a ratio from runs whose rewards differ without saying so (``same_rewards`` is in the output).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs.suites.base import Suite
from bunshin.policies.base import Policy

from ..commands.flags import make_suite
from ..errors import CommandError
from ..records import Status, Trajectory
from ..report import human_bytes, markdown_table, percentile, pyplot, write_json

HOP_CALLS = 200


def rewards_sha256(trajectories: list[Trajectory]) -> str:
    rows = sorted((t.group_id, t.sample, t.reward, str(t.status)) for t in trajectories)
    return hashlib.sha256(msgspec.json.encode(rows)).hexdigest()


def mean_observation_bytes(trajectories: list[Trajectory]) -> int:
    sizes = [len(msgspec.json.encode(s.observation)) + len(msgspec.json.encode(s.call))
             for t in trajectories for s in t.steps]
    return int(sum(sizes) / len(sizes)) if sizes else 1024


async def measure(address: str, suite: Suite, policy: Policy, nodes: int, *, tasks: int, group_size: int,
                  concurrency: int, seed: int, hop: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    import ray

    from ..cluster.driver import ClusterEngine

    await asyncio.to_thread(ray.init, address=address, log_to_driver=False)
    try:
        async with ClusterEngine(suite, policy, concurrency=concurrency) as engine:
            requests = engine.requests(limit=tasks, group_size=group_size, seed=seed)
            started = time.monotonic()
            results = await engine.run(requests)
            wall = time.monotonic() - started
            trajectories = [r.trajectory for r in results]
            row = {"nodes": nodes, "rollouts": len(results), "wall_s": round(wall, 3),
                   "rollouts_per_s": round(len(results) / wall, 3) if wall > 0 else 0.0,
                   "peak_bytes_per_node": max(engine.node_peaks.values(), default=0),
                   "rewards_sha256": rewards_sha256(trajectories),
                   "retried": sum(t.attempts > 1 for t in trajectories),
                   "ok": sum(t.status == Status.OK for t in trajectories)}
            hop_row = await measure_hop(engine, mean_observation_bytes(trajectories)) if hop else None
    finally:
        await asyncio.to_thread(ray.shutdown)
    return row, hop_row


async def measure_hop(engine: Any, payload_bytes: int) -> dict[str, Any]:
    agent = next(iter(engine.agents.values()))
    payload = b"x" * payload_bytes
    for _ in range(10):  # warm the connection
        await agent.echo.remote(payload)
    hops = []
    for _ in range(HOP_CALLS):
        started = time.perf_counter()
        await agent.echo.remote(payload)
        hops.append(time.perf_counter() - started)
    calls = await agent.probe_calls.remote(HOP_CALLS)
    hop, call = percentile(hops, 50), percentile(calls, 50)
    return {"payload_bytes": payload_bytes, "ray_hop_p50_ms": round(hop * 1e3, 3),
            "ray_hop_p90_ms": round(percentile(hops, 90) * 1e3, 3), "tool_call_p50_ms": round(call * 1e3, 3),
            "tool_call_p90_ms": round(percentile(calls, 90) * 1e3, 3),
            "hop_per_call": round(hop / call, 3) if call > 0 else None}


COLUMNS = [("nodes", "nodes"), ("rollouts", "rollouts"), ("wall_s", "wall s"), ("rollouts_per_s", "rollouts/s"),
           ("speedup", "speed-up"), ("peak", "peak per node"), ("retried", "retried"), ("digest", "rewards sha256")]


def table(rows: list[dict[str, Any]], hop: dict[str, Any] | None) -> str:
    base = rows[0]["rollouts_per_s"] if rows and rows[0]["rollouts_per_s"] else None
    shown = [{**r, "peak": human_bytes(r["peak_bytes_per_node"]), "digest": r["rewards_sha256"][:12],
              "speedup": f"{r['rollouts_per_s'] / base:.2f}x" if base else "-"} for r in rows]
    text = markdown_table(shown, COLUMNS)
    if hop is not None:
        text += "\n\n" + markdown_table([hop], [("payload_bytes", "payload bytes"), ("ray_hop_p50_ms", "Ray hop p50 ms"),
                                                ("ray_hop_p90_ms", "p90 ms"), ("tool_call_p50_ms", "tool call p50 ms"),
                                                ("tool_call_p90_ms", "p90 ms"), ("hop_per_call", "hop / call")])
    return text


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    nodes = [r["nodes"] for r in rows]
    ax1.plot(nodes, [r["rollouts_per_s"] for r in rows], marker="o")
    ax1.set_xlabel("nodes (simulated, one machine)")
    ax1.set_ylabel("rollouts / s")
    ax1.set_xticks(nodes)
    ax1.set_ylim(bottom=0)
    ax1.grid(alpha=0.3)
    ax2.plot(nodes, [r["peak_bytes_per_node"] / (1 << 20) for r in rows], marker="o", color="tab:orange")
    ax2.set_xlabel("nodes")
    ax2.set_ylabel("peak memory per node (MiB)")
    ax2.set_xticks(nodes)
    ax2.set_ylim(bottom=0)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command(args: Any) -> int:
    """Each node count in its own local cluster (made and removed from the main thread: Ray's node start sets
    signal handlers), the batch run on an event loop inside it; what it refuses is a ``CommandError``."""
    from bunshin.policies.registry import make_policy

    from .. import event_loop
    from ..cluster.local import local_cluster

    if not args.nodes or min(args.nodes) < 1:
        raise CommandError("bunshin bench scale: --nodes: node counts >= 1, e.g. 1,2,3")
    try:
        policy = make_policy(args.policy, args.time_scale)
    except (ValueError, OSError) as exc:
        raise CommandError(f"bunshin bench scale: --policy: {exc}") from exc
    suite = make_suite(args)
    rows: list[dict[str, Any]] = []
    hop: dict[str, Any] | None = None
    for k, n in enumerate(args.nodes):
        print(f"[{k + 1}/{len(args.nodes)}] {n} node(s) ...", file=sys.stderr, flush=True)
        with local_cluster(n) as cluster:
            row, got = event_loop.run(measure(cluster.address, suite, policy, n, tasks=args.tasks,
                                              group_size=args.group_size, concurrency=args.concurrency,
                                              seed=args.seed, hop=k == len(args.nodes) - 1))
        hop = got or hop
        rows.append(row)
        print(f"[{k + 1}/{len(args.nodes)}] {n} node(s): {row['rollouts']} rollouts in {row['wall_s']} s, "
              f"{row['rollouts_per_s']}/s", file=sys.stderr, flush=True)
    same = len({r["rewards_sha256"] for r in rows}) == 1
    print(table(rows, hop))
    if not same:
        print("the rewards differ between node counts: the ratios compare different work", file=sys.stderr)
    if args.json:
        write_json(args.json, {"suite": suite.name, "tasks": args.tasks, "group_size": args.group_size,
                               "concurrency_per_node": args.concurrency, "time_scale": args.time_scale,
                               "seed": args.seed, "simulated_nodes": True, "same_rewards": same, "results": rows,
                               "hop": hop})
    if args.plot:
        plot(rows, args.plot)
    return 0 if same and all(r["ok"] == r["rollouts"] for r in rows) else 1


def add_arguments(parser: Any) -> None:
    parser.add_argument("--nodes", type=lambda t: [int(x) for x in t.split(",") if x], default=[1, 2, 3],
                        help="node counts, each a local cluster of that many simulated nodes (default 1,2,3)")
    parser.add_argument("--tasks", type=int, default=6, help="groups in the batch: the suite's first N tasks")
    parser.add_argument("--group-size", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=3, help="rollouts at once per node")
    parser.add_argument("--policy", default="scripted", help="as bunshin eval's --policy")
    parser.add_argument("--time-scale", type=float, default=0.2,
                        help="the policy's reasoning time and the suite's tool latency (1 = as modelled)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write results as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG plot here")
