"""``bunshin bench sharing``: how much of one sample's workspace memory stays identical to another sample's of the
same GRPO group (samples of one task), step by step, and how much our fork actually shares.

Owns: the procedure, which is the engine's group as far as memory goes. The suite's application is created once
(the root); per task, a fork of it is the group's base, where the task is set up (``suite.start``); ``samples``
samples are forked from the base with the engine's sample seeds (``derive_seed(run seed, task id, sample)``) and the
base is closed. Each sample is driven step by step by a real policy (``Policy.decide`` on the ``PolicyContext``
that ``engine.episode.Episode`` keeps, the suite's ``parse_action``/``normalize`` through ``Episode.next_move``,
``suite.concrete`` then ``execute``), reasoning time scale 0. After each step every resident 4 KiB page of sample
0's processes is hashed and matched against each other sample's (``bunshin.envs.runtime.page_sharing``):
``identical_fraction`` is what a content-deduplicating system could share, ``physically_shared_fraction`` what the
copy-on-write fork shares (both the mean over the other samples), ``workspace_bytes`` sample 0's resident memory in
its writable private mappings (where a workspace's state lives). Step 0 is right after the fork.
Then per template the median (and min, max) of each step's figures across its tasks, and a table across templates.

Decisions: a step whose observation carries an error, an action the suite refuses, a reference the page cannot
resolve, a policy that raises or overruns: the task's run fails there; it is listed with the sample, the step,
the action and the reason, kept out of the medians, and the command exits non-zero. A sample that gives its final
action (``stop``/``DONE``/``FAIL``) before the last step stays as it is, its workspace open and idle, so its state no
longer changes; the step after which it finished is reported (``finished_at``: actions taken) and the measurement
goes on to the last step.
Must never: skip a failed step, run the page walk on the event loop (it reads hundreds of MB), or leave a
workspace open (every path closes what it made; the runtime closes the root).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs import Limits, WorkspaceRuntime, derive_seed
from bunshin.envs.records import ToolCall, canonical
from bunshin.envs.runtime.page_sharing import PageSet, compare, page_set
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace
from bunshin.policies.base import Policy

from ..episode import Episode, Stop
from ..errors import BadRequest, EngineError
from ..outcomes import describe
from ..records import Trajectory
from ..report import human_bytes, markdown_table, pyplot, write_json

DECIDE_TIMEOUT_S = 300.0  # the engine's defaults
CALL_TIMEOUT_S = 120.0


class StepFailed(EngineError):
    """A sample's step failed: the task's run ends there (never skipped)."""

    def __init__(self, sample: int, step: int, action: str | None, reason: str):
        super().__init__(f"sample {sample} step {step}{f' {action}' if action else ''}: {reason}")
        self.sample, self.step, self.action, self.reason = sample, step, action, reason


def select(tasks: list[SuiteTask], template: str, per_template: int | None) -> dict[str, list[SuiteTask]]:
    """Tasks by template (in the suite's order): ``template`` or every one (``all``), the first ``per_template`` of
    each."""
    by_template: dict[str, list[SuiteTask]] = {}
    for t in tasks:
        by_template.setdefault(t.template, []).append(t)
    if template != "all":
        if template not in by_template:
            raise BadRequest(f"unknown template {template!r}; known: all, {', '.join(sorted(by_template))}")
        by_template = {template: by_template[template]}
    if per_template is not None:
        if per_template < 1:
            raise BadRequest(f"--tasks-per-template must be >= 1, got {per_template}")
        by_template = {k: v[:per_template] for k, v in by_template.items()}
    return by_template


# -- one task -------------------------------------------------------------------------------------------------
@dataclass
class _Sample:
    index: int
    ws: Workspace
    episode: Episode
    finished_at: int | None = None  # actions taken before its final action
    final: str | None = None
    said: list[str] = field(default_factory=list)  # its actions as the policy gave them


def _said(action: str | ToolCall) -> str:
    text = action if isinstance(action, str) else canonical(action).decode()
    return text if len(text) <= 200 else text[:197] + "..."


async def _play(suite: Suite, policy: Policy, s: _Sample, step: int) -> None:
    """Sample ``s``'s ``step``-th action, as the engine's sample loop runs it; ``StepFailed`` if it fails."""
    if s.finished_at is not None:
        return
    try:
        async with asyncio.timeout(DECIDE_TIMEOUT_S):
            decision = await policy.decide(s.episode.context)
    except Exception as exc:
        raise StepFailed(s.index, step, None, f"the policy could not decide: {describe(exc)}") from exc
    said = _said(decision.action)
    s.said.append(said)
    try:
        move = s.episode.next_move(decision)
    except (ValueError, TypeError) as exc:  # the suite's ActionError is a ValueError
        raise StepFailed(s.index, step, said, f"malformed action: {describe(exc)}") from exc
    if isinstance(move, Stop):
        s.finished_at, s.final = step - 1, said
        return
    try:
        call = await suite.concrete(s.ws, move.call)
    except Exception as exc:
        raise StepFailed(s.index, step, said, f"could not resolve the action: {describe(exc)}") from exc
    obs = await s.ws.execute(call, timeout_s=CALL_TIMEOUT_S)
    if obs.error:
        raise StepFailed(s.index, step, said, f"error observation: {obs.error}")
    s.episode.record(decision, move, call, obs, obs.tool_seconds)


async def _measure(samples: list[_Sample]) -> dict[str, Any]:
    """Sample 0's pages against every other sample's: the mean over them, and each pair."""
    sets: list[PageSet] = [await asyncio.to_thread(page_set, s.ws.cgroup.procs()) for s in samples]
    pairs = [compare(sets[0], other) for other in sets[1:]]
    return {"identical_fraction": round(statistics.fmean(p.identical_fraction for p in pairs), 4),
            "physically_shared_fraction": round(statistics.fmean(p.physically_shared_fraction for p in pairs), 4),
            "workspace_bytes": sets[0].bytes,
            "pairs": [{"sample": j, "identical_fraction": round(p.identical_fraction, 4),
                       "physically_shared_fraction": round(p.physically_shared_fraction, 4), "bytes": p.b_bytes}
                      for j, p in enumerate(pairs, start=1)],
            "playing": sum(s.finished_at is None for s in samples)}


async def run_task(suite: Suite, policy: Policy, root: Workspace, task: SuiteTask, steps: int, samples: int,
                   seed: int) -> dict[str, Any]:
    """One group: the curve of ``task``'s samples, or the failure that ended it (``status`` ``failed``)."""
    started = time.monotonic()
    group_id = f"{seed}:{task.id}"
    seeds = [derive_seed(seed, task.id, i) for i in range(samples)]
    result: dict[str, Any] = {"task": task.id, "template": task.template, "instruction": task.instruction,
                              "sample_seeds": seeds, "status": "ok", "error": None, "curve": []}
    made: list[_Sample] = []
    try:
        base = await root.fork(seed=derive_seed(seed, task.id, "base"))
        try:
            first = await suite.start(base, task)
            if first.error:
                raise StepFailed(0, 0, None, f"the task's start observed an error: {first.error}")
            for i, sample_seed in enumerate(seeds):
                trajectory = Trajectory(task_id=task.id, suite=suite.name, group_id=group_id, sample=i,
                                        seed=sample_seed, run_seed=seed, instruction=task.instruction)
                ws = await base.fork(seed=sample_seed)
                made.append(_Sample(i, ws, Episode(suite, task, trajectory, first, max_steps=steps)))
        finally:
            await base.close()
        result["curve"].append({"step": 0, **await _measure(made)})
        for step in range(1, steps + 1):
            for s in made:
                await _play(suite, policy, s, step)
            result["curve"].append({"step": step, **await _measure(made)})
    except Exception as exc:
        result["status"] = "failed"
        if isinstance(exc, StepFailed):
            result["error"] = {"sample": exc.sample, "step": exc.step, "action": exc.action, "reason": exc.reason}
        else:
            result["error"] = {"sample": None, "step": len(result["curve"]), "action": None, "reason": describe(exc)}
    finally:
        for s in made:
            await s.ws.close()
    result["finished_at"] = [s.finished_at for s in made]
    result["finals"] = [s.final for s in made]
    result["actions"] = [s.said for s in made]
    result["wall_s"] = round(time.monotonic() - started, 2)
    return result


# -- the run --------------------------------------------------------------------------------------------------
def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": min(values), "max": max(values)}


def summarize(results: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Per step, the median and min-max across the measured (not failed) ``results``."""
    ok = [r for r in results if r["status"] == "ok"]
    curve = []
    for step in range(steps + 1):
        rows = [r["curve"][step] for r in ok]
        curve.append({"step": step, **{k: _spread([row[k] for row in rows]) for k in
                                       ("identical_fraction", "physically_shared_fraction", "workspace_bytes")}})
    finished = [f for r in ok for f in r["finished_at"]]
    return {"tasks": len(ok), "failed": len(results) - len(ok), "curve": curve,
            "samples_finished_early": sum(f is not None for f in finished), "samples": len(finished)}


async def run(suite: Suite, policy: Policy, steps: int = 10, *, samples: int = 2, template: str = "all",
              per_template: int | None = None, seed: int = 0, state_dir: str | None = None,
              log: Any = sys.stderr, save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every chosen task's curve and the summaries; ``save`` gets what there is after each task (``complete``
    False until the last), so a long run that is stopped keeps what it measured."""
    if steps < 1 or samples < 2:
        raise BadRequest(f"need steps >= 1 and samples >= 2, got {steps} and {samples}")
    tasks = await asyncio.to_thread(suite.tasks)  # may generate a catalog's task files: off the loop
    chosen = select(tasks, template, per_template)
    todo = [t for group in chosen.values() for t in group]
    kwargs: dict[str, Any] = {"limits": Limits(memory_bytes=4 << 30, pids=512, command_timeout_s=CALL_TIMEOUT_S)}
    if state_dir:
        kwargs["state_dir"] = state_dir
    head = {"suite": suite.name, "knobs": suite.knobs, "policy": policy.name,
            "policy_knobs": {k: v for k, v in vars(policy).items() if isinstance(v, int | float | str | bool)},
            "steps": steps, "samples": samples, "template": template, "tasks_per_template": per_template,
            "seed": seed}
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    async with WorkspaceRuntime(**kwargs) as runtime:
        roots: dict[bytes, Workspace] = {}  # one per application, as the engine keeps them
        for n, task in enumerate(todo, start=1):
            spec = suite.app(task)
            key = msgspec.json.encode(spec)
            if key not in roots:
                roots[key] = await runtime.create(spec, seed=derive_seed("root", key))
            r = await run_task(suite, policy, roots[key], task, steps, samples, seed)
            results.append(r)
            if r["status"] == "ok":
                last = r["curve"][-1]
                what = (f"identical {last['identical_fraction']:.3f} shared {last['physically_shared_fraction']:.3f}"
                        f" after {steps} steps, workspace {human_bytes(last['workspace_bytes'])}, finished at "
                        f"{r['finished_at']}")
            else:
                e = r["error"]
                what = f"FAILED at sample {e['sample']} step {e['step']} {e['action'] or ''}: {e['reason']}"
            print(f"[{n}/{len(todo)}] task {task.id} ({task.template}): {what}  {r['wall_s']:.0f}s "
                  f"({time.monotonic() - started:.0f}s total)", file=log, flush=True)
            if save is not None and n < len(todo):
                save({**head, "complete": False, "wall_s": round(time.monotonic() - started, 1),
                      **_summaries(results, chosen, steps)})
    return {**head, "complete": True, "wall_s": round(time.monotonic() - started, 1),
            **_summaries(results, chosen, steps)}


def _summaries(results: list[dict[str, Any]], chosen: dict[str, list[SuiteTask]], steps: int) -> dict[str, Any]:
    done = {r["template"] for r in results}
    return {"tasks": results, "templates": {name: summarize([r for r in results if r["template"] == name], steps)
                                            for name in chosen if name in done},
            "all": summarize(results, steps)}


# -- presenting -----------------------------------------------------------------------------------------------
def _fraction(s: dict[str, float] | None) -> tuple[str, str]:
    return ("-", "-") if s is None else (f"{s['median']:.2f}", f"{s['min']:.2f}-{s['max']:.2f}")


def table_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per template, then every task together."""
    rows = []
    for name, t in [*data["templates"].items(), ("all templates", data["all"])]:
        last = t["curve"][-1]
        identical, identical_range = _fraction(last["identical_fraction"])
        shared, shared_range = _fraction(last["physically_shared_fraction"])
        size = last["workspace_bytes"]
        rows.append({"template": name, "tasks": t["tasks"], "failed": t["failed"], "identical": identical,
                     "identical_range": identical_range, "shared": shared, "shared_range": shared_range,
                     "workspace": "-" if size is None else human_bytes(size["median"]),
                     "early": f"{t['samples_finished_early']}/{t['samples']}"})
    return rows


def columns(steps: int) -> list[tuple[str, str]]:
    return [("template", "template"), ("tasks", "tasks"), ("failed", "failed"),
            ("identical", f"identical after {steps} (median)"), ("identical_range", "min-max"),
            ("shared", f"physically shared after {steps} (median)"), ("shared_range", "min-max"),
            ("workspace", "workspace (median)"), ("early", "samples finished early")]


STEP_COLUMNS = [("step", "step"), ("identical", "identical (median)"), ("identical_range", "min-max"),
                ("shared", "physically shared (median)"), ("shared_range", "min-max"), ("workspace", "workspace")]


def step_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for row in summary["curve"]:
        identical, identical_range = _fraction(row["identical_fraction"])
        shared, shared_range = _fraction(row["physically_shared_fraction"])
        size = row["workspace_bytes"]
        rows.append({"step": row["step"], "identical": identical, "identical_range": identical_range,
                     "shared": shared, "shared_range": shared_range,
                     "workspace": "-" if size is None else human_bytes(size["median"])})
    return rows


def plot(data: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    panels = (("identical_fraction", "identical by content"), ("physically_shared_fraction", "physically shared"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for name, t in data["templates"].items():
            points = [(r["step"], r[key]["median"]) for r in t["curve"] if r[key] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker=".", label=f"{name} ({t['tasks']})")
        everything = [(r["step"], r[key]["median"]) for r in data["all"]["curve"] if r[key] is not None]
        if everything:
            ax.plot(*zip(*everything, strict=True), color="black", linewidth=2.5, label="all tasks")
        ax.axhspan(0.5, 0.7, color="green", alpha=0.08, label="seed's figure after 10 steps (0.5-0.7)")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{title}: median across tasks")
    axes[0].set_ylabel("fraction of sample 0's memory")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7)
    fig.suptitle(f"{data['suite']}: {data['samples']} samples of one task, policy {data['policy']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main(suite: Suite, policy: Policy, steps: int, *, samples: int, template: str, per_template: int | None,
               seed: int, json_path: Path | None, plot_path: Path | None) -> int:
    try:
        data = await run(suite, policy, steps, samples=samples, template=template, per_template=per_template,
                         seed=seed, save=(lambda d: write_json(json_path, d)) if json_path else None)
    except BadRequest as exc:
        print(f"bunshin bench sharing: {exc}", file=sys.stderr)
        return 2
    finally:
        await policy.close()
    print(markdown_table(table_rows(data), columns(steps)))
    print()
    print(markdown_table(step_rows(data["all"]), STEP_COLUMNS))
    failed = [r for r in data["tasks"] if r["status"] != "ok"]
    for r in failed:
        e = r["error"]
        print(f"FAILED task {r['task']} ({r['template']}) sample {e['sample']} step {e['step']} "
              f"{e['action'] or ''}: {e['reason']}")
    if json_path:
        write_json(json_path, data)
    if plot_path:
        plot(data, plot_path)
    return 1 if failed else 0
