"""The shop's HTTP server: a worker process of the workspace serving the catalog on its loopback.

Owns: routing (Magento-shaped URLs: ``/``, ``/catalogsearch/result/?q=``, ``/<category>.html``,
``/<product>-<sku>.html``) and answering one HTTP/1.0 request per connection. The catalog and index live here, in
packed form; reading them copies nothing in a fork. Carts, checkout and accounts come next (SQLite per workspace).
Must never: let one bad request stop the server.
"""

from __future__ import annotations

import http.server
import re
import urllib.parse
import socket
from typing import Any

import numpy as np

from ..app import AppContext
from ..workers import WorkerApp
from . import html as pages
from .catalog import Catalog
from .search import SearchIndex
from .store import Store

PAGE_SIZE = 12
_PRODUCT = re.compile(r"^/[a-z0-9-]*-(b\d{10})\.html$")


def product_path(catalog: Catalog, index: int) -> str:
    p = catalog[index]
    return f"/{pages.slug(p.name)}-{p.sku.lower()}.html"


class ShopServer(WorkerApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0, port: int = 7770,
                 db_path: str = "/var/lib/shop/shop.db"):
        self.catalog_size, self.catalog_seed, self.port = catalog_size, catalog_seed, port
        self.db_path = db_path

    def setup(self, ctx: AppContext) -> None:
        self.catalog = Catalog(self.catalog_size, self.catalog_seed)
        self.index = SearchIndex(self.catalog)
        categories = self.catalog.categories()
        owner = np.array([categories.index(self.catalog[i].category) for i in range(len(self.catalog))],
                         dtype=np.int32)
        self.by_category = {pages.category_url(c): (c, np.flatnonzero(owner == k)) for k, c in enumerate(categories)}
        self.server = ctx.listen(self.port)
        self.store = Store(self.db_path)
        self.ctx = ctx

    def before_fork(self, ctx: AppContext) -> None:
        super().before_fork(ctx)
        self.store.flush()

    def after_fork(self, ctx: AppContext) -> None:
        self.store.reopen()

    def session(self, cookie_header: str | None) -> tuple[str, bool]:
        """The request's session id, or a new one (drawn from the workspace's seeded stream: deterministic)."""
        for part in (cookie_header or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == "session" and value:
                return value, False
        session = f"{self.ctx.rng.getrandbits(64):016x}"
        self.store.new_session(session)
        return session, True

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
    def route(self, raw_path: str, session: str = "") -> tuple[int, str]:
        path, query = pages.query_of(raw_path)
        if path in ("/", "/index.html"):
            return 200, pages.home(self.catalog.categories())
        if path.rstrip("/") == "/catalogsearch/result":
            q = (query.get("q") or [""])[0]
            hits = self.index.search(q, limit=PAGE_SIZE) if q.strip() else []
            return 200, pages.search_results(q, [self._with_url(doc) for doc, _ in hits])
        if path.rstrip("/") == "/checkout/cart":
            return 200, pages.cart(self._cart_rows(session))
        if path in self.by_category:
            name, docs = self.by_category[path]
            return 200, pages.category(name, [self._with_url(int(d)) for d in docs[:PAGE_SIZE]])
        match = _PRODUCT.match(path)
        if match:
            doc = int(match.group(1)[4:])
            if doc < len(self.catalog) and self.catalog[doc].sku.lower() == match.group(1):
                return 200, pages.product_page(self.catalog[doc])
        return 404, pages.not_found(path)

    def post(self, raw_path: str, form: dict[str, list[str]], session: str) -> tuple[int, str, str | None]:
        """(status, body, redirect location)."""
        path, _ = pages.query_of(raw_path)
        if path.rstrip("/") == "/checkout/cart/add":
            sku = (form.get("sku") or [""])[0].lower()
            match = _PRODUCT.match(f"/x-{sku}.html")
            try:
                qty = int((form.get("qty") or ["1"])[0])
            except ValueError:
                qty = 0
            if not match or int(sku[4:]) >= len(self.catalog) or qty < 1:
                return 400, pages.not_found(f"{path} (sku {sku!r}, qty {qty})"), None
            self.store.add_to_cart(session, self.catalog[int(sku[4:])].sku, qty)
            return 302, "", "/checkout/cart/"
        return 404, pages.not_found(path), None

    def _cart_rows(self, session: str) -> list[tuple[Any, int]]:
        return [(self._with_url(int(sku[4:])), qty) for sku, qty in self.store.cart(session)]

    def _with_url(self, doc: int) -> Any:
        return _Linked(self.catalog[doc], product_path(self.catalog, doc))

    def close(self) -> None:
        self.store.close()
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
        session, new = self.shop.session(self.headers.get("Cookie"))
        try:
            status, body = self.shop.route(self.path, session)
        except Exception as exc:  # a bad request gets a 500 page; the server goes on
            status, body = 500, f"<html><body>internal error: {type(exc).__name__}</body></html>"
        self._answer(status, body, session if new else None, None)

    def do_POST(self) -> None:  # noqa: N802
        session, new = self.shop.session(self.headers.get("Cookie"))
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(min(length, 1 << 20)).decode(errors="replace"))
        try:
            status, body, location = self.shop.post(self.path, form, session)
        except Exception as exc:
            status, body, location = 500, f"<html><body>internal error: {type(exc).__name__}</body></html>", None
        self._answer(status, body, session if new else None, location)

    def _answer(self, status: int, body: str, new_session: str | None, location: str | None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if new_session:
            self.send_header("Set-Cookie", f"session={new_session}; Path=/")
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
