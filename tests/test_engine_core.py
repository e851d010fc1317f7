"""The engine's decision code without a runtime: admission (injected clock and memory reading), failure
classification, the memory meter's arithmetic and the episode's moves."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bunshin.engine.admission import Admission, AdmissionGate, Verdict
from bunshin.engine.episode import Act, Episode, Stop
from bunshin.engine.errors import DecideTimeout, EngineError, RolloutTimeout, SetupTimeout, UnknownTask
from bunshin.engine.meter import MemoryMeter
from bunshin.engine.outcomes import Phase, classify
from bunshin.engine.records import Status, Trajectory
from bunshin.envs import CallDeadlineExceeded, ForkFailed, Observation, ToolCall, WorkspaceBroken
from bunshin.envs.suites.base import ActionError, SuiteStepFailed, SuiteTask
from bunshin.policies.base import Decision, PolicyError
from tests.quiet import all_tasks_blocked

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# -- admission ----------------------------------------------------------------------------------------------------


def test_concurrency_bounds_admission_and_a_release_frees_a_slot() -> None:
    clock = Clock()
    adm = Admission(2, None, memory=lambda: 0, clock=clock)
    a, b = adm.admit(clock()), adm.admit(clock())
    assert adm.verdict() is Verdict.WAIT_FOR_SLOT
    with pytest.raises(EngineError):
        adm.admit(clock())
    adm.release(a)
    adm.release(a)  # releasing twice releases once
    assert adm.active == 1 and adm.verdict() is Verdict.ADMIT
    adm.release(b)
    assert adm.active == 0


def test_the_memory_budget_holds_back_a_second_rollout_but_never_the_first() -> None:
    clock, memory = Clock(), [900 * MiB]
    adm = Admission(8, 1000 * MiB, memory=lambda: memory[0], clock=clock, initial_estimate=200 * MiB)
    assert adm.verdict() is Verdict.ADMIT  # over budget already, but nothing runs: one always runs
    first = adm.admit(clock())
    assert adm.verdict() is Verdict.WAIT_FOR_MEMORY  # 900 + 200 > 1000
    memory[0] = 800 * MiB
    assert adm.verdict() is Verdict.ADMIT  # 800 + 200 fits
    clock.t += 3
    second = adm.admit(clock() - 3)
    assert second.waited_s == 3
    first.grew = 300 * MiB  # the largest rollout so far raises the estimate
    adm.release(first)
    assert adm.estimate == 300 * MiB
    assert adm.verdict() is Verdict.WAIT_FOR_MEMORY  # 800 + 300 > 1000, and one still runs
    adm.release(second)
    assert adm.verdict() is Verdict.ADMIT


def test_the_estimate_never_falls_below_its_floor() -> None:
    adm = Admission(4, 1 << 30, memory=lambda: 0, clock=Clock(), initial_estimate=1, estimate_floor=16 * MiB)
    t = adm.admit(0.0)
    t.grew = -5 * MiB  # a rollout that freed memory
    adm.release(t)
    assert adm.estimate == 16 * MiB


class AdmissionMachine(RuleBasedStateMachine):
    """Random asks, releases and memory changes against a dictionary model of what may run."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.memory = 0
        self.running: dict[int, object] = {}

    @initialize(concurrency=st.integers(1, 5), budget=st.integers(0, 2 << 30))
    def start(self, concurrency: int, budget: int) -> None:
        self.concurrency, self.budget = concurrency, budget
        self.adm = Admission(concurrency, budget, memory=lambda: self.memory, clock=self.clock,
                             initial_estimate=64 * MiB)

    @rule(memory=st.integers(0, 2 << 30))
    def memory_changes(self, memory: int) -> None:
        self.memory = memory

    @rule()
    def ask(self) -> None:
        verdict = self.adm.verdict()
        if not self.running:
            assert verdict is Verdict.ADMIT  # one always runs
        if verdict is Verdict.ADMIT:
            if self.running:  # admitted beside others: the budget held at that moment
                assert self.memory + self.adm.estimate <= self.budget
            ticket = self.adm.admit(self.clock())
            self.running[ticket.number] = ticket

    @precondition(lambda self: self.running)
    @rule(data=st.data(), grew=st.none() | st.integers(-(64 * MiB), 512 * MiB))
    def release(self, data: st.DataObject, grew: int | None) -> None:
        number = data.draw(st.sampled_from(sorted(self.running)))
        ticket = self.running.pop(number)
        ticket.grew = grew  # type: ignore[attr-defined]
        self.adm.release(ticket)  # type: ignore[arg-type]

    @invariant()
    def bounded(self) -> None:
        if not hasattr(self, "adm"):
            return
        assert self.adm.active == len(self.running) <= self.concurrency
        assert self.adm.estimate >= self.adm.estimate_floor


TestAdmissionMachine = AdmissionMachine.TestCase
TestAdmissionMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@pytest.mark.asyncio
@settings(max_examples=15, deadline=None)
@given(concurrency=st.integers(1, 4), sizes=st.lists(st.integers(1, 400), min_size=1, max_size=12),
       seed=st.integers(0, 1000))
async def test_the_gate_never_runs_more_than_it_may(concurrency: int, sizes: list[int], seed: int) -> None:
    """Rollouts of random sizes through the async gate; the run's memory is what the running ones hold."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    held: dict[int, int] = {}
    budget = 500 * MiB
    adm = Admission(concurrency, budget, memory=lambda: sum(held.values()), clock=asyncio.get_running_loop().time,
                    initial_estimate=16 * MiB)
    gate = AdmissionGate(adm, recheck_s=0.005)
    peak = 0
    violations: list[str] = []

    async def rollout(i: int, size: int) -> None:
        nonlocal peak
        async with gate.slot() as ticket:
            if held and sum(held.values()) + adm.estimate > budget:
                violations.append(f"rollout {i} admitted over the budget beside {sorted(held)}")
            held[i] = size * MiB
            peak = max(peak, len(held))
            await asyncio.sleep(rng.random() * 0.01)  # the rollout runs a random time: admissions interleave
            ticket.grew = size * MiB
            del held[i]

    async with asyncio.TaskGroup() as tg:
        for i, size in enumerate(sizes):
            tg.create_task(rollout(i, size))
    assert violations == []
    assert 1 <= peak <= concurrency and adm.active == 0 and adm.admitted == len(sizes)


@pytest.mark.asyncio
async def test_a_cancelled_waiter_takes_no_slot_and_a_cancelled_holder_gives_its_slot_back() -> None:
    adm = Admission(1, None, memory=lambda: 0, clock=asyncio.get_running_loop().time)
    gate = AdmissionGate(adm)
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.slot():
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await all_tasks_blocked()  # the holder has the slot
    assert adm.active == 1
    waiter = asyncio.ensure_future(gate.acquire())
    await all_tasks_blocked()  # the waiter waits for it
    assert not waiter.done()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.active == 1
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert adm.active == 0
    async with gate.slot():
        assert adm.active == 1


# -- classification ------------------------------------------------------------------------------------------------

ENGINE_BUGS = [KeyError("k"), TypeError("t"), AttributeError("a"), AssertionError("x"), EngineError("e"),
               ZeroDivisionError("z")]


@pytest.mark.parametrize("phase", [Phase.SETUP, Phase.FORK, Phase.PARSE, Phase.RESOLVE, Phase.CALL, Phase.ENGINE])
@pytest.mark.parametrize("bug", ENGINE_BUGS, ids=lambda e: type(e).__name__)
def test_an_exception_from_our_own_code_is_an_engine_error(phase: Phase, bug: Exception) -> None:
    assert classify(phase, bug) is Status.ENGINE_ERROR


@pytest.mark.parametrize("phase,exc,status", [
    (Phase.SETUP, ForkFailed("w1", "no clone"), Status.SETUP_FAILED),
    (Phase.SETUP, SetupTimeout(5.0), Status.SETUP_FAILED),
    (Phase.SETUP, UnknownTask("99", "webshop"), Status.SETUP_FAILED),
    (Phase.SETUP, SuiteStepFailed("_start: no page"), Status.SETUP_FAILED),
    (Phase.FORK, ForkFailed("w1", "no clone"), Status.WORKSPACE_FAILED),
    (Phase.DECIDE, DecideTimeout(3.0), Status.POLICY_TIMEOUT),
    (Phase.DECIDE, PolicyError("server said 500"), Status.POLICY_ERROR),
    (Phase.DECIDE, KeyError("the policy's own bug"), Status.POLICY_ERROR),
    (Phase.PARSE, ActionError("invalid action 'x'"), Status.MALFORMED_ACTION),
    (Phase.RESOLVE, SuiteStepFailed("no element"), Status.MALFORMED_ACTION),
    (Phase.RESOLVE, WorkspaceBroken("w1", "killed"), Status.WORKSPACE_FAILED),
    (Phase.CALL, CallDeadlineExceeded("w1", "overran", tool="goto", deadline_s=3.0), Status.CALL_TIMEOUT),
    (Phase.CALL, WorkspaceBroken("w1", "host killed by SIGKILL"), Status.WORKSPACE_FAILED),
    (Phase.EVALUATE, WorkspaceBroken("w1", "killed"), Status.WORKSPACE_FAILED),
    (Phase.EVALUATE, SuiteStepFailed("_url failed"), Status.EVALUATOR_ERROR),
    (Phase.EVALUATE, KeyError("a bug"), Status.ENGINE_ERROR),
    (Phase.CALL, RolloutTimeout(10.0), Status.ROLLOUT_TIMEOUT),
    (Phase.DECIDE, RolloutTimeout(10.0), Status.ROLLOUT_TIMEOUT),
])
def test_each_phase_blames_only_what_it_expects(phase: Phase, exc: Exception, status: Status) -> None:
    assert classify(phase, exc) is status


def test_a_workspace_error_outside_the_workspace_phases_is_not_the_agents() -> None:
    assert classify(Phase.PARSE, WorkspaceBroken("w", "x")) is Status.ENGINE_ERROR


def test_cancellation_is_never_a_rollout_outcome() -> None:
    with pytest.raises(TypeError):
        classify(Phase.CALL, asyncio.CancelledError())


def test_status_is_an_enum_recorded_by_its_value() -> None:
    import msgspec

    t = Trajectory(task_id="1", suite="webshop", group_id="g", sample=0, seed=1, status=Status.CALL_TIMEOUT)
    data = msgspec.json.encode(t)
    assert b'"status":"call_timeout"' in data
    assert msgspec.json.decode(data, type=Trajectory).status is Status.CALL_TIMEOUT
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(data.replace(b"call_timeout", b"whatever"), type=Trajectory)


# -- the memory meter ----------------------------------------------------------------------------------------------


def test_the_meter_integrates_by_trapezoids_and_keeps_the_peak() -> None:
    clock, value = Clock(), [0]
    meter = MemoryMeter(lambda: value[0], 0.25, clock=clock)
    for t, v in [(0, 1 << 30), (2, 3 << 30), (3, 1 << 30)]:
        clock.t = 100.0 + t
        value[0] = v
        meter.sample()
    assert meter.peak_bytes == 3 << 30
    assert meter.gib_s == pytest.approx((1 + 3) / 2 * 2 + (3 + 1) / 2 * 1)
    assert meter.wall_s == 3
    assert meter.mean_bytes == pytest.approx(meter.gib_s / 3 * (1 << 30))  # GiB*s over the time it covers


def test_the_meters_detail_readings_peak_field_by_field() -> None:
    from bunshin.envs.runtime.memory import RunMemory

    clock = Clock()
    meter = MemoryMeter(lambda: 0, 0.25, clock=clock, detail=RunMemory)
    for t, pss, tables in [(0, 5, 1), (1, 9, 2), (2, 7, 4)]:
        clock.t = 100.0 + t
        meter.add_detail(RunMemory(pss=pss, page_tables=tables, cgroup_charge=10))
    assert meter.detail_peaks() == {**dict.fromkeys(RunMemory.__struct_fields__, 0), "pss": 9, "page_tables": 4,
                                    "cgroup_charge": 10}
    assert [t for t, _ in meter.details] == [0, 1, 2]


@pytest.mark.asyncio
async def test_the_meter_reads_in_its_own_tasks_until_stopped_then_once_more() -> None:
    """``start`` runs the reading and the detailed reading in tasks of the meter's scope; ``stop`` ends both (no
    task is left) and reads each once more, so a run shorter than an interval has its end on the timeline."""
    from bunshin.envs.runtime.memory import RunMemory

    readings: list[int] = []

    def reading() -> int:
        readings.append(len(readings))
        return 1 << 20

    before = set(asyncio.all_tasks())
    meter = MemoryMeter(reading, 3600.0, detail=RunMemory, detail_interval_s=3600.0)
    meter.start()
    await all_tasks_blocked()
    assert len({t for t in asyncio.all_tasks() if t not in before}) == 2  # the reading and the detailed one
    assert readings == [0]  # the first reading; the next is an hour away
    await meter.stop()
    assert {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()} == set()
    assert readings == [0, 1] and len(meter.timeline) == 2 and meter.details
    await meter.stop()  # once stopped, stopping again reads nothing
    assert readings == [0, 1]


# -- the episode's moves -------------------------------------------------------------------------------------------


class Language:
    """A small suite language for the episode: ``go N`` and ``done``."""

    name = "toy"

    def parse_action(self, text: str) -> ToolCall:
        if text == "done":
            return ToolCall(name="done")
        verb, _, n = text.partition(" ")
        if verb != "go" or not n.isdigit():
            raise ActionError(f"invalid action {text!r}")
        return ToolCall(name="go", args={"n": int(n)})

    def is_final(self, call: ToolCall) -> bool:
        return call.name == "done"

    def null_action(self) -> ToolCall:
        return ToolCall(name="done", args={"gave_up": True})

    def normalize(self, call: ToolCall) -> ToolCall:
        """The schema's normal form: ``go`` has a default ``speed``; a ToolCall of another tool is refused."""
        if call.name not in ("go", "done"):
            raise ActionError(f"unknown tool {call.name!r}")
        return ToolCall(name="go", args={"speed": 1, **call.args}) if call.name == "go" else call


def episode(max_steps: int = 2) -> Episode:
    task = SuiteTask(suite="toy", id="t", template="x", instruction="go somewhere", path="-", reference=[])
    t = Trajectory(task_id="t", suite="toy", group_id="g", sample=0, seed=1)
    return Episode(Language(), task, t, Observation(output="start"), max_steps)  # type: ignore[arg-type]


def test_an_episode_acts_records_and_ends_on_the_final_action() -> None:
    e = episode()
    d = Decision(action="go 3", reasoning_s=0.5, token_ids=[1, 2], logprobs=[-0.1, -0.2])
    move = e.next_move(d)
    assert move == Act(call=ToolCall(name="go", args={"n": 3, "speed": 1}), text="go 3")  # normalised
    e.record(d, move, move.call, Observation(output="moved"), 0.25)  # type: ignore[union-attr]
    assert e.context.observations == ["start", "moved"] and e.context.actions == ["go 3"] and e.context.step == 1
    assert e.trajectory.steps[0].token_ids == [1, 2] and e.trajectory.steps[0].tool_s == 0.25
    final = e.next_move(Decision(action="done", token_ids=[9], logprobs=[-1.0]))
    assert final == Stop(final=ToolCall(name="done"), status=Status.OK)
    assert e.trajectory.final_text == "done" and e.trajectory.final_token_ids == [9]


def test_an_episode_that_reaches_its_step_limit_stops_with_the_null_action() -> None:
    e = episode(max_steps=1)
    d = Decision(action="go 1")
    move = e.next_move(d)
    e.record(d, move, move.call, Observation(output="x"), 0.1)  # type: ignore[union-attr]
    stop = e.next_move(Decision(action="go 2"))
    assert stop == Stop(final=ToolCall(name="done", args={"gave_up": True}), status=Status.MAX_STEPS,
                        error="no final action within 1 steps")


def test_an_action_outside_the_language_is_an_action_error() -> None:
    refused = episode()
    with pytest.raises(ActionError):
        refused.next_move(Decision(action="fly away", token_ids=[7, 8], logprobs=[-0.5, -0.25], finish_reason="stop"))
    t = refused.trajectory  # the model's refused turn is recorded, so that a trainer sees what it said
    assert (t.final_token_ids, t.final_logprobs, t.final_finish_reason) == ([7, 8], [-0.5, -0.25], "stop")
    assert t.final_policy_version == 0
    with pytest.raises(ActionError):  # a tool call the policy made up is checked by the suite's schema too
        episode().next_move(Decision(action=ToolCall(name="_put_file", args={"path": "/etc/passwd"})))
