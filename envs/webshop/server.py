"""The shop's HTTP server: a worker process of the workspace serving the catalog on its loopback.

Owns: routing (Magento-shaped URLs: ``/``, ``/catalogsearch/result/?q=``, ``/<category>.html``,
``/<product>-<sku>.html``) and answering one HTTP/1.0 request per connection. The catalog and index live here, in
packed form; reading them copies nothing in a fork. Carts, checkout and accounts come next (SQLite per workspace).
Must never: let one bad request stop the server.
"""

from __future__ import annotations

import http.server
import re
import socket
from typing import Any

import numpy as np

from ..app import AppContext
from ..workers import WorkerApp
from . import html as pages
from .catalog import Catalog
from .search import SearchIndex

PAGE_SIZE = 12
_PRODUCT = re.compile(r"^/[a-z0-9-]*-(b\d{10})\.html$")


def product_path(catalog: Catalog, index: int) -> str:
    p = catalog[index]
    return f"/{pages.slug(p.name)}-{p.sku.lower()}.html"


class ShopServer(WorkerApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0, port: int = 7770):
        self.catalog_size, self.catalog_seed, self.port = catalog_size, catalog_seed, port

    def setup(self, ctx: AppContext) -> None:
        self.catalog = Catalog(self.catalog_size, self.catalog_seed)
        self.index = SearchIndex(self.catalog)
        categories = self.catalog.categories()
        owner = np.array([categories.index(self.catalog[i].category) for i in range(len(self.catalog))],
                         dtype=np.int32)
        self.by_category = {pages.category_url(c): (c, np.flatnonzero(owner == k)) for k, c in enumerate(categories)}
        self.server = ctx.listen(self.port)

    def readers(self) -> dict[Any, Any]:
        return {self.server.sock: self._accept}

    def rpc_port(self) -> int:
        return self.server.port

    def _accept(self) -> None:
        conn, addr = self.server.sock.accept()
        with conn:
            conn.settimeout(5)
            _Handler(conn, addr, self)

    # -- routes -----------------------------------------------------------------------------------------------
    def route(self, raw_path: str) -> tuple[int, str]:
        path, query = pages.query_of(raw_path)
        if path in ("/", "/index.html"):
            return 200, pages.home(self.catalog.categories())
        if path.rstrip("/") == "/catalogsearch/result":
            q = (query.get("q") or [""])[0]
            hits = self.index.search(q, limit=PAGE_SIZE) if q.strip() else []
            return 200, pages.search_results(q, [self._with_url(doc) for doc, _ in hits])
        if path in self.by_category:
            name, docs = self.by_category[path]
            return 200, pages.category(name, [self._with_url(int(d)) for d in docs[:PAGE_SIZE]])
        match = _PRODUCT.match(path)
        if match:
            doc = int(match.group(1)[4:])
            if doc < len(self.catalog) and self.catalog[doc].sku.lower() == match.group(1):
                return 200, pages.product_page(self.catalog[doc])
        return 404, pages.not_found(path)

    def _with_url(self, doc: int) -> Any:
        return _Linked(self.catalog[doc], product_path(self.catalog, doc))

    def close(self) -> None:
        self.server.close()
        self.index.close()
        self.catalog.close()


class _Linked:
    """A product carrying its URL, for the listing templates."""

    def __init__(self, product: Any, url: str):
        self._p, self.url = product, url

    def __getattr__(self, name: str) -> Any:
        return getattr(self._p, name)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def __init__(self, conn: socket.socket, addr: Any, shop: ShopServer):
        self.shop = shop
        super().__init__(conn, addr, None)  # type: ignore[arg-type]

    def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
        try:
            status, body = self.shop.route(self.path)
        except Exception as exc:  # a bad request gets a 500 page; the server goes on
            status, body = 500, f"<html><body>internal error: {type(exc).__name__}</body></html>"
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
