"""Errors of ``bunshin.engine``. One root, ``EngineError``; the timeouts the engine enforces are typed by phase.

A rollout's failure never escapes as an exception: it ends that rollout with a ``Status`` (``outcomes.classify``).
These types are what the engine raises internally and what ``classify`` reads; a caller sees ``EngineError`` only
for misuse of the API (an engine used before ``async with``, bad arguments); a command's refusal of its
arguments is a ``CommandError``, which only the command line's entry point turns into an exit status.
Must never: stand for another package's failure (a workspace's is ``bunshin.envs.WorkspaceError``, a policy's
``bunshin.policies.PolicyError``).
"""

from __future__ import annotations


class EngineError(Exception):
    """The root of every error ``bunshin.engine`` raises on purpose."""


class PhaseTimeout(EngineError, TimeoutError):
    """A phase of a rollout took longer than the engine allows; ``phase`` names it and ``limit_s`` the bound."""

    phase = "phase"

    def __init__(self, limit_s: float, what: str = ""):
        super().__init__(f"{what or self.phase} took over {limit_s:g}s")
        self.limit_s = limit_s


class SetupTimeout(PhaseTimeout):
    """A group's base workspace was not forked and its task set up in time."""

    phase = "setup"


class DecideTimeout(PhaseTimeout):
    """The policy did not decide in time."""

    phase = "decide"


class RolloutTimeout(PhaseTimeout):
    """The whole rollout (fork, steps, evaluation) took longer than allowed."""

    phase = "rollout"


class UnknownTask(EngineError, KeyError):
    """A request names a task the suite does not have."""

    def __init__(self, task_id: str, suite: str):
        super().__init__(f"unknown task {task_id!r} for suite {suite}")
        self.task_id, self.suite = task_id, suite

    def __str__(self) -> str:
        return str(self.args[0])


class EngineNotStarted(EngineError, RuntimeError):
    """The engine was used outside ``async with RolloutEngine(...)``."""


class BadRequest(EngineError, ValueError):
    """What was asked cannot be run as given: a ``RolloutRequest`` whose ``samples`` are outside the group or
    repeated, or a benchmark's configuration (an unknown mode, template or policy, a policy without a knob that was
    set, too few epochs, steps or samples)."""


class NeedsLiveFork(BadRequest):
    """A mode that forks workspaces mid-trajectory (the prefix cache, speculation) asked of a suite whose workspaces
    do not fork live (a real desktop: ``Suite.forks_live``)."""

    def __init__(self, suite: str, mode: str):
        super().__init__(f"suite {suite}: {mode} forks workspaces mid-trajectory, and a {suite} workspace cannot be "
                         "forked live by this backend (its programs are multi-threaded); run it without, or on the "
                         "tree fork (--backend kmod, docs/kmod.md), which carries them")
        self.suite, self.mode = suite, mode


class CommandError(EngineError, ValueError):
    """A command cannot do what it was asked (a flag without the one it needs, an unknown task id, a policy that
    cannot be built, a tool the command drives that failed); the message names the culprit. Only
    ``engine/cli.py: main`` turns it into an exit: the message on stderr, status 1."""


class ArgumentRefused(CommandError):
    """A flag refused the way argparse refuses one: ``main`` prints ``command``'s usage and
    ``<command>: error: <reason>`` and exits with status 2 (``str()``: ``<command>: <reason>``)."""

    def __init__(self, command: str, reason: str):
        super().__init__(f"{command}: {reason}")
        self.command, self.reason = command, reason


def first_exception(group: BaseExceptionGroup, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``group``, nested groups (TaskGroups in TaskGroups) included."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = first_exception(exc, kind)
            if found is not None:
                return found
        elif isinstance(exc, kind):
            return exc
    return None
