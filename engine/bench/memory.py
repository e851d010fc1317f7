"""``bunshin bench memory``: peak and total memory as concurrent rollouts grow, live fork vs private restore.

Owns: the procedure. For each backend and each rollout count N, one engine runs N concurrent rollouts of the
suite's calibrated default workload (``--group-size`` samples per task, the first N / group-size tasks, the
scripted policy with ``--time-scale`` so that rollouts overlap), and its memory meter samples the run's cgroup
charge (every workspace of the run, shared pages counted once) every 0.25 s: ``peak_bytes``, ``total_gib_s``
(the integral over the run), ``wall_s``. Results as JSON ``{"results": [...], "ratios": [...]}``, a table, and a
PNG of memory over time per run.
Must never: compare runs of different workloads: both backends run the same requests with the same seed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs.suites.base import Suite
from bunshin.policies.scripted import ScriptedPolicy

from ..records import Status
from ..rollout import RolloutEngine
from .report import human_bytes, markdown_table, pyplot, write_json

COLUMNS = [("backend", "backend"), ("rollouts", "rollouts"), ("peak", "peak memory"),
           ("total_gib_s", "total GiB*s"), ("wall_s", "wall s"), ("ok", "finished ok")]


async def measure(suite: Suite, backend: str, rollouts: int, group_size: int, time_scale: float,
                  seed: int) -> dict[str, Any]:
    groups = max(1, rollouts // group_size)
    engine = RolloutEngine(suite, ScriptedPolicy(time_scale=time_scale), backend=backend, concurrency=rollouts)
    started = time.monotonic()
    async with engine:
        requests = engine.requests(limit=groups, group_size=group_size, seed=seed)
        results = await engine.run(requests)
    wall = time.monotonic() - started
    return {"backend": backend, "rollouts": len(results), "peak_bytes": engine.meter.peak_bytes,
            "total_gib_s": round(engine.meter.gib_s, 3), "wall_s": round(wall, 2),
            "ok": sum(r.trajectory.status == Status.OK for r in results),
            "statuses": {s: n for s in Status if (n := sum(r.trajectory.status == s for r in results))},
            "errors": sorted({(r.trajectory.error or "")[:200] for r in results if r.trajectory.error})[:5],
            "mean_reward": round(sum(r.trajectory.reward for r in results) / max(len(results), 1), 4),
            "timeline": [(round(t, 2), v) for t, v in engine.meter.timeline]}


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["backend"], r["rollouts"]): r for r in results}
    out = []
    for (backend, n), r in sorted(by.items()):
        other = by.get(("restore", n))
        if backend == "cow" and other:
            out.append({"rollouts": n, "peak_ratio": round(r["peak_bytes"] / other["peak_bytes"], 4),
                        "total_ratio": round(r["total_gib_s"] / other["total_gib_s"], 4)})
    return out


def plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        ts = [t for t, _ in r["timeline"]]
        ax.plot(ts, [v / 2**30 for _, v in r["timeline"]], label=f"{r['backend']} x{r['rollouts']}",
                linestyle="-" if r["backend"] == "cow" else "--")
    ax.set_xlabel("seconds")
    ax.set_ylabel("run memory (GiB, cgroup charge)")
    ax.set_title("memory over time")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    for backend in sorted({r["backend"] for r in results}):
        rs = sorted((r for r in results if r["backend"] == backend), key=lambda r: r["rollouts"])
        ax2.plot([r["rollouts"] for r in rs], [r["peak_bytes"] / 2**30 for r in rs], marker="o", label=backend)
    ax2.set_xlabel("concurrent rollouts")
    ax2.set_ylabel("peak memory (GiB)")
    ax2.set_title("peak memory as rollouts grow")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main(suite: Suite, counts: list[int], backends: list[str], group_size: int, time_scale: float,
               seed: int, json_path: Path | None, plot_path: Path | None) -> int:
    results = []
    for backend in backends:
        for n in counts:
            print(f"{backend}: {n} rollouts ...", file=sys.stderr, flush=True)
            r = await measure(suite, backend, n, group_size, time_scale, seed)
            print(f"{backend}: {n} rollouts: peak {human_bytes(r['peak_bytes'])}, {r['total_gib_s']} GiB*s, "
                  f"{r['wall_s']} s, {r['ok']} ok", file=sys.stderr, flush=True)
            results.append(r)
    shown = [{**r, "peak": human_bytes(r["peak_bytes"])} for r in results]
    print(markdown_table(shown, COLUMNS))
    rs = ratios(results)
    if rs:
        print()
        print(markdown_table(rs, [("rollouts", "rollouts"), ("peak_ratio", "peak cow/restore"),
                                  ("total_ratio", "GiB*s cow/restore")]))
    if json_path:
        write_json(json_path, {"suite": suite.name, "group_size": group_size, "time_scale": time_scale,
                               "results": results, "ratios": rs})
    if plot_path:
        plot(results, plot_path)
    return 0
