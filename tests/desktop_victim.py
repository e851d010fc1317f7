"""An engine for tests to kill: starts a run, a desktop workspace with its session (Xvfb, D-Bus, openbox), AT-SPI
(an accessibility tree built), LibreOffice Calc and gedit launched, its VM API served over HTTP, reports on stdout,
then waits to be killed. Usage: python -m tests.desktop_victim STATE_DIR"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bunshin.envs import Limits, ToolCall, WorkspaceRuntime
from bunshin.envs.xdesktop.app import desktop_app
from bunshin.envs.xdesktop.http import Endpoint


async def vm(ws, path: str, body: dict) -> None:  # type: ignore[no-untyped-def]
    obs = await ws.execute(ToolCall(name="vm", args={"method": "POST", "path": path, "json": body}), timeout_s=120)
    assert obs.error is None and obs.data["status"] == 200, (path, obs.error, obs.data.get("body", b"")[:300])


async def main(state_dir: Path) -> None:
    rt = WorkspaceRuntime(state_dir=state_dir, limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150))
    await rt.start()
    print(f"run {rt.run_id} {rt.run_dir}", flush=True)
    ws = await rt.create(desktop_app())
    endpoint = Endpoint(ws)
    await endpoint.start()
    await vm(ws, "/setup/launch", {"command": ["localc", "--norestore"]})
    await vm(ws, "/setup/launch", {"command": ["gedit"]})
    for _ in range(600):  # both windows up
        obs = await ws.execute(ToolCall(name="vm", args={"method": "POST", "path": "/execute",
                                                         "json": {"command": "wmctrl -l", "shell": True}}))
        if b"LibreOffice" in obs.data["body"] and b"gedit" in obs.data["body"]:
            break
        await asyncio.sleep(0.2)
    await ws.execute(ToolCall(name="observe"))  # AT-SPI's bus and registry up, the tree walked
    print("up", flush=True)
    await asyncio.sleep(600)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
