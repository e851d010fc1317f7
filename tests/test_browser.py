"""The text browser against a real HTTP server (a ThreadingHTTPServer in a thread serving the shop's own page
templates): accessibility tree format and stable ids, links, GET and POST forms, redirects and cookies, the
back/forward cache, tabs, scrolling, screenshots and raster memory, the action language, selectors, fetch_text."""

from __future__ import annotations

import html
import http.server
import io
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.webshop import html as pages
from bunshin.envs.webshop.browser import dom
from bunshin.envs.webshop.browser.actions import format_action, parse_action, validate_call
from bunshin.envs.webshop.browser.browser import Browser, BrowserError
from bunshin.envs.webshop.browser.dom import SelectorError, form_fields, outer_text, parse_html
from bunshin.envs.webshop.catalog import generate_products

PRODUCTS = generate_products(30, 0)
CATEGORIES = sorted({p.category for p in PRODUCTS})

FORM_PAGE = """<!DOCTYPE html><html><head><title>Contact Us</title></head><body>
<h1>Contact Us</h1>
<form id="contact" action="/contact/post/" method="post">
  <input type="hidden" name="form_key" value="k3y">
  <label for="name">Name</label><input id="name" name="name" type="text" placeholder="Your name">
  <label for="topic">Topic</label><select id="topic" name="topic"><option value="q">Question</option>
  <option value="c">Complaint</option></select>
  <label><input type="checkbox" name="subscribe" value="yes"> Subscribe</label>
  <textarea name="comment" placeholder="Comment"></textarea>
  <button type="submit" name="action" value="send">Send</button>
</form></body></html>"""


@dataclass
class _Linked:
    product: object
    url: str

    def __getattr__(self, name: str) -> object:
        return getattr(self.product, name)


def product_url(index: int) -> str:
    p = PRODUCTS[index]
    return f"/{pages.slug(p.name)}-{p.sku.lower()}.html"


@dataclass
class Shop:
    """The test server's state: every request it saw and the carts by session."""

    requests: list[tuple[str, str, str, str]] = field(default_factory=list)  # method, path, cookie, body
    images: list[str] = field(default_factory=list)  # image paths asked for (kept apart from page requests)
    carts: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    sessions: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Handler(http.server.BaseHTTPRequestHandler):
    shop: Shop

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _session(self) -> tuple[str, bool]:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == "session" and value:
                return value, False
        with self.shop.lock:
            self.shop.sessions += 1
            return f"s{self.shop.sessions}", True

    def _answer(self, status: int, body: str, location: str | None = None, cookie: str | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if cookie:
            self.send_header("Set-Cookie", f"session={cookie}; Path=/")
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/media/"):
            return self._image()
        self.shop.requests.append(("GET", self.path, self.headers.get("Cookie") or "", ""))
        path, query = pages.query_of(self.path)
        session, _ = self._session()
        if path == "/":
            return self._answer(200, pages.home(CATEGORIES))
        if path == "/catalogsearch/result/":
            q = (query.get("q") or [""])[0]
            hits = [_Linked(p, product_url(i)) for i, p in enumerate(PRODUCTS)
                    if q and any(w in (p.name + " " + p.description).lower() for w in q.lower().split())]
            return self._answer(200, pages.search_results(q, hits, len(hits), 1, 1))
        for c in CATEGORIES:
            if path == pages.category_url(c):
                items = [_Linked(p, product_url(i)) for i, p in enumerate(PRODUCTS) if p.category == c]
                return self._answer(200, pages.category(c, path, items, len(items), 1, 1, "position", "asc"))
        for i in range(len(PRODUCTS)):
            if path == product_url(i):
                return self._answer(200, pages.product_page(PRODUCTS[i], []))
        if path == "/checkout/cart/":
            rows = [(_Linked(PRODUCTS[i], product_url(i)), qty) for i, qty in self.shop.carts.get(session, [])]
            return self._answer(200, pages.cart(rows))
        if path == "/contact/":
            return self._answer(200, FORM_PAGE)
        if path == "/contact/thanks/":
            fields = "".join(f"<li class=\"field\">{html.escape(k)}={html.escape(v)}</li>" for k, v in
                             urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query, keep_blank_values=True))
            return self._answer(200, f"<html><head><title>Thanks</title></head><body><ul>{fields}</ul></body></html>")
        return self._answer(404, pages.not_found(path))

    def _image(self) -> None:
        self.shop.images.append(self.path)
        if "b000" not in self.path:
            return self._answer(404, pages.not_found(self.path))
        seed = int(self.path.rsplit("/", 1)[1].split(".")[0][1:])
        pixels = np.random.default_rng(seed).integers(0, 256, size=(48, 48, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        data = buffer.getvalue()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        self.shop.requests.append(("POST", self.path, self.headers.get("Cookie") or "", body))
        form = urllib.parse.parse_qs(body, keep_blank_values=True)
        session, new = self._session()
        if self.path == "/checkout/cart/add/":
            sku = (form.get("sku") or [""])[0]
            index = next((i for i, p in enumerate(PRODUCTS) if p.sku == sku), None)
            if index is None:
                return self._answer(400, pages.not_found(self.path))
            with self.shop.lock:
                self.shop.carts.setdefault(session, []).append((index, int((form.get("qty") or ["1"])[0])))
            return self._answer(302, "", "/checkout/cart/", session if new else None)
        if self.path == "/contact/post/":
            return self._answer(303, "", "/contact/thanks/?" + body, session if new else None)
        return self._answer(404, pages.not_found(self.path))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Shop]]:
    shop = Shop()
    handler = type("BoundHandler", (Handler,), {"shop": shop})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", shop
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def browser(server: tuple[str, Shop]) -> Iterator[Browser]:
    b = Browser(server[0] + "/")
    yield b
    b.close()


def do(b: Browser, action: str) -> None:
    b.act(parse_action(action))


def find_id(text: str, role: str, name: str) -> int:
    """The id of the first line ``[id] role 'name'`` in an observation or tree text."""
    for line in text.splitlines():
        m = re.match(r"\t*\[(\d+)\] (\S+) (['\"])(.*)\3", line)
        if m and m.group(2) == role and m.group(4) == name:
            return int(m.group(1))
    raise AssertionError(f"no {role} {name!r} in:\n{text}")


TREE_LINE = re.compile(r"^\t*(\[\d+\] [A-Za-z]+ ('[^'\n]*'|\"[^\"\n]*\")( [a-zA-Z]+: \S+)*"
                       r"|\t\(\.\.\. \d+ lines (above|below); scroll (up|down) to see them\))$")


# -- accessibility tree ---------------------------------------------------------------------------------------------


def test_observation_is_webarena_format_and_stable(browser: Browser) -> None:
    first = browser.observe()
    again = browser.observe()
    assert first.output == again.output and first.data["screenshot"] == again.data["screenshot"]
    header, _, tree = first.output.partition("\n\n")
    assert header == "Tab 0 (current): Home Page"
    lines = tree.splitlines()
    assert lines[0] == "[1] RootWebArea 'Home Page' focused: True"
    assert all(TREE_LINE.match(line) for line in lines[1:]), tree
    assert all(line.startswith("\t") for line in lines[1:])
    assert "\t[" in tree and re.search(r"^\t\[\d+\] link 'One Stop Market'$", tree, re.M)
    assert re.search(r"^\t\[\d+\] textbox 'Search entire store here\.\.\.' required: False$", tree, re.M)
    assert re.search(r"^\t\[\d+\] button 'Search'$", tree, re.M)
    assert re.search(r"^\t\[\d+\] heading 'Home Page'$", tree, re.M)
    assert re.search(r"^\t\t\[\d+\] link '" + re.escape(CATEGORIES[0].split("/")[-1]) + "'$", tree, re.M)
    assert first.data["url"] == browser.current_url() and first.data["title"] == "Home Page"
    assert first.data["tabs"] == ["Home Page"] and first.data["status"] == 200
    # a second browser on the same page gives the same ids
    other = Browser(browser.current_url())
    assert other.observe().output == first.output
    other.close()


def test_product_page_tree(browser: Browser) -> None:
    p = PRODUCTS[5]
    do(browser, f"goto [{product_url(5)}]")
    tree = browser.page.tree.text()
    assert find_id(tree, "heading", p.name)
    assert f"StaticText '{p.price}'" in tree
    assert find_id(tree, "button", "Add to Cart")
    assert find_id(tree, "textbox", "1")  # the quantity field shows its value
    assert re.search(r"row 'Color " + p.attributes["color"], tree)
    assert find_id(tree, "img", p.name)
    assert "StaticText" in tree and "hidden" not in tree


# -- navigation and forms -------------------------------------------------------------------------------------------


def test_click_link_navigates(browser: Browser, server: tuple[str, Shop]) -> None:
    category = CATEGORIES[1]
    link = find_id(browser.observe().output, "link", category.split("/")[-1])
    do(browser, f"click [{link}]")
    assert browser.current_url() == server[0] + pages.category_url(category)
    obs = browser.observe()
    assert obs.data["title"] == category.split("/")[-1]
    product = next(p for p in PRODUCTS if p.category == category)
    do(browser, f"click [{find_id(obs.output, 'link', product.name)}]")
    assert browser.observe().data["title"] == product.name
    # clicking plain text only focuses it: nothing is loaded
    before = len(server[1].requests)
    do(browser, f"click [{find_id(browser.observe().output, 'StaticText', product.price)}]")
    assert len(server[1].requests) == before and browser.observe().data["title"] == product.name


def test_type_and_enter_submits_get_form(browser: Browser, server: tuple[str, Shop]) -> None:
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [skillet deluxe] [0]")
    obs = browser.observe()
    assert re.search(rf"^\t\[{box}\] textbox 'skillet deluxe' focused: True required: False$", obs.output, re.M)
    assert browser.current_url() == server[0] + "/"
    do(browser, "press [Enter]")
    assert browser.current_url() == server[0] + "/catalogsearch/result/?q=skillet+deluxe"
    assert server[1].requests[-1][:2] == ("GET", "/catalogsearch/result/?q=skillet+deluxe")
    assert browser.observe().data["title"] == "Search results for: 'skillet deluxe'"
    # the default press_enter_after=1 submits at once
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [charger]")
    assert browser.current_url().endswith("/catalogsearch/result/?q=charger")


def test_post_form_redirect_and_cookie_shared_by_tabs(browser: Browser, server: tuple[str, Shop]) -> None:
    base, shop = server
    do(browser, f"goto [{product_url(3)}]")
    before = len(shop.requests)
    do(browser, f"click [{find_id(browser.observe().output, 'button', 'Add to Cart')}]")
    post, redirected = shop.requests[before], shop.requests[before + 1]
    assert post[0] == "POST" and post[1] == "/checkout/cart/add/"
    assert urllib.parse.parse_qs(post[3]) == {"sku": [PRODUCTS[3].sku], "qty": ["1"]}  # hidden field included
    assert redirected[:2] == ("GET", "/checkout/cart/")  # 302 after POST: a GET
    session = redirected[2]
    assert session.startswith("session=s")  # the cookie set on the 302 is sent on the redirect
    assert browser.current_url() == base + "/checkout/cart/"
    obs = browser.observe()
    assert obs.data["title"] == "Shopping Cart" and PRODUCTS[3].name in obs.output
    # a new tab shares the cookie jar
    do(browser, "new_tab")
    do(browser, "goto [/checkout/cart/]")
    assert shop.requests[-1][2] == session
    assert PRODUCTS[3].name in browser.observe().output


def test_post_form_fields_select_checkbox_textarea(browser: Browser, server: tuple[str, Shop]) -> None:
    do(browser, "goto [/contact/]")
    tree = browser.observe().output
    do(browser, f"type [{find_id(tree, 'textbox', 'Name')}] [Ada Lovelace] [0]")
    do(browser, f"type [{find_id(tree, 'combobox', 'Question')}] [Complaint] [0]")
    do(browser, f"click [{find_id(tree, 'checkbox', 'Subscribe')}]")
    do(browser, f"type [{find_id(tree, 'textbox', 'Comment')}] [too loud] [0]")
    tree = browser.observe().output
    assert find_id(tree, "combobox", "Complaint") and "checked: true" in tree
    do(browser, f"click [{find_id(tree, 'StaticText', 'Subscribe')}]")  # a click on the label toggles the box
    assert "checked: false" in browser.observe().output
    do(browser, f"click [{find_id(tree, 'StaticText', 'Subscribe')}]")
    tree = browser.observe().output
    assert "checked: true" in tree
    assert re.search(r"option 'Complaint' selected: True", tree)
    with pytest.raises(BrowserError, match="no option 'Refund'"):
        do(browser, f"type [{find_id(tree, 'combobox', 'Complaint')}] [Refund]")
    do(browser, f"click [{find_id(tree, 'button', 'Send')}]")
    assert browser.observe().data["title"] == "Thanks"
    fields = browser.page.document.query_selector_all("li.field")
    assert [outer_text(f) for f in fields] == ["form_key=k3y", "name=Ada Lovelace", "topic=c", "subscribe=yes",
                                               "comment=too loud", "action=send"]


def test_keys_hover_and_same_page_links(browser: Browser, server: tuple[str, Shop]) -> None:
    shop = server[1]
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [lamps] [0]")
    do(browser, "press [Backspace]")
    assert find_id(browser.observe().output, "textbox", "lamp") == box
    do(browser, "press [Meta+a]")
    do(browser, "press [Backspace]")  # select-all then Backspace clears the field (WebArena agents do this)
    assert re.search(rf"\[{box}\] textbox 'Search entire store here\.\.\.' focused: True", browser.observe().output)
    button = find_id(browser.observe().output, "button", "Search")
    do(browser, f"hover [{button}]")
    assert re.search(rf"\[{button}\] button 'Search' focused: True", browser.observe().output)
    do(browser, f"goto [{product_url(7)}]")
    count = len(shop.requests)
    do(browser, f"click [{find_id(browser.observe().output, 'link', f'{len(PRODUCTS[7].reviews)} Reviews')}]")
    obs = browser.observe().output  # "#reviews": the page scrolls to the reviews, no request
    assert len(shop.requests) == count and browser.page.scroll > 0
    assert re.search(r"^\t\[\d+\] heading 'Customer Reviews'$", obs, re.M)
    do(browser, "press [Alt+Left]")
    assert browser.observe().data["title"] == "Home Page" and len(shop.requests) == count
    do(browser, "press [PageDown]")  # the focus is on a button, not in a field: the page scrolls
    assert browser.page.scroll > 0


def test_back_forward_cache_makes_no_requests(browser: Browser, server: tuple[str, Shop]) -> None:
    shop = server[1]
    home = browser.observe().output
    box = find_id(home, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [kept value] [0]")
    typed_home = browser.observe().output
    do(browser, f"goto [{pages.category_url(CATEGORIES[0])}]")
    category = browser.observe().output
    do(browser, f"goto [{product_url(0)}]")
    count = len(shop.requests)
    do(browser, "go_back")
    assert browser.observe().output == category
    do(browser, "go_back")
    assert browser.observe().output == typed_home  # form state survives in the cache
    do(browser, "go_back")  # no history before the first page: nothing happens
    assert browser.observe().output == typed_home
    do(browser, "go_forward")
    assert browser.observe().output == category
    assert len(shop.requests) == count
    do(browser, f"goto [{product_url(1)}]")  # a navigation drops the forward entries
    do(browser, "go_forward")
    assert browser.observe().data["title"] == PRODUCTS[1].name
    assert [p.title for p in browser.tab.history] == ["Home Page", CATEGORIES[0].split("/")[-1], PRODUCTS[1].name]


def test_tabs(browser: Browser) -> None:
    do(browser, "new_tab")
    obs = browser.observe()
    assert obs.output.startswith("Tab 0: Home Page | Tab 1 (current): \n\n[1] RootWebArea '' focused: True")
    assert obs.data["tabs"] == ["Home Page", ""] and obs.data["url"] == "about:blank"
    do(browser, f"goto [{product_url(2)}]")
    assert len(browser.tab.history) == 1  # the blank page was replaced
    do(browser, "tab_focus [0]")
    assert browser.observe().output.startswith(f"Tab 0 (current): Home Page | Tab 1: {PRODUCTS[2].name}\n\n")
    with pytest.raises(BrowserError, match="no tab 2"):
        do(browser, "tab_focus [2]")
    do(browser, "close_tab")  # the last tab gets the focus
    assert browser.observe().data["tabs"] == [PRODUCTS[2].name] and browser.current == 0
    do(browser, "close_tab")  # closing the last tab leaves one blank tab
    obs = browser.observe()
    assert obs.data["tabs"] == [""] and obs.data["url"] == "about:blank"
    do(browser, "goto [/]")  # a path on a blank tab resolves against the start URL
    assert browser.observe().data["title"] == "Home Page"


def test_scroll_moves_the_viewport_keeps_ids(browser: Browser) -> None:
    do(browser, "goto [/catalogsearch/result/?q=the]")
    full = browser.page.tree.text()
    top = browser.observe().output
    assert browser.lines_per_viewport == 36
    assert "lines below; scroll down to see them)" in top and "lines above" not in top
    assert len([line for line in top.split("\n\n", 1)[1].splitlines() if re.match(r"\t+\[", line)]) == 36
    do(browser, "scroll [down]")
    second = browser.observe().output
    assert "(... 36 lines above; scroll up to see them)" in second
    for line in second.split("\n\n", 1)[1].splitlines()[2:-1]:  # every shown line is the page's line, same id
        assert line in full.splitlines()
    do(browser, "scroll [direction=up]")
    assert browser.observe().output == top
    for _ in range(20):
        do(browser, "scroll [down]")
    bottom = browser.observe().output
    assert "lines below" not in bottom and full.splitlines()[-1] == bottom.splitlines()[-1]
    do(browser, "scroll [down]")
    assert browser.observe().output == bottom


# -- pixels and memory ---------------------------------------------------------------------------------------------


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_screenshot_is_a_deterministic_1280x720_png(browser: Browser, server: tuple[str, Shop]) -> None:
    shot = browser.observe().data["screenshot"]
    image = _png(shot)
    assert image.format == "PNG" and image.size == (1280, 720) and image.mode == "RGB"
    other = Browser(server[0] + "/")
    assert other.observe().data["screenshot"] == shot
    other.close()
    colours = image.getcolors(1 << 16)
    assert colours is not None and len(colours) > 10  # text was drawn
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [lamp] [0]")
    assert browser.observe().data["screenshot"] != shot
    do(browser, "goto [/catalogsearch/result/?q=the]")
    top = browser.observe().data["screenshot"]
    do(browser, "scroll [down]")
    scrolled = browser.observe().data["screenshot"]
    assert scrolled != top and _png(scrolled).size == (1280, 720)
    assert Browser(server[0] + "/", screenshots=False).observe().data.get("screenshot") is None


def test_rasters_kept_per_history_entry_grow_memory(server: tuple[str, Shop]) -> None:
    b = Browser(server[0] + "/")
    sizes = [b.raster_bytes()]
    for i in range(4):
        do(b, f"goto [{product_url(i)}]")
        sizes.append(b.raster_bytes())
    assert all(later > earlier for earlier, later in zip(sizes, sizes[1:]))
    for page in b.tab.history:
        assert page.raster is not None and page.raster.dtype.name == "uint8"
        assert page.raster.shape[1:] == (1280, 3) and page.raster.shape[0] >= 720
    assert b.raster_bytes() == sum(p.raster.nbytes + sum(i.nbytes for i in p.images) for p in b.tab.history
                                   if p.raster is not None)
    long_page = Browser(server[0] + "/catalogsearch/result/?q=the")
    assert long_page.page.raster is not None and long_page.page.raster.shape[0] > 720  # grows with the page
    light = Browser(server[0] + "/", keep_rasters=False, load_images=False)
    do(light, f"goto [{product_url(0)}]")
    assert light.raster_bytes() == 0 and _png(light.observe().data["screenshot"]).size == (1280, 720)
    for x in (b, long_page, light):
        x.close()


# -- errors --------------------------------------------------------------------------------------------------------


def test_browser_errors_and_404(browser: Browser, server: tuple[str, Shop]) -> None:
    with pytest.raises(BrowserError, match=r"no element \[99999\]"):
        do(browser, "click [99999]")
    link = find_id(browser.observe().output, "link", "One Stop Market")
    with pytest.raises(BrowserError, match="not a text box"):
        do(browser, f"type [{link}] [hello]")
    with pytest.raises(ActionError):
        do(browser, "stop [done]")
    with pytest.raises(ActionError):
        browser.act(ToolCall(name="click", args={"element_id": "3"}))
    do(browser, "goto [/no/such/page]")
    obs = browser.observe()
    assert obs.data["status"] == 404 and obs.data["title"] == "404 Not Found"
    with socket_closed_port() as port:
        with pytest.raises(BrowserError, match="cannot reach"):
            do(browser, f"goto [http://127.0.0.1:{port}/]")
        with pytest.raises(BrowserError, match="cannot reach"):
            Browser(f"http://127.0.0.1:{port}/")
    assert browser.observe().data["status"] == 404  # the failed navigation left the page alone


class socket_closed_port:
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


# -- fetch_text ----------------------------------------------------------------------------------------------------


def test_fetch_text(browser: Browser, server: tuple[str, Shop]) -> None:
    whole = browser.fetch_text(None, "")
    assert whole.startswith("My Account\nMy Cart\nOne Stop Market\nSearch\nHome Page\n")
    assert browser.fetch_text(None, ".page-title") == "Home Page"
    assert browser.fetch_text(None, "h1.page-title > span.base") == "Home Page"
    assert browser.fetch_text(None, ".no-such-thing") == ""
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [typed words] [0]")
    assert browser.fetch_text(None, "#search") == "typed words"  # a field's text is its current value
    p = PRODUCTS[4]
    history = len(browser.tab.history)
    count = len(server[1].requests)
    assert browser.fetch_text(product_url(4), ".product-info-price .price") == p.price
    assert browser.fetch_text(server[0] + product_url(4), "[class=\"base\"]") == p.name
    assert len(browser.tab.history) == history and browser.current_url() == server[0] + "/"
    assert len(server[1].requests) == count + 2
    # with the browser's cookies: the cart of this session
    do(browser, f"goto [{product_url(4)}]")
    do(browser, f"click [{find_id(browser.observe().output, 'button', 'Add to Cart')}]")
    do(browser, "goto [/]")
    assert browser.fetch_text("/checkout/cart/", "#shopping-cart-table .product-item-link") == p.name
    with pytest.raises(SelectorError, match="a:hover") as info:
        browser.fetch_text(None, "a:hover")
    assert isinstance(info.value, BrowserError)  # callers that turn browser errors into tool errors catch it


# -- DOM and selectors ---------------------------------------------------------------------------------------------

DOC = """<html><head><title>T</title><style>p { color: red }</style></head><body>
<div id="main" class="page main"><ol class="items"><li class="item product"><a class="link" href="/a">A <b>bold</b></a>
<span class="price">$1.00</span><li class="item product special"><a class="link" href="/b">B</a><span class="price">$2.00
</span></ol><p>First paragraph<br>second line<p>Another <img src=x alt="pic"> paragraph</div>
<table><tr><th>K</th><td>V</td></tr><tr><th>K2</th><td>V2</td></table>
<form id="f" method="post"><input type="hidden" name="h" value="1"><input name="t" value="x">
<input type="checkbox" name="c"><select name="s"><option>one<option selected>two</select>
<textarea name="ta">
hello</textarea><input type="submit" name="go" value="Go"><input name="disabled" disabled value="d"></form>
<input form="f" name="outside" value="o">
</body></html>"""


def test_dom_selectors_and_text() -> None:
    d = parse_html(DOC)
    assert d.node_id == 1 and [n.node_id for n in d.iter()] == list(range(1, len(list(d.iter())) + 1))
    assert [n.outer_text for n in d.query_selector_all("li.item.product > a.link")] == ["A bold", "B"]
    assert [n.text_content() for n in d.query_selector_all(".special .price, #main li:not-used".split(",")[0])] \
        == ["$2.00\n"]
    assert len(d.query_selector_all("ol li")) == 2  # the unclosed <li> was closed by the next one
    assert len(d.query_selector_all("div#main > ol > li")) == 2 and d.query_selector_all("body > li") == []
    assert len(d.query_selector_all("a[href]")) == 2 and d.query_selector("a[href='/b']").outer_text == "B"
    assert d.query_selector("[href=\"/a\"]").text_content() == "A bold"
    assert len(d.query_selector_all(".price, a")) == 4
    assert d.query_selector("*.page.main#main") is d.query_selector("#main")
    assert d.query_selector("p").outer_text == "First paragraph\nsecond line"  # unclosed <p> closed by <p>
    assert d.query_selector("table").outer_text == "K\tV\nK2\tV2"
    assert outer_text(d.query_selector("#main")) == "A bold $1.00\nB$2.00\n\nFirst paragraph\nsecond line\n\n" \
                                                    "Another paragraph"
    for bad in ("a:hover", "a + b", "a ~ b", "[href^='/']", "div >", "> div", "", "a,,b", "::before"):
        with pytest.raises(SelectorError) as info:
            d.query_selector_all(bad)
        assert repr(bad) in str(info.value)
    form = d.query_selector("#f")
    assert form_fields(form) == [("h", "1"), ("t", "x"), ("s", "two"), ("ta", "hello"), ("outside", "o")]
    d.query_selector("[name=t]").value = "typed"
    d.query_selector("[name=c]").checked = True
    submit = d.query_selector("[type=submit]")
    assert form_fields(form, submit) == [("h", "1"), ("t", "typed"), ("c", "on"), ("s", "two"), ("ta", "hello"),
                                         ("go", "Go"), ("outside", "o")]


# -- the action language -------------------------------------------------------------------------------------------

EXAMPLES = {
    "click [12]": ToolCall(name="click", args={"element_id": 12}),
    "hover [3]": ToolCall(name="hover", args={"element_id": 3}),
    "type [7] [sony headphones] [1]": ToolCall(name="type", args={"element_id": 7, "text": "sony headphones",
                                                                  "press_enter_after": True}),
    "type [7] [sony headphones]": ToolCall(name="type", args={"element_id": 7, "text": "sony headphones",
                                                              "press_enter_after": True}),
    "type [7] [a] [b] [0]": ToolCall(name="type", args={"element_id": 7, "text": "a] [b", "press_enter_after": False}),
    "type [7] [x] [press_enter_after=0]": ToolCall(name="type", args={"element_id": 7, "text": "x",
                                                                      "press_enter_after": False}),
    "press [Control+a]": ToolCall(name="press", args={"key_comb": "Control+a"}),
    "scroll [down]": ToolCall(name="scroll", args={"direction": "down"}),
    "scroll [direction=up]": ToolCall(name="scroll", args={"direction": "up"}),
    "new_tab": ToolCall(name="new_tab"),
    "tab_focus [2]": ToolCall(name="tab_focus", args={"tab_index": 2}),
    "close_tab": ToolCall(name="close_tab"),
    "goto [http://127.0.0.1:7770/x.html?q=[1]]": ToolCall(name="goto",
                                                         args={"url": "http://127.0.0.1:7770/x.html?q=[1]"}),
    "go_back": ToolCall(name="go_back"),
    "go_forward": ToolCall(name="go_forward"),
    "stop [$12.99]": ToolCall(name="stop", args={"answer": "$12.99"}),
    "stop []": ToolCall(name="stop", args={"answer": ""}),
    "stop": ToolCall(name="stop", args={"answer": ""}),
    "  CLICK[5]  ": ToolCall(name="click", args={"element_id": 5}),
}


@pytest.mark.parametrize("text", list(EXAMPLES))
def test_parse_every_verb(text: str) -> None:
    call = parse_action(text)
    assert call == EXAMPLES[text]
    assert parse_action(format_action(call)) == call and validate_call(call) == call


@pytest.mark.parametrize("text, message", [
    ("clik [1]", "unknown action 'clik'"),
    ("", "empty"),
    ("click", r"click needs \[element_id\]"),
    ("click [x]", "must be a non-negative integer"),
    ("click [-3]", "must be a non-negative integer"),
    ("click [1] [2]", "takes 1 argument"),
    ("click 12", "square brackets"),
    ("type [3]", "type needs"),
    ("type [a] [b]", "non-negative integer"),
    ("scroll [left]", "up or down"),
    ("tab_focus [one]", "non-negative integer"),
    ("goto []", "non-empty"),
    ("press", "press needs"),
    ("new_tab [1]", "takes 0 argument"),
])
def test_parse_errors_name_the_action(text: str, message: str) -> None:
    with pytest.raises(ActionError, match=message) as info:
        parse_action(text)
    assert repr(text.strip()) in str(info.value) or text == ""


@pytest.mark.parametrize("call, message", [
    (ToolCall(name="jump", args={}), "unknown tool 'jump'"),
    (ToolCall(name="click", args={}), "missing"),
    (ToolCall(name="click", args={"element_id": 1, "x": 2}), "unexpected"),
    (ToolCall(name="click", args={"element_id": True}), "non-negative int"),
    (ToolCall(name="type", args={"element_id": 1, "text": 5}), "text must be str"),
    (ToolCall(name="scroll", args={"direction": "left"}), "up' or 'down"),
    (ToolCall(name="goto", args={"url": " /x"}), "surrounding whitespace"),
])
def test_validate_call_errors(call: ToolCall, message: str) -> None:
    with pytest.raises(ActionError, match=message):
        validate_call(call)
    assert validate_call(ToolCall(name="type", args={"element_id": 1, "text": "x"})).args["press_enter_after"] is True


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_stripped = _text.map(str.strip).filter(bool)
CALLS = st.one_of(
    st.builds(lambda n, i: ToolCall(name=n, args={"element_id": i}), st.sampled_from(["click", "hover"]),
              st.integers(0, 10**9)),
    st.builds(lambda i, t, p: ToolCall(name="type", args={"element_id": i, "text": t, "press_enter_after": p}),
              st.integers(0, 10**6), _text, st.booleans()),
    st.builds(lambda k: ToolCall(name="press", args={"key_comb": k}), _stripped),
    st.builds(lambda d: ToolCall(name="scroll", args={"direction": d}), st.sampled_from(["up", "down"])),
    st.builds(lambda i: ToolCall(name="tab_focus", args={"tab_index": i}), st.integers(0, 100)),
    st.builds(lambda u: ToolCall(name="goto", args={"url": u}), _stripped),
    st.builds(lambda a: ToolCall(name="stop", args={"answer": a}), _text),
    st.sampled_from([ToolCall(name=n) for n in ("new_tab", "close_tab", "go_back", "go_forward")]),
)


@settings(max_examples=300, deadline=None)
@given(CALLS)
def test_format_then_parse_round_trips(call: ToolCall) -> None:
    assert parse_action(format_action(call)) == call


def test_images_are_decoded_at_their_displayed_size_and_kept_with_the_page(server: tuple[str, Shop]) -> None:
    b = Browser(server[0] + "/", device_scale=2.0)
    do(b, f"goto [{product_url(3)}]")
    product = b.page
    assert [i.shape for i in product.images] == [(1400, 1400, 4)]  # 700x700 CSS px at device scale 2, RGBA
    assert server[1].images[-1].endswith(f"{PRODUCTS[3].sku.lower()}.png")
    do(b, f"goto [{product_url(4)}]")
    assert not np.array_equal(b.page.images[0], product.images[0])  # another product, other pixels
    do(b, "go_back")
    assert b.page is product and len(product.images) == 1  # the back/forward cache keeps them
    plain = Browser(server[0] + "/", load_images=False)
    do(plain, f"goto [{product_url(3)}]")
    assert plain.page.images == []
    for x in (b, plain):
        x.close()


def test_a_broken_image_does_not_break_its_page(server: tuple[str, Shop]) -> None:
    b = Browser(server[0] + "/")
    b.act(ToolCall(name="goto", args={"url": "/contact/"}))
    doc = b.page.document
    from bunshin.envs.webshop.browser import images

    img = dom.parse_html('<html><body><img src="/media/missing.png" width="10" height="10"></body></html>')
    assert images.decode_images(img, lambda src: b._fetch_image(b.current_url(), src), 2.0) == []
    assert images.decode_images(img, lambda src: b"not a png", 2.0) == []
    assert doc is b.page.document
    b.close()
