"""A test application that starts a long-lived program (``ctx.launch``), as a browser or a display server is one:
a shell with a job of its own and a daemon that leaves its session (``setsid``), with a private "tmpfs" path.

Owns: ``launched`` (the program's pid as the host sees it, and its log) and ``stop`` (kill it).
"""

from __future__ import annotations

from typing import Any

from bunshin.envs.app import AppContext, Tool, WorkspaceApp
from bunshin.envs.records import Observation

CACHE = "/tmp/launcher-cache"
PROGRAM = ["/bin/sh", "-c", f"echo started > {CACHE}/log; sleep 1000 & setsid sleep 1001 & exec sleep 1002"]


class LauncherApp(WorkspaceApp):
    def setup(self, ctx: AppContext) -> None:
        self.process = ctx.launch("program", PROGRAM, env={"PATH": "/usr/bin:/bin"}, tmpfs={CACHE: 1 << 20})

    def tools(self) -> dict[str, Tool]:
        return {"launched": self._launched, "stop": self._stop}

    def _launched(self, args: dict[str, Any]) -> Observation:
        return Observation(output=str(self.process.pid), data={"pid": self.process.pid})

    def _stop(self, args: dict[str, Any]) -> Observation:
        self.process.kill()
        return Observation(output="stopped")
