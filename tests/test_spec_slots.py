"""Speculation slots and tail priority, without workspaces: a bounded number of branches, the memory budget, the
highest priority first (preempting a clearly lower one), and the tail predictor's remaining steps and its measured
rank correlation."""

from __future__ import annotations

import asyncio

import pytest

from bunshin.engine.speculation.settings import SpecSettings
from bunshin.engine.speculation.slots import PREEMPT_MARGIN, SpecSlots
from bunshin.engine.speculation.tail import TailPredictor


@pytest.mark.asyncio
async def test_no_more_grants_than_slots_and_the_highest_waiter_goes_first() -> None:
    slots = SpecSlots(2, None, lambda: 0)
    a = await slots.acquire(1.0, lambda: None)
    b = await slots.acquire(1.0, lambda: None)
    low = asyncio.ensure_future(slots.acquire(1.1, lambda: None))  # not enough to preempt
    high = asyncio.ensure_future(slots.acquire(1.2, lambda: None))
    await asyncio.sleep(0.01)
    assert not low.done() and not high.done() and len(slots.running) == 2
    slots.release(a)
    await asyncio.sleep(0.01)
    assert high.done() and not low.done()  # the freed slot went to the higher priority, though it asked later
    slots.release(b)
    slots.release(b)  # idempotent: one release frees one slot
    await asyncio.sleep(0.01)
    assert low.done() and len(slots.running) == 2


@pytest.mark.asyncio
async def test_a_clearly_higher_priority_preempts_the_lowest_running_grant() -> None:
    preempted: list[str] = []
    slots = SpecSlots(1, None, lambda: 0)
    low = await slots.acquire(1.0, lambda: preempted.append("low"))
    near = asyncio.ensure_future(slots.acquire(PREEMPT_MARGIN * 0.9, lambda: preempted.append("near")))
    await asyncio.sleep(0.01)
    assert not near.done() and preempted == []
    tail = await slots.acquire(PREEMPT_MARGIN * 2.0, lambda: None)
    assert preempted == ["low"] and low.released and slots.running == {tail} and slots.preempted == 1
    near.cancel()
    with pytest.raises(asyncio.CancelledError):
        await near
    assert slots._waiters == []  # a cancelled waiter leaves the queue


@pytest.mark.asyncio
async def test_the_memory_budget_holds_grants_back_until_memory_falls() -> None:
    used = [100]
    slots = SpecSlots(4, 64, lambda: used[0])
    waiting = asyncio.ensure_future(slots.acquire(1.0, lambda: None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    used[0] = 10  # a branch was closed: the waiter sees it at its next look
    await asyncio.wait_for(waiting, 2.0)
    assert len(slots.running) == 1


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


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="slots"):
        SpecSettings(slots=0)
    with pytest.raises(ValueError, match="threshold"):
        SpecSettings(threshold=1.5)
    with pytest.raises(ValueError, match="memory budget"):
        SpecSettings(memory_budget=-1)
