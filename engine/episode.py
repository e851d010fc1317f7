"""One sample's episode as pure decisions: what the policy's decision means, and what the trajectory records.

Owns: ``Episode`` (the policy's view of the episode, ``PolicyContext``, kept up to date; the decision -> move rule:
the suite's final action ends the episode, the step limit ends it as ``MAX_STEPS`` with the suite's null action,
anything else is a tool call to run; a reply the model server cut at ``max_tokens`` (``finish_reason`` "length") ends
it as ``TRUNCATED``, a prompt the server refused as too long as ``CONTEXT_LENGTH``, both scored as they stand with the
suite's null action; recording each step, and every model turn: its prompt and response token ids, log-probs,
finish reason and the policy version that produced it (``Step``; the last decision on the trajectory's ``final_*``),
and the assistant message it came from in ``PolicyContext.replies``). The async shell (``sample.py``) does the I/O:
it asks the policy, resolves and runs calls, scores. This is where the prefix tree and speculation plug in: they
change how an ``Act`` is carried out (executed, served from a cached node, adopted from a speculative branch:
``Step.source``), never which move is made, so a trajectory is the same whichever way its calls ran.
Must never: do I/O or await.
"""

from __future__ import annotations

from dataclasses import dataclass

from bunshin.envs.records import Observation, ToolCall
from bunshin.envs.suites.base import ActionError, Suite, SuiteTask, observation_text
from bunshin.policies.base import Decision, PolicyContext

from .records import Status, Step, StepObservation, Trajectory


@dataclass(frozen=True)
class Act:
    """Run ``call`` (a reference step naming an element is resolved against the page first)."""

    call: ToolCall
    text: str | None  # the action as the policy said it, when it spoke the suite's language


@dataclass(frozen=True)
class Stop:
    """The episode ends; score it with ``final``."""

    final: ToolCall
    status: Status
    error: str | None = None


Move = Act | Stop


class Episode:
    def __init__(self, suite: Suite, task: SuiteTask, trajectory: Trajectory, first: Observation, max_steps: int):
        self.suite, self.task, self.trajectory, self.max_steps = suite, task, trajectory, max_steps
        trajectory.first_observation = StepObservation.of(first)
        self.context = PolicyContext(suite=suite.name, task_id=task.id, group_id=trajectory.group_id,
                                     sample=trajectory.sample, seed=trajectory.seed, instruction=task.instruction,
                                     reference=task.reference, observations=[observation_text(first)])
        self.step = 0
        self.version = 0  # the policy version of the decision being carried out

    def _turn(self, decision: Decision) -> None:
        """A decision was made: the version that produced it (its own, or the engine's at the time)."""
        self.version = decision.policy_version if decision.policy_version is not None else \
            self.context.policy_version
        t = self.trajectory
        if t.prompt_token_ids is None and decision.prompt_token_ids is not None:
            t.prompt_token_ids = decision.prompt_token_ids

    def _final_turn(self, decision: Decision) -> None:
        t = self.trajectory
        t.final_token_ids, t.final_logprobs = decision.token_ids, decision.logprobs
        t.final_prompt_token_ids, t.final_finish_reason = decision.prompt_token_ids, decision.finish_reason
        t.final_policy_version = self.version

    def cut_short(self, status: Status, error: str) -> Stop:
        """The policy could not take another turn (the model's context is full): the episode ends as it stands."""
        return Stop(final=self.suite.null_action(), status=status, error=error)

    def next_move(self, decision: Decision) -> Move:
        """The move ``decision`` makes at the current step. Raises the suite's ``ActionError`` when the action is
        not in its language (the caller classifies it as a malformed action)."""
        t = self.trajectory
        self._turn(decision)
        if decision.finish_reason == "length":  # the reply was cut: whatever action it holds is not the model's
            self._final_turn(decision)
            return Stop(final=self.suite.null_action(), status=Status.TRUNCATED,
                        error=f"the model's reply was cut at its token limit (finish_reason 'length') at step "
                              f"{self.step}")
        text = decision.action if isinstance(decision.action, str) else None
        try:
            call = self.suite.parse_action(text) if text is not None else decision.action
            if not isinstance(call, ToolCall):
                raise TypeError(f"a decision's action is text or a ToolCall, not {type(call).__name__}")
            call = self.suite.normalize(call)  # the suite's schema: defaults filled in, types as declared; refuses
            # anything outside the agent's tools (a suite's internal tools, which run as root, above all)
        except ActionError:
            self._final_turn(decision)  # the model's turn, refused: recorded, so that a trainer sees what it said
            raise
        if self.suite.is_final(call):
            t.final, t.final_text = call, text
            self._final_turn(decision)
            return Stop(final=call, status=Status.OK)
        if self.step >= self.max_steps:
            self._final_turn(decision)  # the model's turn, though the step limit keeps it from being carried out
            return Stop(final=self.suite.null_action(), status=Status.MAX_STEPS,
                        error=f"no final action within {self.max_steps} steps")
        return Act(call=call, text=text)

    def record(self, decision: Decision, act: Act, call: ToolCall, obs: Observation, tool_s: float,
               source: str = "executed", saved_s: float = 0.0) -> None:
        """``call`` (``act``'s call as the workspace took it) ran and answered ``obs``: a step of the trajectory,
        and what the policy sees next."""
        self.trajectory.steps.append(Step(
            index=self.step, call=call, observation=StepObservation.of(obs), reasoning_s=round(decision.reasoning_s, 4),
            tool_s=round(tool_s, 4), source=source, saved_s=round(saved_s, 4), action_text=act.text,
            token_ids=decision.token_ids, logprobs=decision.logprobs, prompt_token_ids=decision.prompt_token_ids,
            finish_reason=decision.finish_reason, policy_version=self.version))
        self.context.replies.append(decision.reply)
        self.context.observations.append(observation_text(obs))
        self.context.actions.append(act.text if act.text is not None else call.name)
        self.step += 1
        self.context.step = self.step
