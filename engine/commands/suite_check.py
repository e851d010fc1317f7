"""``bunshin suite check``: every task's reference solution, and a null attempt, each in a fresh workspace.

Owns: the check's procedure and its report ``{"suite", "tasks", "oracle_pass", "null_pass", "failures",
"null_pass_expected"}``. A fresh workspace is a fork of one initialised workspace (the suite's heavy state is built
once), so it starts exactly as a new one would. A suite whose tasks are right has ``oracle_pass == tasks`` and
``null_pass`` equal to the number of tasks whose correct answer is to give up (listed in ``null_pass_expected``).
Must never: stop at the first failing task: every failure is recorded with its reason and the check goes on.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from bunshin.envs import Limits, WorkspaceRuntime
from bunshin.envs.suites.base import Suite, SuiteTask, play
from bunshin.envs.workspace import Workspace


async def attempt(suite: Suite, base: Workspace, task: SuiteTask, calls: list[Any]) -> tuple[float, str | None]:
    """Score of playing ``calls`` on a fresh fork of ``base``; (0.0, reason) when something broke on the way."""
    ws = None
    try:
        ws = await base.fork()
        await suite.start(ws, task)
        errors = []
        async for call, obs in play(suite, ws, task, calls):
            if obs.error:
                errors.append(f"{call.name} {call.args}: {obs.error}")
        score = await suite.evaluate(ws, task, calls[-1])
        return score, "; ".join(errors) or None
    except Exception as exc:  # one task's failure is recorded; the check goes on
        return 0.0, f"{type(exc).__name__}: {exc}"
    finally:
        if ws is not None:
            await ws.close()


async def check(suite: Suite, *, runtime: WorkspaceRuntime | None = None, concurrency: int = 2,
                limit: int | None = None, log: Any = sys.stderr) -> dict[str, Any]:
    """Check ``suite`` on ``runtime`` (a new one of the default kind when None)."""
    if runtime is None:
        async with WorkspaceRuntime(limits=Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=120)) as rt:
            return await check(suite, runtime=rt, concurrency=concurrency, limit=limit, log=log)
    tasks = (await asyncio.to_thread(suite.tasks))[:limit]  # may generate a catalog's task files: off the loop
    report: dict[str, Any] = {"suite": suite.name, "tasks": len(tasks), "oracle_pass": 0, "null_pass": 0,
                              "failures": [], "null_pass_expected": [t.id for t in tasks if t.give_up]}
    started = time.monotonic()
    base = await runtime.create(suite.app())
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def one(task: SuiteTask) -> None:
        nonlocal done
        async with gate:
            oracle, why = await attempt(suite, base, task, task.reference)
            null, null_why = await attempt(suite, base, task, [suite.null_action()])
        report["oracle_pass"] += oracle == 1.0
        report["null_pass"] += null == 1.0
        if oracle != 1.0:
            report["failures"].append({"task": task.id, "template": task.template, "attempt": "oracle",
                                       "score": oracle, "reason": why or "scored below 1"})
        if (null == 1.0) != task.give_up:
            report["failures"].append({"task": task.id, "template": task.template, "attempt": "null",
                                       "score": null, "reason": null_why or (
                                           "giving up scored 1" if null == 1.0 else "giving up scored 0")})
        done += 1
        print(f"[{done}/{len(tasks)}] {suite.name} task {task.id} ({task.template}): oracle {oracle:g}, "
              f"null {null:g}  {time.monotonic() - started:.0f}s", file=log, flush=True)

    try:
        await asyncio.gather(*(one(t) for t in tasks))
    finally:
        await base.close()
    report["failures"].sort(key=lambda f: (int(f["task"]) if str(f["task"]).isdigit() else 0, str(f["task"])))
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report
