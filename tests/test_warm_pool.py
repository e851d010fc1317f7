"""The warm pool (``envs/runtime/warm_pool.py``): workspaces prepared ahead whose Chromium a live clone of a Chromium
web-shop workspace takes over (its cgroup, its network namespace, the browser's DevTools pipe) instead of starting
its own; a miss starts one as before; the pool keeps to its memory budget, and a taken slot is removed with its
clone, on a failed fork too."""

from __future__ import annotations

import asyncio

import pytest

from bunshin.envs.errors import ForkFailed
from bunshin.envs.runtime.host_workspace import HostWorkspace
from bunshin.envs.webshop.suite import WebShopSuite

from .conftest import pool_layers
from .quiet import settled, until
from .test_chromium_shop import SHOP, act, chromium_processes

pytestmark = pytest.mark.asyncio


async def shop_with_pool(make_runtime, **options: object):
    """A runtime with a warm pool, a Chromium shop workspace on a page, and the pool's slots ready."""
    rt = await make_runtime(**options)
    suite = WebShopSuite(catalog_size=200, time_scale=0.0, browser="chromium")
    spec = suite.app()
    ws = await rt.create(spec)
    page = await act(ws, "goto", url=f"{SHOP}/checkout/cart/")
    page = await act(ws, "goto", url=f"{SHOP}/")
    return rt, spec, ws, page


async def ready_slots(rt, spec, count: int) -> list[HostWorkspace]:
    assert await until(lambda: len(rt.hosts.pool.ready(spec.warm)) >= count, 60), rt.hosts.pool.stats
    return rt.hosts.pool.ready(spec.warm)[:count]


def cgroup_pids(ws: HostWorkspace) -> set[int]:
    return set(ws.cgroup.procs())


def chromium_pids() -> set[int]:
    return {pid for pid, _, _ in chromium_processes()}


async def test_a_clone_takes_a_slot_browser_over_and_shows_the_source_state(make_runtime) -> None:
    rt, spec, ws, page = await shop_with_pool(make_runtime, warm_pool=1)
    (slot,) = await ready_slots(rt, spec, 1)
    slot_browsers = chromium_pids() & cgroup_pids(slot)
    assert slot_browsers  # the slot's Chromium runs in the slot's cgroup, started ahead
    typed = await act(ws, "type", element_id=next(int(line.strip()[1:line.strip().index("]")])
                                                   for line in page.output.splitlines() if "] textbox " in line),
                      text="half typed", press_enter_after=False)
    clone = await ws.fork()
    try:
        assert clone.last_fork is not None and clone.last_fork.warm_slot
        browser = await act(clone, "_browser")
        assert browser.data["warm"] is True and browser.data["launch_s"] < 0.1  # taken over, not started
        mine = await act(clone, "observe")
        assert mine.output == typed.output and mine.data["url"] == typed.data["url"]
        assert slot_browsers <= cgroup_pids(clone)  # the clone's cgroup is the slot's: one workspace, one charge
        back = await act(clone, "go_back")  # its shop server answers the slot's browser: the same loopback
        assert back.data["url"] == f"{SHOP}/checkout/cart/" and back.data["status"] == 200
        assert (await act(ws, "observe")).output == typed.output  # the source's browser is untouched
        assert slot not in rt.hosts.pool.ready(spec.warm) and slot.id not in rt.workspaces
    finally:
        await clone.close()
    assert not slot_browsers & chromium_pids()  # gone with the clone
    assert f"ws-{slot.id}" not in pool_layers(rt) and not any(d.exists() for d in slot.cgroup.dirs())
    assert rt.hosts.pool.stats.hits == 1
    await ws.close()
    await rt.close()
    assert not chromium_processes(rt.run_id)


async def test_without_a_ready_slot_the_clone_starts_its_own_chromium(make_runtime) -> None:
    rt, spec, ws, page = await shop_with_pool(make_runtime, warm_pool=0)
    clone = await ws.fork()
    try:
        assert clone.last_fork is not None and not clone.last_fork.warm_slot
        assert (await act(clone, "_browser")).data["warm"] is False
        assert (await act(clone, "observe")).output == page.output
    finally:
        await clone.close()
    assert rt.hosts.pool.stats.hits == 0 and rt.hosts.pool.stats.started == 0
    await ws.close()


async def test_the_pool_never_starts_a_slot_past_its_memory_budget(make_runtime) -> None:
    rt, spec, ws, page = await shop_with_pool(make_runtime, warm_pool=2, warm_budget_bytes=64 << 20)
    clone = await ws.fork()  # the source alone is over 64 MiB: no slot was started, the fork is a miss
    try:
        assert not clone.last_fork.warm_slot and (await act(clone, "observe")).output == page.output
    finally:
        await clone.close()
    stats = rt.hosts.pool.stats
    assert stats.started == 0 and stats.refused_for_budget >= 1 and stats.misses == 1, stats
    await ws.close()


async def test_a_snapshot_clones_take_slots_and_each_slot_is_taken_once(make_runtime) -> None:
    rt, spec, ws, page = await shop_with_pool(make_runtime, warm_pool=2)
    snap = await ws.snapshot()
    first, second = await ready_slots(rt, spec, 2)
    clones = [await snap.fork(), await snap.fork()]
    try:
        assert all(c.last_fork.warm_slot for c in clones)
        assert {first.id, second.id} == {s.id for c in clones for s in c.companions}
        for clone in clones:
            assert (await act(clone, "observe")).output == page.output
    finally:
        for clone in clones:
            await clone.close()
    await snap.close()
    await ws.close()


async def test_a_fork_that_fails_in_the_clone_removes_the_slot_it_took(make_runtime) -> None:
    rt, spec, ws, _ = await shop_with_pool(make_runtime, warm_pool=1, faults=["clone.after_cgroup"])
    (slot,) = await ready_slots(rt, spec, 1)
    slot_browsers = chromium_pids() & cgroup_pids(slot)
    with pytest.raises(ForkFailed):
        await ws.fork()
    assert not await settled(lambda: slot_browsers & chromium_pids(), 10)
    assert f"ws-{slot.id}" not in pool_layers(rt) and not any(d.exists() for d in slot.cgroup.dirs())
    assert len(rt.workspaces) == 1
    assert (await act(ws, "observe")).error is None  # the source goes on
    await ws.close()


async def test_a_fork_of_a_text_workspace_never_touches_the_pool(make_runtime) -> None:
    rt = await make_runtime(warm_pool=2)
    ws = await rt.create(WebShopSuite(catalog_size=50, time_scale=0.0).app())
    clone = await ws.fork()
    try:
        assert not clone.last_fork.warm_slot
    finally:
        await clone.close()
    stats = rt.hosts.pool.stats
    assert (stats.hits, stats.misses, stats.started) == (0, 0, 0)
    await ws.close()


async def test_the_private_restore_keeps_no_slots(make_runtime) -> None:
    """The baseline starts every clone's browser itself, as CRIU's restore would: the run keeps no slot ready for
    it (a slot nobody takes would be memory charged to the baseline)."""
    rt = await make_runtime(backend="restore", warm_pool=2)
    suite = WebShopSuite(catalog_size=50, time_scale=0.0, browser="chromium")
    ws = await rt.create(suite.app())
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("warm pool")]  # no refill started
    clone = await ws.fork()
    try:
        assert not clone.last_fork.warm_slot
        assert (await act(clone, "observe")).error is None
    finally:
        await clone.close()
    stats = rt.hosts.pool.stats
    assert (stats.hits, stats.started) == (0, 0) and not rt.hosts.pool.ready(suite.app().warm)
    await ws.close()


async def test_an_engine_fills_the_pool_as_it_starts(state_dir) -> None:
    """The first group's forks should find browsers ready: ``RolloutEngine`` has the runtime prepare the suite's
    app when it starts (``WorkspaceRuntime.prepare``), before any workspace exists."""
    from bunshin.engine.rollout import RolloutEngine
    from bunshin.policies.scripted import ScriptedPolicy

    suite = WebShopSuite(catalog_size=50, time_scale=0.0, browser="chromium")
    async with RolloutEngine(suite, ScriptedPolicy(time_scale=0.0), concurrency=2, state_dir=state_dir) as engine:
        rt = engine.runtime
        assert not rt.workspaces
        assert [t for t in asyncio.all_tasks() if t.get_name().startswith("warm pool")]  # filling already
        assert await until(lambda: len(rt.hosts.pool.ready(suite.app().warm)) == 2, 60), rt.warm_pool_stats()
