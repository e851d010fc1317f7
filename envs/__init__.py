"""Workspaces and what runs in them: the Workspace contract, fork backends, task suites (later) and loaders."""

from .errors import (
    ForkFailed,
    HostUnsupported,
    RequestRefused,
    WorkspaceBroken,
    WorkspaceClosed,
    WorkspaceError,
    WorkspaceStartFailed,
)
from .records import AppSpec, Limits, MemoryStats, Observation, ToolCall
from .runtime import WorkspaceRuntime, derive_seed
from .workspace import ForkTiming, Snapshot, Workspace

__all__ = [
    "AppSpec", "ForkFailed", "ForkTiming", "HostUnsupported", "Limits", "MemoryStats", "Observation",
    "RequestRefused", "Snapshot", "ToolCall", "Workspace", "WorkspaceBroken", "WorkspaceClosed", "WorkspaceError",
    "WorkspaceRuntime", "WorkspaceStartFailed", "derive_seed",
]
