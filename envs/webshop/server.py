"""The shop's HTTP server: a worker process of the workspace serving the catalog on its loopback.

Owns: routing (Magento-shaped URLs: ``/``, ``/catalogsearch/result/?q=&p=``, ``/<category>.html`` with sorting
and pages, ``/<product>-<sku>.html``, the cart, ``/checkout/`` with an address form, order success, account, sign-in
(WebArena's account; the shop's one customer), order history and order pages, review posting, product images, and
the REST routes WebArena's evaluators read: reviews, orders newest first, the admin token they ask for first) and answering one HTTP/1.0 request per connection. The catalog, index and images live here, packed in huge-page heaps;
reading them copies nothing in a fork. Carts, orders and reviews are in SQLite (``store.py``).
Must never: let one bad request stop the server.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import re
import socket
import time
import urllib.parse
from typing import Any

import numpy as np
from PIL import Image

from .. import state_image
from ..app import AppContext, WorkerApp
from . import html as pages
from .catalog import Catalog, Thumbnails
from .search import SearchIndex
from .store import ADDRESS_FIELDS, CUSTOMER, Address, OrderItem, Store, order_history

PAGE_SIZE = 12
RELATED = 4
MAX_PAGES = 20  # listings and search results stop after 240 items, as a shop's toolbar does
HTML, JSON = "text/html; charset=utf-8", "application/json"
ADMIN = ("admin", "admin1234")  # WebArena's shopping_site_admin account, for the REST API's token
ADMIN_TOKEN = "bunshin-shop-admin-token"
# Magento's answer to a wrong email or password
SIGN_IN_REFUSED = ("The account sign-in was incorrect or your account is disabled temporarily. Please wait and try "
                   "again later.")
_SKU = re.compile(r"^b\d{10}$")
_PRODUCT = re.compile(r"^/[a-z0-9-]*-(b\d{10})\.html$")
_ORDER = re.compile(r"^/sales/order/view/order_id/(\d+)/?$")
_IMAGE = re.compile(r"^/media/catalog/product/(b\d{10})\.png$")
_REVIEWS_API = re.compile(r"^/rest/V1/products/(b\d{10})/reviews/?$", re.I)
MAX_WAITING = 32  # connections accepted and not yet asked on; beyond it the oldest is closed
IDLE_S = 10.0  # a connection that asked nothing for this long is closed when the next one comes
_REVIEW_POST = re.compile(r"^/review/product/post/id/(b\d{10})/$")


def product_path(catalog: Catalog, index: int) -> str:
    p = catalog[index]
    return f"/{pages.slug(p.name)}-{p.sku.lower()}.html"


class ShopServer(WorkerApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0, port: int = 7770,
                 db_path: str = "/var/lib/shop/shop.db", image_px: int = 40):
        self.catalog_size, self.catalog_seed, self.port = catalog_size, catalog_seed, port
        self.db_path, self.image_px = db_path, image_px
        # connections accepted whose request has not come yet (a browser opens some ahead and sends nothing on them
        # for a while): served when readable, so an idle one never holds up the others
        self._waiting: dict[socket.socket, tuple[Any, float]] = {}

    def setup(self, ctx: AppContext) -> None:
        ctx.on_clone(self.forget_connections)
        self.catalog = Catalog(self.catalog_size, self.catalog_seed)
        self.index = SearchIndex(self.catalog)
        self.images = Thumbnails(self.catalog_size, self.catalog_seed, self.image_px)
        categories = self.catalog.categories()
        owner = np.array([categories.index(self.catalog[i].category) for i in range(len(self.catalog))],
                         dtype=np.int32)
        self.prices = np.array([self.catalog[i].price_cents for i in range(len(self.catalog))], dtype=np.int64)
        self.ratings = np.array([self.catalog[i].rating for i in range(len(self.catalog))], dtype=np.float64)
        self.by_category = {pages.category_url(c): (c, np.flatnonzero(owner == k)) for k, c in enumerate(categories)}
        self.server = ctx.listen(self.port)
        self.store = Store(self.db_path, order_history(len(self.catalog), self.catalog.__getitem__,
                                                       self.catalog_seed))
        self.ctx = ctx

    def before_fork(self, ctx: AppContext) -> None:
        super().before_fork(ctx)
        self.store.flush()

    def after_fork(self, ctx: AppContext) -> None:
        self.store.reopen()

    # -- the private-restore baseline ------------------------------------------------------------------------------
    def checkpoint(self) -> list[bytes | memoryview]:
        """The server process's image (``state_image``): the catalog, the search index, the images and the
        per-category arrays, their heaps written out of band straight from memory, and the port actually bound.
        Carts, orders and reviews are in SQLite, flushed by ``before_fork`` and carried by the file snapshot."""
        return state_image.dump({"identity": self._identity(), "catalog": self.catalog, "index": self.index,
                                 "images": self.images, "prices": self.prices, "ratings": self.ratings,
                                 "by_category": self.by_category})

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        """Instead of ``setup``: the catalog, index and images read back from the image into this process's
        private memory (nothing is recomputed, as a CRIU restore reads pages back), the port bound again and
        SQLite reopened on the restored workspace's copy of the database.

        The session-id stream (``ctx.rng``) is not restored from the source, on purpose: a clone's random state
        is seeded from the clone's own seed (docs/design.md section 4), which is what a live fork does too (a ``cow``
        clone's worker is reseeded with ``derive_seed(clone seed, "worker", index)``, the same seed this
        re-spawned worker got), so both backends draw the same session ids after a fork, and two clones of one
        source do not share a stream."""
        ctx.on_clone(self.forget_connections)
        state = state_image.load(data)
        recorded = state["identity"]
        self.catalog, self.index, self.images = state["catalog"], state["index"], state["images"]
        self.prices, self.ratings, self.by_category = state["prices"], state["ratings"], state["by_category"]
        self.server = ctx.listen(recorded["port"])
        if recorded != self._identity():
            raise ValueError(f"the image is of another shop: {recorded} (this server is {self._identity()})")
        self.store = Store(self.db_path)
        self.ctx = ctx

    def _identity(self) -> dict[str, Any]:
        return {"catalog_size": self.catalog_size, "catalog_seed": self.catalog_seed, "image_px": self.image_px,
                "db_path": self.db_path, "port": self.server.port}

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
        return {self.server.sock: self._accept,
                **{conn: functools.partial(self._serve, conn) for conn in self._waiting}}

    def rpc_port(self) -> int:
        return self.server.port

    def _accept(self) -> None:
        conn, addr = self.server.sock.accept()
        now = time.monotonic()
        for old, (_, since) in list(self._waiting.items()):
            if now - since > IDLE_S or len(self._waiting) >= MAX_WAITING:
                self._drop(old)
        self._waiting[conn] = (addr, now)

    def _serve(self, conn: socket.socket) -> None:
        addr, _ = self._waiting.pop(conn)
        with conn:
            conn.settimeout(5)
            _Handler(conn, addr, self)

    def _drop(self, conn: socket.socket) -> None:
        self._waiting.pop(conn, None)
        conn.close()

    def forget_connections(self) -> None:
        """In a clone: the connections accepted are the source's (its browser's), not ours to answer."""
        for conn in list(self._waiting):
            self._drop(conn)

    # -- GET ------------------------------------------------------------------------------------------------------
    def route(self, raw_path: str, session: str = "") -> tuple[int, str, str | bytes]:
        """(status, content type, body)."""
        path, query = pages.query_of(raw_path)
        arg = lambda name, default="": (query.get(name) or [default])[0]  # noqa: E731
        page = _page_number(arg("p", "1"))
        if path in ("/", "/index.html"):
            return 200, HTML, pages.home(self.catalog.categories())
        if path.rstrip("/") == "/catalogsearch/result":
            q = arg("q")
            hits = [doc for doc, _ in self.index.search(q, limit=PAGE_SIZE * MAX_PAGES)] if q.strip() else []
            shown, pages_total = _slice(hits, page)
            return 200, HTML, pages.search_results(q, [self._with_url(d) for d in shown], len(hits), page,
                                                   pages_total)
        if path in self.by_category:
            return 200, HTML, self._category(path, arg("product_list_order", "position"),
                                             arg("product_list_dir", "asc"), page)
        if path.rstrip("/") == "/checkout/cart":
            return 200, HTML, pages.cart(self._cart_rows(session))
        if path.rstrip("/") == "/checkout":
            return 200, HTML, pages.checkout(self._cart_rows(session), {}, [])
        if path.rstrip("/") == "/checkout/onepage/success":
            order_id = _int(arg("order"))
            if order_id is not None and self.store.order(order_id) is not None:
                return 200, HTML, pages.order_success(order_id)
        if path.rstrip("/") == "/customer/account":
            return 200, HTML, pages.account(self.store.orders())
        if path.rstrip("/") == "/customer/account/login":
            email = self.store.signed_in(session)
            return 200, HTML, pages.login(f"You are signed in as {email}." if email else "")
        if path.rstrip("/") == "/sales/order/history":
            return 200, HTML, pages.order_history(self.store.orders())
        if match := _ORDER.match(path):
            order = self.store.order(int(match.group(1)))
            if order is not None:
                return 200, HTML, pages.order_view(order)
        if match := _IMAGE.match(path):
            doc = self._doc(match.group(1))
            if doc is not None:
                return 200, "image/png", _png(self.images[doc])
        if match := _REVIEWS_API.match(path):  # Magento's REST route that WebArena's evaluators read
            doc = self._doc(match.group(1))
            if doc is not None:
                return 200, JSON, json.dumps([  # Magento's shape: oldest first, ratings in percent
                    {"id": r.id, "nickname": r.nickname, "title": r.title, "detail": r.detail, "created_at": r.created,
                     "ratings": [{"rating_name": "Rating", "percent": r.rating * 20, "value": r.rating}]}
                    for r in reversed(self.store.reviews(self.catalog[doc].sku))])
        if path == "/rest/V1/orders/latest":
            return 200, JSON, json.dumps({"order_id": self.store.latest_order_id()})
        if path.rstrip("/") == "/rest/V1/orders":  # Magento's order search, newest first (WebArena's latest order)
            size = _int(arg("searchCriteria[pageSize]", "20")) or 20
            orders = self.store.orders()[:max(1, min(size, 100))]
            return 200, JSON, json.dumps({"items": [{"entity_id": o.id, "increment_id": o.number,
                                                     "created_at": o.created, "status": o.status} for o in orders],
                                          "total_count": len(self.store.orders())})
        if match := _PRODUCT.match(path):
            doc = self._doc(match.group(1))
            if doc is not None:
                return 200, HTML, self._product(doc)
        return 404, HTML, pages.not_found(path)

    def _category(self, url: str, order: str, direction: str, page: int) -> str:
        name, docs = self.by_category[url]
        order = order if order in pages.SORT_KEYS else "position"
        direction = "desc" if direction == "desc" else "asc"
        if order == "price":
            keys = self.prices[docs]
        elif order == "rating":
            keys = self.ratings[docs]
        elif order == "name":
            keys = np.argsort(np.argsort([self.catalog[int(d)].name for d in docs], kind="stable"))
        else:
            keys = np.arange(len(docs))
        ranked = docs[np.lexsort((docs if direction == "asc" else -docs, keys if direction == "asc" else -keys))]
        shown, pages_total = _slice(ranked.tolist(), page)
        return pages.category(name, url, [self._with_url(int(d)) for d in shown], len(docs), page, pages_total,
                              order, direction)

    def _product(self, doc: int, message: str = "") -> str:
        p = self.catalog[doc]
        return pages.product_page(p, self.store.reviews(p.sku), message, [self._with_url(d) for d in self._related(doc)])

    def _related(self, doc: int) -> list[int]:
        """Luma's "Related Products" block: the next products of the same category."""
        _, docs = self.by_category[pages.category_url(self.catalog[doc].category)]
        at = int(np.searchsorted(docs, doc))
        return [int(docs[(at + k) % len(docs)]) for k in range(1, min(RELATED, len(docs) - 1) + 1)]

    def _doc(self, sku: str) -> int | None:
        """The catalog index of a SKU (``b000001234``, any case), or None."""
        sku = sku.lower()
        if not _SKU.match(sku):
            return None
        doc = int(sku[4:])
        return doc if doc < len(self.catalog) and self.catalog[doc].sku.lower() == sku else None

    # -- POST -----------------------------------------------------------------------------------------------------
    def post(self, raw_path: str, form: dict[str, list[str]], session: str) -> tuple[int, str, str | None]:
        """(status, body, redirect location)."""
        path, _ = pages.query_of(raw_path)
        field = lambda name: (form.get(name) or [""])[0].strip()  # noqa: E731
        path = path.rstrip("/")
        if path == "/checkout/cart/add":
            doc, qty = self._doc(field("sku")), _int(field("qty") or "1")
            if doc is None or qty is None or not 1 <= qty <= 99:
                return 400, pages.bad_request(f"cannot add sku {field('sku')!r} with quantity {field('qty')!r}"), None
            self.store.add_to_cart(session, self.catalog[doc].sku, qty)
            return 302, "", "/checkout/cart/"
        if path == "/checkout/cart/delete":
            doc = self._doc(field("sku"))
            if doc is None or not self.store.remove_from_cart(session, self.catalog[doc].sku):
                return 400, pages.bad_request(f"sku {field('sku')!r} is not in the cart"), None
            return 302, "", "/checkout/cart/"
        if path == "/checkout/placeorder":
            rows = self._cart_rows(session)
            values = {f: field(f) for f in ADDRESS_FIELDS}
            missing = [f for f, v in values.items() if not v]
            if not rows or missing:
                return 200, pages.checkout(rows, values, missing), None
            items = [OrderItem(sku=p.sku, name=p.name, price_cents=p.price_cents, qty=q) for p, q in rows]
            order_id = self.store.place_order(session, Address(**values), items)
            return 302, "", f"/checkout/onepage/success/?order={order_id}"
        if path == "/customer/account/loginPost":  # WebArena's set-up signs in so; the shop has one customer
            if field("login[username]").lower() != CUSTOMER["email"] or field("login[password]") != \
                    CUSTOMER["password"]:
                return 200, pages.login(SIGN_IN_REFUSED), None
            self.store.sign_in(session, CUSTOMER["email"])
            return 302, "", "/customer/account/"
        if match := _REVIEW_POST.match(path + "/"):
            doc = self._doc(match.group(1))
            rating = _int(field("rating"))
            if doc is None:
                return 404, pages.not_found(path), None
            if rating is None or not 1 <= rating <= 5 or not field("nickname") or not field("title") \
                    or not field("detail"):
                return 200, self._product(doc, "Please enter a rating from 1 to 5, a nickname, a summary and a "
                                               "review."), None
            self.store.add_review(self.catalog[doc].sku, field("nickname"), field("title"), field("detail"), rating)
            return 302, "", product_path(self.catalog, doc)
        return 404, pages.not_found(path), None

    def rest_post(self, raw_path: str, body: bytes) -> tuple[int, str]:
        """A POST to the REST API: (status, JSON). Magento's admin token (WebArena's helpers ask for one with the
        shop's admin account before they read orders and reviews)."""
        path, _ = pages.query_of(raw_path)
        if path.rstrip("/") != "/rest/default/V1/integration/admin/token":
            return 404, json.dumps({"message": f"Request does not match any route: {path}"})
        try:
            given = json.loads(body or b"{}")
        except ValueError:
            return 400, json.dumps({"message": "the body is not JSON"})
        if not isinstance(given, dict) or (given.get("username"), given.get("password")) != ADMIN:
            return 401, json.dumps({"message": SIGN_IN_REFUSED})
        return 200, json.dumps(ADMIN_TOKEN)

    def _cart_rows(self, session: str) -> list[tuple[Any, int]]:
        rows = [(self._doc(sku), qty) for sku, qty in self.store.cart(session)]
        return [(self._with_url(doc), qty) for doc, qty in rows if doc is not None]

    def _with_url(self, doc: int) -> Any:
        return _Linked(self.catalog[doc], product_path(self.catalog, doc))

    def close(self) -> None:
        self.store.close()
        self.server.close()
        self.images.close()
        self.index.close()
        self.catalog.close()


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _page_number(text: str) -> int:
    n = _int(text)
    return n if n is not None and 1 <= n <= MAX_PAGES else 1


def _slice(docs: list[int], page: int) -> tuple[list[int], int]:
    pages_total = max(1, -(-min(len(docs), PAGE_SIZE * MAX_PAGES) // PAGE_SIZE))
    return docs[(page - 1) * PAGE_SIZE: page * PAGE_SIZE], pages_total


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buf, format="PNG")
    return buf.getvalue()


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
            status, ctype, body = self.shop.route(self.path, session)
        except Exception as exc:  # a bad request gets a 500 page; the server goes on
            status, ctype, body = 500, HTML, f"<html><body>internal error: {type(exc).__name__}</body></html>"
        self._answer(status, body, session if new else None, None, ctype)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(min(length, 1 << 20))
        if self.path.startswith("/rest/"):
            status, answer = self.shop.rest_post(self.path, raw)
            self._answer(status, answer, None, None, JSON)
            return
        session, new = self.shop.session(self.headers.get("Cookie"))
        form = urllib.parse.parse_qs(raw.decode(errors="replace"))
        try:
            status, body, location = self.shop.post(self.path, form, session)
        except Exception as exc:
            status, body, location = 500, f"<html><body>internal error: {type(exc).__name__}</body></html>", None
        self._answer(status, body, session if new else None, location)

    def _answer(self, status: int, body: str | bytes, new_session: str | None, location: str | None,
                ctype: str = HTML) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if new_session:
            self.send_header("Set-Cookie", f"session={new_session}; Path=/")
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass
