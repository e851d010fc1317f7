"""``bunshin suite check``: every task's reference solution, and a null attempt, each in a fresh workspace.

Owns: the check's procedure and its report ``{"suite", "tasks", "oracle_pass", "null_pass", "failures",
"null_pass_expected", "no_reference", "evaluated", "refused"}``. A fresh workspace is a fork of one initialised workspace (the
suite's heavy state is built once), so it starts exactly as a new one would; a suite that does not fork live
(``Suite.forks_live``: a real desktop) gets a new workspace per attempt. A suite whose tasks are right has
``oracle_pass == tasks - no_reference`` and ``null_pass`` equal to the number of tasks whose correct answer is to
give up (listed in ``null_pass_expected``). A task without a reference solution (a user's OSWorld file) runs its
null attempt and, where the suite declares one (``Suite.done_action``), a done-at-once attempt: that its set-up
and evaluation run is what is checked (``evaluated`` counts the evaluations that ran). An attempt that broke (set-up, a judge)
is a failure whatever it scored; so is one whose judges disagree (``Suite.judge_all``).
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


async def attempt(suite: Suite, base: Workspace | None, task: SuiteTask, calls: list[Any],
                  runtime: WorkspaceRuntime | None = None) -> tuple[float, str | None, bool]:
    """Score of playing ``calls`` on a fresh fork of ``base`` (a suite that forks live) or a new workspace of
    ``runtime`` (one that does not), why it is not 1 (the agent's errors on the way), and whether it broke
    (0.0 and the reason: set-up or evaluation raised, or the judges disagree)."""
    ws = None
    try:
        if base is not None:
            ws = await base.fork()
        else:
            assert runtime is not None, "a suite that does not fork live is checked on new workspaces"
            ws = await runtime.create(suite.app(task))
        await suite.start(ws, task)
        errors = []
        async for call, obs in play(suite, ws, task, calls):
            if obs.error:
                errors.append(f"{call.name} {call.args}: {obs.error}")
        scores = await suite.judge_all(ws, task, calls[-1])
        if len(set(scores.values())) > 1:
            shown = ", ".join(f"{name} {score:g}" for name, score in scores.items())
            return 0.0, f"the judges disagree: {shown}" + (f"; {'; '.join(errors)}" if errors else ""), True
        return next(iter(scores.values())), "; ".join(errors) or None, False
    except Exception as exc:  # one task's failure is recorded; the check goes on
        return 0.0, f"{type(exc).__name__}: {exc}", True
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
                              "failures": [], "null_pass_expected": [t.id for t in tasks if t.give_up],
                              "no_reference": sum(not t.reference for t in tasks), "evaluated": 0,
                              "refused": [{"file": r.file, "reason": r.reason} for r in suite.refused()]}
    started = time.monotonic()
    base = await runtime.create(suite.app()) if suite.forks_live else None
    gate = asyncio.Semaphore(concurrency)
    done = 0

    async def one(task: SuiteTask) -> None:
        nonlocal done
        done_at_once = suite.done_action()
        async with gate:
            oracle, why, oracle_broke = (await attempt(suite, base, task, task.reference, runtime)
                                         if task.reference else (None, None, False))
            null, null_why, null_broke = await attempt(suite, base, task, [suite.null_action()], runtime)
            if not task.reference and done_at_once is not None:
                score, done_why, done_broke = await attempt(suite, base, task, [done_at_once], runtime)
                report["evaluated"] += not done_broke
                if done_broke:
                    report["failures"].append({"task": task.id, "template": task.template, "attempt": "done",
                                               "score": score, "reason": done_why})
        report["oracle_pass"] += oracle == 1.0
        report["null_pass"] += null == 1.0
        if oracle is not None and (oracle != 1.0 or oracle_broke):
            report["failures"].append({"task": task.id, "template": task.template, "attempt": "oracle",
                                       "score": oracle, "reason": why or "scored below 1"})
        if (null == 1.0) != task.give_up or null_broke:
            report["failures"].append({"task": task.id, "template": task.template, "attempt": "null",
                                       "score": null, "reason": null_why or (
                                           "giving up scored 1" if null == 1.0 else "giving up scored 0")})
        done += 1
        shown = "no reference" if oracle is None else f"oracle {oracle:g}"
        print(f"[{done}/{len(tasks)}] {suite.name} task {task.id} ({task.template}): {shown}, "
              f"null {null:g}  {time.monotonic() - started:.0f}s", file=log, flush=True)

    try:
        await asyncio.gather(*(one(t) for t in tasks))
    finally:
        if base is not None:
            await base.close()
    report["failures"].sort(key=lambda f: (int(f["task"]) if str(f["task"]).isdigit() else 0, str(f["task"])))
    report["wall_s"] = round(time.monotonic() - started, 1)
    return report
