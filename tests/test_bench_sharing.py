"""``bunshin bench sharing`` on a small shop (500 products, one task, a few steps): the samples of a group play one
task with their own seeds, every step's figures are fractions with identical >= physically shared, a failed step
fails the task's run loudly (listed with its reason, exit status 1), and nothing is left behind. The figures
themselves come from the real benchmark (BENCHMARKS.md), not from here."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bunshin.engine.bench import sharing
from bunshin.envs import derive_seed
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.base import Decision, Policy, PolicyContext
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import host_processes

CATALOG = 500
TEMPLATE = "add_to_cart"  # five reference steps: three steps measure a sample still playing


class Wrong(Policy):
    """Plays the reference, then at ``at`` gives ``action`` instead."""

    name = "wrong"

    def __init__(self, at: int, action: str):
        self.at, self.action = at, action

    async def decide(self, ctx: PolicyContext) -> Decision:
        return Decision(action=self.action if ctx.step == self.at else ctx.reference[ctx.step])


def small() -> WebShopSuite:
    return WebShopSuite(catalog_size=CATALOG, time_scale=0.0)  # as `bench sharing` runs it


async def measure(policy: Policy, state_dir: Path, steps: int = 3, samples: int = 2) -> dict:
    log = io.StringIO()
    data = await sharing.run(small(), policy, steps, samples=samples, template=TEMPLATE, per_template=1,
                             state_dir=str(state_dir), log=log)
    assert not host_processes(), "the benchmark left workspace hosts behind"
    data["log"] = log.getvalue()
    return data


class QuitsEarly(Policy):
    """The scripted policy without detours or giving up (every sample plays the reference), but sample 2 gives
    up at its second step."""

    name = "quits-early"

    def __init__(self) -> None:
        self.scripted = ScriptedPolicy(detour_p=0.0, fail_p=0.0, time_scale=0.0)

    async def decide(self, ctx: PolicyContext) -> Decision:
        if ctx.sample == 2 and ctx.step == 1:
            return Decision(action="stop [nothing]")
        return await self.scripted.decide(ctx)


@pytest.mark.asyncio
async def test_samples_of_one_task_step_by_step(state_dir: Path) -> None:
    data = await measure(QuitsEarly(), state_dir, steps=3, samples=3)
    [task] = data["tasks"]
    assert task["status"] == "ok" and task["error"] is None and task["template"] == TEMPLATE
    # one task: the same actions in every sample; seeds as the engine derives them, one per sample
    assert task["actions"][0] == task["actions"][1] and len(task["actions"][0]) == 3
    assert task["actions"][2] == [task["actions"][0][0], "stop [nothing]"]
    assert task["sample_seeds"] == [derive_seed(0, task["task"], i) for i in range(3)]
    assert len(set(task["sample_seeds"])) == 3
    # a sample that finished stays as it is: reported with the actions it took, still measured
    assert task["finished_at"] == [None, None, 1] and task["finals"] == [None, None, "stop [nothing]"]
    assert [row["playing"] for row in task["curve"]] == [3, 3, 2, 2]
    assert [row["step"] for row in task["curve"]] == [0, 1, 2, 3]
    for row in task["curve"]:
        assert len(row["pairs"]) == 2 and row["workspace_bytes"] > 0
        for pair in [row, *row["pairs"]]:
            assert 0 <= pair["physically_shared_fraction"] <= pair["identical_fraction"] <= 1, row
    assert task["curve"][0]["physically_shared_fraction"] > 0.8  # right after the fork nearly everything is shared
    summary = data["templates"][TEMPLATE]
    assert summary["tasks"] == 1 and summary["failed"] == 0 and summary["samples_finished_early"] == 1
    assert summary["curve"][-1]["identical_fraction"]["median"] == task["curve"][-1]["identical_fraction"]
    assert f"task {task['task']} ({TEMPLATE}): identical" in data["log"]


@pytest.mark.asyncio
@pytest.mark.parametrize(("action", "reason"), [("click [999999]", "error observation"),
                                                ("fly [1]", "malformed action")])
async def test_a_failed_step_fails_the_task_loudly(state_dir: Path, action: str, reason: str) -> None:
    data = await measure(Wrong(at=1, action=action), state_dir, steps=3)
    [task] = data["tasks"]
    assert task["status"] == "failed"
    assert task["error"]["step"] == 2 and task["error"]["sample"] == 0 and task["error"]["action"] == action
    assert task["error"]["reason"].startswith(reason), task["error"]
    assert data["templates"][TEMPLATE]["tasks"] == 0 and data["templates"][TEMPLATE]["failed"] == 1
    assert data["all"]["curve"][-1]["identical_fraction"] is None  # a failed task is kept out of the medians
    assert "FAILED at sample 0 step 2" in data["log"]


def bunshin(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BUNSHIN_STATE_DIR": "/var/lib/bunshin-test"}
    return subprocess.run([sys.executable, "-m", "bunshin.engine.cli", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_command_writes_json_plot_and_tables(tmp_path: Path) -> None:
    out, png = tmp_path / "sharing.json", tmp_path / "sharing.png"
    proc = bunshin("bench", "sharing", "--suite", "webshop", "--set", f"catalog_size={CATALOG}", "--steps", "2",
                   "--template", TEMPLATE, "--tasks-per-template", "1", "--policy", "scripted", "--detour-p", "0",
                   "--json", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["policy"] == "scripted" and data["policy_knobs"]["detour_p"] == 0 and data["samples"] == 2
    assert data["knobs"]["catalog_size"] == CATALOG and len(data["tasks"]) == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| template | tasks | failed | identical after 2 (median) |" in proc.stdout
    assert "[1/1] task" in proc.stderr
    proc = bunshin("bench", "sharing", "--suite", "webshop", "--set", f"catalog_size={CATALOG}", "--template",
                   "nonesuch", "--policy", "scripted")
    assert proc.returncode == 2 and "unknown template 'nonesuch'" in proc.stderr


def test_summaries_take_the_median_of_measured_tasks_only() -> None:
    def task(name: str, template: str, figures: list[float], status: str = "ok") -> dict:
        curve = [{"step": i, "identical_fraction": f, "physically_shared_fraction": f / 2, "workspace_bytes": 1 << 20}
                 for i, f in enumerate(figures)]
        return {"task": name, "template": template, "status": status, "curve": curve, "finished_at": [None, 0]}

    results = [task("a", "t", [1.0, 0.9]), task("b", "t", [1.0, 0.5]), task("c", "t", [1.0, 0.7]),
               task("d", "t", [1.0], status="failed"), task("e", "u", [1.0, 0.8])]
    t = sharing.summarize(results[:4], 1)
    assert t["tasks"] == 3 and t["failed"] == 1 and t["samples_finished_early"] == 3 and t["samples"] == 6
    assert t["curve"][1]["identical_fraction"] == {"median": 0.7, "min": 0.5, "max": 0.9}
    assert t["curve"][1]["physically_shared_fraction"] == {"median": 0.35, "min": 0.25, "max": 0.45}
    data = {"templates": {"t": t, "u": sharing.summarize(results[4:], 1)}, "all": sharing.summarize(results, 1)}
    rows = sharing.table_rows(data)
    assert [(r["template"], r["tasks"], r["failed"], r["identical"], r["identical_range"]) for r in rows] == [
        ("t", 3, 1, "0.70", "0.50-0.90"), ("u", 1, 0, "0.80", "0.80-0.80"), ("all templates", 4, 1, "0.75",
                                                                             "0.50-0.90")]
