"""``bunshin suite check --suite webshop --browser chromium``: every reference solution passes and every null attempt
fails (bar the tasks whose right answer is to give up: the shop has none), through real input events in Chromium.

The check is ``engine/commands/suite_check.check``, the function the command runs, on a suite that also keeps what
the page was before each reference step and after the last one (``Witnessed``). A score alone would not notice a
click that did nothing on the retrieval templates (the answer is the task file's, whatever page the browser is
on), so every click and every ``type`` with Enter must have changed the page: its URL, or its accessibility tree
(focus aside). What is typed without Enter is checked by the evaluators of the templates that type into forms
(checkout's order address and write_review's review are read back; add_to_cart's quantity is the field's default).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bunshin.engine.commands.suite_check import check
from bunshin.envs import ToolCall
from bunshin.envs.suites.base import SuiteTask, checked
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.envs.workspace import Workspace

from .test_chromium_shop import chromium_processes


class Page(msgspec.Struct, frozen=True):
    url: str
    tree: str  # the whole tree, focus marks taken out: moving the focus alone is not an effect


async def page(ws: Workspace) -> Page:
    url = (await checked(ws, "_url", {})).output
    tree = (await checked(ws, "_tree", {})).output
    return Page(url=url, tree=tree.replace(" focused: True", ""))


class Witnessed(WebShopSuite):
    """The web shop suite, keeping per task the page before and after each reference step of its oracle attempt
    (``walks``); playing and scoring are the suite's own."""

    def __init__(self, **knobs: Any):
        super().__init__(**knobs)
        self.seen: dict[int, list[tuple[ToolCall, Page]]] = {}  # by id() of a workspace being played
        self.walks: dict[str, list[tuple[ToolCall, Page, Page]]] = {}  # task id -> (step, before, after)

    async def concrete(self, ws: Workspace, call: ToolCall) -> ToolCall:
        before = await page(ws)
        resolved = await super().concrete(ws, call)
        self.seen.setdefault(id(ws), []).append((call, before))
        return resolved

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        steps = self.seen.pop(id(ws), [])
        if steps:  # the null attempt plays no step
            pages = [before for _, before in steps] + [await page(ws)]
            self.walks[task.id] = [(call, before, after)
                                   for (call, before), after in zip(steps, pages[1:], strict=True)]
        return await super().evaluate(ws, task, final)


def no_effect(walks: dict[str, list[tuple[ToolCall, Page, Page]]]) -> list[str]:
    """The clicks and Enters that left the page as it was (URL and tree)."""
    found = []
    for task_id, steps in sorted(walks.items(), key=lambda kv: int(kv[0])):
        for n, (call, before, after) in enumerate(steps):
            navigating = call.name == "click" or (call.name == "type" and call.args.get("press_enter_after"))
            if navigating and after == before:
                found.append(f"task {task_id} step {n}: {call.name} {call.args} left {before.url} unchanged")
    return found


def one_per_template(directory: Path) -> Path:
    """The first committed task of every template, copied into ``directory``."""
    seen: set[str] = set()
    for task in WebShopSuite().tasks():
        if task.template not in seen:
            seen.add(task.template)
            shutil.copy(task.path, directory / Path(task.path).name)
    assert seen == set(generator.TEMPLATES)
    return directory


async def checked_suite(runtime, suite: Witnessed) -> dict[str, Any]:
    tasks = suite.tasks()
    report = await check(suite, runtime=runtime, concurrency=2, log=io.StringIO())
    assert report["tasks"] == len(tasks)
    assert report["failures"] == [], repr(report["failures"])[:3000]
    assert report["oracle_pass"] == report["tasks"]
    assert report["null_pass"] == len(report["null_pass_expected"]) == sum(t.give_up for t in tasks) == 0
    assert sorted(suite.walks) == sorted(t.id for t in tasks)  # every oracle played its steps
    assert not no_effect(suite.walks), "\n".join(no_effect(suite.walks))
    await runtime.close()  # the warm pool's slots (their Chromium) go with the run
    assert not chromium_processes(runtime.run_id)
    return report


@pytest.mark.asyncio(loop_factories=["uvloop"])  # the event loop does not matter here: one pass is enough
async def test_suite_check_in_chromium_on_one_task_of_every_template(runtime, tmp_path: Path) -> None:
    suite = Witnessed(browser="chromium", time_scale=0.0, tasks_dir=one_per_template(tmp_path))
    report = await checked_suite(runtime, suite)
    assert report["tasks"] == len(generator.TEMPLATES)


@pytest.mark.full  # ~4 min; CI runs one task of every template (above), pytest -m full this one
@pytest.mark.timeout(1800)
@pytest.mark.asyncio(loop_factories=["uvloop"])
async def test_suite_check_in_chromium_on_every_task(runtime) -> None:
    report = await checked_suite(runtime, Witnessed(browser="chromium", time_scale=0.0))
    assert report["tasks"] == 70


def test_a_click_that_did_nothing_is_caught() -> None:
    """The effect check itself: a step whose page is the same before and after is named; typing is not judged."""
    same, other = Page(url="http://x/", tree="[1] RootWebArea 'x'"), Page(url="http://x/", tree="[1] RootWebArea 'y'")
    click = ToolCall(name="click", args={"element_id": 3})
    typed = ToolCall(name="type", args={"element_id": 4, "text": "a", "press_enter_after": False})
    entered = ToolCall(name="type", args={"element_id": 4, "text": "a", "press_enter_after": True})
    walks = {"1": [(click, same, other), (typed, other, other), (entered, other, other), (click, other, other)]}
    assert [line.split(":")[0] for line in no_effect(walks)] == ["task 1 step 2", "task 1 step 3"]
