"""``bunshin bench sharing``: how much of one sample's workspace memory stays identical to another sample's of the
same group, step by step, and how much our fork actually shares.

Owns: the procedure. One initialised workspace runs the task's start, then two samples are forked from it. Sample
A plays the reference solutions of tasks of one template, B those of the template's other tasks (a sample that went
for another item of the same kind: same start, different path), one step each per round, until ``steps`` rounds.
After each round every resident 4 KiB page of A's processes is hashed and matched against B's
(``bunshin.envs.runtime.page_sharing``): ``identical_fraction`` is what a content-deduplicating system could share,
``physically_shared_fraction`` what the copy-on-write fork shares, and ``workspace_bytes`` A's resident memory in
its writable private mappings (where a workspace's state lives).
Must never: run the page walk on the event loop (it reads hundreds of MB).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bunshin.envs import Limits, WorkspaceRuntime
from bunshin.envs.records import ToolCall
from bunshin.envs.runtime.page_sharing import compare, page_set
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace

from .report import human_bytes, markdown_table, pyplot, write_json

COLUMNS = [("step", "step"), ("identical_fraction", "identical by content"),
           ("physically_shared_fraction", "physically shared"), ("workspace", "workspace")]


def plans(tasks: list[SuiteTask], steps: int, template: str | None) -> tuple[SuiteTask, list[ToolCall], list[ToolCall]]:
    """The start task and the two samples' actions: A takes the template's tasks 0, 2, 4, ... in turn, B 1, 3, 5..."""
    by_template: dict[str, list[SuiteTask]] = {}
    for t in tasks:
        by_template.setdefault(t.template, []).append(t)
    if template is None:  # the template with the longest references
        template = max(by_template, key=lambda k: (sum(len(t.reference) for t in by_template[k]), k))
    if template not in by_template or len(by_template[template]) < 2:
        raise ValueError(f"template {template!r} needs two tasks; known: {sorted(by_template)}")
    group = by_template[template]
    a = [c for t in group[0::2] for c in t.reference[:-1]]
    b = [c for t in group[1::2] for c in t.reference[:-1]]
    if min(len(a), len(b)) < steps:
        raise ValueError(f"template {template!r} has only {min(len(a), len(b))} steps per sample, asked {steps}")
    return group[0], a[:steps], b[:steps]


async def _measure(a: Workspace, b: Workspace) -> dict[str, Any]:
    pa = await asyncio.to_thread(page_set, a.cgroup.procs())
    pb = await asyncio.to_thread(page_set, b.cgroup.procs())
    s = compare(pa, pb)
    return {"identical_fraction": round(s.identical_fraction, 4),
            "physically_shared_fraction": round(s.physically_shared_fraction, 4), "workspace_bytes": s.a_bytes}


async def run(suite: Suite, steps: int, template: str | None = None, state_dir: str | None = None,
              log: Any = sys.stderr) -> dict[str, Any]:
    tasks = await asyncio.to_thread(suite.tasks)  # may generate a catalog's task files: off the loop
    start_task, plan_a, plan_b = plans(tasks, steps, template or getattr(suite, "sharing_template", None))
    kwargs: dict[str, Any] = {"limits": Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=120)}
    if state_dir:
        kwargs["state_dir"] = state_dir
    rows = []
    started = time.monotonic()
    async with WorkspaceRuntime(**kwargs) as runtime:
        base = await runtime.create(suite.app(start_task))
        try:
            await suite.start(base, start_task)
            a, b = await base.fork(), await base.fork()
        finally:
            await base.close()
        try:
            rows.append({"step": 0, **await _measure(a, b)})
            for step, (call_a, call_b) in enumerate(zip(plan_a, plan_b), start=1):
                for ws, call in ((a, call_a), (b, call_b)):
                    try:
                        await ws.execute(await suite.concrete(ws, call))
                    except Exception as exc:  # a reference step that does not fit this page: the sample moves on
                        print(f"  step {step}: {call.name} {call.args} not played: {exc}", file=log)
                rows.append({"step": step, **await _measure(a, b)})
                r = rows[-1]
                print(f"[{step}/{steps}] identical {r['identical_fraction']:.3f} shared "
                      f"{r['physically_shared_fraction']:.3f} workspace {human_bytes(r['workspace_bytes'])}  "
                      f"{time.monotonic() - started:.0f}s", file=log, flush=True)
        finally:
            await a.close()
            await b.close()
    return {"suite": suite.name, "template": start_task.template, "start_task": start_task.id,
            "knobs": getattr(suite, "knobs", {}), "steps": rows}


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step"] for r in data["steps"]]
    ax.plot(steps, [r["identical_fraction"] for r in data["steps"]], marker="o", label="identical by content")
    ax.plot(steps, [r["physically_shared_fraction"] for r in data["steps"]], marker="s",
            label="physically shared (our fork)")
    ax.axhspan(0.5, 0.7, color="green", alpha=0.08, label="target after 10 steps (0.5-0.7)")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("step")
    ax.set_ylabel("fraction of sample A's memory")
    ax2 = ax.twinx()
    ax2.plot(steps, [r["workspace_bytes"] / 2**20 for r in data["steps"]], color="gray", linestyle="--",
             label="workspace MiB")
    ax2.set_ylabel("workspace (MiB)")
    ax.set_title(f"{data['suite']}: two samples of one group ({data['template']})")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax.legend(lines, labels, loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main(suite: Suite, steps: int, template: str | None, json_path: Path | None,
               plot_path: Path | None) -> int:
    data = await run(suite, steps, template)
    print(markdown_table([{**r, "workspace": human_bytes(r["workspace_bytes"])} for r in data["steps"]], COLUMNS))
    if json_path:
        write_json(json_path, data)
    if plot_path:
        plot(data, plot_path)
    return 0
