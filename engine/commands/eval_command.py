"""``bunshin eval``: a batch of GRPO rollouts from the command line.

Owns: which tasks run (the suite's, or a tasks file's ids, less those the policy refuses, then ``--limit``), the
progress display, the summary (table on stdout, ``summary.json``, and every task file not run with the reason: the
suite's refusals of a ``--task-dir``, then the policy's) and ``trajectories.jsonl``. The summary always has the
steps by source (``steps_by_source``: executed, cached, rebuilt, speculated, from the trajectories) and
``speculation`` (the engine's ``speculation_statistics()``; None without ``--speculate``); with speculation on,
a second table shows its accuracy, tool-seconds and the branches' peak memory.
Must never: lose a finished rollout: trajectories are appended to the file as they finish; nor drop a refused task
file silently: each is in ``summary["refused"]`` and on stdout.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs.suites.base import Refusal, Suite, SuiteTask
from bunshin.policies.base import Policy

from ..errors import CommandError
from ..prefix.settings import PrefixSettings
from ..records import Status, Trajectory
from ..report import Progress, human_bytes, markdown_table, write_json
from ..rollout import RolloutEngine
from ..speculation.settings import SpecSettings


def summarize(trajectories: list[Trajectory], wall_s: float, peak: int, gib_s: float, backend: str) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for t in trajectories:
        statuses[t.status] = statuses.get(t.status, 0) + 1
    ok = [t for t in trajectories if t.status == Status.OK]
    return {"rollouts": len(trajectories), "succeeded": len(ok), "failed": len(trajectories) - len(ok),
            "mean_reward": round(sum(t.reward for t in trajectories) / len(trajectories), 4) if trajectories else 0.0,
            "success_rate": round(sum(t.reward == 1.0 for t in trajectories) / len(trajectories), 4)
            if trajectories else 0.0,
            "wall_s": round(wall_s, 2), "peak_memory_bytes": peak, "total_memory_gib_s": round(gib_s, 3),
            "backend": backend, "tasks": len({t.task_id for t in trajectories}), "statuses": statuses}


def prefix_summary(trajectories: list[Trajectory], cache: dict[str, Any]) -> dict[str, Any]:
    """The prefix cache's part of the summary: steps by how they ran (from the trajectories), hit rate, tool-seconds
    skipped (what the cached steps' calls took when executed) and replayed, nodes hot and cold, bytes."""
    steps = [s for t in trajectories for s in t.steps]
    by = {source: sum(s.source == source for s in steps) for source in ("executed", "cached", "rebuilt")}
    return {**{f"steps_{k}": v for k, v in by.items()},
            "hit_rate": round(by["cached"] / len(steps), 4) if steps else 0.0,
            "tool_s_skipped": round(sum(s.saved_s for s in steps), 3),
            "tool_s_executed": round(sum(s.tool_s for s in steps), 3),
            **{k: cache.get(k, 0) for k in ("tool_s_replayed", "nodes", "nodes_hot", "nodes_cold", "nodes_absent",
                                            "bytes_hot", "bytes_cold", "bytes_written", "full_bytes",
                                            "writer_backlog", "evicted_hot", "evicted_cold", "disk_bytes")}}


SOURCES = ("executed", "cached", "rebuilt", "speculated")


def steps_by_source(trajectories: list[Trajectory]) -> dict[str, int]:
    """Steps by where their result came from (a source not in ``SOURCES`` is counted under its own name)."""
    counts = dict.fromkeys(SOURCES, 0)
    for t in trajectories:
        for s in t.steps:
            counts[s.source] = counts.get(s.source, 0) + 1
    return counts


def speculation_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The speculation table's one row: the statistics (as the engine gave them) and the steps by source."""
    spec, steps = summary["speculation"], summary["steps_by_source"]
    rate = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    peak = spec.get("branch_bytes_peak")
    return [{**{f"steps_{k}": v for k, v in steps.items()}, "top1": rate(spec.get("spec_top1")),
             "topk": rate(spec.get("spec_topk")),
             "branches": f"{spec.get('speculated', 0)} / {spec.get('adopted', 0)} / {spec.get('wasted', 0)}",
             "adopted_s": spec.get("adopted_s", 0.0), "hidden_s": spec.get("hidden_s", 0.0),
             "wasted_s": spec.get("wasted_s", 0.0), "peak": "-" if peak is None else human_bytes(peak)}]


SPECULATION_COLUMNS = [("steps_executed", "executed steps"), ("steps_cached", "cached"), ("steps_rebuilt", "rebuilt"),
                       ("steps_speculated", "speculated"), ("top1", "top-1"), ("topk", "top-k"),
                       ("branches", "branches started / adopted / wasted"), ("adopted_s", "adopted tool-s"),
                       ("hidden_s", "hidden tool-s"), ("wasted_s", "wasted tool-s"), ("peak", "branches' peak")]


def runnable(tasks: dict[str, SuiteTask], ids: list[str] | None, policy: Policy,
             refused: list[Refusal]) -> tuple[list[str], list[Refusal]]:
    """The ids to run (``ids``, or every task, in order) without those ``policy`` refuses, and every task file not
    run: ``refused`` (the suite's) and then the policy's refusals, each with the task's file."""
    run, refused = [], list(refused)
    for i in ids if ids is not None else list(tasks):
        reason = policy.refuses(tasks[i])
        if reason is None:
            run.append(i)
        else:
            refused.append(Refusal(file=tasks[i].path, reason=reason))
    return run, refused


def print_refused(refused: list[Refusal]) -> None:
    if refused:
        print(f"refused {len(refused)} task file{'s' if len(refused) != 1 else ''}:")
        for r in refused:
            print(f"  {r.file}: {r.reason}")


async def run_eval(suite: Suite, policy: Policy, out: Path, *, tasks_file: Path | None = None,
                   limit: int | None = None, group_size: int = 4, concurrency: int = 8,
                   memory_budget: int | None = None, backend: str = "cow", seed: int = 0,
                   max_steps: int = 40, prefix: PrefixSettings | None = None,
                   speculation: SpecSettings | None = None, ray_address: str | None = None,
                   warm_pool: int | None = None, image: str | None = None,
                   runtime_kind: str = "native") -> dict[str, Any]:
    """``speculation``: speculative tool execution's settings (None: off). ``ray_address``: run the same job on a
    Ray cluster (``engine/cluster``: one agent per node, ``concurrency`` and ``memory_budget`` per node), as
    ``ray.init(address=...)`` takes it. ``warm_pool``: ready browsers per engine (``RolloutEngine``'s; None: its
    default). On a cluster the prefix cache and speculation run on every node, each node with its own cache
    (memory only: ``--cache-dir`` is refused with ``--ray``) and selector; groups go where their task's prefix
    tree is. What it refuses (that, a tasks file naming tasks the suite does not have) is a ``CommandError``."""
    if ray_address is not None and (image is not None or runtime_kind != "native"):
        raise CommandError("bunshin eval: --ray: --image and --runtime are not supported on a cluster yet (each node would need the "
                           "image); drop --image, or run on one host")
    if ray_address is not None and prefix is not None and prefix.cache_dir is not None:
        raise CommandError("bunshin eval: --ray: --cache-dir is not supported on a cluster (each node's prefix cache "
                           "is in its memory); drop --cache-dir, or run on one host")
    if runtime_kind == "docker":
        backend = "docker"  # what the summary says forked the workspaces
    out.mkdir(parents=True, exist_ok=True)
    trajectories: list[Trajectory] = []
    encoder = msgspec.json.Encoder()
    if ray_address is not None:
        from ..cluster.driver import ClusterEngine

        engine_cm: Any = ClusterEngine(suite, policy, address=ray_address, backend=backend, concurrency=concurrency,
                                       memory_budget=memory_budget, max_steps=max_steps, warm_pool=warm_pool,
                                       prefix=prefix, speculation=speculation)
    else:
        engine_cm = RolloutEngine(suite, policy, backend=backend, concurrency=concurrency,
                                  memory_budget=memory_budget, max_steps=max_steps, prefix=prefix,
                                  speculation=speculation, warm_pool=warm_pool, image=image,
                                  runtime_kind=runtime_kind)
    async with engine_cm as engine:
        ids = None
        if tasks_file is not None:
            try:
                text = tasks_file.read_text()
            except OSError as exc:
                raise CommandError(f"--tasks {tasks_file}: cannot read the file of task ids ({exc.strerror}); it "
                                   f"lists task ids one a line (--limit N takes the first N tasks)") from exc
            ids = [line.strip() for line in text.splitlines() if line.strip()]
            unknown = [i for i in ids if i not in engine.tasks]
            if unknown:
                raise CommandError(f"{tasks_file}: unknown task ids {unknown[:5]} for suite {suite.name}")
        ids, refused = runnable(engine.tasks, ids, policy, suite.refused())
        requests = engine.requests(ids, limit=limit, group_size=group_size, seed=seed)
        progress = Progress(sum(r.group_size for r in requests))
        started = time.monotonic()
        with open(out / "trajectories.jsonl", "wb") as f:
            async for result in engine.stream(requests):
                trajectories.append(result.trajectory)
                f.write(encoder.encode(result.trajectory) + b"\n")
                f.flush()
                progress.update(result.trajectory, engine.meter.now())
        wall = time.monotonic() - started
        if ray_address is not None:
            await engine.refresh()  # the nodes' figures as of the batch's end
        cache = engine.prefix_statistics()
        spec = engine.speculation_statistics()
    summary = summarize(trajectories, wall, engine.meter.peak_bytes, engine.meter.gib_s, backend)
    if cache is not None:
        summary["prefix"] = prefix_summary(trajectories, cache)
    summary["steps_by_source"] = steps_by_source(trajectories)
    summary["speculation"] = dict(spec) if spec is not None else None
    summary["refused"] = msgspec.to_builtins(refused)
    summary.update(suite.report(sorted({t.task_id for t in trajectories})))
    summary["knobs"] = dict(suite.knobs)  # what ``bunshin replay`` of this recording builds the suite with
    if ray_address is not None:
        summary["cluster"] = {"nodes": len(engine.infos), "lost_nodes": len(engine.dead),
                              "retried": sum(t.attempts > 1 for t in trajectories),
                              "peak_bytes_per_node": dict(engine.node_peaks)}
    write_json(out / "summary.json", summary)
    print(markdown_table([{**summary, "peak": human_bytes(summary["peak_memory_bytes"]),
                           "success": f"{summary['success_rate']:.0%}"}],
                         [("tasks", "tasks"), ("rollouts", "rollouts"), ("succeeded", "finished"),
                          ("failed", "failed"), ("success", "success rate"), ("mean_reward", "mean reward"),
                          ("wall_s", "wall s"), ("peak", "peak memory"), ("total_memory_gib_s", "GiB*s"),
                          ("backend", "backend")]))
    if cache is not None:
        p = summary["prefix"]
        print(markdown_table([{**p, "hit": f"{p['hit_rate']:.0%}", "hot": human_bytes(p["bytes_hot"]),
                               "written": f"{human_bytes(p['bytes_written'])} of {human_bytes(p['full_bytes'])}"}],
                             [("steps_cached", "cached steps"), ("steps_executed", "executed"),
                              ("steps_rebuilt", "rebuilt"), ("hit", "hit rate"), ("tool_s_skipped", "tool s skipped"),
                              ("nodes_hot", "nodes hot"), ("nodes_cold", "nodes cold"), ("hot", "snapshots"),
                              ("written", "checkpoints written (of full)")]))
    if summary["speculation"] is not None:
        print(markdown_table(speculation_rows(summary), SPECULATION_COLUMNS))
    if summary["failed"]:
        print("failed rollouts by status: " + ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())
                                                       if k != Status.OK))
    print_refused(refused)
    for note in summary.get("notes", []):
        print(f"note: {note}")
    if not requests:
        print(f"bunshin eval: nothing to run: {len(refused)} task file(s) refused (listed on stdout)"
              if refused else f"bunshin eval: nothing to run: suite {suite.name} has no tasks", file=sys.stderr)
    return summary
