"""One sample's speculation: branches that run predicted calls while the model reasons, adopted or thrown away.

Owns: ``SampleSpeculation``. ``begin`` (the sample starts reasoning) asks the selector for the next call; when the
best prediction clears the threshold (and, in read-only mode, the suite declares the call read-only; and the prefix
tree would not serve it anyway), it waits for a slot (tail priority), forks the sample's workspace (a ``Branch``)
and runs the call there; when that finishes before the real call comes and the next prediction also pays (the two
probabilities' product clears the threshold), it forks the branch and runs that one too (depth 2). ``resolve``
(the real call has come): an exact canonical match adopts the branch, awaited if still running (its workspace and
observation become the sample's, the caller takes the workspace); anything else cancels and discards every branch,
and the caller runs the call in its own workspace, which speculation never touched. A branch whose own call failed
(an error of the runtime, a deadline) is never adopted: the real call runs, and fails or not as it would have.
It reaches the selector, the slots, tail priority and the figures through the ``SpeculationShared`` record it is
given (``shared.py``), never through the ``Speculator``. Its tasks have owning scopes: the predictions, the jobs (this
step's speculation, and a carried branch's run) and the background (a walk's catch-up, closing thrown-away branches'
workspaces), each a ``TaskScope`` that ``close`` ends.
Must never: let a branch's state reach the sample except by an exact match, touch the sample's workspace but to
fork it, or leave a branch's workspace open or a task running (``close`` on every path, cancellation included).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.runtime import await_points
from bunshin.envs.runtime.task_scope import TaskScope
from bunshin.envs.suites.base import Suite, observation_text
from bunshin.envs.workspace import Workspace

from .features import Situation, label_of
from .selector import Prediction
from .shared import SpeculationShared
from .slots import Grant

log = logging.getLogger(__name__)

Execute = Callable[[Workspace, ToolCall, float], Awaitable[Observation]]
SampleWorkspace = Callable[[], Coroutine[Any, Any, Workspace]]


def _no_prediction(exc: BaseException) -> None:
    log.warning("spec tool selector: no prediction: %s", exc)


def _background_failed(exc: BaseException) -> None:  # the sample's own step meets a catch-up's failure again
    log.debug("speculation: background task failed: %r", exc)


@dataclass(eq=False)
class Branch:
    """A fork of the sample's workspace (or of another branch) that ran, or runs, one predicted call."""

    call: ToolCall
    label: str
    p: float  # the probability that the real calls up to and including this one are the predicted ones
    own_p: float  # the selector's probability for this call given the ones before it
    grant: Grant | None = None
    ws: Workspace | None = None
    concrete: ToolCall | None = None
    observation: Observation | None = None
    started: float | None = None  # when its call started
    finished: float | None = None
    failed: bool = False  # its call or its fork failed, or it was preempted: never adopted
    discarded: bool = False
    adopted: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)
    job: asyncio.Task[Any] | None = None  # the job that runs it: cancelled when the branch is preempted
    child: Branch | None = None  # depth 2: the predicted call after this one, in a fork of this branch

    def seconds(self, now: float) -> float:
        """Tool-seconds its call has taken so far."""
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


class SampleSpeculation:
    def __init__(self, shared: SpeculationShared, suite: Suite, *, sample: object, task_id: str, template: str,
                 seed: int, execute: Execute, call_timeout_s: float):
        self.shared, self.suite = shared, suite
        self.settings = shared.settings
        self.sample, self.task_id, self.template = sample, task_id, template
        self.seed, self.execute, self.call_timeout_s = seed, execute, call_timeout_s
        self.situation: Situation | None = None
        self.predictions: list[Prediction] | None = None
        self.predicting: asyncio.Task[list[Prediction]] | None = None  # this decision's prediction
        # predictions not yet come, this decision's or earlier ones (scored when they come)
        self._predictions = TaskScope(f"spec-predictions {task_id}", on_error=_no_prediction)
        self.current: Branch | None = None  # the branch for the call being decided
        self.pending: Branch | None = None  # a depth-2 branch carried over from the last adoption
        self._jobs = TaskScope(f"spec-jobs {task_id}")  # this step's speculation, and a carried branch's run
        self.prep: asyncio.Task[Workspace] | None = None  # the sample's workspace for a fork (a walk's catch-up)
        # the prep, and closing the workspaces of thrown-away branches (``close`` waits for them)
        self._background = TaskScope(f"spec-background {task_id}", on_error=_background_failed)
        self.decided_at = 0.0
        self.step_started: float | None = None
        self.step_s: list[float] = []

    # -- the sample starts reasoning ----------------------------------------------------------------------------
    def begin(self, situation: Situation, workspace: SampleWorkspace, serves: Callable[[ToolCall], bool]) -> None:
        """Predict the call ``situation`` leads to and, if it pays, run it in a branch while the model reasons.
        ``workspace()``: the sample's workspace in the state of ``situation`` (for a fork); ``serves(call)``:
        whether the prefix tree would serve ``call`` without executing it (then there is nothing to hide)."""
        now = time.monotonic()
        if self.step_started is not None:
            self.step_s.append(now - self.step_started)
            self.shared.tail.step_took(now - self.step_started)
        self.step_started = now
        self.situation, self.predictions = situation, None
        self.predicting = self._predictions.start_soon(self.shared.selector.predict(situation))
        carried, self.pending = self.pending, None
        if carried is not None:  # this step's branch from now: a call that comes before the prediction resolves it
            carried.p = carried.own_p  # the call before it has matched
            self.current = carried
        self._jobs.start_soon(self._speculate(situation, workspace, serves, carried))

    async def _speculate(self, situation: Situation, workspace: SampleWorkspace,
                         serves: Callable[[ToolCall], bool], carried: Branch | None) -> None:
        stats = self.shared.counts
        assert self.predicting is not None
        try:  # shielded: cancelling this job (the real call came) leaves the prediction to be scored
            self.predictions = await asyncio.shield(self.predicting)
        except asyncio.CancelledError:
            raise
        except Exception:  # a selector that cannot predict costs this step its speculation, nothing more
            self.predictions = []
        if carried is not None:  # a branch for this call is already running or done
            await self._extend(carried, situation.step + 1, situation.calls)
            return
        best = self._worth(self.predictions, 1.0, serves)
        if best is None:
            return
        branch = Branch(call=best.call, label=best.label, p=best.p, own_p=best.p, job=asyncio.current_task())
        self.current = branch
        priority = self.shared.tail.priority(self.sample, self.task_id, self.template, situation.step,
                                                 sum(self.step_s) / len(self.step_s) if self.step_s else None)
        branch.grant = await self.shared.slots.acquire(priority, lambda: self._preempted(branch))
        if self.prep is None:  # shielded: a catch-up of the walk is finished even if the branch is cancelled
            self.prep = self._background.start_soon(workspace())
        source = await asyncio.shield(self.prep)
        stats["speculated"] += 1
        await self._run(branch, source)
        await self._extend(branch, situation.step + 1, situation.calls)

    def _worth(self, predictions: list[Prediction], p_before: float, serves: Callable[[ToolCall], bool]
               ) -> Prediction | None:
        """The best prediction if it is worth a branch: clears the threshold (jointly with the branch it would
        follow), is not the final action, is read-only in read-only mode, and would not be served by the tree."""
        stats = self.shared.counts
        if not predictions:
            return None
        best = predictions[0]
        if best.p * p_before < self.settings.threshold:
            if p_before == 1.0:
                stats["skipped_threshold"] += 1
            return None
        if self.suite.is_final(best.call):
            return None
        if self.settings.read_only and not self.suite.read_only(best.call):
            stats["skipped_read_only"] += 1
            return None
        if serves(best.call):
            return None
        return best

    async def _run(self, branch: Branch, source: Workspace) -> None:
        """Fork ``source`` and run the branch's call in the fork; a failure marks the branch, never raises."""
        try:
            branch.ws = await source.fork(seed=self.seed)
            self.shared.branch_opened(branch.ws)
            branch.concrete = await self.suite.concrete(branch.ws, branch.call)
            branch.started = time.monotonic()
            await await_points.reached("speculation.branch.call")
            branch.observation = await self.execute(branch.ws, branch.concrete, self.call_timeout_s)
            branch.finished = time.monotonic()
        except Exception as exc:
            branch.failed = True
            log.debug("speculative branch for %s failed: %s", branch.label, exc)
        finally:
            if branch.finished is None and branch.started is not None and not branch.failed:
                branch.failed = True  # cancelled mid-call
            self._release(branch)  # a slot bounds branches at work; a finished one holds only memory (the budget)
            branch.done.set()

    async def _extend(self, branch: Branch, step: int, calls: tuple[str, ...]) -> None:
        """Depth 2: while the model still reasons, run the next predicted call in a fork of ``branch``."""
        if self.settings.depth < 2 or branch.failed or branch.child is not None:
            return
        await branch.done.wait()
        if branch.failed or branch.observation is None or branch.ws is None:
            return
        after = Situation(suite=self.situation.suite, template=self.situation.template,  # type: ignore[union-attr]
                          instruction=self.situation.instruction, step=step,  # type: ignore[union-attr]
                          calls=(*calls, branch.label), observation=observation_text(branch.observation))
        try:
            predictions = await self.shared.selector.predict(after)
        except Exception:
            return
        best = self._worth(predictions, branch.p, lambda call: False)
        if best is None:
            return
        child = Branch(call=best.call, label=best.label, p=best.p * branch.p, own_p=best.p,
                       job=asyncio.current_task())
        priority = self.shared.tail.priority(self.sample, self.task_id, self.template, step, None)
        child.grant = await self.shared.slots.acquire(priority, lambda: self._preempted(child))
        branch.child = child
        self.shared.counts["speculated"] += 1
        await self._run(child, branch.ws)

    def _preempted(self, branch: Branch) -> None:
        """A sample predicted to end later took this branch's slot: it is cancelled (or, done, closed) and will
        not be adopted."""
        if branch.adopted or branch.discarded:
            return
        branch.failed = True
        if not branch.done.is_set():
            if branch.job is not None:  # only this branch is running: its parent, if any, is done
                branch.job.cancel()
        else:
            self._discard(branch)

    # -- the real call has come ---------------------------------------------------------------------------------
    async def resolve(self, call: ToolCall, *, adopt: bool = True) -> Branch | None:
        """``call`` (normal form) is the sample's real call: the adopted branch, its ``ws`` now the caller's, or
        None (the branches are gone). ``adopt=False``: only score and learn it (a final action; a call the prefix
        tree serves)."""
        self.decided_at = time.monotonic()
        label = label_of(call)
        self._score(label)
        branch, self.current = self.current, None
        if (not adopt or branch is None or branch.label != label or branch.failed
                or branch.started is None):  # its call has not started (no slot yet): running it here is faster
            await self._stop()
            if branch is not None:
                self._discard(branch)
            await self._settle_prep()
            return None
        self._release(branch)  # the sample's real call from here: no preemption takes it while it finishes
        branch.adopted = True
        await branch.done.wait()
        if branch.failed or branch.ws is None:
            await self._stop()
            branch.adopted = False
            self._discard(branch)
            await self._settle_prep()
            return None
        if branch.child is None or branch.child.ws is None:  # the child had not forked yet: not worth keeping
            await self._stop()
            if branch.child is not None:
                self._discard(branch.child)
                branch.child = None
        # else the child's call runs on in its job: it is the next step's branch
        await self._settle_prep()
        self.pending, branch.child = branch.child, None
        self._adopted(branch)
        return branch

    def _score(self, label: str) -> None:
        """Top-1 and top-k of the predictions made for this decision (scored when they come if the real call came
        first: the selector's accuracy does not depend on how fast the model decided); the example goes to the
        selector."""
        self.shared.counts["decisions"] += 1
        predicting = self.predicting
        if predicting is not None and predicting.done():
            self._tally(predicting, label)
        elif predicting is not None:
            self.shared.counts["late_predictions"] += 1
            predicting.add_done_callback(lambda done: self._tally(done, label))
        if self.situation is not None:
            self.shared.selector.learn(self.situation, label)

    def _tally(self, predicting: asyncio.Task[list[Prediction]], label: str) -> None:
        if predicting.cancelled() or predicting.exception() is not None:
            return
        stats = self.shared.counts
        labels = [p.label for p in predicting.result()]
        if labels:
            stats["predicted"] += 1
            stats["top1_hits"] += labels[0] == label
            stats["topk_hits"] += label in labels

    def _adopted(self, branch: Branch) -> None:
        stats = self.shared.seconds
        self.shared.counts["adopted"] += 1
        assert branch.started is not None and branch.finished is not None
        stats["adopted_s"] += branch.finished - branch.started
        stats["hidden_s"] += self.hidden_s(branch)
        self.shared.branch_closed(branch.ws)  # the sample's now: its memory is the sample's

    def waited_s(self, branch: Branch) -> float:
        """How long the sample waited for an adopted branch after its real call came."""
        return max(0.0, (branch.finished or self.decided_at) - self.decided_at)

    def hidden_s(self, branch: Branch) -> float:
        """The adopted branch's tool time that ran while the model was still reasoning."""
        if branch.started is None or branch.finished is None:
            return 0.0
        return max(0.0, min(branch.finished, self.decided_at) - branch.started)

    def close_later(self, ws: Workspace) -> None:
        """Close ``ws`` (the sample's workspace an adopted branch replaced) in the background; ``close`` waits."""
        self._background.start_soon(ws.close())

    def finished(self, length: int | None) -> None:
        """The rollout ended after ``length`` calls (None: it failed; its length teaches nothing)."""
        if length is None:
            self.shared.tail.forget(self.sample)
        else:
            self.shared.tail.finished(self.sample, self.task_id, self.template, length)

    # -- throwing branches away -----------------------------------------------------------------------------------
    async def _stop(self) -> None:
        """Cancel this sample's speculation jobs and wait until they have ended (a cancelled caller still waits for
        them, then is cancelled); the next step's jobs go to a new scope."""
        jobs, self._jobs = self._jobs, TaskScope(self._jobs.name)
        await jobs.aclose()

    async def _settle_prep(self) -> None:
        """Let the sample's own workspace settle (a walk's catch-up the branch asked for) before it is used."""
        prep, self.prep = self.prep, None
        if prep is not None:
            await asyncio.wait([prep])
            if not prep.cancelled():
                prep.exception()  # the sample's own step meets the failure again and reports it

    def _release(self, branch: Branch) -> None:
        if branch.grant is not None:
            self.shared.slots.release(branch.grant)

    def _discard(self, branch: Branch) -> None:
        """Count ``branch`` (and its child) as wasted and close its workspace in the background (awaited by
        ``close``)."""
        now = time.monotonic()
        for b in (branch, branch.child):
            if b is None or b.discarded:
                continue
            b.discarded = True
            if b.grant is None and b.ws is None and b is branch and not b.failed:
                self.shared.counts["skipped_slots"] += 1  # its real call came before a slot did
            self._release(b)
            if b.ws is not None or b.started is not None:
                self.shared.counts["wasted"] += 1
                self.shared.seconds["wasted_s"] += b.seconds(now)
            if b.ws is not None:
                ws, b.ws = b.ws, None
                self.shared.branch_closed(ws)
                self.close_later(ws)

    async def close(self) -> None:
        """Cancel and close every branch, the sample's speculation ends (every path, cancellation included): the
        jobs are cancelled and awaited, the branches discarded, the predictions not yet come cancelled (scored as
        misses: the rollout has ended), a catch-up cancelled, and every workspace's close awaited; each step runs
        even when one before it failed or the caller was cancelled."""
        async with contextlib.AsyncExitStack() as stack:  # callbacks run last pushed, first
            stack.push_async_callback(self._close_background)
            stack.push_async_callback(self._predictions.aclose)
            stack.callback(self._discard_all)
            await self._jobs.aclose()

    def _discard_all(self) -> None:
        for branch in (self.current, self.pending):
            if branch is not None:
                self._discard(branch)
        self.current = self.pending = None

    async def _close_background(self) -> None:
        prep, self.prep = self.prep, None
        if prep is not None:
            prep.cancel()
        try:
            await self._background.join()  # the catch-up's end and every thrown-away branch's close
        finally:
            await self._background.aclose()
