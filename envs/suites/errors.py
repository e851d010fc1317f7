"""The errors of the task suites, one tree under ``SuiteError`` (an ``EnvsError``).

Owns: ``SuiteError`` and its kinds: ``ActionError`` (the agent's malformed action), ``SuiteStepFailed`` (a step the
suite itself takes failed), ``TaskFileError`` (a task file the suite cannot use, naming it) and ``UnknownSuite``
(a name the registry does not have). A suite's own finer kinds subclass these next to its code (the desktop's
``SetupError`` is a ``SuiteStepFailed``).
Must never: import a suite (every suite module imports this one).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import EnvsError


class SuiteError(EnvsError):
    """The root of a suite's errors: the task files, the agent's actions, the suite's own steps."""


class ActionError(SuiteError, ValueError):
    """An action in the suite's language that cannot be parsed: names the action and what is wrong."""


class SuiteStepFailed(SuiteError):
    """A step the suite itself takes (setup, resolving a reference, reading state for scoring) failed: a broken
    task or workspace, not the agent's mistake."""


class TaskFileError(SuiteError, ValueError):
    """A task file we cannot use. ``path`` is the file; the message names the field or feature."""

    def __init__(self, path: str | Path, message: str):
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.detail = message


class UnknownSuite(SuiteError, ValueError):
    """The registry has no suite of that name; the message lists the known ones."""
