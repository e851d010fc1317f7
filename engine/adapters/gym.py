"""A gymnasium ``Env`` over a suite task: text observations in, actions in the suite's action language out.

Owns: ``BunshinTaskEnv`` (gymnasium's ``Env`` contract: ``observation_space`` and ``action_space`` as
``gymnasium.spaces.Text``; ``reset(seed=...)`` forks a fresh copy of the task's set-up workspace and returns
``(observation, info)``; ``step(action_text)`` returns ``(observation, reward, terminated, truncated, info)``, the
reward being the suite's evaluator's score at the final action; ``close()`` closes every workspace) and
``make_env`` (by suite name and task id; also registered with gymnasium as ``ENV_ID``, so
``gymnasium.make(ENV_ID, suite="webshop", task_id="42")`` makes one with gymnasium's own wrappers). The workspaces run on the session's own
event loop in a background thread (``session.py``), since gymnasium's API is synchronous.
Must never: import gymnasium at bunshin's import (the class is built on first use), or leave a workspace behind
(closed by ``close()``, at garbage collection and at exit).
"""

from __future__ import annotations

import functools
import string
from pathlib import Path
from typing import Any

from bunshin.envs.records import Limits
from bunshin.envs.suites.base import Suite, SuiteTask
from bunshin.envs.suites.registry import get_suite

from .session import EpisodeNotStarted, TaskSession

ENV_ID = "bunshin/SuiteTask-v0"  # gymnasium.make(ENV_ID, suite=..., task_id=...) once env_class() has run
MAX_TEXT = 1 << 20  # the spaces' bound on an observation's or action's length (characters)


def find_task(suite: Suite, task_id: str) -> SuiteTask:
    for task in suite.tasks():
        if task.id == task_id:
            return task
    raise KeyError(f"suite {suite.name!r} has no task {task_id!r}")


@functools.cache
def env_class() -> type:
    """``BunshinTaskEnv``, a subclass of ``gymnasium.Env`` (gymnasium imported here, on first use)."""
    import gymnasium
    from gymnasium import spaces

    charset = frozenset(string.printable) | frozenset(chr(c) for c in range(0xA0, 0x3000))

    class BunshinTaskEnv(gymnasium.Env):
        """One suite task as a gymnasium environment; every ``reset`` is a fresh copy-on-write fork."""

        metadata = {"render_modes": []}

        def __init__(self, suite: Suite, task: SuiteTask, *, max_steps: int = 30, backend: str = "cow",
                     state_dir: Path | None = None, limits: Limits | None = None, call_timeout_s: float = 60.0,
                     use_uvloop: bool = True):
            super().__init__()
            self.suite, self.task = suite, task
            self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=charset)
            self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=1, charset=charset)
            self.session = TaskSession(suite, task, backend=backend, state_dir=state_dir, limits=limits,
                                       max_steps=max_steps, call_timeout_s=call_timeout_s, use_uvloop=use_uvloop)

        def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
            super().reset(seed=seed)
            if seed is None:  # gymnasium seeds once and continues its stream; so do the forks
                seed = int(self.np_random.integers(0, 2**31 - 1))
            observation = self.session.reset(seed)
            return observation, {"task_id": self.task.id, "instruction": self.task.instruction, "seed": seed}

        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            if not isinstance(action, str):
                raise TypeError(f"an action is text in the {self.suite.name} action language, "
                                f"not {type(action).__name__}")
            result = self.session.step(action)
            return result.observation, result.reward, result.terminated, result.truncated, dict(result.info)

        def close(self) -> None:
            self.session.close()
            super().close()

    BunshinTaskEnv.__module__ = __name__
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:make_env")
    return BunshinTaskEnv


def make_env(suite: str | Suite, task_id: str, **kwargs: Any) -> Any:
    """A ``BunshinTaskEnv`` for task ``task_id`` of ``suite`` (a name for ``get_suite``, or a suite)."""
    s = get_suite(suite) if isinstance(suite, str) else suite
    return env_class()(s, find_task(s, task_id), **kwargs)


__all__ = ["EpisodeNotStarted", "env_class", "find_task", "make_env"]
