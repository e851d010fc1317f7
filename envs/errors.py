"""Errors of the workspace layer. One base; subclasses say who broke it, and every error names the workspace.

Must never: hide the foreign exception it translates (``raise ... from exc`` keeps it as ``__cause__``).
"""

from __future__ import annotations


class WorkspaceError(Exception):
    def __init__(self, ws_id: str | None, message: str):
        super().__init__(f"workspace {ws_id}: {message}" if ws_id else message)
        self.ws_id = ws_id
        self.detail = message


class WorkspaceClosed(WorkspaceError):
    """We closed it: the caller used a workspace after ``close()``."""


class WorkspaceBroken(WorkspaceError):
    """The workspace broke under us: its host died, or it hit its memory or process limit. ``reason`` says which."""

    def __init__(self, ws_id: str | None, reason: str):
        super().__init__(ws_id, f"broken: {reason}")
        self.reason = reason


class WorkspaceStartFailed(WorkspaceError):
    """A new workspace could not be built (image, namespaces, application setup)."""


class ForkFailed(WorkspaceError):
    """A fork did not produce a clone. The source is unchanged and keeps running."""


class RequestRefused(WorkspaceError):
    """The host refused a request it understood the shape of (e.g. a tool on a snapshot). ``kind`` classifies it."""

    def __init__(self, ws_id: str | None, kind: str, message: str):
        super().__init__(ws_id, f"{kind}: {message}")
        self.kind = kind


class HostUnsupported(RuntimeError):
    """This machine lacks something a backend needs; the message names it (see ``bunshin doctor``)."""
