"""Page-level comparison of two workspaces: identical by content vs physically shared."""

from __future__ import annotations

import asyncio

import pytest

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.runtime.page_sharing import compare, page_set

from .conftest import heap_app

pytestmark = pytest.mark.asyncio


async def sharing(a, b):
    pa, pb = await asyncio.to_thread(page_set, a.cgroup.procs()), await asyncio.to_thread(page_set, b.cgroup.procs())
    return compare(pa, pb)


async def test_fork_shares_pages_until_they_are_written(runtime: WorkspaceRuntime) -> None:
    source = await runtime.create(heap_app(64 << 20))
    clone = await source.fork()
    right_after = await sharing(clone, source)
    assert right_after.physically_shared_fraction > 0.8, right_after
    assert right_after.identical_fraction >= right_after.physically_shared_fraction
    await clone.execute(ToolCall(name="write_pages", args={"fraction": 0.5, "value": 0x5A}))
    after = await sharing(clone, source)
    # half the heap now differs in content and lives in the clone's own pages
    assert after.physically_shared_fraction < right_after.physically_shared_fraction - 0.2, after
    assert after.identical_fraction < right_after.identical_fraction - 0.2, after
