"""A trajectory as a trainer learns from it: token ids in, token ids out, with the loss mask and log-probs.

Owns: ``TrainingTurn`` (one model turn: its whole prompt and its completion as the model server tokenized them, the
server's log-probs, finish reason and the policy version that produced it), ``TrainingRecord`` (the episode as one
sequence: the first turn's prompt, then ``response_ids``: each completion, loss mask 1, followed by the tokens the
next turn's prompt appended after it, the observation and the chat template's glue, loss mask 0; log-probs aligned
with it, 0.0 where the mask is 0; where each turn's completion lies; per-turn policy versions; reward and status),
``turns_of`` and ``training_record`` that build them, and their errors.
The record is exact only because the conversation grew by appending (``policies/openai.py``): turn k+1's prompt
starts with turn k's prompt and completion, so what lies between is the observation, token for token, as the
server's own tokenizer made it.
Must never: guess a tokenizer or re-tokenize text. A turn without token ids (a policy that does not have them, a
server that did not return them) is ``MissingTokenIds``; a prompt that does not start with the previous prompt and
its completion (a sliding window, a re-rendered history) is ``NotAppendOnly``; both name the trajectory and the turn.
"""

from __future__ import annotations

import msgspec

from .errors import EngineError
from .records import Status, Trajectory

__all__ = ["MissingTokenIds", "NotAppendOnly", "TrainingRecord", "TrainingRecordError", "TrainingTurn",
           "training_record", "turns_of"]


class TrainingRecordError(EngineError):
    """A trajectory cannot become a training record; ``trajectory`` names it (``task/group/sample``), ``turn`` the
    turn at fault (None: the trajectory as a whole)."""

    def __init__(self, trajectory: str, turn: int | None, problem: str):
        where = f"trajectory {trajectory}" + (f" turn {turn}" if turn is not None else "")
        super().__init__(f"{where}: {problem}")
        self.trajectory, self.turn = trajectory, turn


class MissingTokenIds(TrainingRecordError):
    """A turn has no prompt or response token ids (or log-probs that do not match its tokens): the policy or its
    server did not give them, and they are never guessed."""


class NotAppendOnly(TrainingRecordError):
    """A turn's prompt does not start with the previous turn's prompt and completion: the conversation was not
    grown by appending, so the tokens between turns are not known."""


class TrainingTurn(msgspec.Struct, frozen=True, kw_only=True):
    """One model turn, enough to re-score it on its own."""

    index: int  # the step it decided (the final decision's is the number of steps)
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None  # the server's, one per response token
    finish_reason: str | None
    policy_version: int


class TrainingRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One trajectory as a single sequence ``prompt_ids + response_ids``."""

    task_id: str
    suite: str
    group_id: str
    sample: int
    seed: int
    prompt_ids: list[int]  # the first turn's prompt
    response_ids: list[int]  # every completion, and the appended tokens between them
    loss_mask: list[int]  # 1 for the model's tokens, 0 for the observations' and the template's
    logprobs: list[float] | None  # aligned with response_ids, 0.0 where the mask is 0; None if a turn had none
    turn_spans: list[tuple[int, int]]  # per turn, [start, end) of its completion in response_ids
    policy_versions: list[int]  # per turn
    turns: list[TrainingTurn]
    reward: float
    status: Status


def _name(t: Trajectory) -> str:
    return f"{t.task_id}/{t.group_id}/{t.sample}"


def turns_of(t: Trajectory) -> list[TrainingTurn]:
    """Every model turn of ``t`` in order (each step's decision, then the final decision when it was recorded).
    ``MissingTokenIds`` when a turn lacks its token ids."""
    raw: list[tuple[int, list[int] | None, list[int] | None, list[float] | None, str | None, int]] = [
        (s.index, s.prompt_token_ids, s.token_ids, s.logprobs, s.finish_reason, s.policy_version) for s in t.steps]
    if t.final_policy_version is not None:
        raw.append((len(t.steps), t.final_prompt_token_ids, t.final_token_ids, t.final_logprobs,
                    t.final_finish_reason, t.final_policy_version))
    turns = []
    for index, prompt, response, logprobs, finish, version in raw:
        if prompt is None or response is None:
            missing = " and ".join(w for w, v in (("prompt", prompt), ("response", response)) if v is None)
            raise MissingTokenIds(_name(t), index, f"no {missing} token ids (the policy or its model server did not "
                                                   "return them; a tokenizer is never guessed)")
        if logprobs is not None and len(logprobs) != len(response):
            raise MissingTokenIds(_name(t), index, f"{len(logprobs)} log-probs for {len(response)} response tokens")
        turns.append(TrainingTurn(index=index, prompt_ids=list(prompt), response_ids=list(response),
                                  logprobs=None if logprobs is None else list(logprobs), finish_reason=finish,
                                  policy_version=version))
    return turns


def training_record(t: Trajectory) -> TrainingRecord:
    """``t`` as one token sequence with its loss mask. Refuses (``TrainingRecordError``) a trajectory with no turn,
    a turn without token ids, or a turn whose prompt does not extend the previous prompt and completion."""
    turns = turns_of(t)
    if not turns:
        raise MissingTokenIds(_name(t), None, f"no model turn was recorded (status {t.status.value})")
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    spans: list[tuple[int, int]] = []
    seen = list(turns[0].prompt_ids)  # everything the model has seen or said so far
    for k, turn in enumerate(turns):
        if k > 0:
            if turn.prompt_ids[:len(seen)] != seen:
                at = next((i for i, (a, b) in enumerate(zip(turn.prompt_ids, seen, strict=False)) if a != b),
                          min(len(seen), len(turn.prompt_ids)))
                raise NotAppendOnly(_name(t), turn.index, f"its prompt ({len(turn.prompt_ids)} tokens) does not start "
                                                          f"with the previous prompt and completion ({len(seen)} "
                                                          f"tokens): they differ from token {at} on")
            appended = turn.prompt_ids[len(seen):]
            response += appended
            mask += [0] * len(appended)
            if logprobs is not None:
                logprobs += [0.0] * len(appended)
            seen += appended
        start = len(response)
        response += turn.response_ids
        mask += [1] * len(turn.response_ids)
        if logprobs is not None:
            logprobs = None if turn.logprobs is None else logprobs + turn.logprobs
        spans.append((start, len(response)))
        seen += turn.response_ids
    return TrainingRecord(task_id=t.task_id, suite=t.suite, group_id=t.group_id, sample=t.sample, seed=t.seed,
                          prompt_ids=list(turns[0].prompt_ids), response_ids=response, loss_mask=mask,
                          logprobs=logprobs, turn_spans=spans, policy_versions=[turn.policy_version for turn in turns],
                          turns=turns, reward=t.reward, status=t.status)
