"""A scripted OpenAI-compatible model server, for the tests of model-server policies: a real HTTP server in its own
process, standard library only.

    python -m tests.openai_server --port 0 --script replies.json [--log requests.jsonl] [--flavor vllm|sglang]
        [--model NAME ...] [--tool-parser hermes|none] [--max-model-len N]

prints the port it listens on (one line on stdout), then serves until it is terminated:

- ``GET /v1/models``: the served models, in OpenAI's list format.
- ``POST /v1/chat/completions``: answers with the script's next reply (in order; once the script is used up, HTTP
  500). The request is checked as a server would (JSON object, a ``messages`` list, a served ``model``, ``tools``
  as OpenAI's API takes them: function tools named ``[a-zA-Z0-9_-]{1,64}``, once each, whose ``parameters`` is a
  self-contained JSON schema of ``"type": "object"``) and every request body, good or bad, is appended to the
  ``--log`` file as one JSON line ``{"method", "path", "authorization", "body"}`` (``body`` is the raw text when it
  is not JSON; the request's ``seed`` is in it).
- ``--tool-parser none`` is a server started without a tool parser, as the real ones behave: vLLM refuses
  ``tool_choice: "auto"`` with HTTP 400 (``"auto" tool choice requires --enable-auto-tool-choice and
  --tool-call-parser to be set``); SGLang answers with the model's tool-call markup as the content, no tool_calls.
- ``--max-model-len N`` (or ``"max_model_len"`` in the script): a prompt whose tokens plus ``max_tokens`` exceed N
  is refused with HTTP 400 and each server's own message. Errors come in each server's shape: vLLM's
  ``{"error": {"message", "type", "param", "code"}}``, SGLang's flat ``{"object": "error", "message", "type",
  "param", "code"}``.

The script is a JSON list of replies (or ``{"models": [...], "replies": [...]}``); each reply is an object with

- ``"action": TEXT``: a call of the ``act`` tool with ``{"action": TEXT}``;
- ``"tool": NAME, "arguments": OBJECT | RAW-STRING``: a call of any tool;
- ``"content": TEXT``: a plain assistant message (also allowed next to a tool call);
- ``"reasoning": TEXT``: the message's ``reasoning_content`` (and vLLM's ``reasoning``);
- ``"delay": SECONDS``: wait before answering;
- ``"status": CODE`` (with optional ``"message"``): answer with that HTTP error and an OpenAI-style error body;
- ``"body": TEXT | JSON``: answer 200 with exactly this body (a malformed reply);
- ``"drop": true``: close the connection without answering (a server that went away mid-request);
- ``"finish": "length"``: the reply is cut as if it reached ``max_tokens`` (also what happens when the reply's
  tokens outnumber the request's ``max_tokens``): ``finish_reason: "length"``, the text so far as content, no tool
  call, no end-of-turn token.

The "model" is a fake tokenizer: text splits at special tokens (``<|system|>``, ``<|end|>``...: one token each),
then into word-sized tokens, a token's id is a hash of its text. The chat template renders each message as
``<|role|>`` + content (an assistant's tool calls in Hermes' format after it) + ``<|end|>`` + a newline, a tool
message as ``<|tool|>`` + content, and ends with ``<|assistant|>`` (the generation prompt). The completion's text is
the content, or a tool call in Hermes' format (``<tool_call>{...}</tool_call>``), which is what a vLLM/SGLang tool
parser would have turned into ``tool_calls``, then the ``<|end|>`` token: exactly what the template renders for that
assistant message in the next prompt, so a conversation that grows by appending has each prompt's tokens start with
the previous prompt's and completion's. Without ``tools`` in the request the tool call's text is returned as content,
as a server without tools would. ``logprobs: true`` gives
``choices[0].logprobs.content`` (token, logprob, bytes, ``top_logprobs`` when asked). Token ids as the two servers
return them:

- ``--flavor vllm`` (default): ``return_token_ids`` -> ``choices[0].token_ids`` and top-level
  ``prompt_token_ids``; ``return_tokens_as_token_ids`` -> log-prob tokens written ``token_id:N``.
- ``--flavor sglang``: ``return_token_ids`` -> ``choices[0].token_ids``; ``return_prompt_token_ids`` ->
  ``choices[0].prompt_token_ids``; ``return_tokens_as_token_ids`` is not supported (ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_TOKEN = re.compile(r"\s*\S+|\s+")
_SPECIAL = re.compile(r"(<\|[a-z_]+\|>)")
END = "<|end|>"


def tokenize(text: str) -> list[tuple[int, str]]:
    """The fake tokenizer: (id, token text) per special token and per word-sized piece between them; the ids are
    stable across runs."""
    tokens = []
    for segment in _SPECIAL.split(text):
        pieces = [segment] if _SPECIAL.fullmatch(segment) else _TOKEN.findall(segment)
        tokens += [(zlib.crc32(piece.encode()) % 150_000, piece) for piece in pieces]
    return tokens


def tool_call_text(name: str, arguments: str) -> str:
    """A tool call as the model writes it (Hermes' format); ``arguments`` is the JSON text."""
    return f"<tool_call>\n{{\"name\": {json.dumps(name)}, \"arguments\": {arguments}}}\n</tool_call>"


def logprob_of(token_id: int) -> float:
    return -round(0.01 * (1 + token_id % 250), 4)


_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def tools_problem(tools: Any) -> str | None:
    """Why a server would refuse the request's ``tools`` (OpenAI's API, vLLM's request model), or ``None``."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        return "'tools' must be a list"
    names = set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            return f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}"
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            return f"tools[{i}].function.name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {name!r}"
        if name in names:
            return f"tools[{i}].function.name {name!r} is given twice"
        names.add(name)
        if not isinstance(fn.get("description", ""), str):
            return f"tools[{i}].function.description must be a string"
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type") != "object":
            return f"tools[{i}].function.parameters must be a JSON schema of type object"
        if _has_key(params, "$ref"):
            return f"tools[{i}].function.parameters has a $ref the schema does not resolve"
    return None


def _has_key(node: Any, key: str) -> bool:
    if isinstance(node, dict):
        return key in node or any(_has_key(v, key) for v in node.values())
    return isinstance(node, list) and any(_has_key(v, key) for v in node)


class Script:
    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = replies
        self.next = 0
        self.lock = threading.Lock()

    def take(self) -> dict[str, Any] | None:
        with self.lock:
            if self.next >= len(self.replies):
                return None
            reply = self.replies[self.next]
            self.next += 1
            return reply


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # -- plumbing -------------------------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a timeout test): nothing to do

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        # vLLM's shape: {"error": {"message", "type", "param", "code"}}; SGLang's ErrorResponse is flat.
        if self.server.flavor == "sglang":
            self._json(status, {"object": "error", "message": message, "type": kind, "param": None, "code": status})
        else:
            self._json(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def _log(self, body: Any) -> None:
        if self.server.log_path is None:
            return
        line = json.dumps({"method": self.command, "path": self.path,
                           "authorization": self.headers.get("Authorization"), "body": body})
        with self.server.log_lock, open(self.server.log_path, "a") as f:
            f.write(line + "\n")

    # -- routes ---------------------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._log(None)
        if self.path.rstrip("/") == "/v1/models":
            now = int(time.time())
            self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": now, "owned_by": self.server.flavor, "root": m,
                 "parent": None, "max_model_len": 4096} for m in self.server.models]})
        else:
            self._error(404, f"no route GET {self.path}", "NotFoundError")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw)
        except ValueError:
            self._log(raw.decode("utf-8", "replace"))
            self._error(400, "the request body is not valid JSON")
            return
        self._log(body)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route POST {self.path}", "NotFoundError")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            self._error(400, "'messages' must be a non-empty list")
            return
        problem = tools_problem(body.get("tools"))
        if problem is not None:
            self._error(400, problem)
            return
        if body.get("model") not in self.server.models:
            self._error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
            return
        if (self.server.flavor == "vllm" and self.server.tool_parser == "none" and body.get("tools")
                and body.get("tool_choice", "auto") == "auto"):
            self._error(400, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')
            return
        prompt_len = len(tokenize(self.chat_template(body)))
        requested = prompt_len + int(body.get("max_tokens") or 0)
        limit = self.server.max_model_len
        if limit is not None and requested > limit:
            if self.server.flavor == "vllm":
                self._error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                 f"{requested} tokens ({prompt_len} in the messages, {body.get('max_tokens') or 0} in "
                                 "the completion). Please reduce the length of the messages or completion.")
            else:
                self._error(400, f"Requested token count exceeds the model's maximum context length of {limit} "
                                 f"tokens. You requested a total of {requested} tokens: {prompt_len} tokens from the "
                                 f"input messages and {body.get('max_tokens') or 0} tokens for the completion. Please "
                                 "reduce the number of tokens in the input messages or the completion to fit within "
                                 "the limit.")
            return
        reply = self.server.script.take()
        if reply is None:
            self._error(500, "the test script has no more replies", "InternalServerError")
            return
        if reply.get("delay"):
            time.sleep(float(reply["delay"]))  # a slow server: what the test's timeouts are about
        if "status" in reply:
            self._error(int(reply["status"]), reply.get("message", f"scripted HTTP {reply['status']}"),
                        "InternalServerError" if int(reply["status"]) >= 500 else "BadRequestError")
            return
        if reply.get("drop"):  # gone mid-request: the connection closes with no answer
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if "body" in reply:
            raw_reply = reply["body"]
            self._send(200, raw_reply.encode() if isinstance(raw_reply, str) else json.dumps(raw_reply).encode())
            return
        self._json(200, self.completion(body, reply))

    # -- the "model" ----------------------------------------------------------------------------------------------

    def completion(self, request: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
        flavor = self.server.flavor
        tools_offered = bool(request.get("tools")) and request.get("tool_choice", "auto") != "none"
        parser = tools_offered and self.server.tool_parser != "none"
        content = reply.get("content")
        call = None
        if "action" in reply:
            call = {"name": reply.get("tool", "act"), "arguments": json.dumps({"action": reply["action"]})}
        elif "tool" in reply:
            arguments = reply.get("arguments", {})
            call = {"name": reply["tool"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}
        text = content or ""
        if call is not None:
            text += tool_call_text(call["name"], call["arguments"])
        generated = tokenize(text) + tokenize(END)
        limit = request.get("max_tokens")
        finish = "tool_calls" if call is not None and parser else "stop"
        if reply.get("finish") == "length" or (isinstance(limit, int) and len(generated) > limit):
            generated = generated[:-1] if reply.get("finish") == "length" else generated[:limit]
            finish, text, call = "length", "".join(piece for _, piece in generated if piece != END), None
            content = text
        if call is not None and not parser:
            content, call = text, None  # no tool parser involved: the model's text is the content
        prompt = tokenize(self.chat_template(request))
        as_ids = flavor == "vllm" and bool(request.get("return_tokens_as_token_ids"))

        message: dict[str, Any] = {"role": "assistant", "content": content}
        if call is not None:
            message["tool_calls"] = [{"id": f"chatcmpl-tool-{self.server.counter()}", "type": "function",
                                      "function": call}]
        if "reasoning" in reply:
            message["reasoning_content"] = reply["reasoning"]
            if flavor == "vllm":
                message["reasoning"] = reply["reasoning"]
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        if request.get("logprobs"):
            top_n = int(request.get("top_logprobs") or 0)
            entries = []
            for token_id, piece in generated:
                token = f"token_id:{token_id}" if as_ids else piece
                entry = {"token": token, "logprob": logprob_of(token_id), "bytes": list(piece.encode()),
                         "top_logprobs": []}
                for k in range(top_n):  # the sampled token first, then made-up alternatives
                    alt = (token_id + k) % 150_000
                    alt_token = token if k == 0 else (f"token_id:{alt}" if as_ids else f"{piece}~{k}")
                    entry["top_logprobs"].append({"token": alt_token, "logprob": logprob_of(token_id) - k,
                                                  "bytes": None})
                entries.append(entry)
            choice["logprobs"] = {"content": entries}
        if request.get("return_token_ids"):
            choice["token_ids"] = [t for t, _ in generated]
        response: dict[str, Any] = {
            "id": f"chatcmpl-{self.server.counter()}", "object": "chat.completion", "created": int(time.time()),
            "model": request["model"], "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated),
                      "total_tokens": len(prompt) + len(generated)},
        }
        if flavor == "vllm" and request.get("return_token_ids"):
            response["prompt_token_ids"] = [t for t, _ in prompt]
        if flavor == "sglang" and request.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = [t for t, _ in prompt]
        return response

    @staticmethod
    def chat_template(request: dict[str, Any]) -> str:
        """The prompt's text: every message, then the generation prompt ``<|assistant|>``."""
        parts = []
        if request.get("tools"):
            parts.append(f"<|tools|>{json.dumps(request['tools'])}{END}\n")
        for m in request["messages"]:
            if not isinstance(m, dict):
                parts.append(f"<|user|>{m}{END}\n")
                continue
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            text = content if isinstance(content, str) else ("" if content is None else json.dumps(content))
            for call in m.get("tool_calls") or ():
                fn = call.get("function") or {}
                arguments = fn.get("arguments")
                text += tool_call_text(fn.get("name", ""), arguments if isinstance(arguments, str)
                                       else json.dumps(arguments))
            parts.append(f"<|{m.get('role')}|>{text}{END}\n")
        parts.append("<|assistant|>")
        return "".join(parts)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a reply still sleeping (a timeout test) must not hold up the exit
    request_queue_size = 1024  # the listen backlog (socketserver's 5 makes a burst of clients retry SYNs for 1 s)

    def __init__(self, address: tuple[str, int], script: Script, models: list[str], flavor: str,
                 log_path: str | None, tool_parser: str = "hermes", max_model_len: int | None = None) -> None:
        super().__init__(address, Handler)
        self.tool_parser = tool_parser
        self.max_model_len = max_model_len
        self.script = script
        self.models = models
        self.flavor = flavor
        self.log_path = log_path
        self.log_lock = threading.Lock()
        self._count = 0
        self._count_lock = threading.Lock()

    def counter(self) -> int:
        with self._count_lock:
            self._count += 1
            return self._count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", required=True, help="JSON file: the replies, in order")
    parser.add_argument("--log", help="append every request as one JSON line to this file")
    parser.add_argument("--model", action="append", help="a served model (repeatable; default: test-model)")
    parser.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm")
    parser.add_argument("--tool-parser", choices=("hermes", "none"), default="hermes",
                        help="none: a server started without a tool parser")
    parser.add_argument("--max-model-len", type=int, help="refuse prompts longer than this (tokens, with max_tokens)")
    args = parser.parse_args(argv)
    with open(args.script) as f:
        loaded = json.load(f)
    replies = loaded.get("replies", []) if isinstance(loaded, dict) else loaded
    # the script's models may be an empty list: a server that lists no model
    models = loaded["models"] if isinstance(loaded, dict) and "models" in loaded else args.model or ["test-model"]
    if not isinstance(replies, list) or not all(isinstance(r, dict) for r in replies):
        parser.error(f"{args.script}: the replies must be a list of objects")
    max_model_len = loaded.get("max_model_len", args.max_model_len) if isinstance(loaded, dict) else \
        args.max_model_len
    server = Server((args.host, args.port), Script(replies), models, args.flavor, args.log, args.tool_parser,
                    max_model_len)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
