"""A pure-state test application: a counter and a list of notes, nothing but Python objects, so it runs alike in a
real workspace and in the in-memory one (``envs/memory_workspace.py``). The contract tests and the engine's
state-machine tests run on it.

Owns: the tools ``add``, ``note``, ``get`` (the state), ``draw`` (the seeded stream ``ctx.rng``), ``whoami`` (the
context's workspace id and seed, and how many ``after_fork`` hooks ran in this lineage), ``sleep`` (a tool that
takes its time: for deadlines), ``slow_add`` (an add after a sleep: a call whose caller may be cancelled meanwhile),
``fail`` (a ``ToolError``), ``crash`` (any other exception), ``grow`` (state of a given size), and the suite's hidden
``_setup`` and ``_value``. Its state is checkpointed and restored for forks that restore a dump.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from bunshin.envs.app import AppContext, Tool, ToolError, WorkspaceApp
from bunshin.envs.records import Observation

MAX_SLEEP_S = 30.0


class CounterApp(WorkspaceApp):
    def __init__(self, start: int = 0):
        self.value = int(start)
        self.notes: list[str] = []
        self.after_forks = 0
        self.blob: list[bytes] = []

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def after_fork(self, ctx: AppContext) -> None:
        self.after_forks += 1

    def checkpoint(self) -> bytes:
        """The state for a fork that restores (the private-restore backend, ``--runtime docker``)."""
        return msgspec.msgpack.encode({"value": self.value, "notes": self.notes, "after_forks": self.after_forks,
                                       "blob": self.blob})

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        state = msgspec.msgpack.decode(bytes(data))
        self.ctx = ctx
        self.value, self.notes, self.after_forks = state["value"], state["notes"], state["after_forks"]
        self.blob = state["blob"]

    def tools(self) -> dict[str, Tool]:
        return {"add": self._add, "note": self._note, "get": self._get, "draw": self._draw, "whoami": self._whoami,
                "sleep": self._sleep, "slow_add": self._slow_add, "fail": self._fail, "crash": self._crash,
                "grow": self._grow, "_setup": self._setup, "_value": self._value}

    def _add(self, args: dict[str, Any]) -> Observation:
        n = args.get("n")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ToolError(f"add needs an integer 'n', got {n!r}")
        self.value += n
        return Observation(output=f"value {self.value}")

    def _note(self, args: dict[str, Any]) -> Observation:
        self.notes.append(str(args.get("text", "")))
        return Observation(output=f"{len(self.notes)} notes")

    def _get(self, args: dict[str, Any]) -> Observation:
        return Observation(output=f"value {self.value}; notes {self.notes}",
                           data={"value": self.value, "notes": list(self.notes)})

    def _draw(self, args: dict[str, Any]) -> Observation:
        return Observation(data={"draw": self.ctx.rng.getrandbits(32)})

    def _whoami(self, args: dict[str, Any]) -> Observation:
        return Observation(data={"ws": self.ctx.ws_id, "seed": self.ctx.seed, "after_forks": self.after_forks})

    def _sleep(self, args: dict[str, Any]) -> Observation:
        time.sleep(min(float(args.get("seconds", 1.0)), MAX_SLEEP_S))
        return Observation(output="slept")

    def _slow_add(self, args: dict[str, Any]) -> Observation:
        time.sleep(min(float(args.get("seconds", 0.2)), MAX_SLEEP_S))
        return self._add(args)

    def _fail(self, args: dict[str, Any]) -> Observation:
        raise ToolError("asked to fail")

    def _crash(self, args: dict[str, Any]) -> Observation:
        raise ValueError("asked to crash")

    def _grow(self, args: dict[str, Any]) -> Observation:
        # Written through (a real host's pages are touched), a MiB at a time (in memory the tool shares the engine's
        # interpreter: one huge memset would hold the GIL, and so the event loop, for as long as it takes).
        nbytes = int(args.get("nbytes", 0))
        self.blob = [b"\x01" * min(1 << 20, nbytes - at) for at in range(0, nbytes, 1 << 20)]
        return Observation(output=f"{nbytes} bytes")

    def _setup(self, args: dict[str, Any]) -> Observation:
        self.value = int(args.get("start", 0))
        self.notes = []
        return Observation(output="set up")

    def _value(self, args: dict[str, Any]) -> Observation:
        return Observation(output=str(self.value), data={"value": self.value})
