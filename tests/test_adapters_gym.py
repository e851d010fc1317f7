"""The gymnasium adapter: real episodes of an embedded desktop task through gymnasium's own ``Env`` contract
(spaces, reset/step/close, its environment checker), each reset a fresh fork; nothing left behind on close or when
the environment is dropped without closing."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from bunshin.engine.adapters.gym import env_class
from bunshin.engine.adapters.session import EpisodeNotStarted, SessionClosed

from .adapter_helpers import LIMITS, TASK_ID, assert_no_leaks_sync, desktop, reference_actions
from .conftest import REPO_ROOT, leftovers

gymnasium = pytest.importorskip("gymnasium", reason="the trainers extra (./scripts/setup.sh --trainers)")


def test_a_reference_episode_scores_1_and_a_fresh_fork_forgets_it(state_dir) -> None:
    from bunshin.engine.adapters.gym import ENV_ID

    suite = desktop()
    env_class()  # registers ENV_ID with gymnasium
    env = gymnasium.make(ENV_ID, suite=suite, task_id=TASK_ID, state_dir=state_dir, limits=LIMITS, max_steps=10)
    try:
        assert isinstance(env, gymnasium.Env) and isinstance(env.unwrapped, env_class())  # in gymnasium's wrappers
        assert isinstance(env.observation_space, gymnasium.spaces.Text)
        assert isinstance(env.action_space, gymnasium.spaces.Text)
        with pytest.raises(gymnasium.error.ResetNeeded):  # gymnasium's order check, before ours
            env.step("DONE")
        with pytest.raises(EpisodeNotStarted):
            env.unwrapped.step("DONE")
        obs, info = env.reset(seed=3)
        assert env.observation_space.contains(obs) and info["task_id"] == TASK_ID
        # a malformed action is the agent's mistake: an observation naming it, the episode goes on
        obs, reward, terminated, truncated, info = env.step("click the button")
        assert obs.startswith("ERROR: ") and "unknown action" in obs
        assert (reward, terminated, truncated) == (0.0, False, False)
        actions = reference_actions(suite)
        for action in actions[:-1]:
            assert env.action_space.contains(action)
            obs, reward, terminated, truncated, info = env.step(action)
            assert not obs.startswith("ERROR"), obs
            assert (reward, terminated, truncated) == (0.0, False, False)
        obs, reward, terminated, truncated, info = env.step(actions[-1])
        assert (reward, terminated, truncated) == (1.0, True, False)
        with pytest.raises(EpisodeNotStarted):
            env.step("DONE")
        # a new episode is a new fork of the set-up workspace: the edit above is not there, DONE scores 0
        env.reset(seed=4)
        assert env.step("DONE")[1:4] == (0.0, True, False)
        # the step limit truncates and scores the null action
        env.reset(seed=5)
        for _ in range(10):
            *_, terminated, truncated, _ = env.step('terminal: pwd')
        assert (terminated, truncated) == (False, False)
        assert env.step("terminal: pwd")[1:4] == (0.0, False, True)
        rt = env.unwrapped.session.runtime
    finally:
        env.close()
    assert_no_leaks_sync(rt)
    with pytest.raises(SessionClosed):
        env.reset(seed=1)


@pytest.mark.parametrize("use_uvloop", [True, False], ids=["uvloop", "asyncio"])
def test_gymnasium_checks_the_env_and_a_dropped_env_leaks_nothing(state_dir, use_uvloop) -> None:
    from gymnasium.utils.env_checker import check_env

    env = env_class()(desktop(), next(t for t in desktop().tasks() if t.id == TASK_ID), state_dir=state_dir,
                      limits=LIMITS, use_uvloop=use_uvloop)  # the session's loop: uvloop or asyncio's own
    check_env(env, skip_render_check=True)  # gymnasium's own checker: spaces, reset/step signatures, seeding
    env.reset(seed=1)
    rt = env.session.runtime
    del env  # never closed: the session's finalizer closes its workspaces and runtime
    gc.collect()
    assert_no_leaks_sync(rt)


EXIT_SCRIPT = """
from pathlib import Path
from bunshin.engine.adapters.gym import make_env
from tests.adapter_helpers import LIMITS, TASK_ID, desktop
env = make_env(desktop(), TASK_ID, state_dir=Path({state_dir!r}), limits=LIMITS)
env.reset(seed=1)
print(env.session.runtime.run_id, env.session.runtime.run_dir, flush=True)
"""  # exits with the env open: the session's exit hook closes it


def test_an_interpreter_that_exits_with_the_env_open_leaks_nothing(state_dir) -> None:
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT.format(state_dir=str(state_dir))], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    run_id, run_dir = done.stdout.split()
    assert not leftovers(run_id, Path(run_dir))
