"""One sample's rollout, the async shell around ``Episode``: fork its workspace from the group's base, then observe
-> ``await policy.decide`` -> run the call -> ... -> score.

Owns: the phases' I/O and their deadlines (a decision within ``decide_timeout_s``, a tool call within
``call_timeout_s``, enforced by the runtime; the whole rollout within ``rollout_timeout_s``), turning whatever
interrupts the rollout into its ``Status`` (``outcomes.classify``, with the phase it happened in), the timings, and
closing the sample's workspace on every path.
A ``ServerConfigError`` from the policy (a model server without the flags it needs) is not this rollout's failure
but the run's: it is re-raised, and the engine's TaskGroups cancel the other rollouts and end the run with it.
Must never: let a rollout's failure escape (it is the rollout's status), swallow cancellation, or leave its
workspace open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.runtime import await_points
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.workspace import Workspace
from bunshin.policies.base import ContextLengthExceeded, Decision, Policy, ServerConfigError

from .admission import AdmissionGate
from .episode import Episode, Stop
from .errors import DecideTimeout, RolloutTimeout
from .outcomes import Phase, classify, describe
from .prefix.walk import Walk
from .records import Status, Trajectory
from .set_up_pool import SetUpPool
from .speculation.branch import Branch, SampleSpeculation
from .speculation.features import Situation, label_of


@dataclass(frozen=True)
class SampleSettings:
    decide_timeout_s: float
    call_timeout_s: float
    rollout_timeout_s: float
    max_steps: int


class SampleRun:
    """Runs one sample; ``run`` fills ``trajectory`` and returns, whatever happened."""

    def __init__(self, suite: Suite, policy: Policy, gate: AdmissionGate, settings: SampleSettings,
                 execute_call: Callable[[Workspace, ToolCall, float], Awaitable[Observation]], task: SuiteTask,
                 base: Workspace | SetUpPool | None, first: Observation, trajectory: Trajectory,
                 walk: Callable[[], Walk] | None = None, speculation: SampleSpeculation | None = None,
                 policy_version: Callable[[], int] = lambda: 0):
        """Either ``base`` (the sample forks it and executes every call) or ``walk`` (the prefix cache: the
        sample walks the tree from the task's root and gets a workspace only at its first miss). ``speculation``:
        while the policy decides, predicted calls run in forks of the sample's workspace (``engine/speculation``);
        an exact match is adopted, anything else is executed as without it."""
        self.suite, self.policy, self.gate, self.settings = suite, policy, gate, settings
        self.execute_call = execute_call
        self.task, self.base, self.first, self.trajectory = task, base, first, trajectory
        self.make_walk = walk
        self.speculation = speculation
        self.policy_version = policy_version  # the trainer's version now: stamped on each decision's context
        self.walk: Walk | None = None
        self.phase = Phase.ENGINE
        self.ws: Workspace | None = None

    async def run(self, forked: Callable[[], None]) -> None:
        """``forked()`` is called once this sample no longer needs the base (forked, or failed before)."""
        t = self.trajectory
        started = time.monotonic()
        told = False
        try:
            async with self.gate.slot() as ticket:
                t.timings["admission_wait_s"] = round(ticket.waited_s, 4)
                try:
                    async with asyncio.timeout(self.settings.rollout_timeout_s) as scope:
                        if self.make_walk is not None:
                            forked()
                            told = True
                            self.walk = self.make_walk()
                            await self._episode(None)
                            return
                        try:
                            self.phase = Phase.FORK
                            assert self.base is not None, "a sample has a base to fork or a walk"  # (__init__)
                            fork_started = time.monotonic()
                            await await_points.reached("sample.fork")
                            self.ws = await self.base.fork(seed=t.seed)
                        finally:
                            forked()
                            told = True
                        t.timings["fork_s"] = round(time.monotonic() - fork_started, 4)
                        t.lineage = [self.base.id, self.ws.id]
                        if isinstance(self.base, SetUpPool):  # a workspace of its own: its own first screen
                            self.first = self.base.first_of(self.ws) or self.first
                        before = self.ws.charge()
                        await self._episode(self.ws)
                        ticket.grew = self.ws.charge() - before  # (after adoptions: the last branch's)
                except TimeoutError as exc:
                    if not scope.expired():
                        raise
                    raise RolloutTimeout(self.settings.rollout_timeout_s, "the rollout") from exc
        except ServerConfigError:
            raise  # the run's failure, not this rollout's: every rollout would fail the same way
        except Exception as exc:  # one rollout's failure is that rollout's, named by the phase it happened in
            t.status, t.error = classify(self.phase, exc), describe(exc)
        finally:
            if not told:
                forked()
            if self.speculation is not None:
                finished = t.status in (Status.OK, Status.MAX_STEPS, Status.TRUNCATED, Status.CONTEXT_LENGTH)
                self.speculation.finished(len(t.steps) if finished else None)
                await self.speculation.close()
            if self.ws is not None:
                await self.ws.close()
            if self.walk is not None:
                t.timings["fork_s"] = round(self.walk.fork_s, 4)
                t.lineage = list(self.walk.lineage)
                try:
                    await self.walk.close()
                except Exception as exc:  # a workspace that would not close is this rollout's failure
                    if t.status is Status.OK:
                        t.status, t.error = classify(Phase.ENGINE, exc), describe(exc)
            t.timings["wall_s"] = round(time.monotonic() - started, 4)
            t.timings["reasoning_s"] = round(sum(s.reasoning_s for s in t.steps), 4)
            t.timings["tool_s"] = round(sum(s.tool_s for s in t.steps), 4)

    async def _episode(self, ws: Workspace | None) -> None:
        """The episode in ``ws``, or through ``self.walk`` when ``ws`` is None."""
        t = self.trajectory
        episode = Episode(self.suite, self.task, t, self.first, self.settings.max_steps)
        spec = self.speculation
        while True:
            if spec is not None:
                self._speculate(spec, episode, walking=ws is None)
            try:
                decision = await self._decide(episode)
            except ContextLengthExceeded as exc:  # no further turn fits: the episode is scored as it stands
                stop = episode.cut_short(classify(Phase.DECIDE, exc), describe(exc))
                break
            self.phase = Phase.PARSE
            move = episode.next_move(decision)
            if isinstance(move, Stop):
                if spec is not None and move.status is Status.OK:
                    await spec.resolve(move.final, adopt=False)
                stop = move
                break
            if ws is None:
                self.phase = Phase.CALL
                await await_points.reached("sample.call")
                walk = self.walk
                assert walk is not None
                if spec is not None:
                    branch = await spec.resolve(move.call, adopt=not walk.serves(move.call))
                    if branch is not None:
                        fork, concrete, observation = _adopted(branch)
                        walk.adopt(move.call, concrete, observation, fork)
                        episode.record(decision, move, concrete, observation,
                                       spec.waited_s(branch), source="speculated", saved_s=spec.hidden_s(branch))
                        continue
                taken = await walk.step(move.call)
                episode.record(decision, move, taken.call, taken.observation, taken.tool_s, source=taken.source,
                               saved_s=taken.saved_s)
                continue
            if spec is not None:
                self.phase = Phase.CALL
                branch = await spec.resolve(move.call)
                if branch is not None:  # the fork that ran this very call becomes the sample's workspace
                    spec.close_later(ws)
                    fork, concrete, observation = _adopted(branch)
                    ws = self.ws = fork
                    t.lineage.append(ws.id)
                    episode.record(decision, move, concrete, observation,
                                   spec.waited_s(branch), source="speculated", saved_s=spec.hidden_s(branch))
                    continue
            self.phase = Phase.RESOLVE
            call = await self.suite.concrete(ws, move.call)
            self.phase = Phase.CALL
            call_started = time.monotonic()
            await await_points.reached("sample.call")
            obs = await self.execute_call(ws, call, self.settings.call_timeout_s)
            episode.record(decision, move, call, obs, obs.tool_seconds or time.monotonic() - call_started)
        if stop.status is not Status.OK:
            t.status, t.error = stop.status, stop.error
        self.phase = Phase.EVALUATE
        evaluate_started = time.monotonic()
        await await_points.reached("sample.evaluate")
        if ws is None:
            assert self.walk is not None
            t.reward = await self.walk.evaluate(stop.final)
        else:
            t.reward = float(await self.suite.evaluate(ws, self.task, stop.final))
        t.timings["evaluate_s"] = round(time.monotonic() - evaluate_started, 4)
        self.phase = Phase.ENGINE

    def _speculate(self, spec: SampleSpeculation, episode: Episode, walking: bool) -> None:
        """The policy is about to reason: let speculation predict and run the next call meanwhile."""
        t = self.trajectory
        situation = Situation(suite=self.suite.name, template=self.task.template, instruction=self.task.instruction,
                              step=episode.step, calls=tuple(label_of(s.call) for s in t.steps),
                              observation=episode.context.observations[-1])
        if walking:
            walk = self.walk
            assert walk is not None
            spec.begin(situation, walk.workspace, walk.serves)
            return

        async def own() -> Workspace:
            assert self.ws is not None
            return self.ws

        spec.begin(situation, own, lambda call: False)

    async def _decide(self, episode: Episode) -> Decision:
        self.phase = Phase.DECIDE
        await await_points.reached("sample.decide")
        limit = self.settings.decide_timeout_s
        episode.context.policy_version = self.policy_version()
        try:
            async with asyncio.timeout(limit) as scope:
                return await self.policy.decide(episode.context)
        except TimeoutError as exc:
            if not scope.expired():
                raise  # the policy's own timeout: its error, not ours to rename
            raise DecideTimeout(limit, "the policy's decision") from exc


def _adopted(branch: Branch) -> tuple[Workspace, ToolCall, Observation]:
    """What a branch ``SampleSpeculation.resolve`` adopted holds: its workspace, the concrete call it ran and that
    call's observation."""
    assert branch.ws is not None and branch.concrete is not None and branch.observation is not None, branch
    return branch.ws, branch.concrete, branch.observation
