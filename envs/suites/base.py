"""The contract every embedded task suite implements, and what the engine, ``bunshin suite check`` and
``bunshin bench sharing`` rely on.

Owns: ``SuiteTask`` (one task: the benchmark's own file decoded, plus its reference action sequence), ``Refusal`` (a
task file set aside, and why) and ``Suite`` (its name, tool schema and knobs; its tasks and the files it refused,
which application a task's workspace runs, the task's setup, parsing the benchmark's action language into tool
calls, recognising the final action, and scoring). The suites' errors are ``errors.py``'s, re-exported here.
Must never: score a task it cannot evaluate; a malformed action is the agent's mistake, reported in an
observation (``ActionError`` from ``parse_action``, ``ToolError`` inside the workspace), never a crash.

A rollout on a suite is::

    ws = await runtime.create(suite.app(task))          # one per group; samples fork it
    first = await suite.start(ws, task)                  # setup steps, then the first observation
    while not suite.is_final(call := policy(...)):       # tool calls in the suite's action language
        observation = await ws.execute(call)             # (a reference step: suite.concrete(ws, step) first)
    score = await suite.evaluate(ws, task, call)         # the final call carries the answer (or FAIL)
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import msgspec

from ..records import AppSpec, Observation, ToolCall
from ..workspace import Workspace
from .errors import ActionError, SuiteError, SuiteStepFailed
from .tools import ToolSchema

__all__ = ["ActionError", "Refusal", "Suite", "SuiteError", "SuiteStepFailed", "SuiteTask", "checked",
           "observation_text", "play"]


class SuiteTask(msgspec.Struct, frozen=True, kw_only=True):
    suite: str
    id: str
    template: str  # which template the task was made from (tests cover every template)
    instruction: str
    path: str  # the task file, in the benchmark's own format
    reference: list[ToolCall]  # the reference solution, ending with the final action
    give_up: bool = False  # the correct answer is to give up (OSWorld's infeasible tasks)


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    """A task file that was not run: the file, and why (what is missing or wrong, or who refused it)."""

    file: str
    reason: str


class Suite(abc.ABC):
    """A suite declares its ``name``, its ``tool_schema`` and its ``knobs`` besides the methods below."""

    name: str
    # The suite's agent tools (names, arguments, types, defaults): what ``normalize`` checks a call against and what
    # a policy offers a model (``policies/prompts.py``, through ``registry.tool_schema``). None: no schema.
    tool_schema: ClassVar[ToolSchema | None] = None
    # The constructor's keyword arguments that shape the suite's workspaces (sizes, seeds, modelled latency), as a
    # JSON-able dict: part of the prefix cache's and the selector's namespaces and of the benchmarks' JSON. A suite
    # with knobs assigns its own dict in ``__init__``; this shared default (none) is never mutated.
    knobs: dict[str, Any] = {}
    # Whether a workspace of this suite forks live (the engine forks a group's base for each sample). False: its
    # application cannot be carried by a fork (a real desktop), so every sample and every check attempt gets a
    # workspace of its own, made from ``app(task)`` and set up by ``start``.
    forks_live: ClassVar[bool] = True
    # The least time a task's setup may need (the engine's set-up deadline is at least this): a real desktop starts
    # applications, slower on a loaded machine. None: the engine's own deadline.
    setup_timeout_s: ClassVar[float | None] = None
    # Whether a run's groups must not overlap: the suite's state lives outside the workspaces (a deployment's sites),
    # and ``before_group`` brings it back to the start. The engine then runs one group at a time.
    exclusive_groups: bool = False

    @abc.abstractmethod
    def tasks(self) -> list[SuiteTask]:
        """Every task of the suite, loaded from its task files through the benchmark's loader."""

    def refused(self) -> list[Refusal]:
        """The task files the last ``tasks()`` set aside instead of raising (a suite loading a directory a user
        brought, leniently: ``envs/suites/task_dir.py``). Default: none (a refused file raises)."""
        return []

    @abc.abstractmethod
    def app(self, task: SuiteTask | None = None) -> AppSpec:
        """The application a workspace for ``task`` runs (its heavy, shared state is built here)."""

    @abc.abstractmethod
    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        """Run the task's setup in ``ws`` and return the first observation."""

    @abc.abstractmethod
    def parse_action(self, text: str) -> ToolCall:
        """The benchmark's action text (``click [12]``, ``DONE``) as a tool call; ``ActionError`` if malformed."""

    def normalize(self, call: ToolCall) -> ToolCall:
        """``call`` in the suite's normal form: one spelling per call (defaults filled in, values of their declared
        types), so ``canonical(normalize(call))`` is the key the engine records and matches on; ``ActionError`` for
        a call the suite's tools refuse. Default: the call unchanged (a suite without a tool schema)."""
        return call

    @abc.abstractmethod
    def is_final(self, call: ToolCall) -> bool:
        """Whether ``call`` ends the episode (``stop [...]``; ``DONE``/``FAIL``)."""

    @abc.abstractmethod
    def null_action(self) -> ToolCall:
        """Giving up at once with an empty answer (what ``suite check``'s null attempt does)."""

    def done_action(self) -> ToolCall | None:
        """Declaring the task done at once (``suite check`` plays it on a task without a reference solution, so that
        the task's evaluation runs, not only its set-up: the null attempt's giving up may short-cut it). Default:
        None (the check then runs the null attempt only)."""
        return None

    def nondeterministic(self, call: ToolCall) -> bool:
        """Whether ``call``'s effect may differ between two executions from one state (the prefix tree then never
        caches it or anything after it). Default: none is declared; a call whose replay answers differently is
        caught by the engine anyway."""
        return False

    def read_only(self, call: ToolCall) -> bool:
        """Whether ``call`` is declared read-only: it changes no state of the application a system without forks
        could not put back (a page view, a query), so such a system could run it ahead of the agent, as PASTE and
        Speculative Actions do. Only ``--spec-readonly`` asks; speculation on forks needs no such declaration.
        Default: none."""
        return False

    async def concrete(self, ws: Workspace, call: ToolCall) -> ToolCall:
        """A reference step as the workspace takes it. A reference may name a page element by role and name
        (ids belong to a page state, a task file cannot know them); the suite resolves it against the workspace's
        current page. Default: the call unchanged."""
        return call

    @abc.abstractmethod
    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        """Score the episode that ended with ``final``, reading the workspace's state (0.0 .. 1.0)."""

    async def before_group(self, task: SuiteTask) -> None:
        """Before a group's set-up (alone, when ``exclusive_groups``): bring the state the suite keeps outside its
        workspaces to the task's start (a deployment's reset). A failure fails that group's rollouts at set-up.
        Default: nothing."""
        return None

    def report(self, ran: list[str]) -> dict[str, Any]:
        """What the suite adds to a run's summary, given the ids of the tasks the run rolled out (its counts; under
        ``notes``, sentences ``bunshin eval`` prints: what the run could not guarantee). Default: nothing."""
        return {}

    async def judge_all(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> dict[str, float]:
        """The episode's score by every judge the suite has, by name (``bunshin suite check`` fails a task whose
        judges disagree). Default: one judge, ``evaluate``."""
        return {self.name: await self.evaluate(ws, task, final)}


def observation_text(obs: Observation) -> str:
    """What a text policy reads from an observation: the error if there is one, else the output."""
    return f"ERROR: {obs.error}\n{obs.output}" if obs.error else obs.output


async def checked(ws: Workspace, tool: str, args: dict[str, Any]) -> Observation:
    """Run one of a suite's own (hidden) tools; its failure is a ``SuiteStepFailed``, not an observation."""
    obs = await ws.execute(ToolCall(name=tool, args=args))
    if obs.error:
        raise SuiteStepFailed(f"{tool} {msgspec.json.encode(args).decode()}: {obs.error}")
    return obs


async def play(suite: Suite, ws: Workspace, task: SuiteTask, calls: list[ToolCall]) -> AsyncIterator[
        tuple[ToolCall, Observation]]:
    """Run ``calls`` (reference steps, up to the final one, which is not executed) in ``ws``; yields each concrete
    call and its observation. A step the agent got wrong is an observation with ``error``; playing goes on."""
    for call in calls:
        if suite.is_final(call):
            return
        concrete = await suite.concrete(ws, call)
        yield concrete, await ws.execute(concrete)
