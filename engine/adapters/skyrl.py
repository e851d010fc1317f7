"""A skyrl-gym environment over a suite task (skyrl-gym 0.4.0's ``BaseTextEnv``: text in, chat messages out).

Owns: ``BunshinSkyRLEnv`` (``__init__(env_config, extras)`` as skyrl-gym's environments take them; ``init(prompt)``
forks a fresh copy of the task's set-up workspace (the envs of one task open at once share one set-up workspace:
``session.SessionPool``) and appends its first observation to the prompt as a user message;
``step(action)`` returns skyrl-gym's ``BaseTextEnvStepOutput``: the next observation as a user message, the
suite's score at the final action, ``done``, metadata; ``close()`` closes every workspace) and ``register()``, which
registers it with skyrl-gym under ``ENV_ID`` the way skyrl-gym registers its own (``skyrl_gym.register(id=...,
entry_point="module:Class")``; this module calls it when imported, so ``skyrl_gym.make("bunshin", ...)`` works once
``bunshin.engine.adapters.skyrl`` has been imported).
Configuration: ``env_config`` (a dict or OmegaConf config, SkyRL's ``environment.skyrl_gym.bunshin``) may give
``suite`` (default ``webshop``), ``suite_knobs`` (the suite's constructor keywords), ``backend``, ``state_dir``,
``max_turns``, ``limits`` (``Limits``'s fields); ``extras`` (the dataset row's fields, as SkyRL passes them) must give ``task_id`` and may give
``seed`` and ``max_turns``.
Must never: be imported by bunshin itself (it imports skyrl_gym, the optional extra ``trainers``), or leave a
workspace behind (closed by ``close()``, at garbage collection and at exit).
"""

from __future__ import annotations

import uuid
import weakref
from pathlib import Path
from typing import Any

import msgspec
import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from bunshin.envs.records import Limits
from bunshin.envs.suites.base import Suite
from bunshin.envs.suites.registry import get_suite

from .gym import find_task
from .session import AdapterError, SessionPool, TaskSession, pool_key

ENV_ID = "bunshin"


POOL = SessionPool()


class BadEnvConfig(AdapterError, ValueError):
    """``env_config`` or ``extras`` lack a field or give a bad one: names it."""


def _plain(value: Any) -> Any:
    """An OmegaConf config as plain containers (skyrl passes DictConfig), anything else unchanged."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


class BunshinSkyRLEnv(BaseTextEnv):
    """One episode of one suite task, in a fresh copy-on-write fork of the task's set-up workspace."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None, *, suite: Suite | None = None):
        super().__init__()
        config = dict(_plain(env_config) or {})
        extras = dict(_plain(extras) or {})
        if "task_id" not in extras:
            raise BadEnvConfig("extras needs task_id (the suite task this episode runs)")
        self.suite = suite if suite is not None else get_suite(config.get("suite", "webshop"),
                                                               **dict(config.get("suite_knobs") or {}))
        self.task = find_task(self.suite, str(extras["task_id"]))
        self.seed = int(extras.get("seed", 0))
        self.max_turns = int(extras["max_turns"] if "max_turns" in extras else config.get("max_turns", 30))
        state_dir, limits = config.get("state_dir"), config.get("limits")
        try:
            limits = msgspec.convert(limits, Limits) if isinstance(limits, dict) else limits
        except msgspec.ValidationError as exc:
            raise BadEnvConfig(f"env_config.limits: {exc}") from exc

        def make() -> TaskSession:
            return TaskSession(self.suite, self.task, backend=config.get("backend", "cow"),
                               state_dir=Path(state_dir) if state_dir else None, limits=limits)

        # SkyRL makes an env per trajectory: those of one task open at once share a session (one set-up
        # workspace; each env's episode is its own fork). A suite object passed in is its own key.
        shared = {k: v for k, v in config.items() if k != "max_turns"}
        self._key = pool_key({**shared, "task_id": self.task.id, "suite_object": id(suite) if suite else None})
        self.session = POOL.acquire(self._key, make)
        self.episode = uuid.uuid4().hex
        self._release = weakref.finalize(self, POOL.release, self._key, self.session, self.episode)
        self.done = False

    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        first = self.session.reset(self.seed, episode=self.episode, max_steps=self.max_turns)
        conversation = [*prompt, {"role": "user", "content": first}]
        return conversation, {"task_id": self.task.id, "seed": self.seed}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        result = self.session.step(action, episode=self.episode)
        self.done = result.terminated or result.truncated
        observations = [] if self.done else [{"role": "user", "content": result.observation}]
        metadata = {k: v for k, v in result.info.items() if k != "call"}
        metadata.update(terminated=result.terminated, truncated=result.truncated)
        return BaseTextEnvStepOutput(observations=observations, reward=result.reward, done=self.done,
                                     metadata=metadata, postprocessed_action=action)

    def close(self) -> None:
        """Close this env's episode; the shared session closes with the last env of its task."""
        self._release()


def register() -> None:
    """Register ``BunshinSkyRLEnv`` with skyrl-gym under ``ENV_ID`` (once)."""
    if ENV_ID not in skyrl_gym.registry:
        skyrl_gym.register(id=ENV_ID, entry_point=f"{__name__}:BunshinSkyRLEnv")


register()
