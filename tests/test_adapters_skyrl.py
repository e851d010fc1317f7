"""The skyrl-gym adapter: a real episode of an embedded desktop task through skyrl-gym's own registry
(``skyrl_gym.make``) and ``BaseTextEnv`` contract, configured as SkyRL configures environments; nothing left behind."""

from __future__ import annotations

import gc

import msgspec
import pytest

from .adapter_helpers import LIMITS, SMALL, TASK_ID, assert_no_leaks_sync, desktop, reference_actions

skyrl_gym = pytest.importorskip("skyrl_gym", reason="the trainers extra (./scripts/setup.sh --trainers)")


def make(state_dir, **extras):
    from omegaconf import OmegaConf

    from bunshin.engine.adapters import skyrl  # registers the environment with skyrl-gym

    config = OmegaConf.create({"suite": "desktop", "suite_knobs": SMALL, "state_dir": str(state_dir),
                               "limits": msgspec.to_builtins(LIMITS), "max_turns": 8})
    return skyrl_gym.make(skyrl.ENV_ID, env_config=config, extras={"task_id": TASK_ID, **extras})


def test_a_reference_episode_through_skyrl_gym_scores_1(state_dir) -> None:
    from skyrl_gym.envs.base_text_env import BaseTextEnv

    env = make(state_dir, seed=2)
    try:
        assert isinstance(env, BaseTextEnv) and isinstance(env, skyrl_gym.Env) and env.max_turns == 8
        prompt = [{"role": "system", "content": "You operate a desktop."}]
        conversation, meta = env.init(prompt)
        assert conversation[0] == prompt[0] and conversation[-1]["role"] == "user" and meta["task_id"] == TASK_ID
        out = env.step("terminal: no_such_tool_exists_here")
        assert out["done"] is False and out["reward"] == 0.0
        assert "not found" in out["observations"][0]["content"]
        actions = reference_actions(desktop())
        for action in actions[:-1]:
            out = env.step(action)
            assert set(out) >= {"observations", "reward", "done", "metadata"}
            assert out["done"] is False and out["observations"][0]["role"] == "user"
        out = env.step(actions[-1])
        assert out["done"] is True and out["reward"] == 1.0 and out["observations"] == []
        assert out["metadata"]["terminated"] is True
        rt = env.session.runtime
    finally:
        env.close()
    assert_no_leaks_sync(rt)


def test_giving_up_scores_0_and_a_dropped_env_leaks_nothing(state_dir) -> None:
    env = make(state_dir, seed=5)
    env.init([])
    out = env.step("FAIL")  # the task is feasible: giving up is wrong
    assert out["done"] is True and out["reward"] == 0.0
    rt = env.session.runtime
    del env, out
    gc.collect()
    assert_no_leaks_sync(rt)


def test_a_missing_task_id_is_named() -> None:
    from bunshin.engine.adapters import skyrl

    with pytest.raises(skyrl.BadEnvConfig, match="task_id"):
        skyrl_gym.make(skyrl.ENV_ID, env_config={"suite": "desktop"}, extras={})


def test_the_envs_of_one_task_share_a_set_up_workspace_and_fork_it(state_dir) -> None:
    first, second = make(state_dir, seed=1), make(state_dir, seed=2)
    try:
        assert first.session is second.session  # one set-up workspace; each env's episode is its own fork
        first.init([])
        second.init([])
        actions = reference_actions(desktop())
        for action in actions[:-1]:
            assert first.step(action)["done"] is False
        # the other fork never saw the edit: DONE there scores 0, and the first still scores 1
        assert second.step("DONE")["reward"] == 0.0
        assert first.step(actions[-1])["reward"] == 1.0
        session, rt = first.session, first.session.runtime
        first.close()
        assert not session.closed  # the second env still holds it
    finally:
        first.close()
        second.close()
    assert session.closed
    assert_no_leaks_sync(rt)
