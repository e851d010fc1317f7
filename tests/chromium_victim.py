"""An engine for tests to kill: starts a run, a web-shop workspace with Chromium and a fork of it (a clone with a
Chromium of its own, a warm-pool slot's) and a ready warm-pool slot, reports on stdout, then waits to be killed. Usage: python -m tests.chromium_victim STATE_DIR"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bunshin.envs import ToolCall, WorkspaceRuntime
from bunshin.envs.webshop.suite import WebShopSuite


async def main(state_dir: Path) -> None:
    rt = WorkspaceRuntime(state_dir=state_dir)
    await rt.start()
    print(f"run {rt.run_id} {rt.run_dir}", flush=True)
    spec = WebShopSuite(catalog_size=200, time_scale=0.0, browser="chromium").app()
    ws = await rt.create(spec)
    await ws.execute(ToolCall(name="goto", args={"url": "http://127.0.0.1:7770/"}))
    await ws.fork()
    for _ in range(600):  # a slot of the pool ready too: it must die with the engine as well
        if rt.hosts.pool.ready(spec.warm):
            break
        await asyncio.sleep(0.1)
    print("forked", flush=True)
    await asyncio.sleep(600)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
