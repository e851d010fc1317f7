"""``bunshin bench steps``: the web shop's per-step latency, Chromium against the text browser.

Owns: the procedure and its table. For each browser, one workspace of the shop (no modelled latency:
``time_scale`` 0, so a step costs what the browser and the shop's server cost) plays the reference solution of the
first ``--tasks`` tasks of every template, ``--repeat`` times, from each task's start page; before every step
(and before the final one, which is not run) it also takes an observation (``observe``: the accessibility tree
and, unless ``--no-screenshots``, the viewport PNG, as an agent sees the page). Per tool: the wall time of the call through the runtime (the engine's side of one
step: request, the browser's work, the tool's page-ready wait, the answer) as p50, p95 and count, and the
Chromium/text ratio of the medians.
Leaves out: the policy's time, the fork at a rollout's start (``bench fork --browser chromium``), the task's
start (a ``goto``, the same for every task).
Must never: compare numbers from different runs: both browsers run here, one after the other.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.records import Limits
from bunshin.envs.webshop.suite import WebShopSuite

from ..errors import EngineError
from ..report import markdown_table, percentile, pyplot, write_json

BROWSERS = ("text", "chromium")
OBSERVE = ToolCall(name="observe", args={})


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _measure(browser: str, catalog_size: int, tasks: int, repeat: int, screenshots: bool
                   ) -> dict[str, list[float]]:
    suite = WebShopSuite(catalog_size=catalog_size, time_scale=0.0, browser=browser, screenshots=screenshots)
    chosen: dict[str, list[Any]] = {}
    for task in suite.tasks():
        if len(chosen.setdefault(task.template, [])) < tasks:
            chosen[task.template].append(task)
    times: dict[str, list[float]] = {}
    limits = Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=120)
    async with WorkspaceRuntime(limits=limits, warm_pool=0) as rt:
        ws = await rt.create(suite.app())
        for k in range(repeat):
            for template, picked in sorted(chosen.items()):
                for task in picked:
                    await suite.start(ws, task)
                    for call in task.reference:
                        started = time.monotonic()
                        await ws.execute(OBSERVE)
                        times.setdefault("observe", []).append(time.monotonic() - started)
                        if suite.is_final(call):
                            break
                        concrete = await suite.concrete(ws, call)  # a symbolic element found: not timed
                        started = time.monotonic()
                        observation = await ws.execute(concrete)
                        times.setdefault(call.name, []).append(time.monotonic() - started)
                        if observation.error:
                            raise EngineError(f"bench steps: {browser}: task {task.id} step {call.name}: "
                                              f"{observation.error}")
                    _log(f"[{browser} {k + 1}/{repeat}] {template} task {task.id}: {len(task.reference) - 1} steps")
        await ws.close()
    return times


def _row(tool: str, by: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    row: dict[str, Any] = {"tool": tool}
    for browser, times in by.items():
        xs = [t * 1e3 for t in times.get(tool, [])]
        row[f"{browser}_n"] = len(xs)
        row[f"{browser}_p50"] = round(percentile(xs, 50), 2) if xs else None
        row[f"{browser}_p95"] = round(percentile(xs, 95), 2) if xs else None
    if row.get("text_p50") and row.get("chromium_p50"):
        row["ratio"] = round(row["chromium_p50"] / row["text_p50"], 2)
    return row


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    tools = [r["tool"] for r in rows]
    xs = range(len(tools))
    for k, browser in enumerate(BROWSERS):
        ax.bar([x + (k - 0.5) * 0.4 for x in xs], [r.get(f"{browser}_p50") or 0 for r in rows], width=0.4,
               label=f"{browser} p50")
        ax.scatter([x + (k - 0.5) * 0.4 for x in xs], [r.get(f"{browser}_p95") or 0 for r in rows], marker="_",
                   s=200, color="black")
    ax.set_xticks(list(xs), tools, rotation=30)
    ax.set_ylabel("ms per call (bar: p50, tick: p95)")
    ax.set_title("web shop: a step's latency, Chromium against the text browser")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(catalog_size: int, tasks: int, repeat: int, screenshots: bool, json_path: Path | None,
              plot_path: Path | None) -> dict[str, Any]:
    by = {b: await _measure(b, catalog_size, tasks, repeat, screenshots) for b in BROWSERS}
    tools = sorted({t for times in by.values() for t in times}, key=lambda t: (t != "observe", t))
    rows = [_row(t, by) for t in tools]
    columns = [("tool", "tool")]
    for b in BROWSERS:
        columns += [(f"{b}_n", f"{b} calls"), (f"{b}_p50", f"{b} p50 ms"), (f"{b}_p95", f"{b} p95 ms")]
    print(markdown_table(rows, [*columns, ("ratio", "chromium/text p50")]))
    data = {"catalog_size": catalog_size, "tasks_per_template": tasks, "repeat": repeat, "screenshots": screenshots,
            "rows": rows, "samples_s": by}
    if json_path:
        write_json(json_path, data)
    if plot_path:
        _plot(rows, plot_path)
    return data
