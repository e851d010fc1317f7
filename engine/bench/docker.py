"""``bunshin bench docker``: workspaces from a Docker image, three ways, in one run: our runtime on the image (a live
fork), Docker as the runtime (a fresh container from the committed files plus the app's state restored), and the
same with KSM merging the containers' pages.

Owns: the procedure, its table and plot. Every mode runs the web shop (the text browser, the suite's own workload)
on the declared image ``base`` imported into Docker (``bunshin/base:<digest>``). Per repeat and mode: a source
workspace is created and its task set up (``create``: the create call until it answers, plus the task's setup);
``--workspaces`` clones are forked from it one after the other (``fork-to-ready``: the fork call until the clone
answers; under Docker that is the source's dump and commit, shared by every fork of one state, plus a container's
start and its host's restore); each clone then plays the task's first ``--calls`` reference steps (``per call``:
each call's wall time as the engine sees it, with the suite's modelled latency at zero, so what is left is the
runtime's path and the tool's own work); then the run's memory with the source and every clone alive: its cgroup
charge (shared pages counted once; every container is in it) and PSS summed over its processes. With KSM, memory is
read once ksmd has settled (its merged-page count unchanged for 3 s, at most 60 s; the wait is reported).
Leaves out: the daemon's own memory and CPU (dockerd, containerd, their shims: outside the run), the image's
import and extraction (once per image, before the first repeat), ksmd's CPU.
Modes run one after the other inside a repeat; each figure is reported as the median and range over the repeats.
Must never: compare modes across runs, or report a Docker fork as a live one.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs import WorkspaceRuntime
from bunshin.envs.images.docker_daemon import import_declared
from bunshin.envs.images.recipes import recipe
from bunshin.envs.images.store import ImageStore
from bunshin.envs.records import Limits
from bunshin.envs.runtime.ksm import read_counters
from bunshin.envs.suites.base import Suite

from ..errors import EngineError
from ..report import human_bytes, markdown_table, percentile, pyplot, write_json

MODES = {
    "live": "our runtime on the Docker image: live fork (cow)",
    "docker": "Docker runtime: fresh container from the committed files + the app's state restored",
    "docker+ksm": "Docker runtime, as above, the containers' pages merged by KSM",
}
TEMPLATE = "add_to_cart"
COLUMNS = [
    ("mode", "mode"), ("create_ms", "create ms"), ("fork_ms", "fork-to-ready p50 ms"),
    ("fork_p95_ms", "fork-to-ready p95 ms"), ("call_ms", "per call p50 ms"), ("charge", "memory (cgroup)"),
    ("per_workspace", "per workspace"), ("pss", "PSS sum"), ("ksm_wait_s", "KSM settle s"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _measure(mode: str, suite: Suite, image: str, workspaces: int, calls: int) -> dict[str, Any]:
    kind = "native" if mode == "live" else "docker"
    limits = Limits(memory_bytes=2 << 30, pids=512, command_timeout_s=120)
    task = next(t for t in suite.tasks() if t.template == TEMPLATE)
    app = suite.app()
    if mode == "docker+ksm":
        app = msgspec.structs.replace(app, merge_memory=True)
    steps = [c for c in task.reference if not suite.is_final(c)][:calls]
    async with WorkspaceRuntime(runtime=kind, image=image, limits=limits, start_timeout_s=240) as rt:
        started = time.monotonic()
        source = await rt.create(app)
        await suite.start(source, task)
        create_ms = (time.monotonic() - started) * 1e3
        forks, call_ms, clones = [], [], []
        for i in range(workspaces):
            started = time.monotonic()
            clones.append(await source.fork())
            forks.append((time.monotonic() - started) * 1e3)
            _log(f"[{mode}] fork {i + 1}/{workspaces}: {forks[-1]:.0f} ms")
        for clone in clones:
            for step in steps:
                call = await suite.concrete(clone, step)
                started = time.monotonic()
                observation = await clone.execute(call)
                call_ms.append((time.monotonic() - started) * 1e3)
                if observation.error:
                    raise EngineError(f"bench docker: {mode}: task {task.id}'s step {call.name} failed: "
                                      f"{observation.error}")
        ksm_wait = await _ksm_settled() if mode == "docker+ksm" else 0.0
        memory = await asyncio.to_thread(rt.memory)
        for ws in (*clones, source):
            await ws.close()
    return {"mode": mode, "runtime": kind, "create_ms": create_ms, "fork_ms": forks, "call_ms": call_ms,
            "charge_bytes": memory.cgroup_charge, "pss_bytes": memory.pss, "processes": memory.processes,
            "ksm_wait_s": ksm_wait}


async def _ksm_settled(quiet_s: float = 3.0, limit_s: float = 60.0) -> float:
    """Seconds until ksmd's merged-page count stopped moving for ``quiet_s`` (at most ``limit_s``)."""
    started = time.monotonic()
    last, since = -1, time.monotonic()
    while time.monotonic() - started < limit_s:
        now = read_counters().get("pages_sharing", 0)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


def _median_range(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def summarize(runs: list[dict[str, Any]], workspaces: int) -> list[dict[str, Any]]:
    rows = []
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        charge = [float(r["charge_bytes"]) for r in mine]
        rows.append({
            "mode": mode, "what": MODES[mode], "repeats": len(mine),
            "create_ms": _median_range([r["create_ms"] for r in mine]),
            "fork_ms": _median_range([percentile(r["fork_ms"], 50) for r in mine]),
            "fork_p95_ms": _median_range([percentile(r["fork_ms"], 95) for r in mine]),
            "call_ms": _median_range([percentile(r["call_ms"], 50) for r in mine], "{:.1f}"),
            "charge": f"{human_bytes(statistics.median(charge))} [{human_bytes(min(charge))}-"
                      f"{human_bytes(max(charge))}]",
            "per_workspace": human_bytes(statistics.median(charge) / (workspaces + 1)),
            "pss": human_bytes(statistics.median(float(r["pss_bytes"]) for r in mine)),
            "ksm_wait_s": f"{statistics.median(r['ksm_wait_s'] for r in mine):.0f}",
            "charge_median_bytes": statistics.median(charge),
            "fork_ms_samples": [x for r in mine for x in r["fork_ms"]],
        })
    return rows


def plot(rows: list[dict[str, Any]], workspaces: int, path: Path) -> None:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [r["mode"] for r in rows]
    ax.boxplot([r["fork_ms_samples"] for r in rows], tick_labels=names)
    ax.set_yscale("log")
    ax.set_ylabel("fork-to-ready (ms, log)")
    ax.set_title("web shop from a Docker image: a fork")
    ax.grid(alpha=0.3)
    ax2.bar(names, [r["charge_median_bytes"] / 2**20 for r in rows])
    ax2.set_ylabel("MiB (cgroup charge, median)")
    ax2.set_title(f"memory of 1 source + {workspaces} clones")
    ax2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(suite: Suite, modes: list[str], workspaces: int, calls: int, repeat: int, address: str) -> dict:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise EngineError(f"bench docker: unknown mode(s) {unknown}: use {', '.join(MODES)}")
    image = str(await import_declared(ImageStore().require(recipe("base")), address=address, progress=_log))
    runs = []
    for r in range(repeat):
        for mode in modes:
            _log(f"bench docker: repeat {r + 1}/{repeat}, {mode}")
            runs.append(await _measure(mode, suite, image, workspaces, calls) | {"repeat": r})
    return {"image": image, "workspaces": workspaces, "calls": calls, "runs": runs}


def command(args: Any) -> int:
    from bunshin.envs.images.docker_daemon import daemon_running
    from bunshin.envs.images.docker_roots import DEFAULT_SOCKET
    from bunshin.envs.webshop.suite import WebShopSuite

    from .. import event_loop

    if args.workspaces < 1 or args.repeat < 1 or args.calls < 0:
        raise EngineError("bench docker: --workspaces and --repeat are at least 1, --calls at least 0")
    suite = WebShopSuite(catalog_size=args.catalog_size, time_scale=0.0)
    with daemon_running(Path(args.daemon_log)) as started:
        if started:
            _log(f"bench docker: started dockerd (stopped at the end; log {args.daemon_log})")
        data = event_loop.run(run(suite, args.modes, args.workspaces, args.calls, args.repeat, DEFAULT_SOCKET))
    rows = summarize(data["runs"], args.workspaces)
    print(markdown_table(rows, COLUMNS))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, {**data, "summary": [{k: v for k, v in r.items() if k != "fork_ms_samples"}
                                                   for r in rows]})
    if args.plot:
        plot(rows, args.workspaces, args.plot)
    return 0


def add_arguments(parser: Any) -> None:
    parser.add_argument("--modes", type=lambda text: [m for m in text.split(",") if m], default=list(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--workspaces", type=int, default=8, help="clones forked from the source per repeat")
    parser.add_argument("--calls", type=int, default=4, help="reference steps each clone plays")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--catalog-size", type=int, default=1000)
    parser.add_argument("--daemon-log", default="/var/log/bunshin-dockerd.log",
                        help="where a dockerd this command starts (when none answers) writes")
    parser.add_argument("--json", type=Path, help="every run and the summary as JSON here")
    parser.add_argument("--plot", type=Path, help="a PNG plot here")
