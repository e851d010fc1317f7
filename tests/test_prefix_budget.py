"""The prefix cache's relative hot budget (``--hot-budget 10%``): a share of the most the run has held without its
hot entries, within the absolute budget when both are set, never shrinking as the run winds down."""

from __future__ import annotations

import pytest

from bunshin.engine.prefix.cache import PrefixCache
from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.envs.webshop.suite import WebShopSuite

MiB = 1 << 20


async def never_set_up(*_: object) -> object:
    raise AssertionError("no task is set up here")


def cache(settings: PrefixSettings, memory: list[int]) -> PrefixCache:
    return PrefixCache(settings, WebShopSuite(time_scale=0.0), never_set_up, call_timeout_s=1.0,  # type: ignore[arg-type]
                       run_memory=lambda: memory[0])


@pytest.mark.asyncio
async def test_the_budget_is_a_share_of_the_runs_high_water_mark_without_its_snapshots() -> None:
    memory = [1000 * MiB]
    c = cache(PrefixSettings(hot_budget=None, hot_share=0.1), memory)
    await c.open([])
    try:
        assert c.statistics()["hot_budget"] == 100 * MiB  # from the run's memory when the cache opens
        memory[0] = 2000 * MiB
        await c.measure_hot()
        assert c.tree.hot_budget == 200 * MiB
        c.tree.bytes_hot = 500 * MiB  # what the snapshots hold is not the run's: 2100 - 500 is below the mark
        memory[0] = 2100 * MiB
        await c.measure_hot()
        assert c.tree.hot_budget == 200 * MiB
        c.tree.bytes_hot = 0
        memory[0] = 300 * MiB  # the last rollouts: the budget keeps what the run has shown it needs
        await c.measure_hot()
        assert c.tree.hot_budget == 200 * MiB
    finally:
        await c.close()


@pytest.mark.asyncio
async def test_with_both_budgets_the_smaller_holds_and_without_a_share_the_absolute_one_alone() -> None:
    memory = [4000 * MiB]
    both = cache(PrefixSettings(hot_budget=256 * MiB, hot_share=0.1), memory)
    absolute = cache(PrefixSettings(hot_budget=256 * MiB), memory)
    for c in (both, absolute):
        await c.open([])
    try:
        assert both.tree.hot_budget == absolute.tree.hot_budget == 256 * MiB
        memory[0] = 1000 * MiB
        fresh = cache(PrefixSettings(hot_budget=256 * MiB, hot_share=0.1), memory)
        await fresh.open([])
        assert fresh.tree.hot_budget == 100 * MiB
        await fresh.close()
    finally:
        for c in (both, absolute):
            await c.close()


def test_a_share_needs_the_runs_memory_and_a_sane_fraction() -> None:
    with pytest.raises(ValueError, match="needs the run's memory"):
        PrefixCache(PrefixSettings(hot_share=0.1), WebShopSuite(time_scale=0.0), never_set_up,  # type: ignore[arg-type]
                    call_timeout_s=1.0)
    with pytest.raises(ValueError, match="hot_share must be a fraction"):
        PrefixSettings(hot_share=-0.5)
