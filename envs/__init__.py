"""Workspaces and what runs in them.

The public face: ``WorkspaceRuntime`` (a run's workspaces), ``Workspace``/``Snapshot`` (the contract of docs/design.md
section 3), the records (``ToolCall`` and its ``canonical`` key, ``Observation``, ``AppSpec``, ``Limits``,
``MemoryStats``), the errors (root ``EnvsError``), ``derive_seed``, and the application contract in
``bunshin.envs.app``. Inside: ``runtime/`` (hosts, workers, nursery, namespaces, layers, cgroups, and the live fork
in ``runtime/fork/``), ``suites/`` (the suite contract, WebArena and OSWorld formats), ``webshop/`` (with its text
browser) and ``desktop/``.
"""

from .errors import (
    CallDeadlineExceeded,
    EnvsError,
    ForkFailed,
    HostUnsupported,
    RequestRefused,
    StartTimeout,
    WorkspaceBroken,
    WorkspaceClosed,
    WorkspaceError,
    WorkspaceStartFailed,
)
from .records import AppSpec, Limits, MemoryStats, Observation, ToolCall, canonical
from .runtime.runtime import WorkspaceRuntime
from .seeds import derive_seed
from .workspace import ForkTiming, Snapshot, Workspace

__all__ = [
    "AppSpec", "CallDeadlineExceeded", "EnvsError", "ForkFailed", "ForkTiming", "HostUnsupported", "Limits",
    "MemoryStats", "Observation", "RequestRefused", "Snapshot", "StartTimeout", "ToolCall", "Workspace",
    "WorkspaceBroken", "WorkspaceClosed", "WorkspaceError", "WorkspaceRuntime", "WorkspaceStartFailed",
    "canonical", "derive_seed",
]
