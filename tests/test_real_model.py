"""A real model in the loop (``policies/local_model.py``): SmolLM2-135M-Instruct behind llama.cpp's OpenAI-compatible
server drives rollouts of both embedded suites through ``OpenAIPolicy``. The model is tiny: malformed calls, wrong
tools and rambling are expected; every rollout must still end with a typed status, none of them an engine error.

Needs the set-up of ``bunshin model setup`` (the portable llama.cpp wheel and the model); without it these tests are
skipped, naming the command."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bunshin.engine.records import Status
from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.suites.registry import get_suite
from bunshin.policies import local_model
from bunshin.policies.openai import OpenAIPolicy

from .conftest import assert_no_leaks


@pytest.fixture(scope="module")
def model_server() -> Iterator[local_model.ModelServer]:
    if local_model.installed_version() != local_model.LLAMA_CPP_VERSION:
        pytest.skip("the model extra is not set up here: bunshin model setup")
    progress = lambda line: print(line, file=sys.stderr)  # noqa: E731
    with local_model.ModelServer(local_model.ensure_model(progress)) as server:
        yield server


@pytest.mark.asyncio
@pytest.mark.parametrize("suite_name", ["webshop", "desktop"])
async def test_the_real_model_drives_rollouts_that_all_end_with_a_typed_status(
        suite_name: str, model_server: local_model.ModelServer, state_dir: Path, loop_watchdog: None) -> None:
    suite = get_suite(suite_name, time_scale=0.0)
    policy = OpenAIPolicy(model_server.url, max_tokens=96, timeout_s=120)
    engine = RolloutEngine(suite, policy, concurrency=2, state_dir=state_dir, max_steps=4)
    try:
        async with engine:
            tasks = sorted(engine.tasks)[:2]
            results = await engine.run(engine.requests(tasks, group_size=2, seed=3))
    finally:
        await policy.close()
    trajectories = [r.trajectory for r in results]
    assert len(trajectories) == 4
    assert all(isinstance(t.status, Status) for t in trajectories)
    assert not [t for t in trajectories if t.status == Status.ENGINE_ERROR], [t.error for t in trajectories]
    await assert_no_leaks(engine.runtime)


def test_the_server_is_stopped_with_its_context(tmp_path: Path) -> None:
    if local_model.installed_version() != local_model.LLAMA_CPP_VERSION:
        pytest.skip("the model extra is not set up here: bunshin model setup")
    with local_model.ModelServer(local_model.ensure_model(lambda line: None), log_path=tmp_path / "log") as server:
        pid, port = server.proc.pid if server.proc else 0, server.port
        assert os.path.exists(f"/proc/{pid}")
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped
    with socket.socket() as s:  # nothing listens on the port any more (its closed connections may linger)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
