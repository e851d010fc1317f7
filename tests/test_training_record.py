"""The trainer's record (``engine/training.py``): the loss mask and the log-probs aligned with the response, built
from every turn's token ids; refused without token ids or when the conversation did not grow by appending. Then
real runs: the OpenAI-compatible policy against the scripted model server, on a real ``RolloutEngine`` over the
webshop suite: every turn recorded, ``length`` and the context-length error as their own statuses, and a server
without a tool parser ending the run with one error."""

from __future__ import annotations

import msgspec
import pytest

from bunshin.engine.episode import Episode
from bunshin.engine.records import Status, Step, StepObservation, ToolCall, Trajectory
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.training import (
    MissingTokenIds,
    NotAppendOnly,
    TrainingRecord,
    TrainingRecordError,
    training_record,
    turns_of,
)
from bunshin.envs.records import Observation
from bunshin.envs.suites.base import SuiteTask
from bunshin.policies.base import Decision, PolicyContext, ServerConfigError
from bunshin.policies.openai import OpenAIPolicy
from tests.openai_server import logprob_of, tokenize

from .conftest import assert_no_leaks
from .test_engine import TASKS, shop, task_dir  # noqa: F401  (the webshop tasks, a module fixture)
from .test_engine_core import Language
from .test_openai_policy import (
    advance,
    context,
    openai_server,  # noqa: F401  (the real scripted server, as a fixture)
)


def step(index: int, prompt: list[int] | None, response: list[int] | None, logprobs: list[float] | None = None,
         version: int = 0) -> Step:
    return Step(index=index, call=ToolCall(name="click", args={"id": index}), observation=StepObservation(),
                reasoning_s=0.0, tool_s=0.0, token_ids=response, logprobs=logprobs, prompt_token_ids=prompt,
                policy_version=version)


def trajectory(steps: list[Step], **final) -> Trajectory:
    return Trajectory(task_id="t-1", suite="webshop", group_id="g", sample=2, seed=5, steps=steps, reward=0.5,
                      **final)


# -- the builder ----------------------------------------------------------------------------------------------------


def test_the_loss_mask_and_log_probs_are_aligned_with_the_response() -> None:
    t = trajectory([step(0, [1, 2, 3], [10, 11], [-0.1, -0.2], version=0),
                    step(1, [1, 2, 3, 10, 11, 50, 51, 52], [12], [-0.3], version=1)],
                   final_prompt_token_ids=[1, 2, 3, 10, 11, 50, 51, 52, 12, 60], final_token_ids=[13, 14],
                   final_logprobs=[-0.4, -0.5], final_finish_reason="stop", final_policy_version=2,
                   status=Status.OK)
    record = training_record(t)
    assert record.prompt_ids == [1, 2, 3]
    assert record.response_ids == [10, 11, 50, 51, 52, 12, 60, 13, 14]
    assert record.loss_mask == [1, 1, 0, 0, 0, 1, 0, 1, 1]
    assert record.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3, 0.0, -0.4, -0.5]
    assert record.turn_spans == [(0, 2), (5, 6), (7, 9)]
    assert [record.response_ids[a:b] for a, b in record.turn_spans] == [[10, 11], [12], [13, 14]]
    assert record.policy_versions == [0, 1, 2] and record.reward == 0.5 and record.status is Status.OK
    assert [turn.index for turn in record.turns] == [0, 1, 2]  # every turn on its own, to be re-scored
    assert record.turns[2].prompt_ids == t.final_prompt_token_ids and record.turns[2].finish_reason == "stop"
    assert msgspec.json.decode(msgspec.json.encode(record), type=TrainingRecord) == record


def test_a_turn_without_log_probs_gives_no_log_probs_but_the_mask() -> None:
    record = training_record(trajectory([step(0, [1], [2], [-0.1]), step(1, [1, 2, 3], [4], None)]))
    assert record.logprobs is None and record.loss_mask == [1, 0, 1]


def test_a_turn_without_token_ids_is_refused_naming_the_trajectory_and_the_turn() -> None:
    with pytest.raises(MissingTokenIds, match=r"trajectory t-1/g/2 turn 1: no response token ids") as info:
        training_record(trajectory([step(0, [1], [2]), step(1, [1, 2, 3], None)]))
    assert info.value.turn == 1 and info.value.trajectory == "t-1/g/2"
    with pytest.raises(MissingTokenIds, match=r"turn 0: no prompt token ids"):
        training_record(trajectory([step(0, None, [2])]))
    with pytest.raises(MissingTokenIds, match=r"turn 1: no prompt and response token ids"):  # a final turn too
        training_record(trajectory([step(0, [1], [2])], final_policy_version=0))
    with pytest.raises(MissingTokenIds, match=r"turn 0: 1 log-probs for 2 response tokens"):
        training_record(trajectory([step(0, [1], [2, 3], [-0.1])]))
    with pytest.raises(MissingTokenIds, match=r"no model turn was recorded \(status setup_failed\)"):
        training_record(trajectory([], status=Status.SETUP_FAILED))


def test_a_prompt_that_does_not_extend_the_previous_turn_is_refused() -> None:
    dropped = trajectory([step(0, [1, 2, 3], [10]), step(1, [1, 3, 10, 20], [11])])  # a window dropped token 2
    with pytest.raises(NotAppendOnly, match=r"t-1/g/2 turn 1: .* differ from token 1 on"):
        training_record(dropped)
    retokenized = trajectory([step(0, [1, 2], [10, 11]), step(1, [1, 2, 10, 99, 20], [12])])
    with pytest.raises(TrainingRecordError, match="turn 1"):
        training_record(retokenized)
    assert len(turns_of(dropped)) == 2  # the turns themselves are still there to re-score one by one


def test_the_episode_records_every_turn_with_its_policy_version() -> None:
    task = SuiteTask(suite="toy", id="t", template="x", instruction="go somewhere", path="-", reference=[])
    t = Trajectory(task_id="t", suite="toy", group_id="g", sample=0, seed=1)
    e = Episode(Language(), task, t, Observation(output="start"), 3)  # type: ignore[arg-type]
    e.context.policy_version = 3  # what the engine sets before each decision
    reply = {"role": "assistant", "content": "go 1"}
    d = Decision(action="go 1", token_ids=[5], logprobs=[-0.5], prompt_token_ids=[1, 2], finish_reason="stop",
                 reply=reply)
    move = e.next_move(d)
    e.record(d, move, ToolCall(name="go", args={"n": 1}), Observation(output="moved"), 0.1)  # type: ignore[arg-type]
    assert e.context.replies == [reply]
    last = Decision(action="done", token_ids=[7], logprobs=[-0.7], prompt_token_ids=[1, 2, 5, 6],
                    finish_reason="stop", policy_version=4)  # the decision's own version wins
    e.next_move(last)
    assert (t.steps[0].prompt_token_ids, t.steps[0].finish_reason, t.steps[0].policy_version) == ([1, 2], "stop", 3)
    assert (t.final_prompt_token_ids, t.final_token_ids, t.final_policy_version) == ([1, 2, 5, 6], [7], 4)
    assert training_record(t).policy_versions == [3, 4]
    cut = Episode(Language(), task, Trajectory(task_id="t", suite="toy", group_id="g", sample=1, seed=1),
                  Observation(output="start"), 3)  # type: ignore[arg-type]
    stop = cut.next_move(Decision(action="go 1 and th", token_ids=[8], prompt_token_ids=[1], finish_reason="length"))
    assert stop.status is Status.TRUNCATED  # type: ignore[union-attr]
    assert cut.trajectory.final_token_ids == [8] and cut.trajectory.final_finish_reason == "length"


# -- with the real scripted server ------------------------------------------------------------------------------------


async def converse(policy: OpenAIPolicy, turns: int) -> Trajectory:
    """``turns`` decisions of ``policy``, each observation appended as the episode would: a trajectory of them."""
    ctx = context(observations=["PAGE-0"], actions=[])
    t = Trajectory(task_id="t-0", suite="webshop", group_id="g-0", sample=0, seed=7)
    for k in range(turns):
        d = await policy.decide(ctx)
        if k < turns - 1:
            t.steps.append(Step(index=k, call=ToolCall(name="click", args={}), observation=StepObservation(),
                                reasoning_s=0.0, tool_s=0.0, token_ids=d.token_ids, logprobs=d.logprobs,
                                prompt_token_ids=d.prompt_token_ids, finish_reason=d.finish_reason))
            advance(ctx, d, f"PAGE-{k + 1} with [{k + 2}] link 'More'")
        else:
            t.final_token_ids, t.final_logprobs, t.final_prompt_token_ids = d.token_ids, d.logprobs, d.prompt_token_ids
            t.final_finish_reason, t.final_policy_version = d.finish_reason, 0
    return t


@pytest.mark.asyncio
async def test_a_conversation_with_the_server_builds_an_exact_record(openai_server) -> None:  # noqa: F811
    server = openai_server([{"action": "click [1]"}, {"action": "click [2]", "content": "Next."},
                            {"action": "stop [3]"}])
    policy = OpenAIPolicy(server.url, "test-model")
    try:
        t = await converse(policy, 3)
    finally:
        await policy.close()
    record = training_record(t)
    assert sum(record.loss_mask) == sum(len(turn.response_ids) for turn in record.turns)
    assert record.logprobs is not None and len(record.logprobs) == len(record.response_ids) == len(record.loss_mask)
    for token, mask, lp in zip(record.response_ids, record.loss_mask, record.logprobs, strict=True):
        assert lp == (logprob_of(token) if mask else 0.0)  # the server's log-prob of that very token
    # what lies between two completions is the observation as the server's template rendered it, token for token
    a, b = record.turn_spans[0][1], record.turn_spans[1][0]
    rendered = "\n<|tool|>PAGE-1 with [2] link 'More'<|end|>\n<|assistant|>"  # (the completion ends with <|end|>)
    assert record.response_ids[a:b] == [tid for tid, _ in tokenize(rendered)]
    assert record.loss_mask[a:b] == [0] * (b - a)


@pytest.mark.asyncio
async def test_the_sliding_window_opt_in_cannot_build_a_record(openai_server) -> None:  # noqa: F811
    server = openai_server([{"action": "click [1]"}, {"action": "click [2]"}, {"action": "stop [3]"}])
    policy = OpenAIPolicy(server.url, "test-model", history_turns=1)
    try:
        t = await converse(policy, 3)
    finally:
        await policy.close()
    with pytest.raises(NotAppendOnly, match="turn 1"):
        training_record(t)


# -- real engine runs -------------------------------------------------------------------------------------------------


class Versioned(OpenAIPolicy):
    """A trainer's policy whose weights move on after every decision (the decision carries its version)."""

    version = 0

    async def decide(self, ctx: PolicyContext) -> Decision:
        decision = await super().decide(ctx)
        self.version += 1
        return msgspec.structs.replace(decision, policy_version=self.version)


@pytest.mark.asyncio
async def test_a_real_run_records_every_turn_and_builds_the_training_record(
        state_dir, task_dir, openai_server, loop_watchdog) -> None:  # noqa: F811
    server = openai_server([{"action": "type [19] [Lumina] [1]", "content": "Searching."}, {"action": "stop [3]"}])
    policy = Versioned(f"http://127.0.0.1:{server.port}/v1")
    engine = RolloutEngine(shop(task_dir), policy, concurrency=1, state_dir=state_dir)
    try:
        async with engine:
            (result,) = await engine.run(engine.requests(TASKS[:1], group_size=1, seed=3))
    finally:
        await policy.close()
    await assert_no_leaks(engine.runtime)
    t = result.trajectory
    assert t.status is Status.OK and len(t.steps) == 1
    s = t.steps[0]
    assert s.prompt_token_ids and s.token_ids and s.logprobs and s.finish_reason == "tool_calls"
    assert t.final_prompt_token_ids and t.final_token_ids and t.final_logprobs and t.final_finish_reason
    assert t.prompt_token_ids == s.prompt_token_ids  # the first turn's, kept for compatibility
    assert (s.policy_version, t.final_policy_version) == (1, 2)
    record = training_record(msgspec.json.decode(msgspec.json.encode(t), type=Trajectory))  # from the JSON too
    assert record.policy_versions == [1, 2] and record.turn_spans[0] == (0, len(s.token_ids))
    assert record.response_ids[:len(s.token_ids)] == s.token_ids
    assert record.loss_mask.count(1) == len(s.token_ids) + len(t.final_token_ids)
    assert "Search results for: 'Lumina'" in s.observation.output
    second = server.chat_bodies()[1]  # the observation went back as the answer to the model's tool call
    call_id = second["messages"][2]["tool_calls"][0]["id"]
    assert second["messages"][3]["role"] == "tool" and second["messages"][3]["tool_call_id"] == call_id
    assert "Search results for: 'Lumina'" in second["messages"][3]["content"]
    seeds = [b["seed"] for b in server.chat_bodies()]
    assert len(set(seeds)) == 2 and seeds[0] == OpenAIPolicy.seed_for(context_of(t))


def context_of(t: Trajectory) -> PolicyContext:
    return PolicyContext(suite=t.suite, task_id=t.task_id, group_id=t.group_id, sample=t.sample, seed=t.seed,
                         instruction=t.instruction, reference=[])


CONTEXT_ERRORS = {  # each server's own words (in its own error shape: vLLM's nested, SGLang's flat)
    "vllm": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4488 in the "
            "messages, 512 in the completion). Please reduce the length of the messages or completion.",
    "sglang": "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a "
              "total of 5000 tokens: 4488 tokens from the input messages and 512 tokens for the completion.",
}


@pytest.mark.asyncio
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_length_and_context_length_end_their_rollouts_scored_as_they_stand(
        state_dir, task_dir, openai_server, loop_watchdog, flavor: str) -> None:  # noqa: F811
    server = openai_server([
        {"action": "type [19] [Lumina] [1]"}, {"action": "stop [3]", "finish": "length"},
        {"action": "type [19] [Lumina] [1]"}, {"status": 400, "message": CONTEXT_ERRORS[flavor]},
    ], flavor=flavor)
    policy = OpenAIPolicy(f"http://127.0.0.1:{server.port}/v1", "test-model")
    engine = RolloutEngine(shop(task_dir), policy, concurrency=1, state_dir=state_dir)
    try:
        async with engine:
            (cut,) = await engine.run(engine.requests(TASKS[:1], group_size=1))
            (full,) = await engine.run(engine.requests(TASKS[:1], group_size=1))
    finally:
        await policy.close()
    await assert_no_leaks(engine.runtime)
    cut_t, full_t = cut.trajectory, full.trajectory
    assert cut_t.status is Status.TRUNCATED and "finish_reason 'length'" in (cut_t.error or "")
    assert len(cut_t.steps) == 1 and cut_t.final is None and "evaluate_s" in cut_t.timings  # scored as it stands
    assert cut_t.final_token_ids and cut_t.final_finish_reason == "length"
    assert training_record(cut_t).turns[-1].finish_reason == "length"  # its tokens are a training turn
    assert full_t.status is Status.CONTEXT_LENGTH and "maximum context length" in (full_t.error or "")
    assert len(full_t.steps) == 1 and full_t.steps[0].token_ids and "evaluate_s" in full_t.timings
    assert len(server.chat_bodies()) == 4  # the context-length refusal was not retried


@pytest.mark.asyncio
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_a_server_without_a_tool_parser_ends_the_run_with_one_error(
        state_dir, task_dir, openai_server, loop_watchdog, flavor: str) -> None:  # noqa: F811
    server = openai_server([{"action": "type [19] [Lumina] [1]"}] * 8, flavor=flavor, tool_parser="none")
    policy = OpenAIPolicy(f"http://127.0.0.1:{server.port}/v1", "test-model")
    engine = RolloutEngine(shop(task_dir), policy, concurrency=2, state_dir=state_dir)
    try:
        async with engine:
            with pytest.raises(ServerConfigError, match="--tool-call-parser"):
                await engine.run(engine.requests(TASKS[:2], group_size=2))
            assert not engine.runtime.workspaces or all(ws in engine.roots for ws in
                                                        engine.runtime.workspaces.values())
    finally:
        await policy.close()
    await assert_no_leaks(engine.runtime)
    # the first request of each rollout running at once (concurrency 2), not a batch of failures: once the server
    # is known not to be set up, the policy asks it nothing more
    assert 1 <= len(server.chat_bodies()) <= 2


def test_bunshin_eval_ends_with_the_server_config_error(openai_server, tmp_path) -> None:  # noqa: F811
    """From the command line: one clear message naming the flags, no trajectories, nothing left running."""
    import os

    from .conftest import host_processes
    from .test_cli import bunshin

    server = openai_server([{"action": "click [1]"}] * 8, tool_parser="none")
    out = tmp_path / "run"
    proc = bunshin("eval", "--suite", "webshop", "--catalog-size", "2000", "--limit", "2", "--group-size", "2",
                   "--concurrency", "2", "--time-scale", "0", "--policy", f"openai:{server.url}", "--out", str(out),
                   env={**os.environ, "BUNSHIN_STATE_DIR": "/var/lib/bunshin-test"})
    assert proc.returncode != 0
    assert "ServerConfigError" in proc.stderr and "--enable-auto-tool-choice --tool-call-parser" in proc.stderr
    assert "Traceback" not in proc.stderr and len(server.chat_bodies()) <= 2
    assert host_processes() == []
