"""A verl agent loop (verl 0.9.1's ``AgentLoopBase``) that runs one rollout of a suite task in a workspace.

Owns: ``BunshinAgentLoop``, registered with verl as ``AGENT_NAME`` by verl's own ``register`` (so a dataset row
whose ``agent_name`` is ``"bunshin"`` runs here: verl's ``AgentLoopWorker`` instantiates it through hydra with its
``server_manager`` and ``tokenizer``, and calls ``run(sampling_params, **row)``). Token-in/token-out, as verl's
``ToolAgentLoop`` is: the prompt (the row's ``raw_prompt`` plus a user message with the task's instruction and
first observation) is rendered once by verl's continuous-token builder; each turn asks ``server_manager.generate``
for tokens from the token ids so far; the model's tokens join the sequence with mask 1 and their log-probs
(``ct_merge_assistant_token``), the decoded text is parsed in the suite's action language and run in the rollout's
workspace, and the observation joins as a user message with mask 0 (``ct_merge_context_msg``). The final action is
scored by the suite's evaluator into ``AgentLoopOutput.reward_score`` (verl puts it on the last token's
``rm_scores``). A rollout that runs out of turns or of ``response_length`` is scored as the suite's null action; one
whose workspace fails (a crash, a call past its deadline) ends there with reward 0 and the reason in
``extra_fields["bunshin_error"]``, so verl's batch goes on; a row without a usable ``bunshin`` field raises
``BadRow``.
The row's ``bunshin`` field says what to run: ``{"task_id", "suite" (default webshop), "suite_knobs",
"seed", "max_turns", "backend", "state_dir", "limits"}``.
What runs where: verl's classes run the loop (this subclass of ``AgentLoopBase``, verl's continuous-token builder,
verl's ``AgentLoopOutput``, and around it verl's ``AgentLoopWorker`` padding it into a ``DataProto``); the workspace
runs in a ``TaskSession`` (``session.py``) on its own thread and loop; the rollouts of one task that run at once
share one (``session.SessionPool``: each rollout is an episode in its own fork of the task's set-up workspace), closed
when the last of them ends.
Must never: be imported by bunshin itself (it imports verl and torch: the optional extra ``trainers``), block
verl's event loop (closing the session runs in a thread), or leave a workspace behind on any path (the session is
closed in ``finally``, cancellation included).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from uuid import uuid4

import msgspec
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from bunshin.envs.errors import EnvsError
from bunshin.envs.records import Limits
from bunshin.envs.runtime.task_scope import run_to_end
from bunshin.envs.suites.registry import get_suite

from .gym import find_task
from .session import AdapterError, AdapterTimeout, EpisodeStep, SessionPool, TaskSession, pool_key

AGENT_NAME = "bunshin"


class BadRow(AdapterError, ValueError):
    """The dataset row's ``bunshin`` field is missing or wrong: names the field."""


def _plain(value: Any) -> Any:
    """Rows come through numpy object arrays and OmegaConf: plain dicts and lists."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
    except ImportError:
        pass
    return value


def session_for(spec: dict[str, Any]) -> TaskSession:
    """The workspace session a row's ``bunshin`` field asks for."""
    if "task_id" not in spec:
        raise BadRow("the row's bunshin field needs task_id")
    suite = get_suite(spec.get("suite", "webshop"), **dict(spec.get("suite_knobs") or {}))
    limits = spec.get("limits")
    try:
        limits = msgspec.convert(limits, Limits) if isinstance(limits, dict) else limits
    except msgspec.ValidationError as exc:
        raise BadRow(f"bunshin.limits: {exc}") from exc
    state_dir = spec.get("state_dir")
    return TaskSession(suite, find_task(suite, str(spec["task_id"])), backend=spec.get("backend", "cow"),
                       state_dir=Path(state_dir) if state_dir else None, limits=limits,
                       max_steps=int(spec.get("max_turns", 30)))


POOL = SessionPool()  # the rollouts of one task running at once in this process share a session


@register(AGENT_NAME)
class BunshinAgentLoop(AgentLoopBase):
    """One rollout of a suite task, token-in/token-out through verl's server manager."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prompt_length = self.rollout_config.prompt_length
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = _plain(kwargs.get("bunshin"))
        if not isinstance(spec, dict):
            raise BadRow("the row needs a bunshin field: {'task_id': ..., 'suite': ..., ...}")
        key = pool_key({k: v for k, v in spec.items() if k not in ("seed", "max_turns")})
        session = POOL.acquire(key, lambda: session_for(spec))
        episode = uuid4().hex
        try:
            return await self._rollout(session, episode, spec, sampling_params, kwargs)
        finally:
            # a cancelled rollout still waits for its workspace to be gone, then is cancelled
            await run_to_end(POOL.arelease(key, session, episode))

    async def _rollout(self, session: TaskSession, episode: str, spec: dict[str, Any],
                       sampling_params: dict[str, Any], row: dict[str, Any]) -> AgentLoopOutput:
        started = time.monotonic()
        first = await session.areset(int(spec.get("seed", 0)), episode=episode,
                                     max_steps=int(spec.get("max_turns", 30)))
        task = session.task
        messages = list(_plain(row.get("raw_prompt")) or [])
        messages.append({"role": "user", "content": f"{task.instruction}\n\n{first}"})
        prompt_ids = await self.ct_build_initial_tokens(messages)
        initial = len(prompt_ids)
        ids = list(prompt_ids)
        mask: list[int] = []
        logprobs: list[float] = []
        request_id = uuid4().hex
        generate_s = tool_s = 0.0
        turns, result, actions = 0, None, []
        while True:
            t0 = time.monotonic()
            out = await self.server_manager.generate(request_id=request_id, prompt_ids=ids,
                                                     sampling_params=sampling_params)
            generate_s += time.monotonic() - t0
            merged, mask, merged_logprobs = await self.ct_merge_assistant_token(
                ids, out.token_ids, mask, logprobs if out.log_probs else None,
                assistant_logprobs=out.log_probs or None)
            ids = list(merged.token_ids)
            logprobs = list(merged_logprobs) if merged_logprobs is not None else []
            turns += 1
            # verl annotates AgentLoopBase.tokenizer as AutoTokenizer (the factory); it holds the tokenizer it made
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True).strip()  # type: ignore[attr-defined]
            actions.append(text)
            messages.append({"role": "assistant", "content": text})
            t0 = time.monotonic()
            try:
                if len(mask) >= self.response_length:
                    result = await session.agive_up(episode=episode)
                else:
                    result = await session.astep(text, episode=episode)
            except (EnvsError, AdapterTimeout) as exc:  # the workspace failed this rollout: it ends, scored 0,
                # with the reason; the rest of verl's batch goes on
                result = EpisodeStep(observation="", reward=0.0, terminated=False, truncated=True,
                                     info={"error": f"{type(exc).__name__}: {exc}"})
                break
            finally:
                tool_s += time.monotonic() - t0
            if result.terminated or result.truncated:
                break
            previous = list(messages)
            messages.append({"role": "user", "content": result.observation})
            merged, new_mask, merged_logprobs = await self.ct_merge_context_msg(
                previous, messages, ids, mask, logprobs if logprobs else None)
            if len(new_mask) >= self.response_length:  # no room for the observation: out of budget
                result = await session.agive_up(episode=episode)
                break
            ids, mask = list(merged.token_ids), new_mask
            logprobs = list(merged_logprobs) if merged_logprobs else []
        return self._output(ids, initial, mask, logprobs, turns, result, actions, generate_s, tool_s,
                            time.monotonic() - started, task.id)

    def _output(self, ids: list[int], initial: int, mask: list[int], logprobs: list[float], turns: int,
                result: EpisodeStep, actions: list[str], generate_s: float, tool_s: float, wall_s: float,
                task_id: str) -> AgentLoopOutput:
        n = self.response_length
        response_ids = ids[initial:]
        assert len(response_ids) == len(mask), "response ids and mask out of step"
        return AgentLoopOutput(
            prompt_ids=ids[:initial],
            response_ids=response_ids[:n],
            response_mask=mask[:n],
            response_logprobs=logprobs[:n] if logprobs else None,
            reward_score=result.reward,
            num_turns=2 * turns + 1,  # the prompt, then an assistant and an observation (or the end) per turn
            metrics=AgentLoopMetrics(generate_sequences=generate_s, tool_calls=tool_s),
            extra_fields={"turn_scores": [], "tool_rewards": [], "bunshin_task_id": task_id,
                          "bunshin_terminated": result.terminated, "bunshin_truncated": result.truncated,
                          "bunshin_actions": actions, "bunshin_wall_s": round(wall_s, 4),
                          "bunshin_error": result.info.get("error")},
        )
