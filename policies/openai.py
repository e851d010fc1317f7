"""A policy that asks a model server: an OpenAI-compatible chat-completions client (vLLM, SGLang) with tool calling.

Owns: ``OpenAIPolicy`` (the conversation built from a ``PolicyContext``, the request, and reading the reply back
into a ``Decision`` with the response's token ids, log-probs and finish reason when the server returns them). The
prompts and tools it offers (``DEFAULT_PROMPTS``, ``ACT_TOOL``, ``suite_tools``...) are ``prompts.py``'s, re-exported
here.
The conversation grows by appending (``OpenAIPolicy.messages``, a pure function of the ``PolicyContext``, whose
``replies`` hold the assistant messages the server returned): assistant ``tool_calls`` answered by ``role: tool``
messages with their ``tool_call_id``, so each turn's prompt tokens start with the previous turn's prompt and
completion, and ``engine/training.py`` can build a trainer's record from the token ids the server returned.
Failures: a transient one (connection refused or reset, a timeout, HTTP 429/500/502/503/504) is retried within a
bound (count and total time, exponential backoff with a seeded jitter), never an HTTP 400; what is left is a
``PolicyError`` naming the URL and the problem, which ends that rollout with ``policy_error``; a prompt longer than
the model's context (vLLM's and SGLang's HTTP 400) is ``ContextLengthExceeded`` (``context_length``, scored as it
stands); a server without a tool parser (vLLM's HTTP 400 for ``tool_choice: "auto"``, SGLang's tool-call markup
returned as text) is ``ServerConfigError``, naming the flags to add, which ends the run on the first request.
Must never: hide a server's failure, retry an HTTP 400, or keep per-rollout state (the context carries it). A reply
that is well formed but holds no usable action is not the server's failure: its text goes back as the action and
the suite reports it as a malformed action.

What is sent to ``POST {base_url}/chat/completions``::

    {"model": ..., "messages": [...], "temperature": ..., "max_tokens": ...,
     "tools": [ACT_TOOL], "tool_choice": "auto",        # unless tools=[] (then neither is sent);
                                                         #   tools="suite": suite_tools(suite)
     "seed": ...,                                        # per turn, from the sample's seed and the step
     "logprobs": true, "top_logprobs": 0,                # unless logprobs=False (llama.cpp needs top_logprobs)
     "return_token_ids": true,                           # vLLM >= 0.10.2 and SGLang: choices[0].token_ids,
                                                         #   vLLM also the top-level prompt_token_ids
     "return_prompt_token_ids": true,                    # SGLang: choices[0].prompt_token_ids
     "return_tokens_as_token_ids": true,                 # vLLM, with logprobs: tokens as "token_id:N"
     **extra_body}                                       # merged last: it overrides any field above

The three ``return_*`` fields are extensions (``token_ids=False`` leaves them out). vLLM ignores fields it does not
know (with a warning in its log) and SGLang ignores them silently; OpenAI's own API refuses unknown fields, so
use ``token_ids=False`` there. A vLLM server needs ``--enable-auto-tool-choice --tool-call-parser <parser>`` to
accept ``tool_choice: "auto"``, SGLang ``--tool-call-parser <parser>``; without a tool parser pass ``tools=[]`` and
the model answers in plain text.

What is read back: the first choice. A tool call to ``act`` gives the action (its JSON ``arguments`` string, field
``action``); a call to another tool the request offered (a caller's own ``tools``, the suite's with ``tools="suite"``)
becomes a ``ToolCall``, one it did not offer the text ``{"name": ..., "args": {...}}``; with no tool call the message
content is the action, with ``<think>...</think>`` and code fences stripped. ``token_ids`` come from
``choices[0].token_ids`` or else from log-prob tokens written ``token_id:N``; ``logprobs`` from
``choices[0].logprobs.content[*].logprob``; ``prompt_token_ids`` from the top level (vLLM) or the choice (SGLang);
``finish_reason`` from the choice (``length``: the reply was cut at ``max_tokens``, its own rollout status).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from collections.abc import Collection
from typing import Any, Literal

import aiohttp
import msgspec

from bunshin.envs.records import ToolCall
from bunshin.envs.seeds import derive_seed

from .base import ContextLengthExceeded, Decision, Policy, PolicyContext, PolicyError, ServerConfigError
from .prompts import (
    ACT_TOOL,
    ACT_TOOL_NAME,
    DEFAULT_PROMPTS,
    EXAMPLES,
    GENERIC_PROMPT,
    SUITE_TOOL_PROMPTS,
    TEXT_SUFFIX,
    TOOL_SUFFIX,
    strip_fences,
    suite_tools,
)

__all__ = ["ACT_TOOL", "DEFAULT_PROMPTS", "NOT_RUN", "RETRY_STATUSES", "SUITE_TOOL_PROMPTS",
           "OpenAIPolicy", "strip_fences", "suite_tools"]

_TOKEN_ID = re.compile(r"token_id:(-?\d+)")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})  # a server that is busy or restarting: worth another try
NOT_RUN = "(not run: one action per turn)"  # the answer to a tool call beside the one that was carried out

# How the two servers say a prompt does not fit the model's context (HTTP 400). vLLM: "This model's maximum context
# length is N tokens. However, you requested M tokens ...", "... and your request has N input tokens ...", v1's
# "The decoder prompt (length N) is longer than the maximum model length of M"; SGLang: "Requested token count
# exceeds the model's maximum context length of N tokens ...", "Input length (N tokens) exceeds the maximum allowed
# length (M tokens) ...".
_CONTEXT_LENGTH = re.compile(r"maximum context length|longer than the maximum model length|exceeds the maximum "
                             r"allowed length|longer than the model's context length", re.I)
# vLLM without --enable-auto-tool-choice --tool-call-parser refuses tool_choice "auto" with HTTP 400: '"auto" tool
# choice requires --enable-auto-tool-choice and --tool-call-parser to be set'.
_NO_TOOL_CHOICE = re.compile(r"tool choice requires|--enable-auto-tool-choice|--tool-call-parser", re.I)
# A model's tool-call markup, as a server without a tool parser returns it in the content (SGLang does, with no
# tool_calls): Hermes/Qwen's <tool_call>{json}</tool_call>, and the markers of other families.
_HERMES_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*(?:</tool_call>|$)", re.S)
_OTHER_MARKUP = ("<|python_tag|>", "[TOOL_CALLS]", "<\uff5ctool\u2581calls\u2581begin\uff5c>",
                 "<|tool_calls_section_begin|>", "<|tool_call_begin|>")
_FLAGS = ("start vLLM with --enable-auto-tool-choice --tool-call-parser <parser> (hermes for Qwen models), "
          "SGLang with --tool-call-parser <parser> (qwen25 for Qwen2.5); or pass tools=[] for plain-text "
          "actions")

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


class OpenAIPolicy(Policy):
    """Decides by asking an OpenAI-compatible chat-completions server; one HTTP session per policy and event loop.

    ``model=None`` asks ``GET {base_url}/models`` once and takes the first id (``check()`` does the same, and checks
    a named model is served). The conversation grows by appending (``messages``): the system prompt, the objective
    with the first observation, then per action the assistant message the server returned (its ``tool_calls`` with
    their ids) and the observation that followed it, as a ``role: tool`` message answering the call (a user message
    after a plain-text reply): each turn's prompt is the previous prompt, its completion and the observation, as a
    trainer needs (``engine/training.py``). ``history_turns=N`` opts into the old sliding window instead (the last N
    pairs re-rendered as text, earlier observations cut to ``history_observation_chars``): smaller prompts, but the
    turns no longer extend each other and no training record can be built from them.
    ``tools=None`` offers ``ACT_TOOL``; ``tools=[]`` offers none (plain-text actions, no ``tool_choice``);
    ``tools="suite"`` offers the suite's own tools, generated from its schema (``suite_tools``): a call of one is the
    decision, as a ``ToolCall``. A call of a tool that was not offered is not trusted as a ``ToolCall``: it goes
    back as the text ``{"name": ..., "args": {...}}`` for the suite to parse (and refuse, if it is not its tool).
    ``token_ids`` asks for token ids with the vLLM/SGLang extension fields (see the module's docstring).
    ``send_seed``: each request carries ``seed``, derived from the sample's seed and the step (turns differ, runs
    repeat). Transient failures (connection refused or reset, a timeout, HTTP 429/500/502/503/504) are retried up
    to ``retries`` times within ``retry_max_s`` in all, with exponential backoff from ``retry_backoff_s`` and a
    jitter drawn from the sample's seed; an HTTP 400 never is.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 temperature: float = 1.0, max_tokens: int = 512, timeout_s: float = 120,
                 tools: list[dict[str, Any]] | Literal["suite"] | None = None, system_prompt: str | None = None,
                 logprobs: bool = True, extra_body: dict[str, Any] | None = None, history_turns: int | None = None,
                 history_observation_chars: int | None = 4000, token_ids: bool = True,
                 max_connections: int = 256, send_seed: bool = True, retries: int = 4, retry_max_s: float = 60.0,
                 retry_backoff_s: float = 0.5) -> None:
        if not isinstance(base_url, str) or not re.match(r"https?://", base_url):
            raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000/v1, got {base_url!r}")
        if history_turns is not None and history_turns < 0:
            raise ValueError(f"history_turns must be >= 0 or None, got {history_turns}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if retries < 0 or retry_max_s < 0 or retry_backoff_s < 0:
            raise ValueError(f"retries, retry_max_s and retry_backoff_s must be >= 0, got {retries}, {retry_max_s}, "
                             f"{retry_backoff_s}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "EMPTY")
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = float(timeout_s)
        if isinstance(tools, str) and tools != "suite":
            raise ValueError(f'tools must be a list of tool definitions, None or "suite", got {tools!r}')
        self.suite_tools = tools == "suite"
        self.tools: list[dict[str, Any]] = [] if self.suite_tools else [ACT_TOOL] if tools is None else list(tools)
        self.system_prompt = system_prompt
        self.logprobs = logprobs
        self.extra_body = dict(extra_body or {})
        self.history_turns = history_turns
        self.history_observation_chars = history_observation_chars
        self.token_ids = token_ids
        self.max_connections = max_connections
        self.send_seed = send_seed
        self.retries, self.retry_max_s, self.retry_backoff_s = retries, float(retry_max_s), float(retry_backoff_s)
        self.chat_url = f"{self.base_url}/chat/completions"
        self.models_url = f"{self.base_url}/models"
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._model_lock: asyncio.Lock | None = None
        self._parser_seen = False  # the server has returned tool_calls: it has a tool parser
        self._config_error: ServerConfigError | None = None  # the server is not set up for this policy
        self.last_usage: dict[str, Any] | None = None  # the latest reply's "usage", for logs and budgets

    # -- session --------------------------------------------------------------------------------------------------

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is not None and not self._session.closed:
            if self._session_loop is loop:
                return self._session
            if self._session_loop is not None and not self._session_loop.is_closed():
                raise PolicyError(f"{self.base_url}: this policy's HTTP session belongs to another running event "
                                  "loop; use one policy per event loop")
            # The loop it was made on is gone (its sockets went with it): start over on this one.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        if self._session_loop is not None and self._session_loop is not loop:
            self._model_lock = None  # an asyncio.Lock belongs to the loop it was first contended on
        self._session_loop = loop
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    # -- HTTP -----------------------------------------------------------------------------------------------------

    async def _request(self, method: str, url: str, body: dict[str, Any] | None = None,
                       rng: random.Random | None = None) -> Any:
        """The decoded JSON reply; ``PolicyError`` naming ``url`` for anything else (``ContextLengthExceeded``,
        ``ServerConfigError`` for those two refusals). Transient failures are retried within the bounds; ``rng``
        draws the backoff's jitter (none without it)."""
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._request_once(method, url, body)
            except _Transient as exc:
                delay = self.retry_backoff_s * 2 ** (attempt - 1)
                if rng is not None:
                    delay *= 0.5 + rng.random() / 2
                if attempt > self.retries or time.monotonic() - started + delay > self.retry_max_s:
                    tries = f" (after {attempt} attempts in {time.monotonic() - started:.1f}s)" if attempt > 1 else ""
                    raise PolicyError(f"{exc}{tries}") from exc.__cause__
                await asyncio.sleep(delay)

    async def _request_once(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        data = _encode.encode(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with session.request(method, url, data=data, headers=headers, timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one too
            raise _Transient(f"{method} {url}: no reply within timeout_s={self.timeout_s:g}s") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:  # refused, reset, cut off
            raise _Transient(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise PolicyError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            text = self._error_text(raw)
            message = f"{method} {url}: HTTP {status}: {text}"
            if status in RETRY_STATUSES:
                raise _Transient(message)
            if status == 400 and _CONTEXT_LENGTH.search(text):
                raise ContextLengthExceeded(message)
            if status == 400 and body is not None and body.get("tools") and _NO_TOOL_CHOICE.search(text):
                raise ServerConfigError(f"{message}. The server has no tool parser: {_FLAGS}")
            raise PolicyError(message)
        try:
            return _decode.decode(raw)
        except msgspec.DecodeError as exc:
            raise PolicyError(f"{method} {url}: the reply is not valid JSON ({exc}): {_snippet(raw)}") from exc

    @staticmethod
    def _error_text(raw: bytes) -> str:
        try:
            obj = _decode.decode(raw)
        except msgspec.DecodeError:
            return _snippet(raw)
        if isinstance(obj, dict):
            err = obj.get("error", obj)
            message = err.get("message") if isinstance(err, dict) else err
            if isinstance(message, str):
                return message[:500]
        return _snippet(raw)

    async def resolve_model(self) -> str:
        """The model's name: as given, or the first id ``GET {base_url}/models`` lists (asked once)."""
        if self.model is not None:
            return self.model
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        async with self._model_lock:
            if self.model is None:
                reply = await self._request("GET", self.models_url)
                data = reply.get("data") if isinstance(reply, dict) else None
                if not isinstance(data, list) or not data:
                    raise PolicyError(f"GET {self.models_url}: no model listed in the reply: {_snippet(reply)}")
                first = data[0]
                if not isinstance(first, dict) or not isinstance(first.get("id"), str) or not first["id"]:
                    raise PolicyError(f"GET {self.models_url}: the first model has no id: {_snippet(first)}")
                self.model = first["id"]
        return self.model

    async def check(self) -> None:
        """The preflight: ``GET {base_url}/models`` answers and serves the model (the first listed when none was
        named). ``ServerConfigError`` when the server serves no model or not this one; ``PolicyError`` when it
        does not answer."""
        reply = await self._request("GET", self.models_url)
        data = reply.get("data") if isinstance(reply, dict) else None
        ids = [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)] \
            if isinstance(data, list) else []
        if not ids:
            raise ServerConfigError(f"GET {self.models_url}: no model listed in the reply: {_snippet(reply)}")
        if self.model is None:
            self.model = ids[0]
        elif self.model not in ids:
            raise ServerConfigError(f"GET {self.models_url}: the server does not serve model {self.model!r}; it "
                                    f"serves {', '.join(map(repr, ids[:10]))}")

    # -- prompt ---------------------------------------------------------------------------------------------------

    def tools_for(self, suite: str) -> list[dict[str, Any]]:
        """The tool definitions a request for ``suite`` offers."""
        return suite_tools(suite) if self.suite_tools else self.tools

    def system_text(self, suite: str) -> str:
        if self.system_prompt is not None:
            return self.system_prompt
        if self.suite_tools:
            return SUITE_TOOL_PROMPTS.get(suite, GENERIC_PROMPT)
        base = DEFAULT_PROMPTS.get(suite, GENERIC_PROMPT)
        if self.tools:
            return base + TOOL_SUFFIX
        return base + TEXT_SUFFIX.format(example=EXAMPLES.get(suite, "<action>"))

    def messages(self, ctx: PolicyContext) -> list[dict[str, Any]]:
        """The conversation so far, grown by appending: system prompt; the objective with the first observation;
        per action, the assistant message the policy got back (``ctx.replies``) and the observation that followed:
        a ``role: tool`` message answering its tool call (the call that was carried out gets the observation, any
        other ``NOT_RUN``), or a user message after a plain-text reply. A pure function of the context, so a fork
        or a prefix-cache hit sees the same conversation. With ``history_turns`` set: the sliding window."""
        if self.history_turns is not None:
            return self._window_messages(ctx, self.history_turns)
        observations = list(ctx.observations)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_text(ctx.suite)},
            {"role": "user", "content": f"OBJECTIVE: {ctx.instruction}\n\nOBSERVATION:\n"
                                        f"{observations[0] if observations else ''}"}]
        for i, action in enumerate(ctx.actions):
            reply = ctx.replies[i] if i < len(ctx.replies) else None
            if reply is None:  # a context without the model's reply (made by hand): the action as it was taken
                reply = {"role": "assistant", "content": str(action)}
            messages.append(reply)
            observation = observations[i + 1] if i + 1 < len(observations) else ""
            calls = reply.get("tool_calls") or []
            if not calls:
                messages.append({"role": "user", "content": f"OBSERVATION:\n{observation}"})
                continue
            taken = _taken_call([c["function"]["name"] for c in calls])
            for k, call in enumerate(calls):
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": observation if k == taken else NOT_RUN})
        return messages

    def _window_messages(self, ctx: PolicyContext, turns: int) -> list[dict[str, Any]]:
        """The opt-in sliding window: the last ``turns`` (observation, action) pairs re-rendered as user/assistant
        text, then the objective with the latest observation."""
        observations = list(ctx.observations)
        actions = [str(a) for a in ctx.actions]
        latest = observations[-1] if observations else ""
        # Observation i came before action i; the latest observation follows the last action.
        done = min(len(actions), max(len(observations) - 1, 0))
        first = max(0, done - turns)
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_text(ctx.suite)}]
        for i in range(first, done):
            text = f"OBSERVATION:\n{self._cut(observations[i])}"
            if i == first and first > 0:
                text = f"({first} earlier steps not shown)\n\n{text}"
            messages.append({"role": "user", "content": text})
            messages.append({"role": "assistant", "content": actions[i]})
        messages.append({"role": "user", "content": f"OBJECTIVE: {ctx.instruction}\n\nOBSERVATION:\n{latest}"})
        return messages

    def _cut(self, text: str) -> str:
        limit = self.history_observation_chars
        if limit is None or len(text) <= limit:
            return text
        return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"

    def request_body(self, ctx: PolicyContext, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages(ctx),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        tools = self.tools_for(ctx.suite)
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = 0  # llama.cpp's server sends no per-token log-probs without it (0: none of the
            # alternatives, which nobody reads; vLLM and SGLang take it alike)
        if self.send_seed:
            body["seed"] = self.seed_for(ctx)
        if self.token_ids:
            body["return_token_ids"] = True
            body["return_prompt_token_ids"] = True
            if self.logprobs:
                body["return_tokens_as_token_ids"] = True
        body.update(self.extra_body)
        return body

    @staticmethod
    def seed_for(ctx: PolicyContext) -> int:
        """The request's ``seed``: from the sample's seed and the step (31 bits: every server takes it)."""
        return derive_seed(ctx.seed, "turn", ctx.step) & 0x7FFF_FFFF

    # -- decide ---------------------------------------------------------------------------------------------------

    async def decide(self, ctx: PolicyContext) -> Decision:
        if self._config_error is not None:  # the server is not set up for us: no point asking it again
            raise ServerConfigError(str(self._config_error))
        model = await self.resolve_model()
        body = self.request_body(ctx, model)
        started = time.perf_counter()
        try:
            reply = await self._request("POST", self.chat_url, body,
                                        rng=random.Random(derive_seed(ctx.seed, "retry", ctx.step)))
            elapsed = time.perf_counter() - started
            offered = [t["function"].get("name") for t in body.get("tools") or () if isinstance(t, dict)
                       and isinstance(t.get("function"), dict)]
            return self.parse_reply(reply, elapsed, offered=offered)
        except ServerConfigError as exc:
            self._config_error = exc
            raise

    def parse_reply(self, reply: Any, reasoning_s: float = 0.0, *, offered: Collection[str] | None = None
                    ) -> Decision:
        """A chat-completions reply as a ``Decision``; ``PolicyError`` when it is not one. ``offered``: the names
        of the tools the request offered (a call of another one is not a ``ToolCall``); ``None``: any.
        ``ServerConfigError`` when tools were offered and the reply holds the model's tool-call markup as text with
        no ``tool_calls`` while this server never returned any: it has no tool parser."""
        where = f"POST {self.chat_url}"
        if not isinstance(reply, dict):
            raise PolicyError(f"{where}: the reply is not a JSON object: {_snippet(reply)}")
        if "error" in reply and "choices" not in reply:
            raise PolicyError(f"{where}: the server reported an error: {_snippet(reply['error'])}")
        choices = reply.get("choices")
        if not isinstance(choices, list) or not choices:
            raise PolicyError(f"{where}: the reply has no choices: {_snippet(reply)}")
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            raise PolicyError(f"{where}: the reply's first choice has no message: {_snippet(choice)}")
        usage = reply.get("usage")
        self.last_usage = usage if isinstance(usage, dict) else None
        message = choice["message"]
        action = self._action(message, where, offered)
        finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
        if message.get("tool_calls"):
            self._parser_seen = True
        elif offered and not self._parser_seen and finish != "length" and _raw_tool_call(message.get("content")):
            raise ServerConfigError(f"{where}: tools were offered and the reply holds the model's tool-call markup "
                                    f"as text, with no tool_calls: the server has no tool parser; {_FLAGS}. The "
                                    f"reply: {_snippet(message.get('content'))}")
        logprobs, logprob_ids = self._logprobs(choice.get("logprobs"))
        token_ids = choice.get("token_ids")
        if not _is_int_list(token_ids):
            token_ids = logprob_ids
        prompt_ids = reply.get("prompt_token_ids")
        if not _is_int_list(prompt_ids):
            prompt_ids = choice.get("prompt_token_ids")
            if not _is_int_list(prompt_ids):
                prompt_ids = None
        return Decision(action=action, reasoning_s=reasoning_s, token_ids=token_ids, logprobs=logprobs,
                        prompt_token_ids=prompt_ids, finish_reason=finish, reply=_assistant_message(message))

    def _action(self, message: dict[str, Any], where: str, offered: Collection[str] | None = None
                ) -> str | ToolCall:
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise PolicyError(f"{where}: the message's tool_calls is not a list: {_snippet(calls)}")
        parsed: list[tuple[str, Any, str]] = []
        for call in calls or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise PolicyError(f"{where}: a tool call without a function name: {_snippet(call)}")
            raw = fn.get("arguments")
            if isinstance(raw, dict):  # some servers send the arguments decoded
                text, args = _encode.encode(raw).decode(), raw
            else:
                text = raw if isinstance(raw, str) else ""
                try:
                    args = _decode.decode(text) if text.strip() else {}
                except msgspec.DecodeError:
                    args = None  # the model wrote broken JSON: its text goes to the suite as it is
            parsed.append((fn["name"], args, text))
        for name, args, text in parsed:
            if name == ACT_TOOL_NAME:
                if isinstance(args, dict) and isinstance(args.get("action"), str):
                    return args["action"]
                if isinstance(args, str):
                    return args
                return text  # not {"action": "..."}: the suite will call it malformed
        if parsed:
            name, args, text = parsed[0]
            if not isinstance(args, dict):
                return text
            if offered is not None and name not in offered:  # e.g. a suite's internal tool: never executed as is
                return _encode.encode({"name": name, "args": args}).decode()
            return ToolCall(name=name, args=args)
        content = message.get("content")
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                              and isinstance(p.get("text"), str))
        if content is None:
            return ""
        if not isinstance(content, str):
            raise PolicyError(f"{where}: the message's content is not text: {_snippet(content)}")
        return strip_fences(content)

    @staticmethod
    def _logprobs(value: Any) -> tuple[list[float] | None, list[int] | None]:
        """Per-token log-probs, and token ids if every token is written ``token_id:N``."""
        content = value.get("content") if isinstance(value, dict) else None
        if not isinstance(content, list):
            return None, None
        logprobs: list[float] = []
        ids: list[int] | None = []
        for entry in content:
            lp = entry.get("logprob") if isinstance(entry, dict) else None
            if not isinstance(lp, int | float) or isinstance(lp, bool):
                return None, None
            logprobs.append(float(lp))
            token = entry.get("token")
            match = _TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
            if ids is not None:
                if match:
                    ids.append(int(match.group(1)))
                else:
                    ids = None
        return logprobs, (ids if ids else None)


class _Transient(Exception):
    """A failure worth another try (``OpenAIPolicy._request`` retries it, then raises it as a ``PolicyError``)."""


def _taken_call(names: list[str]) -> int:
    """Which of a reply's tool calls was carried out (``OpenAIPolicy._action``'s rule): the first ``act``, else the
    first."""
    return names.index(ACT_TOOL_NAME) if ACT_TOOL_NAME in names else 0


def _assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """The server's assistant message as it goes back into the conversation: its content and its tool calls (id,
    name, arguments as the model wrote them); the reasoning and other extras are left out."""
    content = message.get("content")
    out: dict[str, Any] = {"role": "assistant", "content": content if isinstance(content, str | list) else None}
    calls = []
    for k, call in enumerate(message.get("tool_calls") or ()):
        fn = call.get("function") or {}
        arguments = fn.get("arguments")
        if not isinstance(arguments, str):
            arguments = _encode.encode(arguments if arguments is not None else {}).decode()
        call_id = call.get("id")
        calls.append({"id": call_id if isinstance(call_id, str) and call_id else f"call_{k}", "type": "function",
                      "function": {"name": fn.get("name"), "arguments": arguments}})
    if calls:
        out["tool_calls"] = calls
    return out


def _raw_tool_call(content: Any) -> bool:
    """Whether ``content`` holds a tool call a tool parser would have taken out: a Hermes/Qwen ``<tool_call>`` whose
    body is a JSON call (a broken one is the model's mistake, not the server's), or another family's marker."""
    if not isinstance(content, str):
        return False
    for body in _HERMES_CALL.findall(content):
        try:
            call = _decode.decode(body)
        except msgspec.DecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            return True
    return any(marker in content for marker in _OTHER_MARKUP)


def _snippet(value: Any, limit: int = 300) -> str:
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value
    else:
        try:
            text = _encode.encode(value).decode()
        except (TypeError, msgspec.EncodeError):
            text = repr(value)
    text = text.strip() or "(empty)"
    return text if len(text) <= limit else text[:limit] + "..."
