"""``bunshin bench fork --browser chromium``: fork-to-ready of a web-shop workspace with a real Chromium, three ways.

Owns: the procedure and its table. A source workspace runs the shop with Chromium, on a task's page with history
(the first ``add_to_cart`` task, its reference steps but the last: a search typed and submitted, a product page).
Each round changes the source's browser (a scroll: a new state, so the private restore dumps again) and forks it:
``cow+pool`` (the live fork; the clone takes over a warm-pool slot's ready Chromium: a hit, the round waits until
a slot is ready), ``cow`` (the live fork with no pool: the clone launches its own Chromium, a miss), ``restore``
(the private baseline: the host restored from a dump on its own, its own Chromium launched). In every way the
clone's browser is brought to the source's state (the ``replay`` fork of the browser: tabs, history, cookies,
storage, typed values, focus, scroll) and checked equal before the fork returns. Per fork: the source's freeze
window, fork-to-ready (the fork call until the clone answers), the browser's launch and restore times as the
clone reports them, and the clone's memory right after (PSS summed over its processes, its cgroup charge: for a
hit the slot's Chromium is in it).
Leaves out: the pool's own start-up of a slot (it runs ahead, in the background: its cost is memory, which
``bench memory`` counts); the first fork of a run (it warms the image's page cache).
Must never: compare numbers from different runs: the three ways run here, one after the other.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.records import Limits
from bunshin.envs.suites.base import Suite, play

from ..errors import EngineError
from ..report import human_bytes, markdown_table, percentile, pyplot, write_json

MODES = ("cow+pool", "cow", "restore")
TEMPLATE = "add_to_cart"
COLUMNS = [
    ("mode", "fork"), ("forks", "forks"), ("hits", "pool hits"),
    ("freeze_ms_p50", "freeze p50 ms"), ("ready_ms_p50", "ready p50 ms"), ("ready_ms_p95", "ready p95 ms"),
    ("ready_ms_range", "ready range ms"), ("launch_ms_p50", "browser launch p50 ms"),
    ("restore_ms_p50", "browser restore p50 ms"), ("pages_loaded", "pages loaded"),
    ("restore_loads_ms_p50", "of which loads p50 ms"), ("restore_check_ms_p50", "of which check p50 ms"),
    ("clone_pss", "clone PSS p50"),
    ("clone_charge", "clone cgroup p50"), ("clone_processes", "clone processes"),
]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _source(rt: WorkspaceRuntime, suite: Suite) -> Any:
    task = next(t for t in suite.tasks() if t.template == TEMPLATE)
    ws = await rt.create(suite.app())
    await suite.start(ws, task)
    async for _call, observation in play(suite, ws, task, task.reference[:-2]):
        if observation.error:
            raise EngineError(f"bench fork --browser chromium: task {task.id}'s reference failed: {observation.error}")
    return ws


async def _measure(mode: str, suite: Suite, forks: int) -> dict[str, Any]:
    backend, pool = ("restore", 0) if mode == "restore" else ("cow", 1 if mode == "cow+pool" else 0)
    limits = Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=120)
    rows: list[dict[str, Any]] = []
    async with WorkspaceRuntime(backend=backend, limits=limits, warm_pool=pool) as rt:
        source = await _source(rt, suite)
        warm = suite.app().warm
        for i in range(forks + 1):  # the first: warm-up, left out
            await source.execute(ToolCall(name="scroll", args={"direction": "down" if i % 2 == 0 else "up"}))
            if pool:
                deadline = time.monotonic() + 120
                while not (warm is not None and rt.hosts is not None and rt.hosts.pool.ready(warm)):
                    if time.monotonic() > deadline:
                        raise EngineError(f"no warm-pool slot became ready in 120 s: {rt.warm_pool_stats()}")
                    await asyncio.sleep(0.05)
            started = time.monotonic()
            clone = await source.fork()
            wall = time.monotonic() - started
            try:
                timing = clone.last_fork
                if timing is None:
                    raise EngineError(f"the {backend} backend returned {clone.id} without its fork timing")
                browser = (await clone.execute(ToolCall(name="_browser", args={}))).data
                memory = await asyncio.to_thread(clone.memory)
            finally:
                await clone.close()
            if i == 0:
                continue
            rows.append({"freeze_ms": timing.freeze_s * 1e3, "ready_ms": timing.ready_s * 1e3, "wall_ms": wall * 1e3,
                         "hit": timing.warm_slot, "launch_ms": browser["launch_s"] * 1e3,
                         "restore_ms": browser["restore_s"] * 1e3, "pss": memory.pss, "charge": memory.cgroup_charge,
                         "processes": memory.processes,
                         **{f"restore_{k}_ms": v * 1e3 for k, v in browser["restore_steps"].items() if k != "pages"},
                         "pages": browser["restore_steps"].get("pages", 0)})
            _log(f"[{mode}] fork {i}/{forks}: ready {rows[-1]['ready_ms']:.0f} ms (launch "
                 f"{rows[-1]['launch_ms']:.0f}, restore {rows[-1]['restore_ms']:.0f}), "
                 f"{'hit' if timing.warm_slot else 'no slot'}, clone PSS {human_bytes(memory.pss)}")
        await source.close()
    p50 = lambda key: percentile([r[key] for r in rows], 50)  # noqa: E731
    ready = [r["ready_ms"] for r in rows]
    return {"mode": mode, "backend": backend, "warm_pool": pool, "forks": len(rows),
            "hits": sum(r["hit"] for r in rows), "freeze_ms_p50": p50("freeze_ms"), "ready_ms_p50": p50("ready_ms"),
            "ready_ms_p95": percentile(ready, 95), "ready_ms_range": f"{min(ready):.0f}-{max(ready):.0f}",
            "launch_ms_p50": p50("launch_ms"), "restore_ms_p50": p50("restore_ms"),
            "restore_loads_ms_p50": p50("restore_loads_ms"), "restore_check_ms_p50": p50("restore_check_ms"),
            "pages_loaded": int(p50("pages")),
            "clone_pss_bytes": int(p50("pss")), "clone_charge_bytes": int(p50("charge")),
            "clone_pss": human_bytes(int(p50("pss"))), "clone_charge": human_bytes(int(p50("charge"))),
            "clone_processes": int(p50("processes")), "samples": rows}


def _plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [r["mode"] for r in results]
    ax.boxplot([[s["ready_ms"] for s in r["samples"]] for r in results], tick_labels=names)
    ax.set_ylabel("fork-to-ready (ms)")
    ax.set_title("Chromium web-shop workspace: fork-to-ready")
    ax.grid(alpha=0.3)
    launch = [r["launch_ms_p50"] for r in results]
    restore = [r["restore_ms_p50"] for r in results]
    ax2.bar(names, launch, label="browser launch (p50)")
    ax2.bar(names, restore, bottom=launch, label="browser state restore (p50)")
    ax2.set_ylabel("ms")
    ax2.set_title("the clone's browser: launch + restore")
    ax2.legend()
    ax2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(suite: Suite, forks: int, modes: list[str], json_path: Path | None,
              plot_path: Path | None) -> dict[str, Any]:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise EngineError(f"bench fork --browser chromium: unknown mode(s) {unknown}: use {', '.join(MODES)}")
    results = [await _measure(mode, suite, forks) for mode in modes]
    print(markdown_table(results, COLUMNS))
    data = {"suite": suite.name, "browser": "chromium", "results": results}
    if json_path:
        write_json(json_path, data)
    if plot_path:
        _plot(results, plot_path)
    return data
