"""The policy contract: what decides a rollout's next action.

Owns: ``PolicyContext`` (what a policy sees: the task, the observations so far, its sample's seed) and
``Decision`` (the action, as the suite's action text or a tool call, plus the reasoning time and, for model
servers, token ids and log-probs), and ``Policy`` itself. The engine awaits ``decide`` under a timeout; a policy
that raises ends its rollout with ``policy_error``, one that is too slow with ``policy_timeout``. Before a run,
``refuses(task)`` says which tasks a policy cannot play at all, by name and why (the scripted policy, a task without
a reference solution); ``bunshin eval`` lists those and runs the rest; ``check()`` is a cheap preflight the engine
calls once at start (a model server that is not there, or not set up as the policy needs, fails the run then).
A model server's turn also carries what a trainer needs (``Decision``: prompt and response token ids, log-probs,
``finish_reason``, the policy version) and ``reply``, the assistant message as the server returned it: the episode
keeps those in ``PolicyContext.replies``, so a conversation is a pure function of the context (nothing per rollout
is kept inside a policy, and a fork or a prefix-cache hit does not change what it sees).
Errors: ``PolicyError`` ends the rollout (``policy_error``); ``ContextLengthExceeded`` ends it scored as it stands
(``context_length``); ``ServerConfigError`` (a server without the flags the policy needs) ends the whole run.
Must never: touch the workspace (a policy only reads observations; the engine executes).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import msgspec

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import SuiteTask


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: str | ToolCall  # the suite's action language ("click [12]", "DONE") or a tool call
    reasoning_s: float = 0.0  # how long the model thought (modelled or measured)
    token_ids: list[int] | None = None  # the response's tokens, when the policy has them
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None
    finish_reason: str | None = None  # the server's: "stop", "tool_calls", "length" (cut at max_tokens: its status)
    policy_version: int | None = None  # the weights' version that produced it, if the policy knows (else the
    # engine's, ``PolicyContext.policy_version``)
    reply: dict[str, Any] | None = None  # the assistant message as it goes back into the conversation (role,
    # content, tool_calls with their ids), kept by the episode in ``PolicyContext.replies``


@dataclass
class PolicyContext:
    suite: str
    task_id: str
    group_id: str
    sample: int
    seed: int
    instruction: str
    reference: list[ToolCall]  # the task's reference solution (scripted policies follow it; others ignore it)
    observations: list[str] = field(default_factory=list)  # what the agent saw so far, oldest first
    actions: list[str] = field(default_factory=list)  # what it did so far (action text or canonical call)
    step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0  # the trainer's policy version when this decision was asked for (the engine sets it)
    replies: list[dict[str, Any] | None] = field(default_factory=list)  # per action, the decision's ``reply``


class Policy(abc.ABC):
    name: str = "policy"

    @abc.abstractmethod
    async def decide(self, ctx: PolicyContext) -> Decision:
        """The next action for the rollout ``ctx`` describes."""

    def refuses(self, task: SuiteTask) -> str | None:
        """Why this policy cannot play ``task`` at all (``"<policy> policy: ..."``), or None. A pure check of the
        task, made before any workspace exists. Default: None, every task."""
        return None

    async def check(self) -> None:  # noqa: B027 (a hook with a default, not abstract: most policies need no check)
        """A cheap preflight the engine awaits once when it starts (a model server's ``GET /models``); raises
        ``ServerConfigError`` when the run cannot work at all. Default: nothing to check."""

    async def close(self) -> None:  # noqa: B027 (a hook with a default: most policies hold nothing to release)
        """Release connections and the like."""


class PolicyError(RuntimeError):
    """The root of ``bunshin.policies``' errors: a policy could not decide (a model server's error, a recording
    without this step). It ends that rollout with ``policy_error``."""


class ContextLengthExceeded(PolicyError):
    """The model server refused the prompt: the conversation no longer fits the model's context. The rollout ends
    scored as it stands, with ``context_length``."""


class ServerConfigError(PolicyError):
    """The model server is not set up as the policy needs (a missing tool parser, say); every rollout would fail
    the same way, so the engine ends the run with this error instead of failing each rollout. The message names the
    server flags to add."""
