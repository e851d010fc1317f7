"""``bunshin bench memory``: memory and time as concurrent rollouts grow, live fork vs private restore, each with
and without KSM (``--compare-ksm``).

Owns: the procedure and its summary. For each repeat, configuration (a backend; with KSM or not) and rollout
count N, one engine runs N concurrent rollouts of the suite's calibrated default workload (``--group-size`` samples
per task, the first N / group-size tasks, the scripted policy with ``--time-scale`` so that rollouts overlap; the same scale goes to the suite's
``time_scale`` knob, its modelled tool latency, unless ``--set time_scale=X`` gives another). Its meter samples the
run's cgroup charge every 0.25 s (every workspace of the run, shared pages counted once; each host's interpreter
start-up included, for both backends) and, every second in a thread, the detailed reading: PSS summed over the run's
processes plus tmpfs, their private memory and page tables, and the engine's and nursery's own PSS (outside the
run). Per run: ``peak_bytes``, ``mean_bytes`` (GiB*s / wall), ``wall_s``, ``total_gib_s`` and the detail peaks.
Also per run: ksmd's CPU seconds over the run (a cost of KSM: the kernel thread works for every run on the machine,
so it is read only as a figure of its own, never added to the run's), and the warm pool's hits and misses (a
Chromium workspace's clones take their browser from it; its ready slots are in the run's cgroup and counted).
Repeats run configuration after configuration within a repeat; the summary gives each figure's median and range
over the repeats, and every configuration's ratios to the private restore are taken within a repeat, then
summarised the same way.
Must never: compare runs of different workloads: both backends run the same requests with the same seed.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bunshin.envs.runtime.fork.registry import forks_live
from bunshin.envs.suites.base import Suite
from bunshin.policies.scripted import ScriptedPolicy

from ..records import Status
from ..report import human_bytes, markdown_table, pyplot, write_json
from ..rollout import RolloutEngine

GiB = 1 << 30
FIGURES = ("peak_bytes", "mean_bytes", "wall_s", "total_gib_s", "pss_peak", "page_tables_peak", "engine_peak",
           "nursery_peak")
RATIOS = (("peak_ratio", "peak_bytes"), ("mean_ratio", "mean_bytes"), ("wall_ratio", "wall_s"),
          ("total_ratio", "total_gib_s"))


@dataclass(frozen=True)
class Config:
    """One way to run the batch: a backend, and whether the workspaces opt into KSM (the suite's ``ksm`` knob)."""

    backend: str
    suite: Suite
    ksm: bool = False

    @property
    def name(self) -> str:
        """The backend, or ``setup-pool`` for a suite that does not fork live (every sample's workspace is made
        and set up on its own: the backend forks nothing); ``+ksm`` with KSM."""
        how = self.backend if forks_live(self.suite.forks_live, self.backend) else "setup-pool"
        return f"{how}+ksm" if self.ksm else how


async def measure(config: Config, rollouts: int, group_size: int, time_scale: float, seed: int,
                  warm_pool: int | None = None) -> dict[str, Any]:
    groups = max(1, rollouts // group_size)
    engine = RolloutEngine(config.suite, ScriptedPolicy(time_scale=time_scale), backend=config.backend,
                           concurrency=rollouts, memory_detail_s=1.0, warm_pool=warm_pool)
    started = time.monotonic()
    ksmd_before = ksmd_cpu_s()
    async with engine:
        requests = engine.requests(limit=groups, group_size=group_size, seed=seed)
        results = await engine.run(requests)
        pool = dataclasses.asdict(engine.runtime.warm_pool_stats())
    wall = time.monotonic() - started
    ksmd_after = ksmd_cpu_s()
    meter = engine.meter
    peaks = meter.detail_peaks()
    return {"config": config.name, "backend": config.backend, "ksm": config.ksm, "rollouts": len(results),
            "peak_bytes": meter.peak_bytes,
            "mean_bytes": round(meter.mean_bytes), "total_gib_s": round(meter.gib_s, 3), "wall_s": round(wall, 2),
            "metered_s": round(meter.wall_s, 2),
            "pss_peak": max((d["pss"] + d["shmem"] for _, d in meter.details), default=0),
            "private_peak": peaks.get("private", 0), "page_tables_peak": peaks.get("page_tables", 0),
            "engine_peak": peaks.get("engine", 0), "nursery_peak": peaks.get("nursery", 0),
            "ok": sum(r.trajectory.status == Status.OK for r in results),
            "statuses": {s: n for s in Status if (n := sum(r.trajectory.status == s for r in results))},
            "errors": sorted({(r.trajectory.error or "")[:200] for r in results if r.trajectory.error})[:5],
            "mean_reward": round(sum(r.trajectory.reward for r in results) / max(len(results), 1), 4),
            "ksmd_cpu_s": round(ksmd_after - ksmd_before, 3) if ksmd_before is not None and ksmd_after is not None
            else None, "warm_pool": pool,
            "timeline": [(round(t, 2), v) for t, v in meter.timeline],
            "details": [(round(t, 2), d) for t, d in meter.details]}


BASELINE = "restore"  # private copies: each clone restored from the dump on its own, nothing shared


def ratios(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every other configuration / ``BASELINE`` per repeat and rollout count, for each figure of ``RATIOS``."""
    by = {(r["repeat"], r["config"], r["rollouts"]): r for r in results}
    out = []
    for (repeat, config, n), run in sorted(by.items()):
        base = by.get((repeat, BASELINE, n))
        if config != BASELINE and base:
            out.append({"repeat": repeat, "config": config, "rollouts": n,
                        **{name: round(run[key] / base[key], 4) if base[key] else None for name, key in RATIOS}})
    return out


def ksmd_cpu_s() -> float | None:
    """CPU seconds ksmd (the kernel's same-page merging thread) has used since boot; None without one."""
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "ksmd":
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15 of stat)
    return None


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(results: list[dict[str, Any]], rs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range over the repeats of every figure per (configuration, rollouts), and of every ratio."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in results:
        runs.setdefault((r["config"], r["rollouts"]), []).append(r)
    per_run = []
    for (config, n), rows in sorted(runs.items()):
        ksmd = [r["ksmd_cpu_s"] for r in rows if r.get("ksmd_cpu_s") is not None]
        hits = [r["warm_pool"].get("hits", 0) for r in rows if r.get("warm_pool")]
        misses = [r["warm_pool"].get("misses", 0) for r in rows if r.get("warm_pool")]
        per_run.append({"config": config, "backend": rows[0]["backend"], "rollouts": n,
                        "ok": min(r["ok"] for r in rows), **{f: spread([r[f] for r in rows]) for f in FIGURES},
                        "ksmd_cpu_s": spread(ksmd) if ksmd else None,
                        "pool_hits": sum(hits), "pool_misses": sum(misses)})
    per_ratio: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rs:
        per_ratio.setdefault((r["config"], r["rollouts"]), []).append(r)
    ratio_rows = [{"config": c, "rollouts": n, **{name: spread([r[name] for r in rows if r[name] is not None])
                                                for name, _ in RATIOS}} for (c, n), rows in sorted(per_ratio.items())]
    return {"runs": per_run, "ratios": ratio_rows}


def _cell(s: dict[str, float], fmt: Any) -> str:
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"


def tables(summary: dict[str, Any]) -> str:
    gib = lambda v: f"{v / GiB:.2f}"  # noqa: E731
    mib = lambda v: f"{v / (1 << 20):.0f}"  # noqa: E731
    num = lambda v: f"{v:.1f}"  # noqa: E731
    rows = [{"config": r["config"], "rollouts": r["rollouts"], "ok": r["ok"],
             "peak": _cell(r["peak_bytes"], gib), "mean": _cell(r["mean_bytes"], gib),
             "wall": _cell(r["wall_s"], num), "gib_s": _cell(r["total_gib_s"], num),
             "pss": _cell(r["pss_peak"], gib), "pt": _cell(r["page_tables_peak"], mib),
             "engine": _cell(r["engine_peak"], mib), "nursery": _cell(r["nursery_peak"], mib),
             "ksmd": _cell(r["ksmd_cpu_s"], num) if r["ksmd_cpu_s"] else "-",
             "pool": f"{r['pool_hits']}/{r['pool_misses']}" if r["pool_hits"] or r["pool_misses"] else "-"}
            for r in summary["runs"]]
    first = markdown_table(rows, [
        ("config", "configuration"), ("rollouts", "rollouts"), ("ok", "finished ok (min)"),
        ("peak", "peak GiB (cgroup)"), ("mean", "mean GiB (GiB*s / wall)"), ("wall", "wall s"),
        ("gib_s", "GiB*s"), ("pss", "peak GiB (PSS + tmpfs)"), ("pt", "page tables MiB (peak)"),
        ("engine", "engine MiB"), ("nursery", "nursery MiB"), ("ksmd", "ksmd CPU s"),
        ("pool", "warm pool hits/misses (all repeats)")])
    ratio = lambda v: f"{v:.3f}"  # noqa: E731
    second = markdown_table([{"config": r["config"], "rollouts": r["rollouts"],
                              **{name: _cell(r[name], ratio) for name, _ in RATIOS}} for r in summary["ratios"]],
                            [("config", "configuration"), ("rollouts", "rollouts"),
                             ("peak_ratio", f"peak / {BASELINE}"), ("mean_ratio", f"mean memory / {BASELINE}"),
                             ("wall_ratio", f"wall / {BASELINE}"), ("total_ratio", f"GiB*s / {BASELINE}")])
    return f"{first}\n\n{second}" if summary["ratios"] else first


def plot(results: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        if r["repeat"] != 0:
            continue
        ax.plot([t for t, _ in r["timeline"]], [v / GiB for _, v in r["timeline"]],
                label=f"{r['config']} x{r['rollouts']}", linestyle="--" if r["backend"] == BASELINE else "-")
    ax.set_xlabel("seconds")
    ax.set_ylabel("run memory (GiB, cgroup charge)")
    ax.set_title("memory over time (first repeat)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    for config in sorted({r["config"] for r in summary["runs"]}):
        rows = [r for r in summary["runs"] if r["config"] == config]
        xs = [r["rollouts"] for r in rows]
        for key, style, label in (("peak_bytes", "-o", "peak"), ("mean_bytes", ":s", "mean")):
            med = [r[key]["median"] / GiB for r in rows]
            err = [[m - r[key]["min"] / GiB for m, r in zip(med, rows, strict=True)],
                   [r[key]["max"] / GiB - m for m, r in zip(med, rows, strict=True)]]
            ax2.errorbar(xs, med, yerr=err, fmt=style, capsize=3, label=f"{config} {label}")
    ax2.set_xlabel("concurrent rollouts")
    ax2.set_ylabel("GiB (median, range over repeats)")
    ax2.set_title("peak and mean memory as rollouts grow")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main(suite: Suite, counts: list[int], backends: list[str], group_size: int, time_scale: float,
               seed: int, json_path: Path | None, plot_path: Path | None, repeat: int = 1,
               ksm_suite: Suite | None = None, warm_pool: int | None = None) -> int:
    """``ksm_suite``: the same suite with KSM on: every backend runs again with it, in the same repeat."""
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    configs = [Config(b, suite) for b in backends] + [Config(b, ksm_suite, ksm=True) for b in backends
                                                       if ksm_suite is not None]
    results = []
    total, done = repeat * len(configs) * len(counts), 0
    for k in range(repeat):
        for config in configs:
            for n in counts:
                done += 1
                print(f"[{done}/{total}] repeat {k + 1}/{repeat}, {config.name}: {n} rollouts ...", file=sys.stderr,
                      flush=True)
                r = {"repeat": k, **await measure(config, n, group_size, time_scale, seed, warm_pool)}
                print(f"[{done}/{total}] {config.name} x{n}: peak {human_bytes(r['peak_bytes'])}, mean "
                      f"{human_bytes(r['mean_bytes'])}, {r['wall_s']} s, {r['total_gib_s']} GiB*s, {r['ok']} ok",
                      file=sys.stderr, flush=True)
                results.append(r)
    rs = ratios(results)
    summary = summarize(results, rs)
    print(tables(summary))
    if json_path:
        write_json(json_path, {"suite": suite.name, "group_size": group_size, "time_scale": time_scale,
                               "repeat": repeat, "warm_pool": warm_pool, "summary": summary, "ratios": rs,
                               "results": results})
    if plot_path:
        plot(results, summary, plot_path)
    return 0 if all(r["ok"] == r["rollouts"] for r in results) else 1
