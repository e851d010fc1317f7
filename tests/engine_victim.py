"""An engine for tests to kill: starts a run, forks a workspace with a fault that hangs mid-fork, and reports
where it is on stdout. Usage: python -m tests.engine_victim STATE_DIR FAULT"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bunshin.envs import AppSpec, WorkspaceRuntime


async def main(state_dir: Path, fault: str) -> None:
    rt = WorkspaceRuntime(state_dir=state_dir, faults=[fault])
    await rt.start()
    ws = await rt.create(AppSpec(target="bunshin.envs.runtime.heap_app:HeapApp", kwargs={"size_bytes": 8 << 20}))
    from bunshin.envs import ToolCall

    await ws.execute(ToolCall(name="shell", args={"cmd": "sleep 600 > /dev/null 2>&1 &"}))
    print(f"run {rt.run_id} {rt.run_dir}", flush=True)
    print("forking", flush=True)
    await ws.fork()
    print("fork returned", flush=True)  # never reached: the fault hangs the fork


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
