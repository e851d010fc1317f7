"""A scripted OpenAI-compatible model server, for the tests of model-server policies: a real HTTP server in its own
process, standard library only.

    python -m tests.openai_server --port 0 --script replies.json [--log requests.jsonl] [--flavor vllm|sglang]
        [--model NAME ...]

prints the port it listens on (one line on stdout), then serves until it is terminated:

- ``GET /v1/models``: the served models, in OpenAI's list format.
- ``POST /v1/chat/completions``: answers with the script's next reply (in order; once the script is used up, HTTP
  500). The request is checked as a server would (JSON object, a ``messages`` list, a served ``model``, ``tools``
  as OpenAI's API takes them: function tools named ``[a-zA-Z0-9_-]{1,64}``, once each, whose ``parameters`` is a
  self-contained JSON schema of ``"type": "object"``) and every request body, good or bad, is appended to the
  ``--log`` file as one JSON line ``{"method", "path", "authorization", "body"}`` (``body`` is the raw text when it
  is not JSON).

The script is a JSON list of replies (or ``{"models": [...], "replies": [...]}``); each reply is an object with

- ``"action": TEXT``: a call of the ``act`` tool with ``{"action": TEXT}``;
- ``"tool": NAME, "arguments": OBJECT | RAW-STRING``: a call of any tool;
- ``"content": TEXT``: a plain assistant message (also allowed next to a tool call);
- ``"reasoning": TEXT``: the message's ``reasoning_content`` (and vLLM's ``reasoning``);
- ``"delay": SECONDS``: wait before answering;
- ``"status": CODE`` (with optional ``"message"``): answer with that HTTP error and an OpenAI-style error body;
- ``"body": TEXT | JSON``: answer 200 with exactly this body (a malformed reply).

The "model" is a fake tokenizer: text splits into word-sized tokens, a token's id is a hash of its text. The
completion's text is the content, or a tool call in Hermes' format (``<tool_call>{...}</tool_call>``), which is
what a vLLM/SGLang tool parser would have turned into ``tool_calls``; without ``tools`` in the request the tool
call's text is returned as content, as a server without tools would. ``logprobs: true`` gives
``choices[0].logprobs.content`` (token, logprob, bytes, ``top_logprobs`` when asked). Token ids as the two servers
return them:

- ``--flavor vllm`` (default): ``return_token_ids`` -> ``choices[0].token_ids`` and top-level
  ``prompt_token_ids``; ``return_tokens_as_token_ids`` -> log-prob tokens written ``token_id:N``.
- ``--flavor sglang``: ``return_token_ids`` -> ``choices[0].token_ids``; ``return_prompt_token_ids`` ->
  ``choices[0].prompt_token_ids``; ``return_tokens_as_token_ids`` is not supported (ignored).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_TOKEN = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[tuple[int, str]]:
    """The fake tokenizer: (id, token text) per word-sized piece; the ids are stable across runs."""
    return [(zlib.crc32(piece.encode()) % 150_000, piece) for piece in _TOKEN.findall(text)]


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
        # vLLM's shape: {"error": {"message", "type", "param", "code"}}; SGLang's is flat, clients accept both.
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
        reply = self.server.script.take()
        if reply is None:
            self._error(500, "the test script has no more replies", "InternalServerError")
            return
        if reply.get("delay"):
            time.sleep(float(reply["delay"]))
        if "status" in reply:
            self._error(int(reply["status"]), reply.get("message", f"scripted HTTP {reply['status']}"),
                        "InternalServerError" if int(reply["status"]) >= 500 else "BadRequestError")
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
            text += (f"<tool_call>\n{{\"name\": {json.dumps(call['name'])}, \"arguments\": {call['arguments']}}}"
                     "\n</tool_call>")
        if call is not None and not tools_offered:
            content, call = text, None  # no tool parser involved: the model's text is the content
        generated = tokenize(text)
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
        choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None,
                                  "finish_reason": "tool_calls" if call is not None else "stop"}
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
        parts = []
        if request.get("tools"):
            parts.append(f"<|tools|>\n{json.dumps(request['tools'])}\n")
        for m in request["messages"]:
            content = m.get("content") if isinstance(m, dict) else m
            parts.append(f"<|{m.get('role') if isinstance(m, dict) else '?'}|>\n{content}\n")
        parts.append("<|assistant|>\n")
        return "".join(parts)


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a reply still sleeping (a timeout test) must not hold up the exit
    request_queue_size = 1024  # the listen backlog (socketserver's 5 makes a burst of clients retry SYNs for 1 s)

    def __init__(self, address: tuple[str, int], script: Script, models: list[str], flavor: str,
                 log_path: str | None) -> None:
        super().__init__(address, Handler)
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
    args = parser.parse_args(argv)
    with open(args.script) as f:
        loaded = json.load(f)
    replies = loaded.get("replies", []) if isinstance(loaded, dict) else loaded
    if isinstance(loaded, dict) and "models" in loaded:
        models = loaded["models"]  # may be empty: a server that lists no model
    else:
        models = args.model or ["test-model"]
    if not isinstance(replies, list) or not all(isinstance(r, dict) for r in replies):
        parser.error(f"{args.script}: the replies must be a list of objects")
    server = Server((args.host, args.port), Script(replies), models, args.flavor, args.log)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
