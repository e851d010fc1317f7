"""The rollout engine on real workspaces: determinism, failure containment, cancellation without leftovers,
streaming, records and replay."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bunshin.engine.commands.eval_command import summarize
from bunshin.engine.commands.replay_command import run_replay
from bunshin.engine.records import (
    RolloutRequest,
    Status,
    Step,
    StepObservation,
    TaskSpec,
    Trajectory,
    canonical,
    read_jsonl,
    write_jsonl,
)
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.speculation.selector import TrainFileError
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.envs import Limits, Observation, ToolCall, derive_seed
from bunshin.envs.runtime import await_points
from bunshin.envs.webshop import tasks as generator
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.base import Decision, Policy, PolicyContext
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import SHARED_POINTS, assert_no_leaks, cancel_at


def tasks_since(before: set[asyncio.Task[object]]) -> set[asyncio.Task[object]]:
    """The tasks alive now that were not alive before (the test's own excepted)."""
    return {t for t in asyncio.all_tasks() if t not in before and t is not asyncio.current_task()}

CATALOG = 2000
TASKS = ["0", "14", "42", "49"]  # review_count, cheapest_in_category, add_to_cart, checkout


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("engine-tasks")
    generator.write(directory, [t for t in generator.generate(CATALOG, 0) if str(t["task_id"]) in TASKS])
    return directory


def shop(task_dir: Path) -> WebShopSuite:
    return WebShopSuite(catalog_size=CATALOG, tasks_dir=task_dir, time_scale=0.0)


def comparable(t: Trajectory) -> dict:
    """A trajectory without its timings (wall-clock) and workspace ids (random names)."""
    data = msgspec.to_builtins(t)
    data.pop("timings")
    data.pop("lineage")
    for step in data["steps"]:
        step.pop("tool_s")
    return data


async def run_batch(state_dir: Path, task_dir: Path, backend: str, seed: int, **kwargs) -> list[Trajectory]:
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.0), backend=backend, concurrency=4,
                           state_dir=state_dir, **kwargs)
    async with engine:
        results = await engine.run(engine.requests(TASKS, group_size=3, seed=seed))
    await assert_no_leaks(engine.runtime)
    return [r.trajectory for r in results]


@pytest.mark.asyncio
async def test_the_same_seed_gives_the_same_trajectories_and_rewards(state_dir, task_dir, loop_watchdog) -> None:
    first = await run_batch(state_dir, task_dir, "cow", seed=7)
    second = await run_batch(state_dir, task_dir, "cow", seed=7)
    assert [comparable(t) for t in first] == [comparable(t) for t in second]
    assert len(first) == 12 and all(t.status == Status.OK for t in first)
    rewards = [t.reward for t in first]
    assert 0 < sum(rewards) < len(rewards)  # the scripted policy's deviations: a group explores
    other = await run_batch(state_dir, task_dir, "cow", seed=8)
    assert [comparable(t) for t in other] != [comparable(t) for t in first]


@pytest.mark.asyncio
async def test_the_same_seed_gives_the_same_trajectories_on_the_restore_backend(state_dir, task_dir,
                                                                                loop_watchdog) -> None:
    first = await run_batch(state_dir, task_dir, "restore", seed=7)
    second = await run_batch(state_dir, task_dir, "restore", seed=7)
    assert [comparable(t) for t in first] == [comparable(t) for t in second]
    assert all(t.status == Status.OK and t.backend == "restore" for t in first)
    cow = await run_batch(state_dir, task_dir, "cow", seed=7)
    # the backend changes how a workspace is copied, not what happens in it
    strip = lambda t: {k: v for k, v in comparable(t).items() if k != "backend"}  # noqa: E731
    assert [strip(t) for t in first] == [strip(t) for t in cow]


class Saboteur(Policy):
    """The scripted policy, except: sample 1 of the first task is killed in its second step, sample 2 times out,
    sample 0 of the second task says something that is not WebArena's action language."""

    def __init__(self, engine_ref: list[RolloutEngine]):
        self.inner = ScriptedPolicy(time_scale=0.0, fail_p=0.0, detour_p=0.0)
        self.engine_ref = engine_ref

    async def decide(self, ctx: PolicyContext) -> Decision:
        if ctx.task_id == TASKS[0] and ctx.sample == 1 and ctx.step == 1:
            engine = self.engine_ref[0]
            victim = next(ws for ws in engine.runtime.workspaces.values() if ws.seed == ctx.seed)
            os.kill(victim.pid, signal.SIGKILL)  # the workspace dies mid-step, under the engine's feet
        if ctx.task_id == TASKS[0] and ctx.sample == 2:
            await asyncio.sleep(30)  # a policy thinking past decide_timeout_s: the decision times out
        if ctx.task_id == TASKS[1] and ctx.sample == 0:
            return Decision(action="please click the cheapest one")
        return await self.inner.decide(ctx)


@pytest.mark.asyncio
async def test_each_failure_ends_only_its_own_rollout(state_dir, task_dir, loop_watchdog) -> None:
    ref: list[RolloutEngine] = []
    engine = RolloutEngine(shop(task_dir), Saboteur(ref), concurrency=6, state_dir=state_dir, decide_timeout_s=2.0)
    ref.append(engine)
    async with engine:
        results = await engine.run(engine.requests(TASKS[:2], group_size=3, seed=1))
        trajectories = [r.trajectory for r in results]
    await assert_no_leaks(engine.runtime)
    status = {(t.task_id, t.sample): t.status for t in trajectories}
    assert status[(TASKS[0], 1)] == Status.WORKSPACE_FAILED
    assert status[(TASKS[0], 2)] == Status.POLICY_TIMEOUT
    assert status[(TASKS[1], 0)] == Status.MALFORMED_ACTION
    ok = [t for t in trajectories if t.status == Status.OK]
    assert len(ok) == 3 and all(t.reward == 1.0 for t in ok)  # the rest of the batch completed
    broken = {t.sample: t for t in trajectories if t.task_id == TASKS[0]}
    assert "killed" in (broken[1].error or "") or "SIGKILL" in (broken[1].error or ""), broken[1].error
    assert "please click" in (trajectories[3].error or "")
    summary = summarize(trajectories, 1.0, 1, 0.1, "cow")
    assert summary["failed"] == 3 and summary["statuses"] == {
        Status.OK: 3, Status.WORKSPACE_FAILED: 1, Status.POLICY_TIMEOUT: 1, Status.MALFORMED_ACTION: 1}


RUN_POINTS = ["group.setup", "sample.fork", "fork.cow.request", "hosts.await_ready", "sample.decide", "sample.call",
              "workspace.request.sent", "sample.evaluate", "workspace.close"]


@pytest.mark.asyncio
async def test_the_await_points_named_here_are_the_ones_a_run_passes(state_dir, task_dir, loop_watchdog) -> None:
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.0), concurrency=2, state_dir=state_dir)
    async with engine:
        await engine.run(engine.requests(TASKS[:1], group_size=1, seed=2))  # the root is made before we look
        with await_points.seen() as passed:
            await engine.run(engine.requests(TASKS[:1], group_size=2, seed=2))
    assert sorted(set(passed) - SHARED_POINTS) == sorted(RUN_POINTS)


@pytest.mark.asyncio
@pytest.mark.parametrize("point", RUN_POINTS)
async def test_cancelling_run_leaves_nothing_behind(state_dir, task_dir, loop_watchdog, point: str) -> None:
    """``run`` cancelled at each await point a run passes (its second passage: other rollouts are under way)."""
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.02), concurrency=4, state_dir=state_dir)
    async with engine:
        task = asyncio.ensure_future(engine.run(engine.requests(TASKS, group_size=3, seed=2)))
        with await_points.hook(cancel_at(task, point, occurrence=2)), pytest.raises(asyncio.CancelledError):
            await task
        assert [ws for ws in engine.runtime.workspaces.values() if not ws.closed] == engine.roots
    await assert_no_leaks(engine.runtime)


@pytest.mark.asyncio
async def test_stream_yields_in_completion_order_and_an_early_exit_cleans_up(state_dir, task_dir,
                                                                             loop_watchdog) -> None:
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.05), concurrency=3, state_dir=state_dir)
    before = set(asyncio.all_tasks())
    async with engine:
        seen = []
        async with contextlib.aclosing(engine.stream(engine.requests(TASKS, group_size=2, seed=3))) as results:
            async for result in results:
                seen.append(result.trajectory)
                if len(seen) == 3:
                    break  # a trainer that has enough
        assert len(seen) == 3 and all(t.status == Status.OK for t in seen)
        assert [ws for ws in engine.runtime.workspaces.values() if not ws.closed] == engine.roots
        # a consumer that leaves without closing its stream: the engine stops the rest when it closes
        async for _ in engine.stream(engine.requests(TASKS[:2], group_size=2, seed=4)):
            break
    assert tasks_since(before) == set()  # its producer ended with the engine
    await assert_no_leaks(engine.runtime)


@pytest.mark.asyncio
async def test_an_engine_that_fails_to_start_closes_what_it_started(state_dir, task_dir, tmp_path) -> None:
    """The speculator's training file is not there: entering the engine raises that, after the runtime, the meter
    and the speculator had started; each is closed again, and no task or workspace of it is left."""
    before = set(asyncio.all_tasks())
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.0), concurrency=2, state_dir=state_dir,
                           speculation=SpecSettings(train_file=tmp_path / "missing.jsonl"))
    with pytest.raises(TrainFileError, match="missing.jsonl"):
        async with engine:
            raise AssertionError("entered")
    assert tasks_since(before) == set() and engine.speculator is None
    await assert_no_leaks(engine.runtime)


class Overlap(Policy):
    """The scripted policy, counting the rollouts between their first decision and their final action."""

    def __init__(self) -> None:
        self.inner = ScriptedPolicy(time_scale=0.02, fail_p=0.0, detour_p=0.0)
        self.live: set[tuple[str, int]] = set()
        self.most = 0

    async def decide(self, ctx: PolicyContext) -> Decision:
        self.live.add((ctx.group_id, ctx.sample))
        self.most = max(self.most, len(self.live))
        decision = await self.inner.decide(ctx)
        if decision.action == ctx.reference[-1]:
            self.live.discard((ctx.group_id, ctx.sample))
        return decision


@pytest.mark.asyncio
async def test_a_memory_budget_admits_rollouts_one_by_one(state_dir, task_dir, loop_watchdog) -> None:
    policy = Overlap()
    engine = RolloutEngine(shop(task_dir), policy, concurrency=6, state_dir=state_dir,
                           memory_budget=1)  # below anything: one rollout at a time, never none
    async with engine:
        results = await engine.run(engine.requests(TASKS[:2], group_size=3, seed=4))
    await assert_no_leaks(engine.runtime)
    assert all(r.trajectory.status == Status.OK for r in results)
    assert policy.most == 1  # never two rollouts at once
    assert engine.gate is not None and engine.gate.admission.peak_active == 1
    waits = sorted(r.trajectory.timings["admission_wait_s"] for r in results)
    assert waits[-1] > 0  # someone waited for memory


@pytest.mark.asyncio
async def test_replay_reproduces_observations_and_rewards(state_dir, task_dir, tmp_path, loop_watchdog) -> None:
    trajectories = await run_batch(state_dir, task_dir, "cow", seed=5)
    path = tmp_path / "trajectories.jsonl"
    write_jsonl(path, trajectories)
    assert [comparable(t) for t in read_jsonl(path)] == [comparable(t) for t in trajectories]
    report = await run_replay(shop(task_dir), path)
    assert report["trajectories"] == report["identical_observations"] == report["identical_rewards"] == 12


@pytest.mark.asyncio
async def test_a_request_for_an_unknown_task_is_its_own_failure(state_dir, task_dir, loop_watchdog) -> None:
    engine = RolloutEngine(shop(task_dir), ScriptedPolicy(time_scale=0.0, fail_p=0.0, detour_p=0.0), concurrency=2,
                           state_dir=state_dir)
    async with engine:
        requests = engine.requests(["no-such-task", TASKS[0]], group_size=2, seed=3)
        trajectories = [r.trajectory for r in await engine.run(requests)]
    await assert_no_leaks(engine.runtime)
    unknown, known = trajectories[:2], trajectories[2:]
    assert [t.status for t in unknown] == [Status.SETUP_FAILED] * 2
    assert all("unknown task 'no-such-task' for suite webshop" in (t.error or "") for t in unknown)
    assert [(t.status, t.reward) for t in known] == [(Status.OK, 1.0)] * 2  # the rest of the batch ran
    assert summarize(trajectories, 1.0, 0, 0.0, "cow")["statuses"] == {Status.SETUP_FAILED: 2, Status.OK: 2}


calls = st.builds(ToolCall, name=st.sampled_from(["click", "type", "goto", "terminal"]),
                  args=st.dictionaries(st.sampled_from(["element_id", "text", "url", "command", "z", "a"]),
                                       st.one_of(st.integers(), st.text(max_size=20), st.booleans()), max_size=4))


@settings(max_examples=60, deadline=None)
@given(calls, st.lists(st.tuples(st.text(max_size=40), st.floats(0, 100), st.binary(max_size=64)), max_size=4))
def test_records_round_trip_through_json_lines(call: ToolCall, steps) -> None:
    import tempfile

    trajectory = Trajectory(
        task_id="3", suite="webshop", group_id="0:3", sample=1, seed=99, run_seed=0, final=call,
        steps=[Step(index=i, call=call, reasoning_s=r, tool_s=0.5,
                    observation=StepObservation.of(Observation(
                        output=text, data={"screenshot": blob, "url": "http://x/"})))
               for i, (text, r, blob) in enumerate(steps)], reward=1.0, timings={"wall_s": 1.5})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        write_jsonl(path, [trajectory, trajectory])
        assert list(read_jsonl(path)) == [trajectory, trajectory]
    assert all("screenshot" not in s.observation.data and len(s.observation.digests["screenshot"]) == 64
               for s in trajectory.steps)
    # the canonical form ignores argument order and nothing else
    shuffled = ToolCall(name=call.name, args=dict(reversed(list(call.args.items()))))
    assert canonical(shuffled) == canonical(call)
    if call.args:
        changed = ToolCall(name=call.name, args={**call.args, next(iter(call.args)): "other-value-x"})
        assert canonical(changed) != canonical(call) or call.args[next(iter(call.args))] == "other-value-x"


def test_a_recording_that_does_not_decode_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "1", "suite": "webshop", "group_id": "g", "sample": 0, "seed": 1}\n{"task_id": 3}\n')
    with pytest.raises(msgspec.ValidationError, match="bad.jsonl:2"):
        list(read_jsonl(path))


def test_requests_name_their_groups() -> None:
    r = RolloutRequest(task=TaskSpec(suite="webshop", task_id="4"), group_size=2, seed=1, group_id="1:4")
    assert msgspec.json.decode(msgspec.json.encode(r), type=RolloutRequest) == r


from .test_openai_policy import openai_server  # noqa: E402,F401  (the real scripted model server, as a fixture)


@pytest.mark.asyncio
async def test_a_model_server_policy_keeps_token_ids_and_logprobs_in_the_trajectory(
        state_dir, task_dir, openai_server, loop_watchdog) -> None:  # noqa: F811
    from bunshin.policies.openai import OpenAIPolicy

    server = openai_server([{"action": "type [19] [Lumina] [1]"}, {"action": "stop [3]"},
                            {"action": "definitely not an action"}])
    policy = OpenAIPolicy(f"http://127.0.0.1:{server.port}/v1")
    engine = RolloutEngine(shop(task_dir), policy, concurrency=1, state_dir=state_dir)
    try:
        async with engine:
            first, second = [r.trajectory for r in await engine.run(engine.requests(TASKS[:1], group_size=1)) +
                             await engine.run(engine.requests(TASKS[1:2], group_size=1))]
    finally:
        await policy.close()
    await assert_no_leaks(engine.runtime)
    assert first.status == Status.OK and len(first.steps) == 1 and first.final_text == "stop [3]"
    step = first.steps[0]
    assert step.action_text == "type [19] [Lumina] [1]" and step.call.args["text"] == "Lumina"
    assert step.token_ids and step.logprobs and len(step.token_ids) == len(step.logprobs)
    assert first.final_token_ids and first.final_logprobs and first.prompt_token_ids
    assert "Search results for: 'Lumina'" in step.observation.output
    assert second.status == Status.MALFORMED_ACTION and "definitely" in (second.error or "")


# it forks once it listens and its parent exits: the command returns with the port open
SILENT_SERVER = ("nohup python3 -c \"import os, socket, time; s = socket.socket(); s.bind(('127.0.0.1', 9009)); "
                 "s.listen(); os.fork() and os._exit(0); time.sleep(600)\" > /dev/null 2>&1")


class Stalling(Policy):
    """Sample 0 points its browser at a server in its own workspace that accepts and never answers (the test starts
    it through the runtime: the shop's agent has no shell); the page load hangs in the host past the call's
    deadline. Sample 1 thinks slower than its rollout may last."""

    def __init__(self, engine_ref: list[RolloutEngine]):
        self.engine_ref = engine_ref

    async def decide(self, ctx: PolicyContext) -> Decision:
        if ctx.sample == 0:
            engine = self.engine_ref[0]
            ws = next(ws for ws in engine.runtime.workspaces.values() if ws.seed == ctx.seed)
            await ws.execute(ToolCall(name="shell", args={"cmd": SILENT_SERVER}))
            return Decision(action="goto [http://127.0.0.1:9009/]")
        await asyncio.sleep(0.6)  # slow thinking: steps add up past rollout_timeout_s
        return Decision(action="scroll [down]")


@pytest.mark.asyncio
async def test_call_and_rollout_timeouts_end_their_rollouts(state_dir, task_dir, loop_watchdog) -> None:
    limits = Limits(memory_bytes=2 << 30, pids=256, command_timeout_s=2.0, deadline_grace_s=0.5)
    ref: list[RolloutEngine] = []
    engine = RolloutEngine(shop(task_dir), Stalling(ref), concurrency=2, state_dir=state_dir, call_timeout_s=2.0,
                           rollout_timeout_s=3.0, decide_timeout_s=5.0, limits=limits)
    ref.append(engine)
    async with engine:
        results = await engine.run(engine.requests(TASKS[:1], group_size=2, seed=6))
    await assert_no_leaks(engine.runtime)
    assert [r.trajectory.status for r in results] == [Status.CALL_TIMEOUT, Status.ROLLOUT_TIMEOUT]
    assert "goto" in (results[0].trajectory.error or "") and "overran its deadline" in results[0].trajectory.error
    assert all(r.trajectory.timings["wall_s"] < 10 for r in results)


class Buggy(RolloutEngine):
    """An engine whose tool-call seam has a bug for one sample: its rollout must say so, and only it."""

    async def execute_call(self, ws, call, timeout_s):  # type: ignore[no-untyped-def]
        if ws.seed == self.victim_seed:
            raise KeyError("a bug in the engine's own code")
        return await super().execute_call(ws, call, timeout_s)


@pytest.mark.asyncio
async def test_an_engine_bug_is_reported_as_an_engine_error_not_a_workspace_failure(state_dir, task_dir,
                                                                                     loop_watchdog) -> None:
    engine = Buggy(shop(task_dir), ScriptedPolicy(time_scale=0.0, fail_p=0.0, detour_p=0.0), concurrency=2,
                   state_dir=state_dir)
    async with engine:
        requests = engine.requests(TASKS[:1], group_size=2, seed=9)
        engine.victim_seed = derive_seed(9, TASKS[0], 1)
        trajectories = [r.trajectory for r in await engine.run(requests)]
    await assert_no_leaks(engine.runtime)
    assert [t.status for t in trajectories] == [Status.OK, Status.ENGINE_ERROR]
    assert "KeyError" in (trajectories[1].error or "")
