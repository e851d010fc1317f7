"""How a rollout's failure is named: ``classify(phase, exception) -> Status``, the one place that decides it.

Owns: ``Phase`` (what the rollout was doing: setting up its group, forking its workspace, waiting for the policy,
parsing the action, resolving it against the page, running the tool call, scoring, or the engine's own
bookkeeping) and the mapping. The rule that matters most: only an exception of the kind a phase expects is blamed
on the policy, the agent or the workspace; anything else is ``ENGINE_ERROR`` (a bug of ours, a suite's included),
so that a fault of ours is never reported as the agent's or the workspace's.
A model server that is not set up for the policy (``ServerConfigError``) is no rollout's outcome either: the sample
re-raises it and the run ends with it (``sample.py``), so it never reaches ``classify``.
Must never: classify ``CancelledError`` (cancellation is not a rollout outcome: it propagates) or do I/O.
"""

from __future__ import annotations

import enum

from bunshin.envs.errors import CallDeadlineExceeded, EnvsError, WorkspaceError
from bunshin.envs.suites.base import ActionError, SuiteError, SuiteStepFailed
from bunshin.policies.base import ContextLengthExceeded

from .errors import DecideTimeout, RolloutTimeout, SetupTimeout, UnknownTask
from .records import Status


class Phase(enum.Enum):
    SETUP = "setup"  # the group's base: root workspace, its fork, the task's setup steps
    FORK = "fork"  # this sample's workspace, forked from the base
    DECIDE = "decide"  # awaiting the policy
    PARSE = "parse"  # the policy's action text to a tool call
    RESOLVE = "resolve"  # a reference step naming a page element, resolved against the page
    CALL = "call"  # the tool call in the workspace
    EVALUATE = "evaluate"  # scoring
    ENGINE = "engine"  # the engine's own bookkeeping around all of these


def classify(phase: Phase, exc: BaseException) -> Status:
    """The status a rollout ends with when ``exc`` interrupted it during ``phase``."""
    if not isinstance(exc, Exception):
        raise TypeError(f"{type(exc).__name__} is not a rollout outcome (cancellation and exits propagate)")
    if isinstance(exc, RolloutTimeout):
        return Status.ROLLOUT_TIMEOUT
    match phase:
        case Phase.SETUP:
            if isinstance(exc, SetupTimeout | UnknownTask | EnvsError):
                return Status.SETUP_FAILED
        case Phase.FORK:
            if isinstance(exc, WorkspaceError):
                return Status.WORKSPACE_FAILED
        case Phase.DECIDE:
            # The policy's code is the policy's: whatever it raises is its error (PolicyError or not); a prompt the
            # model server refused as longer than its context is its own status (the sample scores the episode as
            # it stands when it can, ``Episode.cut_short``; this is the status either way).
            if isinstance(exc, ContextLengthExceeded):
                return Status.CONTEXT_LENGTH
            return Status.POLICY_TIMEOUT if isinstance(exc, DecideTimeout) else Status.POLICY_ERROR
        case Phase.PARSE:
            if isinstance(exc, ActionError):
                return Status.MALFORMED_ACTION
        case Phase.RESOLVE:
            if isinstance(exc, WorkspaceError):
                return Status.WORKSPACE_FAILED
            if isinstance(exc, ActionError | SuiteStepFailed):  # names no element on the page of the moment
                return Status.MALFORMED_ACTION
        case Phase.CALL:
            if isinstance(exc, CallDeadlineExceeded):
                return Status.CALL_TIMEOUT
            if isinstance(exc, WorkspaceError):
                return Status.WORKSPACE_FAILED
        case Phase.EVALUATE:
            if isinstance(exc, WorkspaceError):
                return Status.WORKSPACE_FAILED
            if isinstance(exc, SuiteError | EnvsError):
                return Status.EVALUATOR_ERROR
    return Status.ENGINE_ERROR


def describe(exc: BaseException) -> str:
    """The error text a trajectory records: the exception's type and message (its cause's too, when it has one)."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in text:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text
