"""The text browser against the real shop (``ShopServer`` served from a thread, tests/shop_server.py): the
accessibility tree's format and stable ids, search and categories, product pages, the cart (add, remove; a POST
answered by a redirect, with the session cookie set on the redirect), checkout and orders, reviews, the
back/forward cache, tabs, scrolling, screenshots and raster memory, decoded images, errors, fetch_text."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from itertools import pairwise

import numpy as np
import pytest
from PIL import Image

from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.webshop import html as pages
from bunshin.envs.webshop.browser import images
from bunshin.envs.webshop.browser.browser import Browser, BrowserError
from bunshin.envs.webshop.browser.dom import SelectorError, parse_html
from bunshin.envs.webshop.browser.loader import Deadline

from .shop_server import CATEGORIES, PRODUCTS, ShopSite, do, find_id, product_url, serve_shop

TREE_LINE = re.compile(r"^\t*(\[\d+\] [A-Za-z]+ ('[^'\n]*'|\"[^\"\n]*\")( [a-zA-Z]+: \S+)*"
                       r"|\t\(\.\.\. \d+ lines (above|below); scroll (up|down) to see them\))$")


@pytest.fixture(scope="module")
def shop() -> Iterator[ShopSite]:
    with serve_shop() as site:
        yield site


@pytest.fixture
def browser(shop: ShopSite) -> Iterator[Browser]:
    b = Browser(shop.url + "/")
    yield b
    b.close()


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


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
    assert "truncated" not in first.data and "[page truncated" not in first.output
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
    assert find_id(tree, "heading", "Customer Reviews") and find_id(tree, "button", "Submit Review")
    assert "StaticText" in tree and "hidden" not in tree


# -- navigation, search, categories ---------------------------------------------------------------------------------


def test_click_link_navigates(browser: Browser, shop: ShopSite) -> None:
    category = CATEGORIES[1]
    link = find_id(browser.observe().output, "link", category.split("/")[-1])
    do(browser, f"click [{link}]")
    assert browser.current_url() == shop.url + pages.category_url(category)
    obs = browser.observe()
    assert obs.data["title"] == category.split("/")[-1]
    product = next(p for p in PRODUCTS if p.category == category)
    do(browser, f"click [{find_id(obs.output, 'link', product.name)}]")
    assert browser.observe().data["title"] == product.name
    # clicking plain text only focuses it: nothing is loaded
    before = len(shop.requests)
    do(browser, f"click [{find_id(browser.observe().output, 'StaticText', product.price)}]")
    assert len(shop.requests) == before and browser.observe().data["title"] == product.name


def test_category_sorting_links(browser: Browser, shop: ShopSite) -> None:
    category = CATEGORIES[2]
    do(browser, f"goto [{pages.category_url(category)}]")
    do(browser, f"click [{find_id(browser.observe().output, 'link', 'Sort by Price descending')}]")
    assert shop.requests[-1].path.endswith("?product_list_order=price&product_list_dir=desc")
    shown = [p for p in PRODUCTS if p.category == category]
    prices = [line for line in browser.page.tree.text().splitlines() if re.search(r"StaticText '\$\d", line)]
    expected = sorted(shown, key=lambda p: -p.price_cents)
    assert [line.split("'")[1] for line in prices] == [p.price for p in expected]


def test_type_and_enter_submits_get_form(browser: Browser, shop: ShopSite) -> None:
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [skillet deluxe] [0]")
    obs = browser.observe()
    assert re.search(rf"^\t\[{box}\] textbox 'skillet deluxe' focused: True required: False$", obs.output, re.M)
    assert browser.current_url() == shop.url + "/"
    do(browser, "press [Enter]")
    assert browser.current_url() == shop.url + "/catalogsearch/result/?q=skillet+deluxe"
    assert shop.requests[-1][:2] == ("GET", "/catalogsearch/result/?q=skillet+deluxe")
    assert browser.observe().data["title"] == "Search results for: 'skillet deluxe'"
    # the default press_enter_after=1 submits at once
    box = find_id(browser.observe().output, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [charger]")
    assert browser.current_url().endswith("/catalogsearch/result/?q=charger")
    charger = next(p for p in PRODUCTS if "Charger" in p.name)
    assert find_id(browser.observe().output, "link", charger.name)


# -- the cart, checkout, orders, reviews ---------------------------------------------------------------------------


def test_post_redirect_sets_the_session_cookie_shared_by_tabs(browser: Browser, shop: ShopSite) -> None:
    do(browser, f"goto [{product_url(3)}]")
    browser.cookies.clear()  # no session yet: the POST starts one, and its 302 sets the cookie
    before = len(shop.requests)
    do(browser, f"click [{find_id(browser.observe().output, 'button', 'Add to Cart')}]")
    post, redirected = shop.requests[before], shop.requests[before + 1]
    assert post[:3] == ("POST", "/checkout/cart/add/", "")
    assert post.form == {"sku": [PRODUCTS[3].sku], "qty": ["1"]}  # the hidden field included
    assert redirected[:2] == ("GET", "/checkout/cart/")  # 302 after POST: a GET
    session = redirected.cookie
    assert re.fullmatch(r"session=[0-9a-f]{16}", session)  # the cookie set on the 302 is sent on the redirect
    assert browser.current_url() == shop.url + "/checkout/cart/"
    obs = browser.observe()
    assert obs.data["title"] == "Shopping Cart" and PRODUCTS[3].name in obs.output  # that session's cart
    # a new tab shares the cookie jar
    do(browser, "new_tab")
    do(browser, "goto [/checkout/cart/]")
    assert shop.requests[-1].cookie == session
    assert PRODUCTS[3].name in browser.observe().output


def test_remove_from_cart(browser: Browser, shop: ShopSite) -> None:
    for index in (10, 11):
        do(browser, f"goto [{product_url(index)}]")
        do(browser, f"click [{find_id(browser.observe().output, 'button', 'Add to Cart')}]")
    cart = browser.observe().output
    assert PRODUCTS[10].name in cart and PRODUCTS[11].name in cart
    do(browser, f"click [{find_id(cart, 'button', f'Remove {PRODUCTS[10].name}')}]")
    assert shop.requests[-2].form == {"sku": [PRODUCTS[10].sku]} and shop.requests[-1].path == "/checkout/cart/"
    cart = browser.observe().output
    assert PRODUCTS[10].name not in cart and PRODUCTS[11].name in cart


def test_checkout_places_an_order_listed_in_the_history(browser: Browser, shop: ShopSite) -> None:
    p = PRODUCTS[12]
    do(browser, f"goto [{product_url(12)}]")
    tree = browser.observe().output
    do(browser, f"type [{find_id(tree, 'textbox', '1')}] [2] [0]")
    do(browser, f"click [{find_id(tree, 'button', 'Add to Cart')}]")
    assert re.search(r"Qty: 2", browser.page.tree.text())
    do(browser, f"click [{find_id(browser.observe().output, 'link', 'Proceed to Checkout')}]")
    assert browser.observe().data["title"] == "Checkout"
    do(browser, f"type [{find_id(browser.observe().output, 'textbox', 'First Name')}] [Ada] [0]")
    do(browser, f"click [{find_id(browser.page.tree.text(), 'button', 'Place Order')}]")
    refused = browser.observe()  # missing fields: the form again, with what was typed and what is missing
    assert refused.data["title"] == "Checkout" and "Last Name: This is a required field." in refused.output
    assert find_id(refused.output, "textbox", "Ada")
    address = {"Last Name": "Lovelace", "Street Address": "12 St James's Square", "City": "London",
               "State/Province": "Westminster", "Zip/Postal Code": "SW1Y 4JH", "Country": "United Kingdom",
               "Phone Number": "5551234"}
    for label, value in address.items():  # the whole page's tree: the last fields are below the viewport
        do(browser, f"type [{find_id(browser.page.tree.text(), 'textbox', label)}] [{value}] [0]")
    do(browser, f"click [{find_id(browser.page.tree.text(), 'button', 'Place Order')}]")
    post = next(r for r in reversed(shop.requests) if r.method == "POST")
    assert post.path == "/checkout/placeorder/" and post.form["firstname"] == ["Ada"]
    assert browser.observe().data["title"] == "Thank you for your purchase!"
    number = browser.fetch_text(None, ".order-number")
    do(browser, f"click [{find_id(browser.observe().output, 'link', number)}]")
    order = browser.observe()
    assert order.data["title"] == f"Order # {number}" and p.name in order.output and "Ordered: 2" in order.output
    assert "Ada Lovelace" in browser.fetch_text(None, ".box-order-shipping-address")
    history = browser.fetch_text("/sales/order/history/", "")
    assert f"View Order {number}" in history
    assert browser.fetch_text("/checkout/cart/", ".cart-empty") == "You have no items in your shopping cart."


def test_a_review_is_posted_and_shown(browser: Browser, shop: ShopSite) -> None:
    p = PRODUCTS[13]
    do(browser, f"goto [{product_url(13)}]")
    tree = browser.page.tree.text()
    do(browser, f"type [{find_id(tree, 'textbox', 'Nickname')}] [ada] [0]")
    do(browser, f"click [{find_id(tree, 'button', 'Submit Review')}]")  # no rating: refused, same page
    assert "Please enter a rating from 1 to 5" in browser.observe().output
    tree = browser.page.tree.text()
    for label, value in (("Your Rating (1-5)", "4"), ("Nickname", "ada"), ("Summary", "Sturdy"),
                         ("Review", "held up on a long hike")):
        do(browser, f"type [{find_id(tree, 'textbox', label)}] [{value}] [0]")
    do(browser, f"click [{find_id(tree, 'button', 'Submit Review')}]")
    assert shop.requests[-2].form["detail"] == ["held up on a long hike"]  # the textarea's value
    assert shop.requests[-1][:2] == ("GET", product_url(13))  # redirected back to the product
    text = browser.fetch_text(None, ".customer-review")
    assert "Sturdy" in text and "held up on a long hike" in text and "Review by ada" in text
    assert find_id(browser.observe().output, "link", f"{len(p.reviews) + 1} Reviews")


# -- keys, history, tabs, scrolling ----------------------------------------------------------------------------------


def test_keys_hover_and_same_page_links(browser: Browser, shop: ShopSite) -> None:
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


def test_back_forward_cache_makes_no_requests(browser: Browser, shop: ShopSite) -> None:
    home = browser.observe().output
    box = find_id(home, "textbox", "Search entire store here...")
    do(browser, f"type [{box}] [kept value] [0]")
    typed_home = browser.observe().output
    do(browser, f"goto [{pages.category_url(CATEGORIES[0])}]")
    category = browser.observe().output
    do(browser, f"goto [{product_url(0)}]")
    count, pictures = len(shop.requests), len(shop.shop.image_requests)
    do(browser, "go_back")
    assert browser.observe().output == category
    do(browser, "go_back")
    assert browser.observe().output == typed_home  # form state survives in the cache
    do(browser, "go_back")  # no history before the first page: nothing happens
    assert browser.observe().output == typed_home
    do(browser, "go_forward")
    assert browser.observe().output == category
    assert len(shop.requests) == count and len(shop.shop.image_requests) == pictures
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
    full = browser.page.tree.text()  # the home page: 40 categories, more than two viewports
    assert len(browser.page.tree.lines) > 2 * 36
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


def test_screenshot_is_a_deterministic_1280x720_png(browser: Browser, shop: ShopSite) -> None:
    shot = browser.observe().data["screenshot"]
    image = _png(shot)
    assert image.format == "PNG" and image.size == (1280, 720) and image.mode == "RGB"
    other = Browser(shop.url + "/")
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
    # without kept rasters the viewport is drawn from the lines: the same pixels
    light = Browser(browser.current_url(), keep_rasters=False, load_images=False)
    do(light, "scroll [down]")
    assert light.observe().data["screenshot"] == scrolled
    assert Browser(shop.url + "/", screenshots=False).observe().data.get("screenshot") is None


def test_rasters_kept_per_history_entry_grow_memory(shop: ShopSite) -> None:
    b = Browser(shop.url + "/")
    sizes = [b.raster_bytes()]
    for i in range(4):
        do(b, f"goto [{product_url(i)}]")
        sizes.append(b.raster_bytes())
    assert all(later > earlier for earlier, later in pairwise(sizes))
    for page in b.tab.history:
        assert page.raster is not None and page.raster.dtype.name == "uint8"
        assert page.raster.shape[1:] == (1280, 3) and page.raster.shape[0] >= 720
    assert b.raster_bytes() == sum(p.raster.nbytes + sum(i.nbytes for i in p.images) for p in b.tab.history
                                   if p.raster is not None)
    long_page = Browser(shop.url + "/catalogsearch/result/?q=the")
    assert long_page.page.raster is not None and long_page.page.raster.shape[0] > 720  # grows with the page
    light = Browser(shop.url + "/", keep_rasters=False, load_images=False)
    do(light, f"goto [{product_url(0)}]")
    assert light.raster_bytes() == 0 and _png(light.observe().data["screenshot"]).size == (1280, 720)
    for x in (b, long_page, light):
        x.close()


def test_images_are_decoded_at_their_displayed_size_and_kept_with_the_page(shop: ShopSite) -> None:
    b = Browser(shop.url + "/", device_scale=2.0)
    do(b, f"goto [{product_url(3)}]")
    product = b.page
    # the product's 700x700 CSS px photo at device scale 2, RGBA, then the related products' 240x300 ones
    assert [i.shape for i in product.images] == [(1400, 1400, 4)] + [(600, 480, 4)] * 4
    assert f"/media/catalog/product/{PRODUCTS[3].sku.lower()}.png" in shop.shop.image_requests
    do(b, f"goto [{product_url(4)}]")
    assert not np.array_equal(b.page.images[0], product.images[0])  # another product, other pixels
    do(b, "go_back")
    assert b.page is product and len(product.images) == 5  # the back/forward cache keeps them
    plain = Browser(shop.url + "/", load_images=False)
    do(plain, f"goto [{product_url(3)}]")
    assert plain.page.images == []
    for x in (b, plain):
        x.close()


def test_a_broken_image_does_not_break_its_page(shop: ShopSite) -> None:
    b = Browser(shop.url + "/")
    doc = b.page.document
    img = parse_html('<html><body><img src="/media/missing.png" width="10" height="10"></body></html>')
    fetch = lambda src, limit: b._fetch_image(b.current_url(), src, Deadline(5), limit)  # noqa: E731
    assert fetch("/media/catalog/product/b0000000001.png", 1 << 20)[:4] == b"\x89PNG"
    assert images.decode_images(img, fetch, 2.0) == []  # a 404
    assert images.decode_images(img, lambda src, limit: b"not a png", 2.0) == []
    assert doc is b.page.document
    b.close()


# -- errors --------------------------------------------------------------------------------------------------------


class socket_closed_port:
    """A loopback port nothing listens on."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        return self.sock.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_browser_errors_and_404(browser: Browser) -> None:
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
    with pytest.raises(BrowserError, match="only http"):
        do(browser, "goto [file:///etc/passwd]")
    assert browser.observe().data["status"] == 404  # the failed navigations left the page alone


# -- fetch_text ----------------------------------------------------------------------------------------------------


def test_fetch_text(browser: Browser, shop: ShopSite) -> None:
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
    count = len(shop.requests)
    assert browser.fetch_text(product_url(4), ".product-info-price .price") == p.price
    assert browser.fetch_text(shop.url + product_url(4), "[class=\"base\"]") == p.name
    assert len(browser.tab.history) == history and browser.current_url() == shop.url + "/"
    assert len(shop.requests) == count + 2
    # with the browser's cookies: the cart of this session
    do(browser, f"goto [{product_url(4)}]")
    do(browser, f"click [{find_id(browser.observe().output, 'button', 'Add to Cart')}]")
    do(browser, "goto [/]")
    assert browser.fetch_text("/checkout/cart/", "#shopping-cart-table .product-item-link") == p.name
    with pytest.raises(SelectorError, match="a:hover") as info:
        browser.fetch_text(None, "a:hover")
    assert isinstance(info.value, BrowserError)  # callers that turn browser errors into tool errors catch it
