"""The verl agent loop: real rollouts of an embedded desktop task through verl 0.9.1's own classes.

What runs: verl's ``AgentLoopWorker`` (built from verl's own generated trainer config, on CPU), its registry and
hydra instantiation of our ``BunshinAgentLoop`` (an ``AgentLoopBase`` subclass registered with verl's ``register``),
verl's continuous-token builder, ``AgentLoopOutput``, and the worker's padding and post-processing into a
``DataProto``. What is ours: the agent loop, and the model server: ``ScriptedServer``, a second implementation of
verl's server-manager contract (``LLMServerClient.generate(request_id, prompt_ids=..., sampling_params=...) ->
TokenOutput``), passed where verl passes its own; it reads the prompt's token ids and answers each turn with the
token ids of the next action of a script, with log-probs. The tokenizer is a byte-level BPE trained here (no model
can be downloaded), wrapped as transformers' ``PreTrainedTokenizerFast`` with a chat template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from .adapter_helpers import LIMITS, SMALL, TASK_ID, assert_no_leaks_sync, desktop, reference_actions
from .conftest import host_processes

verl = pytest.importorskip("verl", reason="the trainers extra (./scripts/setup.sh --trainers)")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SPECIAL = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]


def tokenizer_dir(directory: Path, corpus: list[str]) -> Path:
    """A byte-level BPE tokenizer trained on ``corpus``, saved with a model config (no weights) where verl's
    ``HFModelConfig`` loads a model's tokenizer and config from."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIAL,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>",
                                 chat_template=TEMPLATE)
    hf.save_pretrained(directory)
    GPT2Config(n_layer=1, n_head=1, n_embd=8, vocab_size=len(hf), architectures=["GPT2LMHeadModel"],
               bos_token_id=hf.eos_token_id, eos_token_id=hf.eos_token_id,
               pad_token_id=hf.pad_token_id).save_pretrained(directory)
    return directory


def column(values: list) -> np.ndarray:
    """A dataset column as verl holds one: a 1-D object array (numpy would make rows of lists 2-D)."""
    array = np.empty(len(values), dtype=object)
    array[:] = [None] * len(values)
    for i, v in enumerate(values):
        array[i] = v
    return array


def make_server(config, tokenizer, scripts: dict[str, list[str]]):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    assistant = tokenizer.convert_tokens_to_ids("<|assistant|>")

    class ScriptedServer(LLMServerClient):
        """verl's server-manager contract answered from a script: the system prompt names the script, the number
        of assistant turns already in the prompt says which action comes next."""

        def __init__(self) -> None:
            super().__init__(config, load_balancer_handle=None)
            self.requests: list[tuple[str, int]] = []
            self.stalled = asyncio.Event()

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
            self.requests.append((request_id, len(prompt_ids)))
            prompt = tokenizer.decode(prompt_ids)
            script = next(v for k, v in scripts.items() if f"script={k}" in prompt)
            turn = sum(1 for t in prompt_ids if t == assistant) - 1  # the generation prompt's own marker
            if script[turn] is None:  # a server that never answers this turn
                self.stalled.set()
                await asyncio.Event().wait()
            ids = tokenizer.encode(script[turn], add_special_tokens=False) + [tokenizer.eos_token_id]
            return TokenOutput(token_ids=ids, log_probs=[-0.01 * (i + 1) for i in range(len(ids))],
                               stop_reason="completed")

    return ScriptedServer()


def test_verl_runs_rollouts_of_a_desktop_task_token_in_token_out(state_dir, tmp_path, monkeypatch) -> None:
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry

    from bunshin.engine.adapters import verl as adapter

    assert _agent_loop_registry[adapter.AGENT_NAME] == {"_target_": "bunshin.engine.adapters.verl.BunshinAgentLoop"}
    suite = desktop()
    reference = reference_actions(suite)
    scripts = {"reference": reference, "done-at-once": ["DONE"], "wander": ["terminal: pwd"] * 5}
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    config.actor_rollout_ref.model.path = str(tokenizer_dir(tmp_path / "model", [*reference, "terminal: pwd FAIL"]))
    config.actor_rollout_ref.rollout.name = "vllm"
    config.actor_rollout_ref.rollout.prompt_length = 8192
    config.actor_rollout_ref.rollout.response_length = 16384
    worker = AgentLoopWorker(config, llm_client=None)  # verl's own worker: config, tokenizer, registry
    server = make_server(config, worker.tokenizer, scripts)
    worker.llm_client = server
    spec = {"suite": "desktop", "suite_knobs": SMALL, "task_id": TASK_ID, "state_dir": str(state_dir),
            "limits": msgspec.to_builtins(LIMITS), "max_turns": 3}
    rows = [("reference", 1), ("done-at-once", 2), ("wander", 3)]
    batch = DataProto.from_dict(non_tensors={
        "agent_name": column([adapter.AGENT_NAME] * len(rows)),
        "raw_prompt": column([[{"role": "system", "content": f"You operate a desktop. script={name}"}]
                              for name, _ in rows]),
        "bunshin": column([{**spec, "seed": seed, "max_turns": 10 if name == "reference" else 3}
                           for name, seed in rows]),
        "index": np.arange(len(rows)),
    }, meta_info={"global_steps": 1, "validate": False})
    sessions = []

    def recorded(row_spec):  # verl's path is unchanged: we only keep each session made to check it after
        sessions.append(real_session_for(row_spec))
        return sessions[-1]

    real_session_for = adapter.session_for
    monkeypatch.setattr(adapter, "session_for", recorded)
    before = set(host_processes(shells=False))
    out = asyncio.run(worker.generate_sequences(batch))
    # the three rollouts of the task ran at once, in forks of one set-up workspace, closed when the last ended
    assert len(sessions) == 1 and sessions[0].closed
    for s in sessions:
        assert_no_leaks_sync(s.runtime)

    tok = worker.tokenizer
    rewards = out.batch["rm_scores"].sum(-1).tolist()
    # the reference solves it; DONE at once (in a fork of the same set-up workspace, while the reference edits the
    # file in its own) and wandering until the turns run out do not
    assert rewards == [1.0, 0.0, 0.0]
    for i, (name, _) in enumerate(rows):
        mask = out.batch["response_mask"][i].bool()
        responses = out.batch["responses"][i]
        model_text = tok.decode(responses[mask].tolist())
        expected = scripts[name] if name != "wander" else scripts[name][:4]  # 3 steps, then out of turns
        assert model_text == "".join(a + "<|end|>" for a in expected), model_text
        # the observations are in the sequence with mask 0: what the editor and the terminal answered
        observed = tok.decode(responses[~mask & (responses != tok.pad_token_id)].tolist())
        assert {"reference": "<|user|>saved /home/agent/Documents/letter_2.txt<|end|>",
                "done-at-once": "", "wander": "<|user|>/home/agent\n<|end|>"}[name] in observed
        assert (observed == "") == (name == "done-at-once")
        logprobs = out.batch["rollout_log_probs"][i][mask]
        assert logprobs.numel() == int(mask.sum()) and float(logprobs.max()) < 0
    extra = out.non_tensor_batch
    assert list(extra["bunshin_truncated"]) == [False, False, True]
    assert list(extra["bunshin_error"]) == [None, None, None]
    assert list(extra["bunshin_actions"][0]) == reference
    assert not (set(host_processes(shells=False)) - before), "a rollout left a workspace host behind"
    assert json.dumps(msgspec.to_builtins(list(extra["bunshin_task_id"]))) == json.dumps([TASK_ID] * 3)


def worker_for(tmp_path: Path, scripts: dict[str, list]):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    config.actor_rollout_ref.model.path = str(tokenizer_dir(tmp_path / "model", ["terminal: pwd FAIL DONE"]))
    config.actor_rollout_ref.rollout.name = "vllm"
    config.actor_rollout_ref.rollout.prompt_length = 8192
    config.actor_rollout_ref.rollout.response_length = 16384
    worker = AgentLoopWorker(config, llm_client=None)
    worker.llm_client = make_server(config, worker.tokenizer, scripts)
    return worker


def one_row(spec) -> object:
    from verl import DataProto

    from bunshin.engine.adapters import verl as adapter

    return DataProto.from_dict(non_tensors={
        "agent_name": column([adapter.AGENT_NAME]),
        "raw_prompt": column([[{"role": "system", "content": "script=stall"}]]),
        "bunshin": column([spec]),
        "index": np.arange(1),
    }, meta_info={"global_steps": 1, "validate": False})


def test_a_cancelled_rollout_closes_its_workspaces_and_a_bad_row_is_named(state_dir, tmp_path, monkeypatch) -> None:
    from bunshin.engine.adapters import verl as adapter

    worker = worker_for(tmp_path, {"stall": ["terminal: pwd", None]})
    sessions = []
    real_session_for = adapter.session_for
    monkeypatch.setattr(adapter, "session_for", lambda spec: sessions.append(real_session_for(spec)) or sessions[-1])
    spec = {"suite": "desktop", "suite_knobs": SMALL, "task_id": TASK_ID, "state_dir": str(state_dir),
            "limits": msgspec.to_builtins(LIMITS)}

    async def cancel_mid_rollout() -> None:
        task = asyncio.ensure_future(worker.generate_sequences(one_row(spec)))
        await asyncio.wait_for(worker.llm_client.stalled.wait(), 60)  # one step done, the model is "thinking"
        assert sessions and not sessions[0].closed
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sessions[0].closed  # closed before the cancellation reached the caller

    asyncio.run(cancel_mid_rollout())
    assert_no_leaks_sync(sessions[0].runtime)

    with pytest.raises(adapter.BadRow, match="task_id"):
        asyncio.run(worker.generate_sequences(one_row({"suite": "desktop"})))
