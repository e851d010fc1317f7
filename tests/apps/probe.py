"""A test application that lets a test look inside its host and misbehave on request.

Owns: ``gc_freeze_count`` (how many objects the host's collector keeps frozen: a fork that failed after
``gc.freeze()`` must leave none), ``spin`` (a tool that ignores its deadline and burns CPU, the way a quadratic
parser would: what the runtime's per-call deadline is for), ``scratch`` (fill and free a large buffer, as a page's
render does) and ``echo``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from bunshin.envs.app import Tool, WorkspaceApp
from bunshin.envs.records import Observation


class ProbeApp(WorkspaceApp):
    def tools(self) -> dict[str, Tool]:
        return {"gc_freeze_count": self._gc_freeze_count, "spin": self._spin, "echo": self._echo,
                "scratch": self._scratch}

    def _gc_freeze_count(self, args: dict[str, Any]) -> Observation:
        return Observation(output=str(gc.get_freeze_count()), data={"count": gc.get_freeze_count()})

    def _spin(self, args: dict[str, Any]) -> Observation:
        until = time.monotonic() + float(args.get("seconds", 3600))
        spins = 0
        while time.monotonic() < until:
            spins += 1
        return Observation(output=f"spun {spins} times")

    def _scratch(self, args: dict[str, Any]) -> Observation:
        for _ in range(int(args.get("times", 1))):
            buffer = bytearray(int(args.get("nbytes", 8 << 20)))  # malloc'd and written through, then freed
            del buffer
        return Observation(output="ok")

    def _echo(self, args: dict[str, Any]) -> Observation:
        return Observation(output=str(args.get("text", "")))
