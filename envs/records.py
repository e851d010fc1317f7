"""Records every user of a workspace sees: tool calls and their one canonical form, observations, memory figures,
which application a workspace runs and its limits. (The host protocol's own messages are the runtime's:
``bunshin.envs.runtime.protocol``.)

Owns: these msgspec Structs and ``canonical(call)``, the byte string two calls share exactly when they are the same
call: the prefix tree's key and what speculation matches on.
Must never: import engine code or do I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """A tool invocation: ``name`` plus arguments (JSON-like values). Its key is ``canonical(call)``."""

    name: str
    args: dict[str, Any] = {}


_canonical_encoder = msgspec.json.Encoder(order="sorted")


def canonical(call: ToolCall) -> bytes:
    """``{"args":{...},"name":"..."}`` as compact JSON with every object's keys sorted: equal exactly for equal calls
    (argument order aside). Calls a suite accepts are normalised by its tool schema first (defaults filled in,
    numbers of the declared type), so two spellings of one call share one key."""
    return _canonical_encoder.encode(call)


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What a tool call returned. ``error`` is set when the call itself was refused or failed."""

    output: str = ""
    exit_code: int | None = None
    error: str | None = None
    data: dict[str, Any] = {}
    tool_seconds: float = 0.0


class MemoryStats(msgspec.Struct, frozen=True, kw_only=True):
    """Memory of one workspace (or the sum over many): bytes, from smaps_rollup and the cgroup."""

    pss: int = 0
    private: int = 0
    shared: int = 0
    rss: int = 0
    anon_huge: int = 0
    cgroup_charge: int = 0
    processes: int = 0

    def __add__(self, other: MemoryStats) -> MemoryStats:
        return MemoryStats(**{f: getattr(self, f) + getattr(other, f) for f in self.__struct_fields__})


class AppSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Which application a workspace host runs: ``module:qualname`` of a WorkspaceApp subclass and its kwargs."""

    target: str = "bunshin.envs.app:WorkspaceApp"
    kwargs: dict[str, Any] = {}
    # the app of the warm pool's slots for this app's live clones (``runtime/warm_pool.py``): workspaces prepared
    # ahead whose long-lived programs (a browser) a clone takes over instead of starting its own
    warm: AppSpec | None = None
    # the app's programs opt into KSM (``PR_SET_MEMORY_MERGE``): the run tunes ksmd while such a workspace lives and
    # gives the host's settings back after (``runtime/ksm.py``)
    merge_memory: bool = False
    # the declared workspace image its workspaces stand on (``envs/images/recipes.py``; None: the host-derived
    # default); a runtime given an image of its own puts every workspace on that one instead
    image: str | None = None
    # the host:port pairs its workspaces may reach, through the egress proxy at http://127.0.0.1:3128 inside each
    # (``runtime/egress.py``: a WebArena deployment's sites); empty: no network at all, the default
    egress: list[str] = []


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace's limits: memory and processes (its cgroup), and the default deadline of a tool call
    (``command_timeout_s``; a call may ask for another with ``execute(call, timeout_s=...)``)."""

    memory_bytes: int | None = 4 << 30
    pids: int | None = 512
    command_timeout_s: float = 60.0
    deadline_grace_s: float = 10.0  # a call's deadline is its timeout plus max(this, a quarter of the timeout)
