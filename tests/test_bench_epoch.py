"""``bunshin bench epoch``: the hash of behaviour sees calls, observations, status and reward, never timings, seeds,
ids, lineage or where a step's result came from; the meter's per-window peak and GiB*s; and a tiny real run (base
mode, a 500-product shop, 2 tasks, groups of 2, 2 epochs, no modelled time) that writes every field and a plot.
The figures themselves come from the real benchmark (BENCHMARKS.md), not from here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest

from bunshin.engine.bench import epoch
from bunshin.engine.bench.epoch_report import running_curve
from bunshin.engine.meter import GiB, MemoryMeter
from bunshin.engine.records import Status, Step, StepObservation, ToolCall, Trajectory
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.grounded import GroundedPolicy

from .conftest import host_processes

FIELDS = ("mode", "epoch", "wall_s", "tool_s_executed", "tool_s_skipped", "hit_rate", "peak_bytes", "total_gib_s",
          "rewards_sha256", "rollouts", "success_rate", "steps", "cached_steps", "running", "prefix", "seed")


def trajectory(sample: int = 0, *, reward: float = 1.0, output: str = "page 1", cached: bool = False,
               group_id: str = "1:t1", seed: int = 11, wall_s: float = 3.0) -> Trajectory:
    steps = [Step(index=i, call=ToolCall(name="click", args={"id": i}), reasoning_s=0.5 * i + seed,
                  observation=StepObservation(output=f"{output} {i}", data={"url": f"/p/{i}"}, digests={"png": "ab"}),
                  tool_s=0.0 if cached else 1.5 + seed, source="cached" if cached else "executed",
                  saved_s=1.5 if cached else 0.0) for i in range(2)]
    return Trajectory(task_id="t1", suite="webshop", group_id=group_id, sample=sample, seed=seed, run_seed=seed,
                      first_observation=StepObservation(output="start"), steps=steps,
                      final=ToolCall(name="stop", args={"answer": "x"}), reward=reward, status=Status.OK,
                      timings={"wall_s": wall_s}, lineage=[f"ws-{seed}", f"ws-{seed + 1}"])


def test_the_hash_ignores_timings_seeds_ids_and_source() -> None:
    one = [trajectory(0), trajectory(1)]
    other = [trajectory(1, cached=True, seed=99, wall_s=0.1), trajectory(0, seed=5, wall_s=7.0)]
    assert epoch.trajectories_sha256(one) == epoch.trajectories_sha256(other)
    # one epoch's group ids are the same in every mode; across epochs they differ but do not enter the hash
    assert epoch.trajectories_sha256(one) == epoch.trajectories_sha256([trajectory(0, group_id="2:t1"),
                                                                        trajectory(1, group_id="2:t1")])


def test_the_hash_sees_observations_rewards_and_status() -> None:
    base = epoch.trajectories_sha256([trajectory(0), trajectory(1)])
    assert epoch.trajectories_sha256([trajectory(0), trajectory(1, reward=0.0)]) != base
    assert epoch.trajectories_sha256([trajectory(0), trajectory(1, output="page 2")]) != base
    failed = trajectory(1)
    failed.status = Status.MAX_STEPS
    assert epoch.trajectories_sha256([trajectory(0), failed]) != base
    moved = trajectory(1)
    moved.steps[1] = msgspec.structs.replace(moved.steps[1], call=ToolCall(name="click", args={"id": 9}))
    assert epoch.trajectories_sha256([trajectory(0), moved]) != base


def test_the_actions_hash_ignores_observations_and_ratios_count_what_differs() -> None:
    same = [trajectory(0), trajectory(1)]
    shown = [trajectory(0), trajectory(1, output="page 1 in 2.4s")]
    scored = [trajectory(0), trajectory(1, reward=0.0)]
    assert epoch.trajectories_sha256(same, observations=False) == epoch.trajectories_sha256(shown, observations=False)
    assert epoch.trajectories_sha256(same, observations=False) != epoch.trajectories_sha256(scored, observations=False)
    records = [epoch.record(mode, 1, 1, ts, 1.0, 1, 1.0, [], None)
               for mode, ts in (("base", same), ("prefix", shown), ("prefix", scored))]
    [seen, acted] = epoch.ratios(records)
    assert (seen["same_behaviour"], seen["same_actions"], seen["rollouts_differing"],
            seen["rollouts_acting_differently"]) == (False, True, 1, 0)
    assert (acted["same_behaviour"], acted["same_actions"], acted["rollouts_acting_differently"]) == (False, False, 1)
    table = epoch.tables(records, [seen, acted])
    assert "1 saw other observations" in table and "NO: 1 rollouts act or score differently" in table


def test_a_meter_window_has_its_own_peak_and_integral() -> None:
    now = [0.0]
    value = [0]
    meter = MemoryMeter(lambda: value[0], 0.25, clock=lambda: now[0])
    for t, v in ((0, 1), (1, 3), (2, 1), (3, 5), (4, 5)):
        now[0], value[0] = float(t), v * GiB
        meter.sample()
    assert meter.elapsed() == 4.0
    # a window on samples: the trapezoids inside it
    assert meter.window(0, 2) == (3 * GiB, pytest.approx(2 + 2))
    assert meter.window(3, 4) == (5 * GiB, pytest.approx(5))
    # ends between samples are interpolated: 0.5 -> 2 GiB, 1.5 -> 2 GiB
    peak, gib_s = meter.window(0.5, 1.5)
    assert peak == 3 * GiB and gib_s == pytest.approx(0.5 * (2 + 3) / 2 * 2)
    # the whole run is the meter's own figures; outside the timeline the ends are held flat
    assert meter.window(0, 4) == (meter.peak_bytes, pytest.approx(meter.gib_s))
    assert meter.window(4, 6) == (5 * GiB, pytest.approx(10))
    assert meter.window(2, 1) == (0, 0.0)
    assert MemoryMeter(lambda: 0, 1.0).window(0, 1) == (0, 0.0)


def test_running_curve_counts_overlapping_rollouts() -> None:
    assert running_curve([(0.0, 2.0), (1.0, 3.0), (1.0, 1.5)]) == ([0.0, 1.0, 1.5, 2.0, 3.0], [1, 3, 2, 1, 0])


def test_ratios_compare_each_epoch_with_the_reference_mode() -> None:
    rec = {"wall_s": 10.0, "peak_bytes": 100, "total_gib_s": 4.0, "hit_rate": 0.0, "tool_s_skipped": 0.0,
           "rewards_sha256": "a", "rollouts": 4, "success_rate": 0.5, "tool_s_executed": 9.0}
    records = [{**rec, "mode": "base", "epoch": 1}, {**rec, "mode": "base", "epoch": 2},
               {**rec, "mode": "prefix", "epoch": 1, "wall_s": 12.0},
               {**rec, "mode": "prefix", "epoch": 2, "wall_s": 5.0, "peak_bytes": 110, "hit_rate": 0.5,
                "tool_s_skipped": 30.0, "rewards_sha256": "b"}]
    rs = epoch.ratios(records)
    assert [(r["epoch"], r["wall_ratio"], r["peak_ratio"], r["gib_s_ratio"], r["same_behaviour"]) for r in rs] == [
        (1, 1.2, 1.0, 1.0, True), (2, 0.5, 1.1, 1.0, False)]
    assert "wall /base" in epoch.tables(records, rs)


def test_prefix_statistics_per_epoch() -> None:
    before = {"hits": 2, "misses": 8, "tool_s_skipped": 1.5, "nodes_hot": 4, "bytes_written": 100}
    after = {"hits": 6, "misses": 10, "tool_s_skipped": 4.0, "nodes_hot": 5, "bytes_written": 150,
             "cache_forks": 3, "hit_rate": 0.3}
    assert epoch.prefix_window(before, after) == {"hits": 4, "misses": 2, "tool_s_skipped": 2.5, "nodes_hot": 5,
                                                  "bytes_written": 50, "cache_forks": 3, "hit_rate": 0.6667}
    assert epoch.prefix_window(None, None) is None


@pytest.mark.asyncio
async def test_a_tiny_run_writes_every_field_and_a_plot(state_dir: Path, tmp_path: Path) -> None:
    suite = WebShopSuite(catalog_size=500, time_scale=0.0)
    out = io.StringIO()
    code = await epoch.main(suite, GroundedPolicy(time_scale=0.0), ["base"], 2, tasks=2, group_size=2, seed=5,
                            engine_kwargs={"state_dir": state_dir, "concurrency": 4},
                            json_path=tmp_path / "epoch.json", plots=tmp_path / "plots", log=out)
    assert not host_processes(), "the benchmark left workspace hosts behind"
    assert code == 0, out.getvalue()
    data = json.loads((tmp_path / "epoch.json").read_text())
    records = data["records"]
    assert [(r["mode"], r["epoch"], r["seed"]) for r in records] == [("base", 1, 6), ("base", 2, 7)]
    for r in records:
        assert all(f in r for f in FIELDS), sorted(set(FIELDS) - set(r))
        assert r["rollouts"] == 4 and len(r["running"]) == 4 and r["prefix"] is None
        assert r["hit_rate"] == 0.0 and r["tool_s_skipped"] == 0.0 and r["cached_steps"] == 0
        assert r["wall_s"] > 0 and r["peak_bytes"] > 0 and r["total_gib_s"] > 0 and r["tool_s_executed"] > 0
        assert all(0 <= a <= b <= r["wall_s"] + 0.01 for a, b in r["running"])
        assert len(r["rewards_sha256"]) == 64
    assert records[0]["actions_sha256"] != records[0]["rewards_sha256"] and "per_rollout" not in records[0]
    assert data["ratios"] == [] and data["tasks"] == 2 and data["group_size"] == 2
    png = tmp_path / "plots" / "epoch-webshop.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
