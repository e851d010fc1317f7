"""State-machine tests of the engine above the workspace: ``SampleRun`` (every mode), ``Walk`` (the prefix cache) and
``SampleSpeculation`` (speculation), through ``RolloutEngine`` on a tiny counter suite (``tests/apps/counter.py``).

A hypothesis ``RuleBasedStateMachine`` opens an engine in a drawn mode (plain, prefix, speculation, both; hot budget,
admission, concurrency, how often samples part ways), then runs groups and cancels runs at named await points.
After every run: each trajectory's observations and reward equal a direct replay of its calls on a fresh workspace
and the counter's model (so prefix-served and speculated steps answer as executing would); the only workspaces
still open are the roots and the prefix tree's snapshots, and no speculative branch is alive; at the end every
workspace opened is closed. It runs on ``MemoryRuntime`` (any user: ids ``memory``) and on the real runtime (root:
``real``); ``test_the_memory_half_runs_as_an_unprivileged_user`` re-runs the memory half as uid 65534.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from bunshin.engine.prefix.settings import PrefixSettings
from bunshin.engine.records import RolloutResult, Status, StepObservation, Trajectory, write_jsonl
from bunshin.engine.rollout import RolloutEngine
from bunshin.engine.speculation.settings import SpecSettings
from bunshin.envs import AppSpec, Limits, ToolCall, derive_seed
from bunshin.envs.memory_workspace import MemoryRuntime
from bunshin.envs.records import Observation
from bunshin.envs.runtime import await_points
from bunshin.envs.suites.base import ActionError, Suite, SuiteTask, checked
from bunshin.policies.base import Decision, Policy, PolicyContext

from .conftest import assert_no_leaks, cancel_at
from .quiet import all_tasks_blocked

REPO = Path(__file__).resolve().parent.parent
COUNTER = AppSpec(target="tests.apps.counter:CounterApp")
TASKS = {"t0": (0, 3), "t1": (2, 5), "t2": (1, 1)}  # task id: (start value, target value)
ACTIONS = [ToolCall(name="add", args={"n": 1}), ToolCall(name="add", args={"n": 2}),
           ToolCall(name="add", args={"n": -1}), ToolCall(name="note", args={"text": "x"}), ToolCall(name="get")]
LIMITS = Limits(memory_bytes=1 << 30, pids=256, command_timeout_s=30)
CANCEL_POINTS = ["group.setup", "sample.fork", "sample.decide", "sample.call", "sample.evaluate"]
MODES = ["plain", "prefix", "spec", "full"]


class CounterSuite(Suite):
    """Reach a task's target value from its start with ``add``; ``done`` ends the episode."""

    name = "counter"

    def tasks(self) -> list[SuiteTask]:
        return [SuiteTask(suite=self.name, id=tid, template="reach", instruction=f"from {start} reach {target}",
                          path=f"{tid}.json", reference=[ToolCall(name="add", args={"n": target - start}),
                                                         ToolCall(name="done")])
                for tid, (start, target) in TASKS.items()]

    def app(self, task: SuiteTask | None = None) -> AppSpec:
        return COUNTER

    async def start(self, ws: Any, task: SuiteTask) -> Observation:
        await checked(ws, "_setup", {"start": TASKS[task.id][0]})
        return await ws.execute(ToolCall(name="get"))

    def parse_action(self, text: str) -> ToolCall:
        match text.split(maxsplit=1):
            case ["add", n] if re.fullmatch(r"-?\d+", n):
                return ToolCall(name="add", args={"n": int(n)})
            case ["note", words]:
                return ToolCall(name="note", args={"text": words})
            case ["get"] | ["done"]:
                return ToolCall(name=text.strip())
        raise ActionError(f"not a counter action: {text!r}")

    def normalize(self, call: ToolCall) -> ToolCall:
        if call.name.startswith("_"):
            raise ActionError(f"{call.name} is the suite's own tool")
        return call

    def is_final(self, call: ToolCall) -> bool:
        return call.name == "done"

    def null_action(self) -> ToolCall:
        return ToolCall(name="done")

    def read_only(self, call: ToolCall) -> bool:
        return call.name == "get"

    async def evaluate(self, ws: Any, task: SuiteTask, final: ToolCall) -> float:
        value = (await checked(ws, "_value", {})).data["value"]
        return 1.0 if value == TASKS[task.id][1] else 0.0


class CounterPolicy(Policy):
    """``steps`` calls then ``done``; each call the task's common choice for that step, or with probability
    ``part`` the sample's own (samples of a group share prefixes and part ways). ``think_s``: modelled reasoning,
    the time speculation's branches run in."""

    name = "counter"

    def __init__(self, *, steps: int, part: float, think_s: float = 0.0):
        self.steps, self.part, self.think_s = steps, part, think_s

    async def decide(self, ctx: PolicyContext) -> Decision:
        if self.think_s:
            await asyncio.sleep(self.think_s)
        if ctx.step >= self.steps:
            return Decision(action=ToolCall(name="done"), reasoning_s=self.think_s)
        own = random.Random(derive_seed(ctx.seed, ctx.step))
        rng = own if own.random() < self.part else random.Random(derive_seed(ctx.task_id, ctx.step))
        return Decision(action=rng.choice(ACTIONS), reasoning_s=self.think_s)


async def bounded(aw: Any, what: str, limit_s: float = 60.0) -> Any:
    """``aw``, or a failure naming every task still waiting (with its stack) if it has not ended in ``limit_s``."""
    try:
        async with asyncio.timeout(limit_s):
            return await aw
    except TimeoutError:
        stuck = []
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                frames = task.get_stack()
                stuck.append(f"{task.get_name()}: " + " <- ".join(
                    f"{f.f_code.co_name}@{Path(f.f_code.co_filename).name}:{f.f_lineno}" for f in frames))
        raise AssertionError(f"{what} did not end within {limit_s:g}s; waiting:\n" + "\n".join(stuck)) from None


def expected_reward(t: Trajectory) -> float:
    start, target = TASKS[t.task_id]
    value = start + sum(s.call.args["n"] for s in t.steps if s.call.name == "add")
    return 1.0 if value == target else 0.0


class EngineMachine(RuleBasedStateMachine):
    """One engine per example; ``kind``, ``loop`` and ``state_dir`` are set by the test."""

    kind = "memory"
    loop = "asyncio"
    state_dir = Path(tempfile.gettempdir())

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if self.loop == "uvloop" else None)
        self.engine: RolloutEngine | None = None
        self.suite = CounterSuite()

    @initialize(mode=st.sampled_from(MODES), concurrency=st.integers(1, 4), steps=st.integers(1, 4),
                part=st.sampled_from([0.0, 0.3, 1.0]), hot=st.sampled_from([None, 0, 3 << 20, 0.5]),
                min_issuers=st.integers(1, 2), slots=st.integers(1, 2), think_s=st.sampled_from([0.0, 0.01]))
    def open(self, mode: str, concurrency: int, steps: int, part: float, hot: int | float | None, min_issuers: int,
             slots: int, think_s: float) -> None:
        kwargs: dict[str, Any] = {}
        if mode in ("prefix", "full"):  # a float: a relative hot budget, that share of the run's memory
            kwargs["prefix"] = (PrefixSettings(hot_budget=None, hot_share=hot, min_issuers=min_issuers)
                                if isinstance(hot, float) else PrefixSettings(hot_budget=hot, min_issuers=min_issuers))
        if mode in ("spec", "full"):
            kwargs["speculation"] = SpecSettings(slots=slots, threshold=0.0, memory_headroom=None)
        if self.kind == "memory":
            kwargs["runtime"] = MemoryRuntime(state_dir=self.state_dir, limits=LIMITS)
        else:
            kwargs.update(state_dir=self.state_dir, limits=LIMITS)
        self.engine = RolloutEngine(self.suite, CounterPolicy(steps=steps, part=part, think_s=think_s),
                                    concurrency=concurrency, call_timeout_s=30, meter_interval_s=0.05, **kwargs)
        self.runner.run(bounded(self.engine.__aenter__(), "the engine's start"))

    @rule(tasks=st.lists(st.sampled_from(sorted(TASKS)), min_size=1, max_size=3, unique=True),
          group=st.integers(1, 3), seed=st.integers(0, 3))
    def run_groups(self, tasks: list[str], group: int, seed: int) -> None:
        assert self.engine is not None
        requests = self.engine.requests(tasks, group_size=group, seed=seed)
        results = self.runner.run(bounded(self.engine.run(requests), "a run"))
        assert len(results) == len(tasks) * group
        self.runner.run(bounded(self.check(results), "the checks"))

    @rule(tasks=st.lists(st.sampled_from(sorted(TASKS)), min_size=1, max_size=2, unique=True),
          group=st.integers(1, 3), seed=st.integers(0, 3), point=st.sampled_from(CANCEL_POINTS),
          occurrence=st.integers(1, 6))
    def cancel_a_run(self, tasks: list[str], group: int, seed: int, point: str, occurrence: int) -> None:
        assert self.engine is not None
        engine = self.engine

        async def cancelled() -> list[RolloutResult] | None:
            running = asyncio.ensure_future(engine.run(engine.requests(tasks, group_size=group, seed=seed)))
            with await_points.hook(cancel_at(running, point, occurrence)):
                try:
                    return await running
                except asyncio.CancelledError:
                    return None

        results = self.runner.run(bounded(cancelled(), "a cancelled run"))
        self.runner.run(bounded(self.check(results or []), "the checks"))

    async def check(self, results: list[RolloutResult]) -> None:
        assert self.engine is not None
        engine = self.engine
        for r in results:
            t = r.trajectory
            assert t.status is Status.OK and t.error is None, (t.status, t.error)
            assert t.reward == expected_reward(t)
            assert {s.source for s in t.steps} <= {"executed", "cached", "rebuilt", "speculated"}
            await self.replay(t)
        await all_tasks_blocked()  # closes the engine started in the background have begun
        live = {ws.id for ws in engine.runtime.workspaces.values() if not ws.closed}
        kept = {ws.id for ws in engine.roots}
        if engine.prefix_cache is not None:
            kept |= {n.hot.handle.id for n in engine.prefix_cache.tree.nodes.values()  # type: ignore[attr-defined]
                     if n.hot is not None}
            engine.prefix_cache.tree.check()
        extra = [(ws, ws.parent, ws.frozen) for ws in engine.runtime.workspaces.values()
                 if ws.id in live - kept]
        assert live == kept, (extra, kept)
        if engine.speculator is not None:
            assert engine.speculator.shared.branches == {}

    async def replay(self, t: Trajectory) -> None:
        """The trajectory's calls on a fresh workspace answer what the trajectory recorded."""
        assert self.engine is not None
        task = self.engine.tasks[t.task_id]
        ws = await self.engine.runtime.create(COUNTER, seed=t.seed)
        try:
            assert StepObservation.of(await self.suite.start(ws, task)) == t.first_observation
            for step in t.steps:
                assert StepObservation.of(await ws.execute(step.call)) == step.observation, (step.source, step)
            assert t.final is not None and await self.suite.evaluate(ws, task, t.final) == t.reward
        finally:
            await ws.close()

    def teardown(self) -> None:
        try:
            if self.engine is not None:
                runtime = self.engine.runtime
                self.runner.run(bounded(self.engine.__aexit__(None, None, None), "the engine's close"))
                if self.kind == "memory":
                    assert runtime.workspaces == {} and not runtime.run_dir.exists()  # every workspace closed
                else:
                    self.runner.run(assert_no_leaks(runtime))
        finally:
            self.runner.close()


def machine_settings(kind: str) -> settings:
    return settings(max_examples=12 if kind == "memory" else 3, stateful_step_count=4 if kind == "memory" else 3,
                    deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("kind", ["memory", "real"])
def test_the_engine_state_machine(kind: str, loop: str, tmp_path: Path, state_dir: Path) -> None:
    if kind == "real" and os.geteuid() != 0:
        pytest.skip("the real runtime needs root")

    class Machine(EngineMachine):
        pass

    Machine.kind, Machine.loop = kind, loop
    Machine.state_dir = tmp_path if kind == "memory" else state_dir
    run_state_machine_as_test(Machine, settings=machine_settings(kind))


@pytest.mark.asyncio(loop_factories=["uvloop"])
@pytest.mark.parametrize("kind", ["memory", "real"])
async def test_the_cache_serves_and_speculation_adopts_with_trajectories_unchanged(kind: str, tmp_path: Path,
                                                                                    state_dir: Path) -> None:
    """Not vacuous: with prefix cache and speculation on, later epochs are served from the tree and branches are
    adopted, and every trajectory is the one plain execution gives."""
    if kind == "real" and os.geteuid() != 0:
        pytest.skip("the real runtime needs root")

    def engine(**kwargs: Any) -> RolloutEngine:
        where: dict[str, Any] = ({"runtime": MemoryRuntime(state_dir=tmp_path, limits=LIMITS)} if kind == "memory"
                                 else {"state_dir": state_dir, "limits": LIMITS})
        return RolloutEngine(CounterSuite(), CounterPolicy(steps=4, part=0.3, think_s=0.05), concurrency=4,
                             call_timeout_s=30, **where, **kwargs)

    async def epochs(e: RolloutEngine) -> list[list[Trajectory]]:
        return [[r.trajectory for r in await e.run(e.requests(sorted(TASKS), group_size=3, seed=seed))]
                for seed in (0, 0, 1)]

    async with engine() as plain:
        expected = await epochs(plain)
    train = tmp_path / "train.jsonl"  # the selector starts from the plain run's trajectories: it predicts at once
    write_jsonl(train, [t for epoch in expected for t in epoch])
    spec_settings = SpecSettings(threshold=0.0, memory_headroom=None, train_file=train)
    runs: dict[str, list[list[Trajectory]]] = {}
    figures: dict[str, dict[str, Any] | None] = {}
    for mode, kwargs in {"prefix": {"prefix": PrefixSettings(min_issuers=1)}, "spec": {"speculation": spec_settings},
                         "full": {"prefix": PrefixSettings(min_issuers=1), "speculation": spec_settings}}.items():
        async with engine(**kwargs) as e:
            runs[mode] = await epochs(e)
            figures[mode] = e.prefix_statistics() if mode == "prefix" else e.speculation_statistics()
    for mode, got in runs.items():
        for mine, theirs in zip(got, expected, strict=True):
            for a, b in zip(mine, theirs, strict=True):
                assert [(s.call, s.observation) for s in a.steps] == [(s.call, s.observation) for s in b.steps], mode
                assert (a.reward, a.status, a.first_observation) == (b.reward, b.status, b.first_observation), mode
    sources = {mode: [s.source for epoch in got for t in epoch for s in t.steps] for mode, got in runs.items()}
    spec, prefix = figures["spec"], figures["prefix"]
    assert spec is not None and spec["adopted"] > 0 and "speculated" in sources["spec"], spec
    assert prefix is not None and prefix["hits"] > 0 and "cached" in sources["prefix"], prefix


def others_can_execute(path: str) -> bool:
    """Whether a user other than the owner may execute ``path`` (every directory on the way searchable)."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents])


def test_the_memory_half_runs_as_an_unprivileged_user() -> None:
    """The in-memory runs of this file and of the contract tests pass as uid 65534 (no root, no capability)."""
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the memory tests of this session are the proof")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    selection = "not real and not docker and not unprivileged"
    if not others_can_execute(sys.executable):
        # The speculation selector trains in interpreters it spawns from sys.executable, which uid 65534 cannot
        # execute here (a pyenv under /root): without a selector no branch is adopted, which only the non-vacuity
        # test asserts; the state machine's invariants hold with or without predictions.
        selection += " and not cache_serves"
    home = tempfile.mkdtemp(prefix="bunshin-nobody-")
    try:
        os.chown(home, 65534, 65534)
        env = {**os.environ, "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}
        done = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "--inh-caps=-all",
             sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_engine_states.py",
             "tests/test_workspace_contract.py", "-k", selection],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, tail
    assert "skipped" not in summary, tail  # nothing of the memory half needed root


@pytest.mark.asyncio
async def test_a_snapshot_whose_keeping_is_cancelled_while_it_is_measured_is_closed(tmp_path: Path) -> None:
    """``PrefixCache._keep_as_hot`` cancelled while it measures a snapshot's memory (a walk's catch-up rebuilding a
    node, cancelled by the walk's close) closes the snapshot instead of leaving it open and nobody's."""
    import threading

    from bunshin.engine.prefix.cache import PrefixCache

    measuring, release = threading.Event(), threading.Event()

    async with MemoryRuntime(state_dir=tmp_path, limits=LIMITS) as runtime:
        suite = CounterSuite()
        task = suite.tasks()[0]
        ws = await runtime.create(COUNTER, seed=0)
        first = await suite.start(ws, task)
        snap = await ws.snapshot()
        memory = snap.memory

        def blocked_memory() -> Any:
            measuring.set()
            release.wait(10)
            return memory()

        snap.memory = blocked_memory  # type: ignore[method-assign]

        async def no_setup(task: SuiteTask, seed: int) -> Any:
            raise AssertionError("not called")

        cache = PrefixCache(PrefixSettings(min_issuers=1), suite, no_setup, call_timeout_s=30)
        node = cache.tree.root(cache.namespace(task), first)
        keeping = asyncio.ensure_future(cache._keep_as_hot(node, snap))
        await asyncio.to_thread(measuring.wait, 10)
        keeping.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await keeping
        assert snap.closed and node.hot is None
        assert set(runtime.workspaces) == {ws.id}
        await ws.close()
