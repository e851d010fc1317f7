"""The OpenAI-compatible policy against a real scripted model server (``tests/openai_server.py``, its own process,
spoken to over HTTP): actions from tool calls and from text, token ids and log-probs as vLLM and SGLang return
them, what the request carries, model discovery, and every server failure as a ``PolicyError`` naming the URL.
No workspace runtime is needed."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.desktop.tools import SCHEMA as DESKTOP_SCHEMA
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.webshop.tools import SCHEMA as WEBSHOP_SCHEMA
from bunshin.policies.base import ContextLengthExceeded, Decision, PolicyContext, PolicyError, ServerConfigError
from bunshin.policies.openai import ACT_TOOL, SUITE_TOOL_PROMPTS, OpenAIPolicy, strip_fences, suite_tools
from tests.openai_server import logprob_of

from .conftest import live_processes

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ScriptedServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    script: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def chat_bodies(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests() if r["method"] == "POST"]


def processes_running(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (a test's own script file)."""
    return [pid for pid, cmd, state in live_processes() if marker.encode() in cmd and state != "Z"]


@pytest.fixture
def openai_server(tmp_path: Path) -> Iterator[Callable[..., ScriptedServer]]:
    """Factory: ``server = openai_server(replies, flavor=..., models=...)`` starts the scripted server process;
    every one started is terminated after the test, and none may be left running."""
    started: list[ScriptedServer] = []

    def start(replies: list[dict[str, Any]], *, flavor: str = "vllm", models: list[str] | None = None,
              tool_parser: str = "hermes", max_model_len: int | None = None) -> ScriptedServer:
        n = len(started)
        script, log = tmp_path / f"script-{n}.json", tmp_path / f"requests-{n}.jsonl"
        script.write_text(json.dumps({"replies": replies, **({"models": models} if models is not None else {})}))
        extra = ["--max-model-len", str(max_model_len)] if max_model_len is not None else []
        with open(tmp_path / f"server-{n}.stderr", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.openai_server", "--port", "0", "--script",
                                     str(script), "--log", str(log), "--flavor", flavor, "--tool-parser",
                                     tool_parser, *extra],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=err)
        server = ScriptedServer(proc=proc, port=0, log=log, script=script)
        started.append(server)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            raise RuntimeError(f"the scripted server did not start: {line!r}; stderr: "
                               f"{(tmp_path / f'server-{n}.stderr').read_text()}")
        server.port = int(line)
        return server

    try:
        yield start
    finally:
        for server in started:
            if server.proc.poll() is None:
                server.proc.terminate()
            try:
                server.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=5)
            if server.proc.stdout is not None:
                server.proc.stdout.close()
        for server in started:
            assert server.proc.returncode is not None
            assert not processes_running(str(server.script)), f"server process left behind: {server.script}"


def context(suite: str = "webshop", *, observations: list[str] | None = None, actions: list[str] | None = None,
            instruction: str = "Find the price of the Acme Blender.") -> PolicyContext:
    observations = observations if observations is not None else ["[1] RootWebArea 'One Stop Market'"]
    actions = actions if actions is not None else []
    return PolicyContext(suite=suite, task_id="t-0", group_id="g-0", sample=0, seed=7, instruction=instruction,
                         reference=[], observations=observations, actions=actions, step=len(actions))


def check_aligned(decision: Decision) -> None:
    """Token ids and log-probs are per token of the same response (the fake model's log-prob is a function of
    the token id)."""
    assert decision.token_ids and decision.logprobs
    assert len(decision.token_ids) == len(decision.logprobs)
    assert decision.logprobs == [logprob_of(t) for t in decision.token_ids]


# -- replies --------------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_tool_call_becomes_the_action_with_token_ids_and_logprobs(openai_server) -> None:
    server = openai_server([{"action": "click [12]"}, {"action": "stop [$25.99]", "content": "Found it."}])
    policy = OpenAIPolicy(server.url, "test-model")
    try:
        first = await policy.decide(context())
        second = await policy.decide(context(observations=["a", "b"], actions=["click [12]"]))
    finally:
        await policy.close()
    assert first.action == "click [12]"
    assert second.action == "stop [$25.99]"  # the tool call wins over the content beside it
    for d in (first, second):
        check_aligned(d)
        assert d.prompt_token_ids and all(isinstance(t, int) for t in d.prompt_token_ids)
        assert d.reasoning_s > 0
    assert len(second.prompt_token_ids or []) > len(first.prompt_token_ids or [])  # the history is in the prompt
    assert policy.last_usage is not None and policy.last_usage["completion_tokens"] == len(second.token_ids or [])


@pytest.mark.asyncio
async def test_token_ids_from_logprob_tokens_when_the_choice_has_none(openai_server) -> None:
    """vLLM before return_token_ids: the ids come from log-prob tokens written "token_id:N"."""
    server = openai_server([{"action": "click [3]"}, {"action": "click [3]"}])
    both = OpenAIPolicy(server.url, "test-model")
    from_logprobs = OpenAIPolicy(server.url, "test-model", extra_body={"return_token_ids": False})
    try:
        reference = await both.decide(context())
        decision = await from_logprobs.decide(context())
    finally:
        await both.close()
        await from_logprobs.close()
    assert decision.action == "click [3]"
    check_aligned(decision)
    assert decision.token_ids == reference.token_ids
    assert decision.prompt_token_ids is None  # vLLM sends those only with return_token_ids
    body = server.chat_bodies()[1]
    assert body["return_token_ids"] is False and body["return_tokens_as_token_ids"] is True


@pytest.mark.asyncio
async def test_sglang_token_ids_and_prompt_ids_on_the_choice(openai_server) -> None:
    server = openai_server([{"action": "scroll [down]"}], flavor="sglang")
    policy = OpenAIPolicy(server.url, "test-model")
    try:
        decision = await policy.decide(context())
    finally:
        await policy.close()
    assert decision.action == "scroll [down]"
    check_aligned(decision)
    assert decision.prompt_token_ids


@pytest.mark.asyncio
async def test_without_token_ids_or_logprobs(openai_server) -> None:
    server = openai_server([{"action": "DONE"}, {"action": "FAIL"}])
    policy = OpenAIPolicy(server.url, "test-model", token_ids=False)
    bare = OpenAIPolicy(server.url, "test-model", token_ids=False, logprobs=False)
    try:
        decision = await policy.decide(context("desktop"))
        plain = await bare.decide(context("desktop"))
    finally:
        await policy.close()
        await bare.close()
    assert decision.action == "DONE" and decision.token_ids is None and decision.prompt_token_ids is None
    assert decision.logprobs and all(lp <= 0 for lp in decision.logprobs)
    assert plain.action == "FAIL" and plain.logprobs is None and plain.token_ids is None
    first, second = server.chat_bodies()
    assert first["logprobs"] is True
    for key in ("return_token_ids", "return_prompt_token_ids", "return_tokens_as_token_ids"):
        assert key not in first and key not in second
    assert "logprobs" not in second


@pytest.mark.asyncio
async def test_content_reply_with_a_code_fence_is_stripped(openai_server) -> None:
    desktop_json = '{"name": "terminal", "args": {"command": "ls -la"}}'
    server = openai_server([
        {"content": "The search box is [7].\n```\ntype [7] [blender] [1]\n```"},
        {"content": f"```json\n{desktop_json}\n```"},
        {"content": "<think>the file is saved</think>\n```DONE```"},
        {"content": "  terminal: cat notes.txt \n"},
    ])
    policy = OpenAIPolicy(server.url, "test-model", tools=[])
    try:
        actions = [(await policy.decide(context(suite))).action
                   for suite in ("webshop", "desktop", "desktop", "desktop")]
    finally:
        await policy.close()
    assert actions == ["type [7] [blender] [1]", desktop_json, "DONE", "terminal: cat notes.txt"]
    body = server.chat_bodies()[0]
    assert "tools" not in body and "tool_choice" not in body  # tools=[]: plain-text actions
    assert "```" in body["messages"][0]["content"]  # and the prompt asks for a fenced action


@pytest.mark.asyncio
async def test_other_tool_calls_and_malformed_arguments(openai_server) -> None:
    sheet_tool = {"type": "function", "function": {"name": "sheet_set", "parameters": {
        "type": "object", "properties": {"cell": {"type": "string"}, "value": {"type": "string"}}}}}
    server = openai_server([
        {"tool": "sheet_set", "arguments": {"cell": "B2", "value": "42"}},
        {"tool": "act", "arguments": "{\"action\": \"click [1]\""},  # the model's JSON is cut off
        {"content": None},  # neither content nor a tool call
    ])
    policy = OpenAIPolicy(server.url, "test-model", tools=[ACT_TOOL, sheet_tool])
    try:
        call = await policy.decide(context("desktop"))
        broken = await policy.decide(context("desktop"))
        empty = await policy.decide(context("desktop"))
    finally:
        await policy.close()
    assert call.action == ToolCall(name="sheet_set", args={"cell": "B2", "value": "42"})
    assert broken.action == "{\"action\": \"click [1]\""  # the suite will report a malformed action
    assert empty.action == ""
    assert server.chat_bodies()[0]["tools"] == [ACT_TOOL, sheet_tool]


@pytest.mark.asyncio
async def test_the_suite_s_own_tools_generated_from_its_schema(openai_server) -> None:
    server = openai_server([
        {"tool": "click", "arguments": {"element_id": 12}},
        {"tool": "type", "arguments": {"element_id": 7, "text": "blender"}, "content": "Searching."},
        {"tool": "stop", "arguments": {"answer": "$25.99"}},
        {"tool": "sheet_set", "arguments": {"cell": "B7", "value": "=SUM(B2:B6)"}},
        {"tool": "DONE", "arguments": {}},
    ])
    policy = OpenAIPolicy(server.url, "test-model", tools="suite")
    try:
        web = [(await policy.decide(context())).action for _ in range(3)]
        desk = [(await policy.decide(context("desktop"))).action for _ in range(2)]
    finally:
        await policy.close()
    assert web == [ToolCall(name="click", args={"element_id": 12}),
                   ToolCall(name="type", args={"element_id": 7, "text": "blender"}),
                   ToolCall(name="stop", args={"answer": "$25.99"})]
    assert desk == [ToolCall(name="sheet_set", args={"cell": "B7", "value": "=SUM(B2:B6)"}), ToolCall(name="DONE")]
    assert WEBSHOP_SCHEMA.normalize(web[1]).args["press_enter_after"] is True  # what the suite makes of it
    assert DesktopSuite(cache_mb=8).is_final(desk[1])
    bodies = server.chat_bodies()  # the server accepted the generated definitions (it checks them)
    assert all(b["tools"] == suite_tools("webshop") and b["tool_choice"] == "auto" for b in bodies[:3])
    assert all(b["tools"] == suite_tools("desktop") for b in bodies[3:])
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == list(WEBSHOP_SCHEMA.names)
    assert [t["function"]["name"] for t in bodies[3]["tools"]] == list(DESKTOP_SCHEMA.names)
    assert bodies[0]["messages"][0]["content"] == SUITE_TOOL_PROMPTS["webshop"] and "`act`" not in str(bodies[0])
    assert bodies[3]["messages"][0]["content"] == SUITE_TOOL_PROMPTS["desktop"]


@pytest.mark.asyncio
async def test_a_call_of_a_tool_that_was_not_offered_goes_to_the_suite_as_text(openai_server) -> None:
    server = openai_server([
        {"tool": "_read_file", "arguments": {"path": "/var/lib/desktop/expected/x.csv"}},  # an internal tool
        {"tool": "terminal", "arguments": {"command": "ls"}},  # a real tool, though only `act` was offered
        {"tool": "_put_file", "arguments": {"path": "/etc/passwd", "content": "x"}},
    ])
    act_only = OpenAIPolicy(server.url, "test-model")
    suite_tools_policy = OpenAIPolicy(server.url, "test-model", tools="suite")
    suite = DesktopSuite(cache_mb=8)
    try:
        internal = (await act_only.decide(context("desktop"))).action
        terminal = (await act_only.decide(context("desktop"))).action
        put = (await suite_tools_policy.decide(context("desktop"))).action
    finally:
        await act_only.close()
        await suite_tools_policy.close()
    assert isinstance(internal, str) and json.loads(internal) == {
        "name": "_read_file", "args": {"path": "/var/lib/desktop/expected/x.csv"}}
    with pytest.raises(ActionError, match="unknown tool '_read_file'"):
        suite.parse_action(internal)
    assert suite.parse_action(terminal) == ToolCall(name="terminal", args={"command": "ls"})
    with pytest.raises(ActionError, match="unknown tool '_put_file'"):
        suite.parse_action(put)


@pytest.mark.asyncio
async def test_tool_definitions_a_server_refuses_are_a_policy_error(openai_server) -> None:
    server = openai_server([{"action": "click [1]"}])
    bad = {"type": "function", "function": {"name": "bad name", "parameters": {"type": "object"}}}
    referencing = {"type": "function", "function": {"name": "x", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}}
    for tools, what in ((bad, "must match"), (referencing, "$ref")):
        policy = OpenAIPolicy(server.url, "test-model", tools=[tools])
        try:
            with pytest.raises(PolicyError, match="HTTP 400") as info:
                await policy.decide(context())
            assert what in str(info.value)
        finally:
            await policy.close()
    unknown = OpenAIPolicy(server.url, "test-model", tools="suite")
    try:
        with pytest.raises(PolicyError, match="no tool schema for suite 'chess'"):
            await unknown.decide(context("chess"))
    finally:
        await unknown.close()
    with pytest.raises(ValueError, match="tools must be"):
        OpenAIPolicy(server.url, "test-model", tools="all")  # type: ignore[arg-type]


# -- the request ----------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_request_carries_prompt_instruction_observation_tools_and_flags(openai_server) -> None:
    server = openai_server([{"action": "click [4]"}, {"action": "terminal: ls"}])
    policy = OpenAIPolicy(server.url, "test-model", api_key="sk-test", temperature=0.7, max_tokens=99,
                          history_turns=1, extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}})
    ctx = context(observations=["OBS-ZERO", "OBS-ONE", "OBS-TWO"], actions=["click [1]", "click [2]"])
    try:
        await policy.decide(ctx)
        await policy.decide(context("desktop", instruction="Sum column B of sales.csv.",
                                    observations=["Terminal window open"]))
    finally:
        await policy.close()
    (web, desk) = server.chat_bodies()
    assert web["model"] == "test-model" and web["temperature"] == 0.7 and web["max_tokens"] == 99
    assert web["tools"] == [ACT_TOOL] and web["tool_choice"] == "auto"
    assert web["logprobs"] is True
    assert web["return_token_ids"] is True and web["return_tokens_as_token_ids"] is True
    assert web["return_prompt_token_ids"] is True
    assert web["top_k"] == 5 and web["chat_template_kwargs"] == {"enable_thinking": False}  # extra_body merged
    roles = [m["role"] for m in web["messages"]]
    assert roles == ["system", "user", "assistant", "user"]  # one earlier turn kept (history_turns=1)
    system, earlier, action, latest = (m["content"] for m in web["messages"])
    assert "click [id]" in system and "stop [answer]" in system and "`act` tool" in system
    assert "OBS-ONE" in earlier and "1 earlier steps not shown" in earlier
    assert action == "click [2]"
    assert "Find the price of the Acme Blender." in latest and "OBS-TWO" in latest
    assert "OBS-ZERO" not in json.dumps(web["messages"])
    assert "terminal:" in desk["messages"][0]["content"] and "DONE" in desk["messages"][0]["content"]
    assert WEBSHOP_SCHEMA.listing() in system  # the actions are listed from the schema, not by hand
    assert DESKTOP_SCHEMA.listing() in desk["messages"][0]["content"]
    assert [m["role"] for m in desk["messages"]] == ["system", "user"]
    assert "Sum column B of sales.csv." in desk["messages"][-1]["content"]
    assert "Terminal window open" in desk["messages"][-1]["content"]
    assert all(r["authorization"] == "Bearer sk-test" for r in server.requests())


@pytest.mark.asyncio
async def test_custom_system_prompt_and_api_key_from_the_environment(openai_server, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server = openai_server([{"action": "click [1]"}])
    policy = OpenAIPolicy(server.url, "test-model", system_prompt="Be brief.")
    try:
        await policy.decide(context())
    finally:
        await policy.close()
    assert server.chat_bodies()[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert server.requests()[0]["authorization"] == "Bearer sk-from-env"


@pytest.mark.asyncio
async def test_model_discovered_once_from_models(openai_server) -> None:
    server = openai_server([{"action": "click [1]"}, {"action": "click [2]"}, {"action": "click [3]"}],
                           models=["served-a", "served-b"])
    policy = OpenAIPolicy(server.url + "/")  # a trailing slash is fine
    try:
        decisions = await asyncio.gather(*(policy.decide(context()) for _ in range(3)))
    finally:
        await policy.close()
    assert sorted(d.action for d in decisions) == ["click [1]", "click [2]", "click [3]"]
    assert policy.model == "served-a"
    gets = [r for r in server.requests() if r["method"] == "GET"]
    assert [g["path"] for g in gets] == ["/v1/models"]  # asked once, though three decisions raced
    assert [b["model"] for b in server.chat_bodies()] == ["served-a"] * 3


@pytest.mark.asyncio
async def test_no_model_listed_is_a_policy_error(openai_server) -> None:
    server = openai_server([], models=[])
    policy = OpenAIPolicy(server.url)
    try:
        with pytest.raises(PolicyError, match="no model listed") as info:
            await policy.decide(context())
    finally:
        await policy.close()
    assert f"{server.url}/models" in str(info.value)


# -- failures -------------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_http_error_malformed_body_and_missing_choices_raise_policy_error(openai_server) -> None:
    server = openai_server([
        {"status": 500, "message": "CUDA out of memory"},
        {"body": "{\"id\": \"chatcmpl-1\", \"choices\": [{\"message\""},
        {"body": {"id": "chatcmpl-2", "object": "chat.completion", "usage": {}}},
        {"body": {"choices": [{"index": 0, "finish_reason": "stop"}]}},
        {"status": 400, "message": "\"auto\" tool choice requires --enable-auto-tool-choice"},
    ])
    policy = OpenAIPolicy(server.url, "test-model", retries=0)  # (retries are tested below)
    url = f"{server.url}/chat/completions"
    try:
        expected = ["HTTP 500: CUDA out of memory", "not valid JSON", "no choices", "has no message",
                    "HTTP 400: \"auto\" tool choice requires"]
        for what in expected:
            with pytest.raises(PolicyError) as info:
                await policy.decide(context())
            assert url in str(info.value) and what in str(info.value)
    finally:
        await policy.close()


@pytest.mark.asyncio
async def test_server_slower_than_timeout_raises_policy_error(openai_server) -> None:
    server = openai_server([{"action": "click [1]", "delay": 5}])
    policy = OpenAIPolicy(server.url, "test-model", timeout_s=0.5, retries=0)
    started = time.monotonic()
    try:
        with pytest.raises(PolicyError, match=r"no reply within timeout_s=0.5s") as info:
            await policy.decide(context())
    finally:
        await policy.close()
    assert time.monotonic() - started < 3
    assert f"{server.url}/chat/completions" in str(info.value)


@pytest.mark.asyncio
async def test_unreachable_server_raises_policy_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "test-model", timeout_s=5, retries=0)
    try:
        with pytest.raises(PolicyError, match=f"http://127.0.0.1:{port}/v1/chat/completions"):
            await policy.decide(context())
    finally:
        await policy.close()


# -- the session ----------------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_close_closes_the_session(openai_server) -> None:
    server = openai_server([{"action": "click [1]"}, {"action": "click [2]"}])
    policy = OpenAIPolicy(server.url, "test-model")
    assert policy._session is None  # created lazily, on the loop that first needs it
    await policy.decide(context())
    session = policy._session
    assert session is not None and not session.closed
    await policy.close()
    assert session.closed and policy._session is None
    await policy.close()  # twice is fine
    assert (await policy.decide(context())).action == "click [2]"  # a new session after close
    again = policy._session
    assert again is not None and again is not session
    await policy.close()
    assert again.closed


@pytest.mark.asyncio
async def test_concurrent_decisions_share_one_session(openai_server) -> None:
    server = openai_server([{"action": f"click [{i}]", "delay": 0.2} for i in range(8)])
    policy = OpenAIPolicy(server.url, "test-model")
    try:
        started = time.monotonic()
        decisions = await asyncio.gather(*(policy.decide(context()) for _ in range(8)))
        elapsed = time.monotonic() - started
    finally:
        await policy.close()
    assert sorted(d.action for d in decisions) == sorted(f"click [{i}]" for i in range(8))
    assert elapsed < 1.2  # in parallel, not one after another (8 x 0.2 s)


# -- units ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "action"), [
    ("click [12]", "click [12]"),
    ("```click [12]```", "click [12]"),
    ("```\nclick [12]\n```", "click [12]"),
    ("Let me look.\n```text\nscroll [down]\n```", "scroll [down]"),
    ("Earlier: ```click [1]```. Now:\n```\nstop [42]\n```", "stop [42]"),
    ("```DONE\n```", "DONE"),
    ("```terminal: ls -la\n```", "terminal: ls -la"),
    ("<think>hmm\n```click [9]```</think>```FAIL```", "FAIL"),
    ("<think>never finished", ""),
    ("I will click.\n```\nclick [5]", "click [5]"),
    ("```json\n{\"name\": \"DONE\"}", '{"name": "DONE"}'),
    ("```stop [7]", "stop [7]"),
])
def test_strip_fences(text: str, action: str) -> None:
    assert strip_fences(text) == action


def test_history_alignment_and_truncation() -> None:
    policy = OpenAIPolicy("http://127.0.0.1:1/v1", "m", history_turns=4, history_observation_chars=10)
    messages = policy.messages(context(observations=["A" * 30, "B", "C"], actions=["x", "y"]))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[1]["content"].startswith("OBSERVATION:\n" + "A" * 10) and "20 more characters" in \
        messages[1]["content"]
    assert [messages[2]["content"], messages[4]["content"]] == ["x", "y"]
    assert messages[-1]["content"].endswith("OBSERVATION:\nC")
    # no history at all, and a first step with no observation yet
    assert len(OpenAIPolicy("http://h/v1", "m", history_turns=0).messages(context(observations=["a", "b"],
                                                                                  actions=["x"]))) == 2
    assert OpenAIPolicy("http://h/v1", "m").messages(context(observations=[]))[-1]["content"].endswith(
        "OBSERVATION:\n")


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="base_url"):
        OpenAIPolicy("127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="history_turns"):
        OpenAIPolicy("http://h/v1", history_turns=-1)
    assert OpenAIPolicy("http://h/v1/", api_key="k").chat_url == "http://h/v1/chat/completions"


# -- token-in/token-out: the conversation, finish reasons, retries, the server's set-up ------------------------------


def advance(ctx: PolicyContext, decision: Decision, observation: str) -> None:
    """What the episode does after a decision was carried out (``Episode.record``)."""
    ctx.replies.append(decision.reply)
    ctx.actions.append(decision.action if isinstance(decision.action, str) else decision.action.name)
    ctx.observations.append(observation)
    ctx.step += 1


@pytest.mark.asyncio
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_the_conversation_grows_by_appending_with_tool_call_ids(openai_server, flavor: str) -> None:
    server = openai_server([{"action": "click [12]", "content": "Opening it."}, {"action": "type [3] [x] [1]"},
                            {"action": "stop [$25.99]"}], flavor=flavor)
    policy = OpenAIPolicy(server.url, "test-model")
    ctx = context(observations=["PAGE-ONE"], actions=[])
    decisions = []
    try:
        for observation in ("PAGE-TWO", "PAGE-THREE", None):
            decisions.append(await policy.decide(ctx))
            if observation is not None:
                advance(ctx, decisions[-1], observation)
    finally:
        await policy.close()
    bodies = server.chat_bodies()
    for k in range(2):
        before, after = bodies[k]["messages"], bodies[k + 1]["messages"]
        assert after[:len(before)] == before  # appended to, never rewritten
        assistant, tool = after[len(before):]
        call = assistant["tool_calls"][0]
        assert assistant["role"] == "assistant" and call["function"]["name"] == "act"
        assert call["id"].startswith("chatcmpl-tool-") and tool == {
            "role": "tool", "tool_call_id": call["id"], "content": ["PAGE-TWO", "PAGE-THREE"][k]}
        assert json.loads(call["function"]["arguments"]) == {"action": decisions[k].action}
    assert bodies[1]["messages"][2]["content"] == "Opening it."  # the content beside the call goes back too
    for k in range(2):  # each prompt starts with the previous prompt and its completion, token for token
        prompt, completion, following = (decisions[k].prompt_token_ids, decisions[k].token_ids,
                                         decisions[k + 1].prompt_token_ids)
        assert prompt and completion and following
        assert following[:len(prompt) + len(completion)] == prompt + completion
        assert len(following) > len(prompt) + len(completion)  # and the observation after them
    assert [d.finish_reason for d in decisions] == ["tool_calls"] * 3
    seeds = [b["seed"] for b in bodies]  # per turn: they differ, and the same sample and step give the same
    assert len(set(seeds)) == 3 and seeds[0] == OpenAIPolicy.seed_for(context())
    assert seeds[1] == OpenAIPolicy.seed_for(context(observations=["a", "b"], actions=["click [12]"]))


@pytest.mark.asyncio
async def test_plain_text_actions_go_back_as_assistant_content_and_user_observations(openai_server) -> None:
    server = openai_server([{"content": "I will click.\n```\nclick [4]\n```"}, {"content": "```\nstop [1]\n```"}])
    policy = OpenAIPolicy(server.url, "test-model", tools=[])
    ctx = context()
    try:
        first = await policy.decide(ctx)
        advance(ctx, first, "PAGE-TWO")
        second = await policy.decide(ctx)
    finally:
        await policy.close()
    assert first.action == "click [4]" and second.action == "stop [1]"
    messages = server.chat_bodies()[1]["messages"]
    assert messages[2:] == [{"role": "assistant", "content": "I will click.\n```\nclick [4]\n```"},
                            {"role": "user", "content": "OBSERVATION:\nPAGE-TWO"}]
    assert first.prompt_token_ids and first.token_ids and second.prompt_token_ids
    assert second.prompt_token_ids[:len(first.prompt_token_ids) + len(first.token_ids)] == \
        first.prompt_token_ids + first.token_ids


@pytest.mark.asyncio
async def test_a_length_finish_keeps_its_tokens(openai_server) -> None:
    server = openai_server([{"action": "click [12]", "finish": "length"},
                            {"content": "one two three four five six seven"}])
    policy = OpenAIPolicy(server.url, "test-model")
    short = OpenAIPolicy(server.url, "test-model", max_tokens=3, tools=[])
    try:
        cut = await policy.decide(context())
        capped = await short.decide(context())
    finally:
        await policy.close()
        await short.close()
    assert cut.finish_reason == "length" and cut.token_ids and cut.logprobs and cut.prompt_token_ids
    assert isinstance(cut.action, str) and "<tool_call>" in cut.action  # the cut text, no tool call parsed
    assert capped.finish_reason == "length" and capped.token_ids and len(capped.token_ids) == 3
    assert server.chat_bodies()[1]["max_tokens"] == 3


@pytest.mark.asyncio
@pytest.mark.parametrize(("flavor", "message"), [
    ("vllm", "This model's maximum context length is 60 tokens"),
    ("sglang", "Requested token count exceeds the model's maximum context length of 60 tokens"),
])
async def test_the_context_length_error_of_each_server(openai_server, flavor: str, message: str) -> None:
    server = openai_server([{"action": "click [1]"}], flavor=flavor, max_model_len=60)
    policy = OpenAIPolicy(server.url, "test-model", max_tokens=8, tools=[], retry_backoff_s=0.01)
    try:
        with pytest.raises(ContextLengthExceeded, match="HTTP 400") as info:
            await policy.decide(context())
    finally:
        await policy.close()
    assert message in str(info.value) and "{" not in str(info.value)  # the message, out of either error shape
    assert len(server.chat_bodies()) == 1  # a 400 is never retried


@pytest.mark.asyncio
async def test_transient_errors_are_retried_and_a_400_is_not(openai_server) -> None:
    server = openai_server([{"status": 503}, {"drop": True}, {"status": 429}, {"status": 502},
                            {"action": "click [7]"}, {"status": 400, "message": "bad request"}, {"action": "x"}])
    policy = OpenAIPolicy(server.url, "test-model", retries=4, retry_backoff_s=0.01)
    try:
        decision = await policy.decide(context())
        with pytest.raises(PolicyError, match="HTTP 400: bad request"):
            await policy.decide(context())
    finally:
        await policy.close()
    assert decision.action == "click [7]"
    assert len(server.chat_bodies()) == 6  # five tries for the first decision, one for the second
    assert len({json.dumps(b, sort_keys=True) for b in server.chat_bodies()[:5]}) == 1  # the same request each time


@pytest.mark.asyncio
async def test_retries_are_bounded_in_count_and_in_time(openai_server) -> None:
    server = openai_server([{"status": 503, "message": "overloaded"}] * 40)
    by_count = OpenAIPolicy(server.url, "test-model", retries=3, retry_backoff_s=0.01)
    by_time = OpenAIPolicy(server.url, "test-model", retries=100, retry_backoff_s=0.1, retry_max_s=1.0)
    try:
        with pytest.raises(PolicyError, match=r"HTTP 503: overloaded \(after 4 attempts"):
            await by_count.decide(context())
        assert len(server.chat_bodies()) == 4
        started = time.monotonic()
        with pytest.raises(PolicyError, match="HTTP 503") as info:
            await by_time.decide(context())
        elapsed = time.monotonic() - started
    finally:
        await by_count.close()
        await by_time.close()
    attempts = len(server.chat_bodies()) - 4
    assert elapsed < 1.5 and 3 <= attempts < 10, (elapsed, attempts)  # backoff 0.1, 0.2, 0.4 (jittered)...
    assert f"after {attempts} attempts" in str(info.value)


@pytest.mark.asyncio
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_a_server_without_a_tool_parser_is_a_server_config_error(openai_server, flavor: str) -> None:
    server = openai_server([{"action": "click [1]"}, {"tool": "act", "arguments": "{\"action\": \"click [2]"}],
                           flavor=flavor, tool_parser="none")
    policy = OpenAIPolicy(server.url, "test-model", retries=0)
    try:
        with pytest.raises(ServerConfigError, match="--enable-auto-tool-choice --tool-call-parser") as info:
            await policy.decide(context())
        assert "SGLang with --tool-call-parser" in str(info.value)
        with pytest.raises(ServerConfigError):  # known now: the server is not asked again
            await policy.decide(context())
    finally:
        await policy.close()
    body = server.chat_bodies()[0]
    assert body["tool_choice"] == "auto" and body["tools"] == [ACT_TOOL] and len(server.chat_bodies()) == 1
    if flavor == "vllm":
        assert '"auto" tool choice requires' in str(info.value)
        return
    # a tool call whose JSON the model broke is the model's mistake, not the server's: a malformed action
    fresh = OpenAIPolicy(server.url, "test-model", retries=0)
    try:
        broken = await fresh.decide(context())
    finally:
        await fresh.close()
    assert isinstance(broken.action, str) and "click [2]" in broken.action


@pytest.mark.asyncio
async def test_check_is_a_preflight_of_the_served_models(openai_server) -> None:
    server = openai_server([], models=["served-a", "served-b"])
    found, named, wrong = OpenAIPolicy(server.url), OpenAIPolicy(server.url, "served-b"), OpenAIPolicy(server.url,
                                                                                                         "other")
    try:
        await found.check()
        await named.check()
        with pytest.raises(ServerConfigError, match="does not serve model 'other'"):
            await wrong.check()
    finally:
        for p in (found, named, wrong):
            await p.close()
    assert found.model == "served-a" and named.model == "served-b"
    assert server.chat_bodies() == []  # nothing generated


@pytest.mark.asyncio
async def test_check_refuses_a_server_that_serves_no_model(openai_server) -> None:
    empty = openai_server([], models=[])
    nothing = OpenAIPolicy(empty.url)
    try:
        with pytest.raises(ServerConfigError, match="no model listed"):
            await nothing.check()
    finally:
        await nothing.close()


@pytest.mark.asyncio
async def test_a_timeout_and_a_refused_connection_are_retried(openai_server) -> None:
    server = openai_server([{"action": "click [1]", "delay": 2}, {"action": "click [2]"}])
    policy = OpenAIPolicy(server.url, "test-model", timeout_s=0.3, retries=2, retry_backoff_s=0.01)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "test-model", retries=2, retry_backoff_s=0.01)
    try:
        decision = await policy.decide(context())
        with pytest.raises(PolicyError, match=r"ClientConnectorError.*\(after 3 attempts"):
            await refused.decide(context())
    finally:
        await policy.close()
        await refused.close()
    assert decision.action == "click [2]" and len(server.chat_bodies()) == 2  # the slow reply was given up on
