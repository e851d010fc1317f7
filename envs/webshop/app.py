"""The shop as a workspace application (first slice): the HTTP shop runs in a worker process (``ShopServer``),
and the host reaches it over the workspace's loopback, as the text browser will. Carts, orders and reviews in
SQLite, the browser with its accessibility tree and screenshots, and the tasks come next (issue 3).
"""

from __future__ import annotations

import http.client
from typing import Any

from ..app import AppContext, Tool, ToolError, WorkspaceApp
from ..records import Observation
from ..workers import WorkerHandle


class ShopApp(WorkspaceApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0, port: int = 7770):
        if catalog_size < 1:
            raise ValueError(f"catalog_size must be >= 1, got {catalog_size}")
        self.kwargs = {"catalog_size": catalog_size, "catalog_seed": catalog_seed, "port": port}

    def setup(self, ctx: AppContext) -> None:
        self.server: WorkerHandle = ctx.spawn("bunshin.envs.webshop.server:ShopServer", **self.kwargs)
        self.port = int(self.server.call("port"))

    def tools(self) -> dict[str, Tool]:
        return {"http_get": self._http_get}

    def _http_get(self, args: dict[str, Any]) -> Observation:
        path = args.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ToolError("http_get needs a 'path' starting with '/'")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return Observation(output=response.read().decode(), data={"status": response.status})
        finally:
            conn.close()
