"""``bunshin bench scale``'s own arithmetic and presentation (the runs themselves need a cluster: tests/test_cluster.py
covers the engine they use; the figures are in BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from bunshin.engine.bench.scale import mean_observation_bytes, rewards_sha256, table
from bunshin.engine.cli import build_parser
from bunshin.engine.records import Status, Step, StepObservation, ToolCall, Trajectory


def traj(group: str, sample: int, reward: float, status: Status = Status.OK) -> Trajectory:
    step = Step(index=0, call=ToolCall(name="shell", args={"cmd": "ls"}), observation=StepObservation(output="x" * 100),
                reasoning_s=0.0, tool_s=0.0)
    return Trajectory(task_id="t", suite="s", group_id=group, sample=sample, seed=1, reward=reward, status=status,
                      steps=[step], attempts=2 if sample else 1)


def test_the_rewards_digest_ignores_order_and_sees_any_change() -> None:
    a = [traj("g", 0, 1.0), traj("g", 1, 0.0), traj("h", 0, 1.0)]
    assert rewards_sha256(a) == rewards_sha256(list(reversed(a)))
    assert rewards_sha256(a) != rewards_sha256([traj("g", 0, 1.0), traj("g", 1, 1.0), traj("h", 0, 1.0)])
    assert rewards_sha256(a) != rewards_sha256([*a[:2], traj("h", 0, 1.0, Status.NODE_LOST)])
    assert mean_observation_bytes(a) > 100 and mean_observation_bytes([]) == 1024


def test_the_table_shows_speed_up_against_one_node_and_the_hop() -> None:
    rows = [{"nodes": n, "rollouts": 6, "wall_s": 6.0 / n, "rollouts_per_s": float(n), "peak_bytes_per_node": 1 << 20,
             "rewards_sha256": "ab" * 32, "retried": 0} for n in (1, 2)]
    text = table(rows, {"payload_bytes": 10, "ray_hop_p50_ms": 1.0, "ray_hop_p90_ms": 2.0, "tool_call_p50_ms": 10.0,
                        "tool_call_p90_ms": 20.0, "hop_per_call": 0.1})
    assert "| 2 | 6 | 3.00 | 2.00 | 2.00x | 1.0 MiB | 0 | abababababab |" in text
    assert "Ray hop p50 ms" in text and "| 10 | 1.00 | 2.00 | 10.00 | 20.00 | 0.10 |" in text


def test_the_command_line() -> None:
    args = build_parser().parse_args(["bench", "scale", "--suite", "webshop", "--nodes", "1,2,3", "--json", "f.json"])
    assert args.nodes == [1, 2, 3] and args.tasks == 6 and str(args.json) == "f.json"
    args = build_parser().parse_args(["eval", "--suite", "webshop", "--out", "o", "--ray", "local:2"])
    assert args.ray == "local:2"


def test_local_addresses() -> None:
    from bunshin.engine.cluster.local import LocalClusterError, parse_local

    assert parse_local("local:3") == 3 and parse_local("auto") is None and parse_local("ray://h:10001") is None
    for bad in ("local:0", "local:x"):
        with pytest.raises(LocalClusterError, match="local"):
            parse_local(bad)
