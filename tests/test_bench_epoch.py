"""``bunshin bench epoch``: the hash of behaviour sees calls, observations, status and reward, never timings, seeds,
ids, lineage or where a step's result came from (a speculated step included); the meter's per-window peak and
GiB*s; the per-epoch windows of the prefix and speculation statistics; each mode's settings (speculating modes,
read-only, per-mode cache directories, the refusals); the tables and both plots from synthetic records; and tiny
real runs (a 500-product shop, 2 tasks, groups of 2, no modelled time): base over 2 epochs, and base,
spec, spec-readonly and full over 1 epoch, that write every field and both plots.
The figures themselves come from the real benchmark (BENCHMARKS.md), not from here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pytest

from bunshin.engine.bench import epoch
from bunshin.engine.bench.epoch_report import running_curve
from bunshin.engine.bench.policy import bench_policy
from bunshin.engine.errors import BadRequest
from bunshin.engine.meter import GiB, MemoryMeter
from bunshin.engine.records import Status, Step, StepObservation, ToolCall, Trajectory
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.grounded import GroundedPolicy

from .conftest import host_processes

FIELDS = ("mode", "epoch", "wall_s", "tool_s_executed", "tool_s_skipped", "hit_rate", "peak_bytes", "total_gib_s",
          "rewards_sha256", "rollouts", "success_rate", "steps", "cached_steps", "running", "prefix", "seed",
          "spec_top1", "spec_topk", "spec_adopted_s", "spec_wasted_s", "spec_hidden_s", "spec_branch_bytes_peak",
          "speculated_steps", "speculation", "memory")
PNG = b"\x89PNG\r\n\x1a\n"


def trajectory(sample: int = 0, *, reward: float = 1.0, output: str = "page 1", cached: bool = False,
               group_id: str = "1:t1", seed: int = 11, wall_s: float = 3.0, speculated: bool = False) -> Trajectory:
    source = "speculated" if speculated else "cached" if cached else "executed"
    steps = [Step(index=i, call=ToolCall(name="click", args={"id": i}), reasoning_s=0.5 * i + seed,
                  observation=StepObservation(output=f"{output} {i}", data={"url": f"/p/{i}"}, digests={"png": "ab"}),
                  tool_s=0.0 if cached else 0.25 if speculated else 1.5 + seed, source=source,
                  saved_s=1.5 if cached or speculated else 0.0) for i in range(2)]
    return Trajectory(task_id="t1", suite="webshop", group_id=group_id, sample=sample, seed=seed, run_seed=seed,
                      first_observation=StepObservation(output="start"), steps=steps,
                      final=ToolCall(name="stop", args={"answer": "x"}), reward=reward, status=Status.OK,
                      timings={"wall_s": wall_s}, lineage=[f"ws-{seed}", f"ws-{seed + 1}"])


def test_the_hash_ignores_timings_seeds_ids_and_source() -> None:
    one = [trajectory(0), trajectory(1)]
    other = [trajectory(1, cached=True, seed=99, wall_s=0.1), trajectory(0, seed=5, wall_s=7.0)]
    assert epoch.trajectories_sha256(one) == epoch.trajectories_sha256(other)
    speculated = [trajectory(0, speculated=True, seed=3), trajectory(1)]
    assert epoch.trajectories_sha256(one) == epoch.trajectories_sha256(speculated)
    assert epoch.trajectories_sha256(one, observations=False) == epoch.trajectories_sha256(speculated,
                                                                                           observations=False)
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
    # each differing rollout whole, beside the reference's: what a reader diffs
    [saw, scored_apart] = epoch.differing_rollouts(records)
    assert (saw["mode"], saw["rollout"], saw["acts_differently"]) == ("prefix", "1:t1/1", False)
    assert saw["this"]["observations"][0]["output"] == "page 1 in 2.4s 0"
    assert saw["reference"]["observations"][0]["output"] == "page 1 0"
    assert scored_apart["acts_differently"]
    assert (scored_apart["reference"]["reward"], scored_apart["this"]["reward"]) == (1.0, 0.0)
    assert epoch.differing_rollouts(records[:1]) == []


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
    before = {"hits": 2, "misses": 8, "tool_s_skipped": 1.5, "nodes_hot": 4, "bytes_written": 100, "hot_budget": 500}
    after = {"hits": 6, "misses": 10, "tool_s_skipped": 4.0, "nodes_hot": 5, "bytes_written": 150,
             "cache_forks": 3, "hit_rate": 0.3, "hot_budget": 500}
    # the hot budget is a gauge: as at the end (a relative budget that did not move was reported as 0)
    assert epoch.prefix_window(before, after) == {"hits": 4, "misses": 2, "tool_s_skipped": 2.5, "nodes_hot": 5,
                                                  "bytes_written": 50, "cache_forks": 3, "hit_rate": 0.6667,
                                                  "hot_budget": 500}
    assert epoch.prefix_window({"hot_budget": None}, {"hot_budget": None})["hot_budget"] is None  # type: ignore[index]
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
    assert records[0]["actions_sha256"] != records[0]["rewards_sha256"]
    assert "per_rollout" not in records[0] and "behaviours" not in records[0]
    assert not (tmp_path / "epoch-differing.jsonl").exists()  # nothing differs: nothing beside the JSON
    assert data["ratios"] == [] and data["tasks"] == 2 and data["group_size"] == 2
    for name in ("epoch-webshop.png", "epoch-webshop-memory.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG
    assert all(r["memory"] and r["speculation"] is None and r["speculated_steps"] == 0 for r in records)


def test_speculation_statistics_per_epoch() -> None:
    """Counts and seconds as differences; ``settings.GAUGES`` as at the end (None kept); accuracy recomputed from
    the epoch's own hits and decisions, not the engine's cumulative figure."""
    before = {"decisions": 10, "predicted": 9, "top1_hits": 2, "topk_hits": 5, "spec_top1": 0.2, "spec_topk": 0.5,
              "speculated": 4, "adopted": 2, "wasted": 2, "adopted_s": 3.0, "hidden_s": 2.0, "wasted_s": 1.5,
              "branch_bytes_peak": 10 << 20, "branch_bytes": 1 << 20, "branches_running": 1, "retrains": 1,
              "examples": 40, "tail_rank_rho": None}
    after = {**before, "decisions": 30, "top1_hits": 14, "topk_hits": 23, "spec_top1": 0.4667, "speculated": 16,
             "adopted": 12, "wasted": 4, "adopted_s": 9.5, "hidden_s": 6.0, "wasted_s": 2.0,
             "branch_bytes_peak": 30 << 20, "branch_bytes": 0, "branches_running": 0, "retrains": 3,
             "examples": 120, "tail_rank_rho": 0.6}
    window = epoch.speculation_window(before, after)
    assert window == {**after, "decisions": 20, "predicted": 0, "top1_hits": 12, "topk_hits": 18, "speculated": 12,
                      "adopted": 10, "wasted": 2, "adopted_s": 6.5, "hidden_s": 4.0, "wasted_s": 0.5,
                      "retrains": 2, "spec_top1": 0.6, "spec_topk": 0.9}
    first = epoch.speculation_window(None, {**before, "tail_rank_rho": None})
    assert first["spec_top1"] == 0.2 and first["decisions"] == 10 and first["tail_rank_rho"] is None
    assert epoch.speculation_window(None, {**before, "decisions": 0, "top1_hits": 0})["spec_top1"] is None
    assert epoch.speculation_window(None, None) is None


def test_a_record_has_speculation_columns() -> None:
    ts = [trajectory(0, speculated=True), trajectory(1, cached=True), trajectory(2)]
    window = epoch.speculation_window(None, {"decisions": 8, "top1_hits": 6, "topk_hits": 7, "adopted_s": 2.5,
                                             "wasted_s": 0.5, "hidden_s": 2.0, "branch_bytes_peak": 5 << 20})
    r = epoch.record("spec", 1, 1, ts, 2.0, 1, 1.0, [], None, speculation=window, memory=[(0.0, 5), (0.25, 7)])
    assert (r["spec_top1"], r["spec_topk"], r["spec_adopted_s"], r["spec_wasted_s"], r["spec_hidden_s"],
            r["spec_branch_bytes_peak"], r["speculated_steps"]) == (0.75, 0.875, 2.5, 0.5, 2.0, 5 << 20, 2)
    assert r["speculation"] is window and r["memory"] == [(0.0, 5), (0.25, 7)]
    # a speculated step's saved_s is speculation's (spec_hidden_s), not the prefix cache's skipped tool-seconds
    assert r["tool_s_skipped"] == 3.0 and r["cached_steps"] == 2
    plain = epoch.record("base", 1, 1, [trajectory(0)], 2.0, 1, 1.0, [], None)
    assert [plain[k] for k in FIELDS if k.startswith("spec_")] == [None] * 6 and plain["speculation"] is None
    assert plain["speculated_steps"] == 0 and plain["memory"] == []


def test_the_memory_window_is_the_epochs_samples_from_its_start() -> None:
    timeline = [(0.0, 1), (0.25, 2), (0.5, 3), (0.75, 4), (1.0, 5)]
    assert epoch.memory_window(timeline, 0.25, 0.75) == [(0.0, 2), (0.25, 3), (0.5, 4)]
    # the epoch starts just after a sample: that sample is its first reading
    assert epoch.memory_window(timeline, 0.3, 0.75) == [(0.0, 2), (0.2, 3), (0.45, 4)]
    assert epoch.memory_window(timeline, 2.0, 3.0) == [(0.0, 5)]
    assert epoch.memory_window([], 0.0, 1.0) == []


def test_each_mode_gets_its_settings_and_unknown_modes_are_refused(tmp_path: Path) -> None:
    from bunshin.engine.prefix.settings import PrefixSettings
    from bunshin.engine.speculation.settings import SpecSettings

    prefix, spec = PrefixSettings(cache_dir=tmp_path), SpecSettings(slots=2, threshold=0.3)
    chosen = epoch.per_mode(list(epoch.MODES), prefix, spec)
    assert chosen["base"] == (None, None)
    assert chosen["spec"] == (None, spec)
    assert chosen["spec-readonly"] == (None, SpecSettings(slots=2, threshold=0.3, read_only=True))
    assert chosen["prefix"] == (PrefixSettings(cache_dir=tmp_path / "prefix"), None)
    # full: its own cache directory, and the selector saved beside its tree
    assert chosen["full"] == (PrefixSettings(cache_dir=tmp_path / "full"),
                              SpecSettings(slots=2, threshold=0.3, model_dir=tmp_path / "full"))
    assert epoch.per_mode(["full"], PrefixSettings(), None)["full"] == (PrefixSettings(), SpecSettings())
    with pytest.raises(BadRequest, match="unknown mode 'fast'"):
        epoch.per_mode(["base", "fast"], prefix, spec)


@pytest.mark.asyncio
async def test_main_refuses_an_unknown_mode_before_running_anything() -> None:
    with pytest.raises(BadRequest, match="unknown mode 'turbo'"):
        await epoch.main(None, None, ["base", "turbo"], 1, tasks=1, group_size=1, log=io.StringIO())


def test_the_policy_takes_the_detour_rate_at_the_time_scale() -> None:
    own = bench_policy("grounded", 0.2)
    assert own.detour_p == 0.15 and own.time_scale == 0.2
    policy = bench_policy("grounded", 0.2, 0.3)
    assert isinstance(policy, GroundedPolicy) and policy.detour_p == 0.3 and policy.time_scale == 0.2
    assert bench_policy("scripted", 0.2, 0.0).detour_p == 0.0
    with pytest.raises(BadRequest, match="--detour-p"):
        bench_policy("grounded", 0.2, 1.0)
    with pytest.raises(BadRequest, match="unknown policy 'openai'"):
        bench_policy("openai", 0.2)


def test_tables_and_both_plots_from_records(tmp_path: Path) -> None:
    window = epoch.speculation_window(None, {"decisions": 4, "top1_hits": 3, "topk_hits": 4, "adopted_s": 1.25,
                                             "wasted_s": 0.5, "hidden_s": 1.0, "branch_bytes_peak": 3 << 20})
    records = []
    for e in (1, 2):
        for mode in ("base", "spec", "full"):
            speculation = window if mode != "base" else None
            r = epoch.record(mode, e, e, [trajectory(0, speculated=mode != "base"), trajectory(1)], 2.0 + e,
                             1 << 30, 2.0, [(0.0, 1.0), (0.5, 2.0)], None, speculation=speculation,
                             memory=[(0.0, 1 << 29), (1.0, 1 << 30), (2.0, 3 << 28)])
            records.append(r)
    rs = epoch.ratios(records)
    assert [(r["mode"], r["epoch"], r["spec_top1"], r["spec_adopted_s"], r["spec_wasted_s"]) for r in rs] == [
        ("spec", 1, 0.75, 1.25, 0.5), ("full", 1, 0.75, 1.25, 0.5), ("spec", 2, 0.75, 1.25, 0.5),
        ("full", 2, 0.75, 1.25, 0.5)]
    text = epoch.tables(records, rs)
    first, second = text.split("\n\n")
    assert "| spec top-1 |" in first and "| adopted tool-s |" in first and "| wasted tool-s |" in first
    assert "| spec top-1 |" in second and "| adopted tool-s |" in second and "| wasted tool-s |" in second
    assert len(first.splitlines()) == 2 + 6  # a row per mode and epoch
    base_row = next(line for line in first.splitlines() if line.startswith("| base | 1 |"))
    spec_row = next(line for line in first.splitlines() if line.startswith("| spec | 1 |"))
    assert "| - |" in base_row and "| 75% |" in spec_row and "| 1.2 |" in spec_row and "3.0 MiB" in spec_row
    from bunshin.engine.bench.epoch_report import plot, plot_memory

    plot(records, tmp_path / "running.png", "title")
    plot_memory(records, tmp_path / "memory.png", "title")
    assert (tmp_path / "running.png").read_bytes()[:8] == PNG
    assert (tmp_path / "memory.png").read_bytes()[:8] == PNG


@pytest.mark.asyncio
async def test_a_tiny_run_of_the_speculating_modes(state_dir: Path, tmp_path: Path) -> None:
    """base, spec, spec-readonly and full, one epoch each: the same actions and rewards in every mode (the ratios'
    check), speculation's figures where the mode speculates, and both plots."""
    from bunshin.engine.speculation.settings import SpecSettings

    suite = WebShopSuite(catalog_size=500, time_scale=0.0)
    out = io.StringIO()
    modes = ["base", "spec", "spec-readonly", "full"]
    code = await epoch.main(suite, GroundedPolicy(time_scale=0.0), modes, 1, tasks=2, group_size=2, seed=5,
                            speculation=SpecSettings(slots=2, threshold=0.0, retrain_every=2),
                            engine_kwargs={"state_dir": state_dir, "concurrency": 4},
                            json_path=tmp_path / "epoch.json", plots=tmp_path / "plots", log=out)
    assert not host_processes(), "the benchmark left workspace hosts behind"
    assert code == 0, out.getvalue()
    data = json.loads((tmp_path / "epoch.json").read_text())
    records = {r["mode"]: r for r in data["records"]}
    assert list(records) == modes
    for mode, r in records.items():
        assert all(f in r for f in FIELDS), sorted(set(FIELDS) - set(r))
        assert r["rollouts"] == 4 and r["memory"] and all(0 <= t <= r["wall_s"] + 1 for t, _ in r["memory"])
        speculating = mode != "base"
        assert (r["speculation"] is not None) == speculating, mode
        assert (r["spec_top1"] is not None) == (speculating and r["speculation"]["decisions"] > 0), mode
        if speculating:
            assert r["speculation"]["decisions"] > 0 and r["spec_adopted_s"] >= 0 and r["spec_wasted_s"] >= 0
            assert isinstance(r["speculated_steps"], int)
        else:
            assert r["speculated_steps"] == 0
        assert (r["prefix"] is not None) == (mode == "full")
    assert all(r["same_actions"] for r in data["ratios"]), data["ratios"]
    for name in ("epoch-webshop.png", "epoch-webshop-memory.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:8] == PNG
