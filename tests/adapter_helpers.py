"""What the adapters' tests share: a small desktop suite, one text-editing task and its reference solution as
action text, and a synchronous leak check (the adapters' APIs are synchronous)."""

from __future__ import annotations

import json

from bunshin.envs import Limits
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.runtime.runtime import WorkspaceRuntime

from .conftest import leftovers
from .quiet import settled_sync

SMALL = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 2, "screenshots": False,
         "time_scale": 0.0}  # no modelled tool latency (the library's default is 1.0, real seconds)
TASK_ID = "103db5b8-ff21-5030-9484-47c32ead1b25"  # text_edit: insert a title line into a letter, save
LIMITS = Limits(memory_bytes=2 << 30, pids=256, command_timeout_s=30)


def desktop() -> DesktopSuite:
    return DesktopSuite(**SMALL)


def reference_actions(suite: DesktopSuite, task_id: str = TASK_ID) -> list[str]:
    """The task's reference solution in the desktop's action language (JSON tool calls, DONE last)."""
    task = next(t for t in suite.tasks() if t.id == task_id)
    return [c.name if c.name in ("DONE", "FAIL") else json.dumps({"name": c.name, "args": c.args})
            for c in task.reference]


def assert_no_leaks_sync(rt: WorkspaceRuntime | None, timeout: float = 10.0) -> None:
    assert rt is not None, "the session never started a runtime"
    left = settled_sync(lambda: leftovers(rt.run_id, rt.run_dir), timeout)
    assert not left, f"run {rt.run_id} left behind: {left}"
