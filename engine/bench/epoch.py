"""``bunshin bench epoch``: wall time, tool-seconds and memory of epochs of GRPO groups, per mode, one engine per
mode living across its epochs. Modes (``MODES``): ``base`` (every call executed), ``spec`` (speculative tool
execution: ``RolloutEngine(speculation=SpecSettings(...))``), ``spec-readonly`` (the same, speculating only calls
the suite declares read-only, as systems without forks must), ``prefix`` (the prefix cache), ``full`` (the prefix
cache and speculation).

Owns: the procedure, its per-epoch records, the ratios and the hash of behaviour (``trajectories_sha256``); the
tables and the plots are ``epoch_report.py``'s. Every mode runs the same tasks (the first of each template in the
suite's order, then the second..., less those the policy refuses, ``tasks`` in all) with the same policy; epoch
``e`` (1-based) runs every task as a group of ``group_size`` samples with run seed ``seed + e`` (a training
policy changes between epochs), the same seeds in every mode. Per mode one ``RolloutEngine`` serves all its
epochs, so what the prefix cache kept and the selector learned in epoch 1 serves epoch 2. Epoch 1 includes
building each application's root (the shop's catalog) in every mode. With a cache directory, ``prefix`` and
``full`` each keep theirs in their own subdirectory (``DIR/prefix``, ``DIR/full``: full must not start from the
tree prefix left), and full's selector is saved there too (``SpecSettings.model_dir``); ``spec`` and
``spec-readonly`` learn in memory only, from nothing but their own epochs (and ``--spec-train``).
Per mode and epoch (``record``): ``wall_s`` from the first request to the last result; ``tool_s_executed`` the
sum of ``Step.tool_s`` (tools run in this epoch's workspaces, rebuilt steps included; cached steps are 0; an
adopted speculated step counts what its sample waited for); ``tool_s_skipped`` the sum of ``Step.saved_s`` over
the steps not speculated (what cached steps did not run); ``hit_rate`` cached steps / all steps, from the
trajectories alone; ``peak_bytes`` and ``total_gib_s`` the engine meter's run memory (the run's cgroup charge:
every workspace, the roots, the cache's frozen snapshots and speculative branches among them; not the engine
process, nor checkpoints on disk) over the epoch's window, and ``memory`` that window's timeline ([seconds since
the epoch's start, bytes], the meter's own samples); ``rewards_sha256`` the hash of behaviour,
``actions_sha256`` the same without observations; ``running`` each rollout's (start, end) from the epoch's start
(end: when its result arrived; start: end less its ``wall_s`` less its ``admission_wait_s``, i.e. from when it
held a rollout slot; group setups not); ``prefix`` the engine's prefix statistics over the epoch (counts as
differences, gauges at the epoch's end), None without a prefix cache; ``speculation`` the engine's
``speculation_statistics()`` over the epoch the same way (``speculation.settings.GAUGES`` as at the epoch's end,
so ``branch_bytes_peak`` is the engine's peak so far; ``spec_top1``/``spec_topk`` recomputed from the epoch's
hits and decisions), None without speculation; beside it ``spec_top1``, ``spec_topk``, ``spec_adopted_s``,
``spec_wasted_s``, ``spec_hidden_s``, ``spec_branch_bytes_peak`` (None without speculation) and
``speculated_steps`` (steps whose source is ``speculated``, from the trajectories). Beside the JSON,
``<name>-differing.jsonl``: each rollout that differs from the first mode's, both behaviours whole
(``differing_rollouts``), written only when one does.
Must never: compare modes that ran different tasks or seeds, or hash timings, seeds, ids, lineage or a step's
source (equal behaviour gives equal hashes in every mode).
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs.suites.base import Suite
from bunshin.policies.base import Policy

from ..commands.flags import budgets, make_suite, spec_settings, with_time_scale
from ..errors import BadRequest, CommandError
from ..prefix.settings import PrefixSettings
from ..records import Status, Trajectory, canonical
from ..report import Progress, human_bytes, write_json
from ..rollout import RolloutEngine
from ..speculation.settings import SpecSettings
from .epoch_report import plot, plot_memory, tables
from .policy import bench_policy

MODES = ("base", "spec", "spec-readonly", "prefix", "full")
PREFIX_MODES = ("prefix", "full")
SPEC_MODES = ("spec", "spec-readonly", "full")
# The engine's prefix statistics that are states, not cumulative counts (those are taken as differences per epoch).
GAUGES = ("nodes", "nodes_hot", "nodes_cold", "nodes_absent", "bytes_hot", "bytes_cold", "pinned", "writer_backlog",
          "hot_budget")  # the hot budget as at the epoch's end (a relative one moves; None: unbounded)
BROKEN = (Status.ENGINE_ERROR, Status.SETUP_FAILED, Status.WORKSPACE_FAILED)  # the run's fault, not the agent's


def behaviour(t: Trajectory, observations: bool = True) -> dict[str, Any]:
    """What a trajectory did and got, without timings, seeds, ids, lineage or where a step's result came from;
    ``observations=False``: only what it did and its outcome (calls, final, status, reward)."""
    did = {"task_id": t.task_id, "sample": t.sample, "calls": [canonical(s.call).decode() for s in t.steps],
           "final": canonical(t.final).decode() if t.final is not None else None,
           "status": str(t.status), "reward": t.reward}
    if observations:
        did["first_observation"] = msgspec.to_builtins(t.first_observation)
        did["observations"] = [msgspec.to_builtins(s.observation) for s in t.steps]
    return did


def trajectories_sha256(trajectories: Iterable[Trajectory], observations: bool = True) -> str:
    """sha256 of every trajectory's ``behaviour``, ordered by (group_id, sample), JSON with sorted keys."""
    digest = hashlib.sha256()
    for t in sorted(trajectories, key=lambda t: (t.group_id, t.sample)):
        digest.update(msgspec.json.encode(behaviour(t, observations), order="sorted") + b"\n")
    return digest.hexdigest()


def rollout_key(t: Trajectory) -> str:
    """A rollout's name across modes: its group id and sample."""
    return f"{t.group_id}/{t.sample}"


def per_rollout(trajectories: Iterable[Trajectory]) -> dict[str, tuple[str, str]]:
    """(hash with observations, hash without) of each rollout, by ``rollout_key`` (equal across modes)."""
    return {rollout_key(t): (trajectories_sha256([t]), trajectories_sha256([t], observations=False))
            for t in trajectories}


def differing_rollouts(records: list[dict[str, Any]], reference: str = "base") -> list[dict[str, Any]]:
    """Every rollout of a mode-epoch whose behaviour differs from the reference mode's same rollout, with both
    behaviours side by side (``acts_differently``: its calls, final, status or reward differ, not only what it
    saw), for a difference to be read rather than only counted."""
    ref = {r["epoch"]: r for r in records if r["mode"] == reference}
    found = []
    for r in records:
        base = ref.get(r["epoch"])
        if r["mode"] == reference or base is None:
            continue
        mine, theirs = r.get("per_rollout", {}), base.get("per_rollout", {})
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                found.append({"mode": r["mode"], "epoch": r["epoch"], "rollout": key,
                              "acts_differently": mine.get(key, ("", ""))[1] != theirs.get(key, ("", ""))[1],
                              "reference": base.get("behaviours", {}).get(key),
                              "this": r.get("behaviours", {}).get(key)})
    return found


def choose_tasks(engine: RolloutEngine, policy: Policy, n: int) -> list[str]:
    """``n`` task ids the policy takes: the first of each template (suite order), then the second, ..."""
    by_template: dict[str, list[str]] = {}
    for task in engine.tasks.values():
        if policy.refuses(task) is None:
            by_template.setdefault(task.template, []).append(task.id)
    chosen: list[str] = []
    for rank in range(max((len(v) for v in by_template.values()), default=0)):
        chosen += [ids[rank] for ids in by_template.values() if rank < len(ids)]
    return chosen[:n]


def _window(before: dict[str, Any] | None, after: dict[str, Any], gauges: Iterable[str]) -> dict[str, Any]:
    """Numbers that are not ``gauges`` (counts, bytes, seconds) as differences; gauges and the rest as in ``after``."""
    before, gauges = before or {}, set(gauges)

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    return {k: (round(v - (before.get(k) if number(before.get(k)) else 0), 4)
                if k not in gauges and number(v) else v) for k, v in after.items()}


def prefix_window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The epoch's prefix statistics: gauges as at the epoch's end, other numbers (counts, bytes written, seconds)
    as differences, the hit rate of the epoch's lookups."""
    if after is None:
        return None
    window = _window(before, after, GAUGES)
    looked = window.get("hits", 0) + window.get("misses", 0)
    window["hit_rate"] = round(window.get("hits", 0) / looked, 4) if looked else 0.0
    return window


def speculation_window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The epoch's speculation statistics: ``speculation.settings.GAUGES`` as at the epoch's end, counts and
    seconds as differences, top-1 and top-k accuracy of the epoch's decisions (None if it had none)."""
    from ..speculation.settings import GAUGES as SPEC_GAUGES

    if after is None:
        return None
    window = _window(before, after, (g for g in SPEC_GAUGES if g not in ("spec_top1", "spec_topk")))
    decisions = window.get("decisions") or 0
    for rate, hits in (("spec_top1", "top1_hits"), ("spec_topk", "topk_hits")):
        window[rate] = round((window.get(hits) or 0) / decisions, 4) if decisions else None
    return window


def speculation_fields(window: dict[str, Any] | None, steps: Iterable[Any]) -> dict[str, Any]:
    """The record's speculation columns: the window's accuracy, seconds and branch peak (None without
    speculation) and the steps adopted from branches (from the trajectories)."""
    get = (lambda k: None) if window is None else window.get  # noqa: E731
    return {"spec_top1": get("spec_top1"), "spec_topk": get("spec_topk"), "spec_adopted_s": get("adopted_s"),
            "spec_wasted_s": get("wasted_s"), "spec_hidden_s": get("hidden_s"),
            "spec_branch_bytes_peak": get("branch_bytes_peak"),
            "speculated_steps": sum(s.source == "speculated" for s in steps), "speculation": window}


def memory_window(timeline: Iterable[tuple[float, int]], t0: float, t1: float) -> list[tuple[float, int]]:
    """The meter's samples between ``t0`` and ``t1`` (seconds since the meter started), as seconds since ``t0``;
    the last sample before ``t0`` (the reading the epoch started from) stands at 0."""
    points = list(timeline)
    inside = [(round(t - t0, 3), int(v)) for t, v in points if t0 <= t <= t1]
    before = [(0.0, int(v)) for t, v in points if t < t0][-1:]
    return inside if inside and inside[0][0] == 0.0 else before + inside


def record(mode: str, epoch: int, seed: int, trajectories: list[Trajectory], wall_s: float, peak: int,
           gib_s: float, running: list[tuple[float, float]], prefix: dict[str, Any] | None, *,
           speculation: dict[str, Any] | None = None, memory: Iterable[tuple[float, int]] = ()) -> dict[str, Any]:
    steps = [s for t in trajectories for s in t.steps]
    n = len(trajectories)
    statuses: dict[str, int] = {}
    for t in trajectories:
        statuses[str(t.status)] = statuses.get(str(t.status), 0) + 1
    return {"mode": mode, "epoch": epoch, "seed": seed, "rollouts": n, "wall_s": round(wall_s, 3),
            "tool_s_executed": round(sum(s.tool_s for s in steps), 3),
            "tool_s_skipped": round(sum(s.saved_s for s in steps if s.source != "speculated"), 3),
            "hit_rate": round(sum(s.source == "cached" for s in steps) / len(steps), 4) if steps else 0.0,
            "steps": len(steps), "cached_steps": sum(s.source == "cached" for s in steps),
            "rebuilt_steps": sum(s.source == "rebuilt" for s in steps),
            "peak_bytes": peak, "total_gib_s": round(gib_s, 3),
            "mean_bytes": round(gib_s * (1 << 30) / wall_s) if wall_s > 0 else peak,
            "rewards_sha256": trajectories_sha256(trajectories),
            "actions_sha256": trajectories_sha256(trajectories, observations=False),
            "mean_reward": round(sum(t.reward for t in trajectories) / n, 4) if n else 0.0,
            "success_rate": round(sum(t.reward == 1.0 for t in trajectories) / n, 4) if n else 0.0,
            "statuses": statuses, "prefix": prefix, **speculation_fields(speculation, steps),
            "running": sorted((round(a, 3), round(b, 3)) for a, b in running),
            "memory": [(t, v) for t, v in memory],
            "per_rollout": per_rollout(trajectories),  # for ``ratios``; not written to the JSON
            "behaviours": {rollout_key(t): behaviour(t) for t in trajectories}}  # for ``differing_rollouts``; neither


async def run_mode(suite: Suite, policy: Policy, mode: str, epochs: int, *, tasks: int, group_size: int,
                   seed: int, engine_kwargs: dict[str, Any], prefix: Any = None, speculation: Any = None,
                   log: Any = sys.stderr) -> list[dict[str, Any]]:
    """Every epoch of one mode on one engine."""
    kwargs = dict(engine_kwargs)
    if prefix is not None:
        kwargs["prefix"] = prefix
    if speculation is not None:
        kwargs["speculation"] = speculation
    out = []
    async with RolloutEngine(suite, policy, **kwargs) as engine:
        ids = choose_tasks(engine, policy, tasks)
        if not ids:
            raise BadRequest(f"the policy {policy.name} takes no task of suite {suite.name}")
        for epoch in range(1, epochs + 1):
            requests = engine.requests(ids, group_size=group_size, seed=seed + epoch)
            print(f"{mode}: epoch {epoch}/{epochs}, {len(ids)} groups of {group_size}, run seed {seed + epoch}",
                  file=log, flush=True)
            progress = Progress(len(ids) * group_size, out=log)
            stats_before = engine.prefix_statistics()
            spec_before = engine.speculation_statistics()
            engine.meter.sample()
            m0, started = engine.meter.elapsed(), time.monotonic()
            trajectories, running = [], []
            async for result in engine.stream(requests):
                end = time.monotonic() - started
                t = result.trajectory
                trajectories.append(t)
                held = t.timings.get("wall_s", 0.0) - t.timings.get("admission_wait_s", 0.0)
                running.append((max(0.0, end - held), end))
                progress.update(t, engine.meter.now())
            wall = time.monotonic() - started
            engine.meter.sample()
            m1 = engine.meter.elapsed()
            peak, gib_s = engine.meter.window(m0, m1)
            r = record(mode, epoch, seed + epoch, trajectories, wall, peak, gib_s, running,
                       prefix_window(stats_before, engine.prefix_statistics()),
                       speculation=speculation_window(
                           spec_before, engine.speculation_statistics()),
                       memory=memory_window(engine.meter.timeline, m0, m1))
            spec = (f", top-1 {_percent(r['spec_top1'])}, adopted {r['spec_adopted_s'] or 0:.1f} s, wasted "
                    f"{r['spec_wasted_s'] or 0:.1f} s" if r["speculation"] is not None else "")
            print(f"{mode}: epoch {epoch}: {r['wall_s']:.1f} s, tool-s {r['tool_s_executed']:.1f} executed "
                  f"{r['tool_s_skipped']:.1f} skipped, hit rate {r['hit_rate']:.2f}{spec}, peak "
                  f"{human_bytes(r['peak_bytes'])}, {r['total_gib_s']:.1f} GiB*s, success {r['success_rate']:.0%}",
                  file=log, flush=True)
            out.append(r)
    return out


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def ratios(records: list[dict[str, Any]], reference: str = "base") -> list[dict[str, Any]]:
    """Every other mode / ``reference`` per epoch: wall, peak, GiB*s; beside them its hit rate, skipped
    tool-seconds, speculation's top-1 accuracy and adopted and wasted tool-seconds (None where it does not
    speculate), and whether it behaved as the reference did: equal hashes with observations (``same_behaviour``)
    and without (``same_actions``: calls, finals, statuses, rewards), and how many rollouts
    differ in each (an observation that shows the clock, as a test runner's "Ran 6 tests in 2.4s" does, differs
    between any two runs; a cached one repeats the run that was cached)."""
    ref = {r["epoch"]: r for r in records if r["mode"] == reference}
    div = lambda a, b: round(a / b, 4) if b else None  # noqa: E731

    def differing(r: dict[str, Any], base: dict[str, Any], which: int) -> int:
        mine, theirs = r.get("per_rollout", {}), base.get("per_rollout", {})
        return sum(mine.get(k, ("", ""))[which] != theirs[k][which] for k in theirs) + len(set(mine) - set(theirs))

    return [{"mode": r["mode"], "epoch": r["epoch"], "wall_ratio": div(r["wall_s"], base["wall_s"]),
             "peak_ratio": div(r["peak_bytes"], base["peak_bytes"]),
             "gib_s_ratio": div(r["total_gib_s"], base["total_gib_s"]), "hit_rate": r["hit_rate"],
             "tool_s_skipped": r["tool_s_skipped"], "spec_top1": r.get("spec_top1"),
             "spec_adopted_s": r.get("spec_adopted_s"), "spec_wasted_s": r.get("spec_wasted_s"),
             "same_behaviour": r["rewards_sha256"] == base["rewards_sha256"],
             "same_actions": r.get("actions_sha256") == base.get("actions_sha256"),
             "rollouts_differing": differing(r, base, 0), "rollouts_acting_differently": differing(r, base, 1)}
            for r in records if r["mode"] != reference and (base := ref.get(r["epoch"]))]


def mode_settings(mode: str, prefix: Any, speculation: Any) -> tuple[Any, Any]:
    """(prefix settings, speculation settings) of ``mode``: ``prefix`` for the modes with the prefix cache,
    ``speculation`` for those that speculate (``read_only`` in ``spec-readonly``); refuses an unknown mode."""
    if mode not in MODES:
        raise BadRequest(f"unknown mode {mode!r}: use {', '.join(MODES)}")
    if mode in SPEC_MODES and speculation is None:
        speculation = SpecSettings()
    return (prefix if mode in PREFIX_MODES else None,
            None if mode not in SPEC_MODES else replace(speculation, read_only=True) if mode == "spec-readonly"
            else speculation)


def per_mode(modes: list[str], prefix: Any, speculation: Any) -> dict[str, tuple[Any, Any]]:
    """Each mode's settings; with a cache directory DIR, each prefix-cache mode keeps its cache (and ``full`` its
    selector: ``SpecSettings.model_dir``) in ``DIR/<mode>``, so no mode starts from what another left."""
    out = {}
    for mode in modes:
        p, s = mode_settings(mode, prefix, speculation)
        if p is not None and p.cache_dir is not None:
            p = replace(p, cache_dir=p.cache_dir / mode)
            if s is not None:
                s = replace(s, model_dir=p.cache_dir)
        out[mode] = (p, s)
    return out


async def main(suite: Suite, policy: Policy, modes: list[str], epochs: int, *, tasks: int, group_size: int,
               seed: int = 0, settings: Any = None, speculation: Any = None,
               engine_kwargs: dict[str, Any] | None = None, json_path: Path | None = None,
               plots: Path | None = None, config: dict[str, Any] | None = None, log: Any = sys.stderr) -> int:
    """Every mode's epochs, the tables on stdout, JSON and the plots; ``settings``: the prefix cache's (None: its
    defaults), ``speculation``: the ``SpecSettings`` of the speculating modes (None: their defaults). Returns 1 if a
    mode acted or scored differently from the first mode or a rollout failed by the run's fault (engine, setup,
    workspace); observations alone that differ are reported, not failed (an observation may show the clock)."""
    if epochs < 1 or tasks < 1 or group_size < 1 or not modes:
        raise BadRequest(f"need epochs, tasks, group size >= 1 and a mode, got {epochs}, {tasks}, {group_size}")
    if settings is None and any(m in PREFIX_MODES for m in modes):
        settings = PrefixSettings()
    chosen = per_mode(modes, settings, speculation)
    records = []
    for mode in modes:
        records += await run_mode(suite, policy, mode, epochs, tasks=tasks, group_size=group_size, seed=seed,
                                  engine_kwargs=engine_kwargs or {}, prefix=chosen[mode][0],
                                  speculation=chosen[mode][1], log=log)
    rs = ratios(records, reference=modes[0])
    print(tables(records, rs, reference=modes[0]))
    if json_path:
        written = [{k: v for k, v in r.items() if k not in ("per_rollout", "behaviours")} for r in records]
        write_json(json_path, {"suite": suite.name, "knobs": suite.knobs, "policy": policy.name,
                               "modes": modes, "epochs": epochs, "tasks": tasks, "group_size": group_size,
                               "seed": seed, "config": config or {}, "ratios": rs, "records": written})
        differing = differing_rollouts(records, reference=modes[0])
        if differing:  # each one whole, beside the reference's: what to diff
            path = json_path.with_name(f"{json_path.stem}-differing.jsonl")
            path.write_bytes(b"".join(msgspec.json.encode(d, order="sorted") + b"\n" for d in differing))
            print(f"wrote {path}: {len(differing)} rollouts that differ from {modes[0]}'s, beside its own", file=log)
    if plots:
        plots.mkdir(parents=True, exist_ok=True)
        title = f"{suite.name}, {policy.name} policy, {tasks} groups of {group_size}"
        for path, draw in ((plots / f"epoch-{suite.name}.png", plot),
                           (plots / f"epoch-{suite.name}-memory.png", plot_memory)):
            await asyncio.to_thread(draw, records, path, title)  # rendering takes a while: off the loop
            print(f"wrote {path}", file=log)
    for r in rs:
        if not r["same_actions"]:
            print(f"{r['mode']} epoch {r['epoch']}: {r['rollouts_acting_differently']} rollouts acted or scored "
                  f"differently from {modes[0]}'s", file=log)
        elif not r["same_behaviour"]:
            print(f"{r['mode']} epoch {r['epoch']}: same actions and rewards as {modes[0]}'s, but "
                  f"{r['rollouts_differing']} rollouts saw different observations", file=log)
    broken = sum(n for r in records for s, n in r["statuses"].items() if s in BROKEN)
    return 1 if broken or not all(r["same_actions"] for r in rs) else 0


def command(args: Any) -> int:
    """``bunshin bench epoch`` from its parsed arguments: the suite (its ``time_scale`` knob ``--time-scale`` unless
    ``--set`` names it), the policy at ``--time-scale`` (and ``--detour-p``), the prefix settings (in memory only
    unless ``--cache-dir``: a directory, or ``temp`` for a fresh temporary one), the speculation settings
    (``--spec-*``), then ``main``; what it refuses is a ``CommandError``."""
    from .. import event_loop

    with_time_scale(args, args.time_scale)
    try:
        policy = bench_policy(args.policy, args.time_scale, args.detour_p)
    except BadRequest as exc:
        raise CommandError(f"bunshin bench epoch: {exc}") from exc
    suite = make_suite(args)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("command", "bench", "set", "subparser")}
    config["suite_time_scale"] = dict(args.set).get("time_scale")
    speculation = spec_settings(args, "bunshin bench epoch")

    with tempfile.TemporaryDirectory(prefix="bunshin-epoch-cache-", dir="/var/tmp") as scratch:
        cache_dir = {"none": None, "temp": Path(scratch)}.get(args.cache_dir, Path(args.cache_dir))
        settings = PrefixSettings(cache_dir=cache_dir, strategy=args.strategy, **budgets(args))
        engine_kwargs = {"backend": args.backend, "concurrency": args.concurrency, "max_steps": args.max_steps}
        try:
            return event_loop.run(main(suite, policy, args.modes, args.epochs, tasks=args.tasks,
                                       group_size=args.group_size, seed=args.seed, settings=settings,
                                       speculation=speculation, engine_kwargs=engine_kwargs, json_path=args.json,
                                       plots=args.plots, config=config))
        except BadRequest as exc:
            raise CommandError(f"bunshin bench epoch: {exc}") from exc
