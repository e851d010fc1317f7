"""The records of a rollout: what a trainer learns from and what replay re-executes.

Owns: ``StepObservation``, ``Step``, ``Trajectory``, ``TaskSpec``, ``RolloutRequest``, ``RolloutResult``, the
rollout ``Status``, and JSON Lines on disk. ``ToolCall`` and ``canonical`` (its one canonical form, the key the
prefix tree and speculation match on) are re-exported from ``bunshin.envs.records``.
Must never: keep bulky binary observation data in a record (screenshots are kept as digests).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from bunshin.envs.records import Observation, ToolCall, canonical

from .errors import BadRequest

__all__ = ["RolloutRequest", "RolloutResult", "Status", "Step", "StepObservation", "TaskSpec", "ToolCall",
           "Trajectory", "canonical", "group_requests", "in_request_order", "read_jsonl", "write_jsonl"]

class Status(enum.StrEnum):
    """How a rollout ended. Everything but ``OK`` ends only that rollout; the batch goes on. Recorded as its value
    (``"ok"``, ``"call_timeout"``...); ``outcomes.classify`` maps a failure to its status."""

    OK = "ok"  # the episode ended with the suite's final action and was scored
    MAX_STEPS = "max_steps"  # the step limit came first; scored as it stands
    POLICY_TIMEOUT = "policy_timeout"
    POLICY_ERROR = "policy_error"
    MALFORMED_ACTION = "malformed_action"  # not the suite's action language, or names no element on the page
    WORKSPACE_FAILED = "workspace_failed"  # the workspace died or broke (killed, out of memory, ...)
    CALL_TIMEOUT = "call_timeout"  # a tool call overran its deadline (the runtime stopped its workspace)
    ROLLOUT_TIMEOUT = "rollout_timeout"
    EVALUATOR_ERROR = "evaluator_error"
    SETUP_FAILED = "setup_failed"  # the group's base workspace could not be made or its task set up
    ENGINE_ERROR = "engine_error"  # a bug of the engine (or a suite's own code): never the agent's or workspace's
    TRUNCATED = "truncated"  # the model's reply was cut at max_tokens (finish_reason "length"); scored as it stands
    CONTEXT_LENGTH = "context_length"  # the conversation outgrew the model's context (the server refused the
    # prompt); scored as it stands
    NODE_LOST = "node_lost"  # on a cluster: its node died and no node was left to run it again


class StepObservation(msgspec.Struct, frozen=True, kw_only=True):
    """An observation as recorded: text and status; binary data (screenshots) as sha256 digests."""

    output: str = ""
    error: str | None = None
    exit_code: int | None = None
    data: dict[str, Any] = {}
    digests: dict[str, str] = {}

    @classmethod
    def of(cls, obs: Observation) -> StepObservation:
        data, digests = {}, {}
        for key, value in obs.data.items():
            if isinstance(value, bytes | bytearray | memoryview):
                digests[key] = hashlib.sha256(value).hexdigest()
            else:
                data[key] = value
        return cls(output=obs.output, error=obs.error, exit_code=obs.exit_code, data=data, digests=digests)


class Step(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    call: ToolCall  # as the workspace took it (element names resolved to ids)
    observation: StepObservation
    reasoning_s: float  # the policy's thinking time before this call
    tool_s: float  # the tool call's time in a workspace of this sample's (0 when served from the prefix tree)
    source: str = "executed"  # "executed" | "cached" (a prefix-tree hit) | "rebuilt" (executed in a workspace
    # the prefix tree rebuilt by replay) | "speculated" (speculation, later)
    saved_s: float = 0.0  # a cached step: the tool-seconds the call took when it was executed, skipped here
    action_text: str | None = None  # what the policy said, when it spoke the suite's action language
    token_ids: list[int] | None = None  # the turn's response tokens (the model's completion), with their log-probs
    logprobs: list[float] | None = None
    prompt_token_ids: list[int] | None = None  # the turn's whole prompt as the server tokenized it
    finish_reason: str | None = None  # the server's ("stop", "tool_calls"...)
    policy_version: int = 0  # the policy version that produced the turn


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    suite: str
    task_id: str


class RolloutRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One GRPO group: ``group_size`` samples of one task, forked from one initialised workspace."""

    task: TaskSpec
    group_size: int = 1
    seed: int = 0
    group_id: str = ""
    samples: list[int] | None = None  # which samples of the group to run (a retry's); None: all of range(group_size)

    def sample_indices(self) -> list[int]:
        """The samples this request runs, in order; ``BadRequest`` (a ``ValueError``) when one is outside the group or
        repeated."""
        if self.samples is None:
            return list(range(self.group_size))
        bad = [s for s in self.samples if not 0 <= s < self.group_size]
        if bad or len(set(self.samples)) != len(self.samples):
            raise BadRequest(f"request {self.group_id or self.task.task_id}: samples {self.samples} must be distinct "
                             f"indices in range({self.group_size})")
        return list(self.samples)


class Trajectory(msgspec.Struct, kw_only=True):
    task_id: str
    suite: str
    group_id: str
    sample: int
    seed: int  # this sample's seed (its workspace's and its policy's), derived from the run seed
    run_seed: int = 0
    instruction: str = ""
    first_observation: StepObservation | None = None
    steps: list[Step] = []
    final: ToolCall | None = None
    final_text: str | None = None
    final_token_ids: list[int] | None = None  # the final decision's tokens and log-probs (a trainer needs them too)
    final_logprobs: list[float] | None = None
    reward: float = 0.0
    status: Status = Status.OK
    error: str | None = None
    timings: dict[str, float] = {}  # wall_s, reasoning_s, tool_s, fork_s, evaluate_s, admission_wait_s
    lineage: list[str] = []  # workspace ids from the group's base to this sample's workspace
    backend: str = "cow"
    prompt_token_ids: list[int] | None = None  # the first turn's prompt (every turn's is on its step)
    final_prompt_token_ids: list[int] | None = None  # the final turn's prompt, finish reason and policy version;
    final_finish_reason: str | None = None
    final_policy_version: int | None = None  # set whenever the last decision is recorded as a turn (OK, TRUNCATED)
    attempts: int = 1  # how many times this sample was started: > 1 when a node died under it and it ran again


class RolloutResult(msgspec.Struct, kw_only=True):
    trajectory: Trajectory
    peak_memory_bytes: int = 0  # the run's memory when this rollout finished (for progress displays)
    policy_version: int = 0  # the engine's policy version when its group started (pull) or its stream began
    staleness: int | None = None  # pull mode: the trainer's version when it was handed out, minus policy_version
    node: str = ""  # on a cluster (``engine/cluster``): the Ray node id whose agent ran it; "" on one host

    @property
    def retried(self) -> bool:
        return self.trajectory.attempts > 1


def group_requests(suite: str, task_ids: Iterable[str], *, limit: int | None, group_size: int, seed: int
                   ) -> list[RolloutRequest]:
    """One request (a GRPO group of ``group_size``) per task of ``task_ids``, the first ``limit`` of them; the
    group id is ``"{seed}:{task}"`` on one host and on a cluster alike."""
    return [RolloutRequest(task=TaskSpec(suite=suite, task_id=i), group_size=group_size, seed=seed,
                           group_id=f"{seed}:{i}") for i in list(task_ids)[:limit]]


def in_request_order(requests: list[RolloutRequest], results: list[RolloutResult]) -> list[RolloutResult]:
    """``results`` sorted as ``requests`` list their groups, samples in order within a group."""
    order = {(r.group_id or r.task.task_id, s): (n, s) for n, r in enumerate(requests) for s in r.sample_indices()}
    return sorted(results, key=lambda r: order.get((r.trajectory.group_id, r.trajectory.sample), (0, 0)))


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Trajectory)


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> int:
    n = 0
    with open(path, "wb") as f:
        for t in trajectories:
            f.write(_encoder.encode(t) + b"\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    """Trajectories from a JSON Lines file; a bad line raises ``msgspec.ValidationError`` naming line and field."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield _decoder.decode(line)
                except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                    raise msgspec.ValidationError(f"{path}:{number}: {exc}") from exc
