"""Speculation slots and tail priority, without workspaces: a bounded number of branches, the memory budget, the
highest priority first (preempting a clearly lower one), and the tail predictor's remaining steps and its measured
rank correlation. Synchronised with ``all_tasks_blocked``, never with sleeps."""

from __future__ import annotations

import asyncio

import pytest

from bunshin.engine.speculation.memory import BranchMemory
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.engine.speculation.slots import PREEMPT_MARGIN, SpecSlots
from bunshin.engine.speculation.tail import TailPredictor
from tests.quiet import all_tasks_blocked


@pytest.mark.asyncio
async def test_no_more_grants_than_slots_and_the_highest_waiter_goes_first() -> None:
    slots = SpecSlots(2, lambda: True)
    a = await slots.acquire(1.0, lambda: None)
    b = await slots.acquire(1.0, lambda: None)
    low = asyncio.ensure_future(slots.acquire(1.1, lambda: None))  # not enough to preempt
    high = asyncio.ensure_future(slots.acquire(1.2, lambda: None))
    await all_tasks_blocked()
    assert not low.done() and not high.done() and len(slots.running) == 2
    slots.release(a)
    await all_tasks_blocked()
    assert high.done() and not low.done()  # the freed slot went to the higher priority, though it asked later
    slots.release(b)
    slots.release(b)  # idempotent: one release frees one slot
    await all_tasks_blocked()
    assert low.done() and len(slots.running) == 2


@pytest.mark.asyncio
async def test_a_clearly_higher_priority_preempts_the_lowest_running_grant() -> None:
    preempted: list[str] = []
    slots = SpecSlots(1, lambda: True)
    low = await slots.acquire(1.0, lambda: preempted.append("low"))
    near = asyncio.ensure_future(slots.acquire(PREEMPT_MARGIN * 0.9, lambda: preempted.append("near")))
    await all_tasks_blocked()
    assert not near.done() and preempted == []
    tail = await slots.acquire(PREEMPT_MARGIN * 2.0, lambda: None)
    assert preempted == ["low"] and low.released and slots.running == {tail} and slots.preempted == 1
    near.cancel()
    with pytest.raises(asyncio.CancelledError):
        await near
    assert slots._waiters == []  # a cancelled waiter leaves the queue


@pytest.mark.asyncio
async def test_memory_holds_grants_back_until_it_allows_one_more() -> None:
    allows = [False]
    slots = SpecSlots(4, lambda: allows[0])
    waiting = asyncio.ensure_future(slots.acquire(1.0, lambda: None))
    await all_tasks_blocked()  # it waits for its next look (a timer)
    assert not waiting.done()
    allows[0] = True  # a branch was closed: the waiter sees it at its next look
    await asyncio.wait_for(waiting, 2.0)
    assert len(slots.running) == 1


def test_the_cpu_rule_refuses_branches_while_the_cores_are_saturated(tmp_path) -> None:
    """``CpuLoad`` reads /proc/stat's format once a window: busy is the time neither idle nor waiting for I/O over
    all the time of the last window; at or above the limit no branch may start, below it one may."""
    from pathlib import Path

    from bunshin.engine.speculation.cpu import CpuLoad, read_cpu_times

    stat = tmp_path / "stat"
    now = [0.0]

    def write(user: int, idle: int) -> None:  # cpu user nice system idle iowait irq softirq steal guest guest_nice
        stat.write_text(f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n")

    write(100, 100)
    load = CpuLoad(0.9, window_s=0.5, read=lambda: read_cpu_times(stat), clock=lambda: now[0])
    write(195, 105)  # 95 busy ticks of 100
    assert not load.allows() and load.busy == 0.95 and load.refused == 1  # the first ask measures since the start
    write(245, 155)  # 50 of 100
    now[0] = 0.3
    assert not load.allows() and load.busy == 0.95  # the window has not passed: the file is not read again
    now[0] = 0.6
    assert load.allows() and load.busy == 0.5 and load.refused == 2
    assert CpuLoad(None).allows()  # no limit: no rule
    busy, total = read_cpu_times(Path("/proc/stat"))  # the machine's own
    assert 0 < busy < total
    with pytest.raises(ValueError, match="fraction in"):
        CpuLoad(1.5)
    with pytest.raises(ValueError, match="CPU limit"):
        SpecSettings(cpu_limit=0.0)


MiB = 1 << 20


def test_a_byte_budget_counts_every_live_branch_at_its_charge_or_the_estimate() -> None:
    memory = BranchMemory(budget=100 * MiB, headroom=None, run_memory=lambda: 10 << 30, initial_estimate=30 * MiB)
    assert memory.allows()  # the asking branch alone: 30
    memory.opened("a")
    memory.opened("b")
    assert memory.reserved() == 90 * MiB and memory.allows()
    memory.opened("c")
    assert not memory.allows()  # 120 > 100
    memory.measure({"a": 5 * MiB, "b": 50 * MiB})  # a fresh branch still counts at the estimate; a grown one at its charge
    assert memory.reserved() == (30 + 50 + 30 + 30) * MiB and memory.held() == 55 * MiB
    memory.closed("b")  # the estimate learns from what a closed branch came to hold
    assert memory.estimate == 50 * MiB and not memory.allows()  # 50 + 50 + 50 > 100
    memory.closed("c")
    assert memory.allows() and memory.peak == 55 * MiB


def test_the_headroom_rule_keeps_the_run_within_a_fraction_above_its_high_water_mark() -> None:
    run = [1000 * MiB]
    memory = BranchMemory(budget=None, headroom=0.10, run_memory=lambda: run[0], initial_estimate=30 * MiB)
    memory.measure({})
    assert memory.high == 1000 * MiB
    run[0] = 1200 * MiB
    memory.allows()
    assert memory.high == 1000 * MiB  # only a measurement moves the mark (a branch may have grown meanwhile)
    run[0] = 1000 * MiB
    memory.opened("a")  # alone it was always allowed; now with it: 60 <= 1100 - 1000
    assert memory.allows()
    memory.opened("b")
    memory.opened("c")
    memory.opened("d")
    assert not memory.allows()  # 150 > 100: at the peak the branches get h of it
    run[0] = 1000 * MiB + 30 * MiB  # what the run reads includes what its branches hold
    memory.measure({"a": 30 * MiB})
    assert memory.high == 1000 * MiB  # the branches are not the run's high-water mark
    run[0] = 600 * MiB  # the last rollouts: the run holds less, the branches may use what it has shown it needs
    assert memory.allows() and memory.reserved() <= 1100 * MiB - (600 - 30) * MiB
    nobody = BranchMemory(budget=None, headroom=0.0, run_memory=lambda: 50 * MiB, initial_estimate=30 * MiB)
    assert nobody.allows()  # with no branch alive one may always start, even with no headroom at all
    nobody.opened("x")
    assert not nobody.allows()


def test_both_rules_apply_and_neither_is_unbounded() -> None:
    both = BranchMemory(budget=40 * MiB, headroom=10.0, run_memory=lambda: 1 << 30, initial_estimate=30 * MiB)
    both.measure({})
    both.opened("a")
    assert not both.allows()  # the headroom would allow it; the budget does not
    free = BranchMemory(budget=None, headroom=None, run_memory=lambda: 1 << 40)
    for i in range(100):
        free.opened(i)
    assert free.allows()


def test_tail_predictor_conditions_on_the_steps_already_taken() -> None:
    tail = TailPredictor(prior_steps=8)
    assert tail.remaining("t", "x", 0) == 8 and tail.remaining("t", "x", 10) == 1  # the prior, never below 1
    for sample, n in enumerate([4, 6, 12]):
        tail.finished(sample, "t", "x", n)
    assert tail.remaining("t", "x", 0) == pytest.approx((4 + 6 + 12) / 3)
    assert tail.remaining("t", "x", 5) == pytest.approx(((6 - 5) + (12 - 5)) / 2)  # only those still going
    assert tail.remaining("other", "x", 0) == pytest.approx(22 / 3)  # the template's lengths stand in
    assert tail.remaining("other", "y", 11) == 1.0  # one length beyond step 11 is too few: the prior


def test_tail_rank_correlation_is_measured_from_settled_predictions() -> None:
    tail = TailPredictor()
    for sample, n in enumerate([3, 3, 9, 9]):
        tail.finished(("old", sample), "short" if n == 3 else "long", "", n)
    assert tail.rho() is None  # nothing predicted yet
    for sample, (task, n) in enumerate([("short", 3), ("long", 9), ("short", 3), ("long", 9)]):
        tail.priority(sample, task, "", 0, 1.0)  # predicted 3 and 9 remaining
        tail.finished(sample, task, "", n)
    assert tail.rho() == pytest.approx(1.0)
    tail.priority("x", "short", "", 0, 1.0)
    tail.forget("x")  # a failed rollout settles nothing
    assert "x" not in tail.pending


def test_spearman_agrees_with_scipy_with_and_without_ties() -> None:
    import random

    from scipy.stats import spearmanr

    from bunshin.engine.speculation.tail import spearman

    rng = random.Random(0)
    print("seed 0")
    for n in (3, 10, 200):
        xs = [rng.randint(0, 5) for _ in range(n)]  # ties
        ys = [x + rng.random() * 3 for x in xs]
        assert spearman(xs, ys) == pytest.approx(float(spearmanr(xs, ys).statistic))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="slots"):
        SpecSettings(slots=0)
    with pytest.raises(ValueError, match="threshold"):
        SpecSettings(threshold=1.5)
    with pytest.raises(ValueError, match="memory budget"):
        SpecSettings(memory_budget=-1)
    with pytest.raises(ValueError, match="headroom"):
        SpecSettings(memory_headroom=-0.1)
