"""The real web shop (``ShopServer``, the suite's own server) served from a thread of the test process, for the
browser tests: the same routes, pages, sessions, carts, orders, reviews and images a workspace's shop serves.

Owns: ``serve_shop`` (a context manager: the server set up in its own thread, which signals ready before anyone
uses it, and always torn down: serving thread stopped, listening socket and database closed, temporary files
removed), ``RecordingShop`` (the real server, noting every request it answers; it changes nothing it answers),
``ShopSite`` and the helpers tests share (``do``, ``find_id``, ``product_url``, ``PRODUCTS``, ``CATEGORIES``);
also ``serve_directory``, the standard library's static file server on a directory of test pages (pages that
exercise browser mechanics the shop has no use for; they are test pages, not an imitation of the shop).
Must never: imitate the shop: every shop page comes from ``envs/webshop/server.py`` and its templates.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import random
import re
import selectors
import shutil
import socket
import tempfile
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bunshin.envs.app import AppContext
from bunshin.envs.records import Observation
from bunshin.envs.webshop.browser.actions import parse_action
from bunshin.envs.webshop.browser.browser import Browser
from bunshin.envs.webshop.catalog import CATEGORIES as TOP_CATEGORIES
from bunshin.envs.webshop.catalog import generate_products
from bunshin.envs.webshop.server import ShopServer, product_path

CATALOG_SIZE = 300  # 40 categories of about 7 products: every category's products fit on its first page
PRODUCTS = generate_products(CATALOG_SIZE, 0)  # what the server's catalog holds, for the tests' expectations
CATEGORIES = [f"{top}/{sub}" for top, subs in TOP_CATEGORIES.items() for sub in subs]  # the home page's order


class Request(NamedTuple):
    """One request the shop answered (images apart): method, path with query, Cookie header, POSTed form."""

    method: str
    path: str
    cookie: str
    form: dict[str, list[str]]


class RecordingShop(ShopServer):
    """The real shop server, noting what it was asked: ``requests`` (pages, forms, REST) and ``image_requests`` (paths of
    image requests, kept apart so tests can count page loads). Recording only: every answer is the server's."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.requests: list[Request] = []
        self.image_requests: list[str] = []
        self._cookie = ""  # the Cookie header of the request being answered (one request at a time)

    def session(self, cookie_header: str | None) -> tuple[str, bool]:
        self._cookie = cookie_header or ""
        return super().session(cookie_header)

    def route(self, raw_path: str, session: str = "") -> tuple[int, str, str | bytes]:
        if raw_path.startswith("/media/"):
            self.image_requests.append(raw_path)
        else:
            self.requests.append(Request("GET", raw_path, self._cookie, {}))
        return super().route(raw_path, session)

    def post(self, raw_path: str, form: dict[str, list[str]], session: str) -> tuple[int, str, str | None]:
        self.requests.append(Request("POST", raw_path, self._cookie, form))
        return super().post(raw_path, form, session)


@dataclass
class ShopSite:
    """A running shop: ``url`` (no trailing slash) and the server object (its ``requests`` and ``image_requests``)."""

    url: str
    shop: RecordingShop
    errors: list[str] = field(default_factory=list)  # tracebacks of requests that raised in the server

    @property
    def requests(self) -> list[Request]:
        return self.shop.requests


def _no_agent(cmd: str, timeout_s: float) -> Observation:
    raise RuntimeError("the test shop runs outside a workspace: it has no agent to run commands")


@contextlib.contextmanager
def serve_shop(catalog_size: int = CATALOG_SIZE, shop_class: type[RecordingShop] = RecordingShop,
               ready_timeout_s: float = 60.0) -> Iterator[ShopSite]:
    """Serve a fresh shop (empty carts, the seeded order history) on 127.0.0.1, port chosen by the kernel, the
    way a workspace's worker serves it (``Worker.serve``: the app's readers called when their sockets are
    readable), from a thread. SQLite connections belong to their thread, so ``setup`` runs in that thread too."""
    directory = tempfile.mkdtemp(prefix="bunshin-shop-test-")
    shop = shop_class(catalog_size=catalog_size, db_path=f"{directory}/db/shop.db", port=0)
    wake_r, wake_w = socket.socketpair()
    ready = threading.Event()
    failure: list[BaseException] = []
    errors: list[str] = []

    def serve() -> None:
        try:
            shop.setup(AppContext(ws_id="test-shop", seed=0, rng=random.Random(0), run_agent=_no_agent))
        except BaseException as exc:  # reported to the fixture's caller, which raises it
            failure.append(exc)
            ready.set()
            return
        ready.set()
        selector = selectors.DefaultSelector()
        try:
            selector.register(wake_r, selectors.EVENT_READ, None)
            while True:  # the readers asked again after every request (connections come and go), as Worker.serve
                wanted = dict(shop.readers())
                for key in list(selector.get_map().values()):
                    if key.fileobj is not wake_r and (key.fileobj not in wanted or key.fileobj.fileno() < 0):
                        selector.unregister(key.fileobj)
                for sock, callback in wanted.items():
                    if sock not in selector.get_map():
                        selector.register(sock, selectors.EVENT_READ, callback)
                for key, _ in selector.select():
                    if key.data is None:
                        return  # woken: stop serving
                    try:
                        key.data()
                    except Exception:  # one bad connection never stops the server (as Worker.serve)
                        errors.append(traceback.format_exc())
        finally:
            selector.close()
            shop.close()

    thread = threading.Thread(target=serve, name="test-shop-server", daemon=True)
    thread.start()
    try:
        if not ready.wait(ready_timeout_s):
            raise RuntimeError(f"the test shop was not ready within {ready_timeout_s}s")
        if failure:
            raise RuntimeError("the test shop failed to set up") from failure[0]
        yield ShopSite(url=f"http://127.0.0.1:{shop.server.port}", shop=shop, errors=errors)
    finally:
        wake_w.send(b"x")
        thread.join(30)
        wake_r.close()
        wake_w.close()
        shutil.rmtree(directory, ignore_errors=True)
        if thread.is_alive():
            raise RuntimeError("the test shop's thread did not stop")


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_in_thread(httpd: http.server.HTTPServer, name: str = "test-http-server") -> Iterator[int]:
    """Run ``httpd`` in a thread; yields its port. Its poll is short because ``shutdown()`` waits for one, and async
    tests leave this context on their event loop (the default 0.5 s per server tripped the loop watchdog)."""
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(30)


@contextlib.contextmanager
def serve_directory(directory: str, handler: type[http.server.BaseHTTPRequestHandler] = QuietFiles
                    ) -> Iterator[str]:
    """``http.server``'s file server on ``directory`` (127.0.0.1, a free port) in a thread; yields its base URL
    (no trailing slash). ``handler`` may be a subclass of the file handler that answers a few paths itself."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=directory))
    httpd.daemon_threads = True
    with serve_in_thread(httpd, name="test-pages-server") as port:
        yield f"http://127.0.0.1:{port}"


def product_url(index: int) -> str:
    """The path of the catalog's ``index``-th product page (the server's own ``product_path``)."""
    return product_path(PRODUCTS, index)  # type: ignore[arg-type]  # reads catalog[index] only


def do(b: Browser, action: str) -> None:
    """Perform one action written in WebArena's action language."""
    b.act(parse_action(action))


def find_id(text: str, role: str, name: str) -> int:
    """The id of the first line ``[id] role 'name'`` in an observation or tree text."""
    for line in text.splitlines():
        m = re.match(r"\t*\[(\d+)\] (\S+) (['\"])(.*)\3", line)
        if m and m.group(2) == role and m.group(4) == name:
            return int(m.group(1))
    raise AssertionError(f"no {role} {name!r} in:\n{text}")
