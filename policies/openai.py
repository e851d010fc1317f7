"""A policy that asks a model server: an OpenAI-compatible chat-completions client (vLLM, SGLang) with tool calling.

Owns: ``OpenAIPolicy`` (the prompt built from a ``PolicyContext``, the request, and reading the reply back into a
``Decision`` with the response's token ids and log-probs when the server returns them), ``DEFAULT_PROMPTS`` (one
system prompt per suite: its action language in prose, its list of actions generated from the suite's tool schema),
``ACT_TOOL`` (the default tool), and ``suite_tools`` with ``SUITE_TOOL_PROMPTS`` (``tools="suite"``: the suite's
own tools offered as functions generated from its schema, ``SUITE_SCHEMAS``).
Must never: retry on its own or hide a server's failure; every failure of the server (HTTP error, timeout,
unreadable or malformed reply) is a ``PolicyError`` naming the URL and the problem, which ends that rollout with
``policy_error``. A reply that is well formed but holds no usable action is not the server's failure: its text
goes back as the action and the suite reports it as a malformed action.

What is sent to ``POST {base_url}/chat/completions``::

    {"model": ..., "messages": [...], "temperature": ..., "max_tokens": ...,
     "tools": [ACT_TOOL], "tool_choice": "auto",        # unless tools=[] (then neither is sent);
                                                         #   tools="suite": suite_tools(suite)
     "logprobs": true,                                   # unless logprobs=False
     "return_token_ids": true,                           # vLLM >= 0.10.2 and SGLang: choices[0].token_ids,
                                                         #   vLLM also the top-level prompt_token_ids
     "return_prompt_token_ids": true,                    # SGLang: choices[0].prompt_token_ids
     "return_tokens_as_token_ids": true,                 # vLLM, with logprobs: tokens as "token_id:N"
     **extra_body}                                       # merged last: it overrides any field above

The three ``return_*`` fields are extensions (``token_ids=False`` leaves them out). vLLM ignores fields it does not
know (with a warning in its log) and SGLang ignores them silently; OpenAI's own API refuses unknown fields, so
use ``token_ids=False`` there. A vLLM server needs ``--enable-auto-tool-choice --tool-call-parser <parser>`` to
accept ``tool_choice: "auto"``; without a tool parser pass ``tools=[]`` and the model answers in plain text.

What is read back: the first choice. A tool call to ``act`` gives the action (its JSON ``arguments`` string, field
``action``); a call to another tool the request offered (a caller's own ``tools``, the suite's with ``tools="suite"``)
becomes a ``ToolCall``, one it did not offer the text ``{"name": ..., "args": {...}}``; with no tool call the message
content is the action, with ``<think>...</think>`` and code fences stripped. ``token_ids`` come from
``choices[0].token_ids`` or else from log-prob tokens written ``token_id:N``; ``logprobs`` from
``choices[0].logprobs.content[*].logprob``; ``prompt_token_ids`` from the top level (vLLM) or the choice (SGLang).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Collection
from typing import Any, Literal

import aiohttp
import msgspec

from bunshin.envs.desktop import suite as desktop_suite
from bunshin.envs.desktop import tools as desktop_tools
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.tools import ToolSchema
from bunshin.envs.webshop import tools as webshop_tools

from .base import Decision, Policy, PolicyContext, PolicyError

__all__ = ["ACT_TOOL", "DEFAULT_PROMPTS", "SUITE_SCHEMAS", "SUITE_TOOL_PROMPTS", "OpenAIPolicy", "strip_fences",
           "suite_tools"]

ACT_TOOL_NAME = "act"

ACT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ACT_TOOL_NAME,
        "description": "Take the next action in the environment.",
        "parameters": {
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "description": "The next action, written exactly in the task's action language "
                                   "(see the system prompt).",
                },
            },
            "required": ["action"],
        },
    },
}

_WEBSHOP_INTRO = """\
You are an autonomous agent operating a web browser on an online shop. Each observation is the accessibility \
tree of the current page: every element you can act on is shown with its numeric id in square brackets, like \
[12] button 'Add to Cart'."""

# The action language (how an action is written) is prose; the list of actions is generated from the suite's schema.
_WEBSHOP_LANGUAGE = """\
Actions (one per turn) are written as the action's name followed by its arguments, each in square brackets, in \
the order listed below: click [id] clicks the element with this id; type [id] [text] [1] types text into a field \
and then presses Enter (a true/false argument is written 1 or 0: [0] types without pressing Enter); stop [answer] \
finishes the task. An argument with a default may be left out at the end (stop alone is stop []). Use only ids \
that appear in the current observation; stop [N/A] if the task cannot be done.

The actions, with their arguments:
{listing}"""

_DESKTOP_INTRO = """\
You are an autonomous agent operating a Linux desktop with a terminal, a text editor and a spreadsheet. Each \
observation describes the open windows and the output of your last action. The user's home is /home/user."""

_DESKTOP_LANGUAGE = """\
Actions (one per turn, written exactly like this):
  terminal: <shell command>       run a command in the terminal, like terminal: ls -la ~/Documents
  <tool>: <text>                  the same short form for the one text argument of {compact}
  {{"name": "<tool>", "args": {{...}}}}  any tool below as JSON, with its arguments by name
  WAIT                            wait a moment (WAIT: <seconds> for longer)
  DONE                            the task is complete
  FAIL                            the task cannot be done

The tools, with their arguments (an argument with a default may be left out):
{listing}"""

_GENERIC_PROMPT = """\
You are an autonomous agent completing a task in an environment. Each observation shows the environment's \
current state. Reply with one action per turn in the environment's action language."""

SUITE_SCHEMAS: dict[str, ToolSchema] = {"webshop": webshop_tools.SCHEMA, "desktop": desktop_tools.SCHEMA}

DEFAULT_PROMPTS: dict[str, str] = {
    "webshop": f"{_WEBSHOP_INTRO}\n\n" + _WEBSHOP_LANGUAGE.format(listing=webshop_tools.SCHEMA.listing()),
    "desktop": f"{_DESKTOP_INTRO}\n\n" + _DESKTOP_LANGUAGE.format(
        compact=", ".join(name for name in desktop_suite.COMPACT if name != "terminal"),
        listing=desktop_tools.SCHEMA.listing()),
}

# With the suite's own tools offered (``tools="suite"``) the functions' definitions describe them: no list here.
SUITE_TOOL_PROMPTS: dict[str, str] = {
    "webshop": f"{_WEBSHOP_INTRO}\n\nAct by calling exactly one of the tools per turn. Use only element ids that "
               "appear in the current observation. Call stop with the answer to finish (answer N/A if the task "
               "cannot be done).",
    "desktop": f"{_DESKTOP_INTRO}\n\nAct by calling exactly one of the tools per turn. Call DONE when the task is "
               "complete, FAIL if it cannot be done.",
}


def suite_tools(suite: str) -> list[dict[str, Any]]:
    """The suite's agent tools as OpenAI function definitions, generated from its tool schema (a model's call of
    one is a ``ToolCall`` the suite's application decodes through the same schema)."""
    if suite not in SUITE_SCHEMAS:
        raise PolicyError(f"no tool schema for suite {suite!r}; suites with one: {', '.join(SUITE_SCHEMAS)}")
    return SUITE_SCHEMAS[suite].openai_tools()


_TOOL_SUFFIX = ("\n\nGive each action by calling the `act` tool with the action text as its `action` argument "
                "(exactly one call per turn).")
_TEXT_SUFFIX = "\n\nReply with the action only, inside a ``` code block, like:\n```\n{example}\n```"
_EXAMPLES = {"webshop": "click [12]", "desktop": "terminal: ls"}

_FENCE = re.compile(r"```([^\n`]*\n)?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_TOKEN_ID = re.compile(r"token_id:(-?\d+)")

_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder()


def strip_fences(text: str) -> str:
    """The action in a model's text: ``<think>`` blocks dropped; the last fenced block's body if there is one
    (a language tag such as ```json on its own first line is dropped; an unclosed last fence counts to the end),
    else the text; whitespace stripped."""
    text = _THINK.sub("", text)
    blocks = _FENCE.findall(text)
    if blocks:
        tag, body = blocks[-1]
    elif "```" in text:  # an unclosed fence (the reply ran out of tokens): what follows it
        tag, newline, body = text.rsplit("```", 1)[1].partition("\n")
        tag, body = (tag + newline, body) if newline else ("", tag)
    else:
        return text.strip()
    if tag and not body.strip():  # ```DONE\n```: the "tag" line is the action itself
        body = tag
    elif tag and not re.fullmatch(r"[\w+.-]*\s*", tag):
        body = tag + body  # ```click [3]\n...```: not a language tag
    return body.strip()


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


class OpenAIPolicy(Policy):
    """Decides by asking an OpenAI-compatible chat-completions server; one HTTP session per policy and event loop.

    ``model=None`` asks ``GET {base_url}/models`` once and takes the first id. ``history_turns`` earlier
    observation/action pairs go into the prompt before the latest observation (older ones are dropped);
    ``history_observation_chars`` cuts those earlier observations (the latest is always sent whole).
    ``tools=None`` offers ``ACT_TOOL``; ``tools=[]`` offers none (plain-text actions, no ``tool_choice``);
    ``tools="suite"`` offers the suite's own tools, generated from its schema (``suite_tools``): a call of one is the
    decision, as a ``ToolCall``. A call of a tool that was not offered is not trusted as a ``ToolCall``: it goes
    back as the text ``{"name": ..., "args": {...}}`` for the suite to parse (and refuse, if it is not its tool).
    ``token_ids`` asks for token ids with the vLLM/SGLang extension fields (see the module's docstring).
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 temperature: float = 1.0, max_tokens: int = 512, timeout_s: float = 120,
                 tools: list[dict[str, Any]] | Literal["suite"] | None = None, system_prompt: str | None = None,
                 logprobs: bool = True, extra_body: dict[str, Any] | None = None, history_turns: int = 4,
                 history_observation_chars: int | None = 4000, token_ids: bool = True,
                 max_connections: int = 256) -> None:
        if not isinstance(base_url, str) or not re.match(r"https?://", base_url):
            raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000/v1, got {base_url!r}")
        if history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {history_turns}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
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
        self.chat_url = f"{self.base_url}/chat/completions"
        self.models_url = f"{self.base_url}/models"
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._model_lock: asyncio.Lock | None = None
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

    async def _request(self, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
        """The decoded JSON reply; ``PolicyError`` naming ``url`` for anything else."""
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        data = _encode.encode(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else None
        try:
            async with session.request(method, url, data=data, headers=headers, timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError is one too
            raise PolicyError(f"{method} {url}: no reply within timeout_s={self.timeout_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise PolicyError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if status != 200:
            raise PolicyError(f"{method} {url}: HTTP {status}: {self._error_text(raw)}")
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

    # -- prompt ---------------------------------------------------------------------------------------------------

    def tools_for(self, suite: str) -> list[dict[str, Any]]:
        """The tool definitions a request for ``suite`` offers."""
        return suite_tools(suite) if self.suite_tools else self.tools

    def system_text(self, suite: str) -> str:
        if self.system_prompt is not None:
            return self.system_prompt
        if self.suite_tools:
            return SUITE_TOOL_PROMPTS.get(suite, _GENERIC_PROMPT)
        base = DEFAULT_PROMPTS.get(suite, _GENERIC_PROMPT)
        if self.tools:
            return base + _TOOL_SUFFIX
        return base + _TEXT_SUFFIX.format(example=_EXAMPLES.get(suite, "<action>"))

    def messages(self, ctx: PolicyContext) -> list[dict[str, Any]]:
        """System prompt; the last ``history_turns`` (observation, action) pairs as user/assistant messages; then
        the objective with the latest observation."""
        observations = list(ctx.observations)
        actions = [str(a) for a in ctx.actions]
        latest = observations[-1] if observations else ""
        # Observation i came before action i; the latest observation follows the last action.
        done = min(len(actions), max(len(observations) - 1, 0))
        first = max(0, done - self.history_turns)
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
        if self.token_ids:
            body["return_token_ids"] = True
            body["return_prompt_token_ids"] = True
            if self.logprobs:
                body["return_tokens_as_token_ids"] = True
        body.update(self.extra_body)
        return body

    # -- decide ---------------------------------------------------------------------------------------------------

    async def decide(self, ctx: PolicyContext) -> Decision:
        model = await self.resolve_model()
        body = self.request_body(ctx, model)
        started = time.perf_counter()
        reply = await self._request("POST", self.chat_url, body)
        elapsed = time.perf_counter() - started
        offered = [t["function"].get("name") for t in body.get("tools") or () if isinstance(t, dict)
                   and isinstance(t.get("function"), dict)]
        return self.parse_reply(reply, elapsed, offered=offered)

    def parse_reply(self, reply: Any, reasoning_s: float = 0.0, *, offered: Collection[str] | None = None
                    ) -> Decision:
        """A chat-completions reply as a ``Decision``; ``PolicyError`` when it is not one. ``offered``: the names
        of the tools the request offered (a call of another one is not a ``ToolCall``); ``None``: any."""
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
        action = self._action(choice["message"], where, offered)
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
                        prompt_token_ids=prompt_ids)

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
