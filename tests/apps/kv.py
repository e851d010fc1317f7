"""An application whose state lives in a worker process: a key-value store with a journal file and a listening
socket, kept by a ``KVWorker`` that the host spawns. The contract's example for state in child processes.
"""

from __future__ import annotations

import http.client
import os
import random
from typing import Any

from bunshin.envs.app import AppContext, Tool, WorkerApp, WorkspaceApp
from bunshin.envs.records import Observation
from bunshin.envs.runtime.workers import WorkerHandle


class KVWorker(WorkerApp):
    def __init__(self, journal: str):
        self.journal_path = journal
        self.data: dict[str, Any] = {}

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.journal = ctx.open(self.journal_path, "a")
        self.server = ctx.listen(0)

    def rpc_set(self, key: str, value: Any) -> int:
        self.data[key] = value
        self.journal.file.write(f"{key}={value}\n")
        self.journal.file.flush()
        return len(self.data)

    def rpc_get(self, key: str) -> Any:
        return self.data.get(key)

    def rpc_identity(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "ppid": os.getppid(), "hostname": os.uname().nodename,
                "port": self.server.port, "ws": self.ctx.ws_id}

    def rpc_random(self, n: int = 4) -> list[int]:
        return [random.getrandbits(32) for _ in range(n)]

    def readers(self) -> dict[Any, Any]:
        return {self.server.sock: self._serve_http}

    def _serve_http(self) -> None:
        """One HTTP/1.0 request per connection: ``GET /<key>`` answers the value (404 if unset)."""
        conn, _ = self.server.sock.accept()
        with conn:
            conn.settimeout(2)
            request = conn.recv(4096).decode(errors="replace")
            path = request.split(" ", 2)[1] if request.count(" ") >= 2 else "/"
            key = path.lstrip("/")
            if key in self.data:
                body, status = str(self.data[key]).encode(), "200 OK"
            else:
                body, status = b"no such key", "404 Not Found"
            conn.sendall(f"HTTP/1.0 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)


class KVApp(WorkspaceApp):
    def __init__(self, journal: str = "/home/agent/kv.log"):
        self.journal = journal

    def setup(self, ctx: AppContext) -> None:
        self.worker: WorkerHandle = ctx.spawn("tests.apps.kv:KVWorker", journal=self.journal)

    def tools(self) -> dict[str, Tool]:
        return {
            "kv_set": lambda a: Observation(output=str(self.worker.call("set", key=a["key"], value=a["value"]))),
            "kv_get": lambda a: Observation(output=repr(self.worker.call("get", key=a["key"]))),
            "kv_identity": lambda a: Observation(data=self.worker.call("identity")),
            "kv_random": lambda a: Observation(data={"draws": self.worker.call("random", n=4)}),
            "kv_fetch": self._fetch,
        }

    def _fetch(self, args: dict[str, Any]) -> Observation:
        """The host as an HTTP client of its own worker, over the workspace's loopback."""
        port = self.worker.call("identity")["port"]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", f"/{args['key']}")
            response = conn.getresponse()
            return Observation(output=response.read().decode(), data={"status": response.status})
        finally:
            conn.close()
