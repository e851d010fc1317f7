"""Errors of ``bunshin.envs``. One root, ``EnvsError``; subclasses say who broke it, and a workspace's errors name
the workspace.

- ``WorkspaceError`` and its family: a workspace we closed (``WorkspaceClosed``), one that broke under us
  (``WorkspaceBroken``, with ``reason``; ``CallDeadlineExceeded`` when a tool call overran the deadline the runtime
  enforces), one that could not be built (``WorkspaceStartFailed``; ``StartTimeout`` when its host was not ready
  in time), a fork that made no clone (``ForkFailed``), a request the host refused (``RequestRefused``), an
  image of a workspace that could not be made (``ImageFailed``) or restored from (``ImageCorrupt``).
- ``HostUnsupported``: this machine lacks what a backend needs (``bunshin doctor`` says what).
- Suites, tools and the text browser define their subclasses next to their code (``SuiteError``, ``ToolError``,
  ``BrowserError``...), all below ``EnvsError``.

Must never: hide the foreign exception it translates (``raise ... from exc`` keeps it as ``__cause__``).
"""

from __future__ import annotations


class EnvsError(Exception):
    """The root of every error ``bunshin.envs`` raises on purpose."""


class WorkspaceError(EnvsError):
    def __init__(self, ws_id: str | None, message: str):
        super().__init__(f"workspace {ws_id}: {message}" if ws_id else message)
        self.ws_id = ws_id
        self.detail = message


class WorkspaceClosed(WorkspaceError):
    """We closed it: the caller used a workspace after ``close()``."""


class WorkspaceBroken(WorkspaceError):
    """The workspace broke under us: its host died, hit its memory or process limit, answered out of step, or
    overran a call's deadline. ``reason`` says which; the workspace serves nothing more."""

    def __init__(self, ws_id: str | None, reason: str):
        super().__init__(ws_id, f"broken: {reason}")
        self.reason = reason


class CallDeadlineExceeded(WorkspaceBroken, TimeoutError):
    """A tool call did not come back within its deadline (its ``timeout_s`` plus the runtime's grace): the host was
    stopped, and the workspace is broken with that reason."""

    def __init__(self, ws_id: str | None, reason: str, *, tool: str, deadline_s: float):
        super().__init__(ws_id, reason)
        self.tool = tool
        self.deadline_s = deadline_s


class WorkspaceStartFailed(WorkspaceError):
    """A new workspace could not be built (image, namespaces, application setup)."""


class StartTimeout(WorkspaceStartFailed, TimeoutError):
    """A new host (a create, a clone, a restore) did not report ready within the runtime's start timeout."""


class ForkFailed(WorkspaceError):
    """A fork did not produce a clone. The source is unchanged and keeps running."""


class ImageFailed(WorkspaceError):
    """A durable image of a workspace (``Workspace.image``) could not be made; nothing of it is left. The workspace
    keeps running unless it broke (then ``WorkspaceBroken`` is raised instead)."""


class ImageCorrupt(WorkspaceStartFailed):
    """A workspace could not be restored from an image (``WorkspaceRuntime.restore_image``) because the image failed
    verification: a part's magic, version, length or CRC-32, or its number of worker images."""


class RequestRefused(WorkspaceError):
    """The host refused a request it understood the shape of (e.g. a tool on a snapshot). ``kind`` classifies it."""

    def __init__(self, ws_id: str | None, kind: str, message: str):
        super().__init__(ws_id, f"{kind}: {message}")
        self.kind = kind


class HostUnsupported(EnvsError, RuntimeError):
    """This machine lacks something a backend needs; the message names it (see ``bunshin doctor``)."""
