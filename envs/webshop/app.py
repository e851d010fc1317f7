"""The shop as a workspace application (first slice): the HTTP shop runs in a worker process (``ShopServer``),
and the host reaches it over the workspace's loopback, as the text browser will. Carts, orders and reviews in
SQLite, the browser with its accessibility tree and screenshots, and the tasks come next (issue 3).
"""

from __future__ import annotations

import http.client
import urllib.parse
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
        self.cookies: dict[str, str] = {}  # the browser's cookie jar (the text browser takes it over)

    def tools(self) -> dict[str, Tool]:
        return {"http_get": lambda a: self._request("GET", a), "http_post": lambda a: self._request("POST", a)}

    def _request(self, method: str, args: dict[str, Any]) -> Observation:
        path = args.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ToolError(f"http_{method.lower()} needs a 'path' starting with '/'")
        form = args.get("form", {})
        if not isinstance(form, dict):
            raise ToolError("'form' must be an object of field names to values")
        body = urllib.parse.urlencode(form) if method == "POST" else None
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body is not None else {}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in sorted(self.cookies.items()))
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode()
            for header in response.headers.get_all("Set-Cookie") or []:
                name, _, rest = header.partition("=")
                self.cookies[name.strip()] = rest.split(";", 1)[0]
            return Observation(output=text, data={"status": response.status,
                                                  "location": response.headers.get("Location")})
        finally:
            conn.close()
