"""Speculation's tasks have owners: a sample's speculation (its predictions, its jobs, its background closes) and
the speculator (its memory measurement, the selector's retrain) leave no task running once closed, whether a
branch's call was in flight, adopted or thrown away. On real workspaces (a runtime of the heap app); synchronised
with the await point before a branch's call and with ``all_tasks_blocked``, never with sleeps."""

from __future__ import annotations

import asyncio

import pytest

from bunshin.engine.speculation.branch import SampleSpeculation
from bunshin.engine.speculation.features import Situation, label_of
from bunshin.engine.speculation.memory import BranchMemory
from bunshin.engine.speculation.selector import Prediction
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.engine.speculation.shared import SpeculationShared
from bunshin.engine.speculation.slots import SpecSlots
from bunshin.engine.speculation.speculator import Speculator
from bunshin.engine.speculation.tail import TailPredictor
from bunshin.envs import AppSpec, WorkspaceRuntime
from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.runtime import await_points
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace
from tests.quiet import all_tasks_blocked

from .conftest import heap_app

pytestmark = pytest.mark.asyncio

BRANCH_CALL = "speculation.branch.call"


class ShellSuite(Suite):
    """The heap app's shell as a suite: ``done`` ends an episode."""

    name = "shell"

    def tasks(self) -> list[SuiteTask]:
        return [SuiteTask(id="t", suite="shell", template="shell", instruction="", path="", reference=[])]

    def app(self, task: SuiteTask | None = None) -> AppSpec:
        return heap_app()

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        return Observation()

    def parse_action(self, text: str) -> ToolCall:
        return ToolCall(name="done") if text == "done" else ToolCall(name="shell", args={"cmd": text})

    def is_final(self, call: ToolCall) -> bool:
        return call.name == "done"

    def null_action(self) -> ToolCall:
        return ToolCall(name="done")

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        return 0.0


class Undecided:
    """A selector whose predictions never come."""

    async def predict(self, situation: Situation) -> list[Prediction]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def learn(self, situation: Situation, label: str) -> None:
        pass


class LateAfter:
    """A selector that predicts one call with certainty ``quick`` times, then only once ``ready`` is set."""

    def __init__(self, call: ToolCall, quick: int):
        self.call, self.quick = call, quick
        self.ready = asyncio.Event()

    async def predict(self, situation: Situation) -> list[Prediction]:
        self.quick -= 1
        if self.quick < 0:
            await self.ready.wait()
        return [Prediction(label=label_of(self.call), call=self.call, p=1.0)]

    def learn(self, situation: Situation, label: str) -> None:
        pass


class Certain:
    """A selector (``shared.Predictor``) that predicts one call with certainty and remembers what it learned."""

    def __init__(self, call: ToolCall):
        self.call = call
        self.learned: list[str] = []

    async def predict(self, situation: Situation) -> list[Prediction]:
        return [Prediction(label=label_of(self.call), call=self.call, p=1.0)]

    def learn(self, situation: Situation, label: str) -> None:
        self.learned.append(label)


def shell(cmd: str) -> ToolCall:
    return ToolCall(name="shell", args={"cmd": cmd})


def shared(call: ToolCall, depth: int = 1) -> SpeculationShared:
    settings = SpecSettings(depth=depth, memory_headroom=None)
    memory = BranchMemory(budget=None, headroom=None, run_memory=lambda: 0)
    return SpeculationShared(settings=settings, selector=Certain(call), tail=TailPredictor(), memory=memory,
                             slots=SpecSlots(settings.slots, memory.allows))


async def execute(ws: Workspace, call: ToolCall, timeout_s: float) -> Observation:
    return await ws.execute(call, timeout_s=timeout_s)


def speculation(state: SpeculationShared) -> SampleSpeculation:
    return SampleSpeculation(state, ShellSuite(), sample=(0, "g", 0), task_id="t", template="shell", seed=1,
                             execute=execute, call_timeout_s=30.0)


def begin(spec: SampleSpeculation, ws: Workspace | None) -> None:
    async def own() -> Workspace:
        assert ws is not None, "the branch forked the sample's workspace"
        return ws

    spec.begin(Situation(suite="shell", template="shell", instruction="", step=0, calls=(), observation=""),
               own, lambda call: False)


def others(before: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    """The tasks alive now that were not alive before (the test's own excepted)."""
    return {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()}


async def branch_call(spec: SampleSpeculation, ws: Workspace) -> None:
    """Begin, and return once the branch (forked from ``ws``) is about to run its call."""
    reached = asyncio.Event()
    with await_points.hook(lambda name: reached.set(), BRANCH_CALL):
        begin(spec, ws)
        await reached.wait()


async def test_closing_with_a_branch_call_in_flight_cancels_it_and_leaves_no_task(
        runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    before = set(asyncio.all_tasks())
    state = shared(shell("sleep 30"))
    spec = speculation(state)
    await branch_call(spec, ws)
    assert len(state.branches) == 1 and others(before)  # the branch's job is running
    await spec.close()
    assert others(before) == set()
    assert state.branches == {} and state.counts["wasted"] == 1 and state.counts["speculated"] == 1
    assert list(runtime.workspaces.values()) == [ws]  # the branch's workspace is gone, the sample's untouched
    assert state.slots.running == set()


async def test_an_adopted_branch_is_the_callers_and_a_replaced_workspace_closes_in_the_background(
        runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    before = set(asyncio.all_tasks())
    call = shell("echo ahead")
    state = shared(call)
    spec = speculation(state)
    await branch_call(spec, ws)
    branch = await spec.resolve(call)
    assert branch is not None and branch.ws is not None and branch.observation is not None
    assert branch.observation.output == "ahead\n" and state.counts["adopted"] == 1
    assert others(before) == set()  # resolving waited for the branch's job; nothing else runs
    spec.close_later(ws)  # the sample's old workspace, replaced by the branch's
    await spec.close()
    assert others(before) == set() and ws.closed
    assert list(runtime.workspaces.values()) == [branch.ws] and state.branches == {}
    await branch.ws.close()


async def test_a_carried_branch_is_the_next_steps_even_before_its_prediction_comes(runtime: WorkspaceRuntime
                                                                                   ) -> None:
    """Depth 2: the branch's child is still running when the branch is adopted, so it is carried to the next step.
    The next call comes before that step's prediction does: the carried branch is the one resolved (adopted here),
    not lost (it was, when it became the step's branch only once the prediction had come: its workspace stayed
    open and counted as a live branch)."""
    ws = await runtime.create(heap_app())
    call = shell("echo ahead")
    state = shared(call, depth=2)
    selector = LateAfter(call, quick=2)  # the first step's and its child's predictions; the next step's is late
    state.selector = selector
    spec = speculation(state)
    reached = 0
    both = asyncio.Event()

    def count(name: str) -> None:
        nonlocal reached
        reached += 1
        if reached == 2:
            both.set()

    with await_points.hook(count, BRANCH_CALL):
        begin(spec, ws)
        await both.wait()  # the branch ran its call, its child forked it and is about to run the same call
    first = await spec.resolve(call)
    assert first is not None and first.ws is not None and spec.pending is not None
    spec.close_later(ws)
    begin(spec, first.ws)  # the next step; its prediction does not come
    second = await spec.resolve(call)
    assert second is not None and second.ws is not None and state.counts["adopted"] == 2
    spec.close_later(first.ws)
    await spec.close()
    selector.ready.set()
    assert state.branches == {} and list(runtime.workspaces.values()) == [second.ws]
    await second.ws.close()


async def test_a_wrong_prediction_is_thrown_away_and_its_close_awaited_by_close(runtime: WorkspaceRuntime) -> None:
    ws = await runtime.create(heap_app())
    before = set(asyncio.all_tasks())
    state = shared(shell("echo predicted > /tmp/mark"))
    spec = speculation(state)
    await branch_call(spec, ws)
    assert await spec.resolve(shell("echo real")) is None
    assert state.counts["wasted"] == 1 and state.branches == {}
    await spec.close()
    assert others(before) == set()
    assert list(runtime.workspaces.values()) == [ws]
    assert (await ws.execute(shell("cat /tmp/mark 2>/dev/null || echo clean"))).output == "clean\n"


async def test_a_cancelled_close_still_ends_every_job_and_prediction(runtime: WorkspaceRuntime) -> None:
    """Cancelled while it waits for the branch's workspace to close: the cancellation reaches the caller, the job
    and the prediction have ended, and what is left is the workspace's own teardown, which ends by itself."""
    ws = await runtime.create(heap_app())
    before = set(asyncio.all_tasks())
    state = shared(shell("sleep 30"))
    spec = speculation(state)
    await branch_call(spec, ws)
    closer = asyncio.ensure_future(spec.close())
    await all_tasks_blocked()
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert state.branches == {} and state.slots.running == set() and state.counts["wasted"] == 1
    left = others(before)
    if left:
        async with asyncio.timeout(10):  # a bound, not a wait: a job left running its `sleep 30` fails here
            await asyncio.wait(left)
    assert list(runtime.workspaces.values()) == [ws]


async def test_a_job_waiting_for_a_slot_is_cancelled_by_close() -> None:
    """Every slot is held elsewhere (by a sample predicted to end far later: no preemption): the branch waits for
    one until the sample's speculation closes; then no task is left, and the branch counts as a slot skipped."""
    state = shared(shell("echo never"))
    held = [await state.slots.acquire(1e12, lambda: None) for _ in range(state.settings.slots)]
    before = set(asyncio.all_tasks())
    spec = speculation(state)
    begin(spec, None)
    await all_tasks_blocked()
    assert others(before) and spec.current is not None and spec.current.grant is None
    await spec.close()
    assert others(before) == set() and state.counts["skipped_slots"] == 1 and state.slots.running == set(held)


async def test_a_prediction_that_has_not_come_is_cancelled_by_close() -> None:
    state = shared(shell("echo never"))
    state.selector = Undecided()
    before = set(asyncio.all_tasks())
    spec = speculation(state)
    begin(spec, None)
    await all_tasks_blocked()
    assert spec.predicting is not None and not spec.predicting.done()
    await spec.resolve(shell("echo real"))  # the job stops; the prediction is left to be scored when it comes
    assert state.counts["late_predictions"] == 1 and not spec.predicting.done()
    await spec.close()
    assert others(before) == set() and spec.predicting.cancelled() and state.counts["predicted"] == 0


async def test_the_speculator_measures_in_its_scope_and_close_ends_it() -> None:
    before = set(asyncio.all_tasks())
    speculator = Speculator(SpecSettings(), ShellSuite(), run_memory=lambda: 0)
    await speculator.open(ShellSuite().tasks())
    await all_tasks_blocked()
    assert others(before)  # the memory measurement waits for its next reading
    await speculator.close()
    assert others(before) == set()
