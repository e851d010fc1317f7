"""Browser mechanics the shop has no use for, on small static test pages served by the standard library's file
server (tests/shop_server.py ``serve_directory``): a form with every kind of field (hidden, text, select,
checkbox, radio, textarea, label-for and wrapping labels, a named submit button, disabled and read-only fields),
fragments, a directory redirect, a 404, text/plain and other content types, declared character sets."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from bunshin.envs.webshop.browser import dom
from bunshin.envs.webshop.browser.browser import Browser, BrowserError
from bunshin.envs.webshop.browser.loader import Response

from .shop_server import do, find_id, serve_directory

FORM_PAGE = """<!DOCTYPE html><html><head><title>Contact Us</title></head><body>
<h1>Contact Us</h1>
<form id="contact" action="/thanks.html" method="get">
  <input type="hidden" name="form_key" value="k3y">
  <label for="name">Name</label><input id="name" name="name" type="text" placeholder="Your name">
  <label for="topic">Topic</label><select id="topic" name="topic"><option value="q">Question</option>
  <option value="c">Complaint</option></select>
  <label><input type="checkbox" name="subscribe" value="yes"> Subscribe</label>
  <label><input type="radio" name="reply" value="mail" checked> By mail</label>
  <label><input type="radio" name="reply" value="phone"> By phone</label>
  <textarea name="comment" placeholder="Comment"></textarea>
  <input name="locked" value="fixed" readonly aria-label="Locked">
  <input name="off" value="x" disabled aria-label="Off">
  <button type="submit" name="action" value="send">Send</button>
</form><a href="http://[::1/broken">Broken link</a><img src="http://[::1/x.png" alt="Broken image"></body></html>"""

LONG_PAGE = ("<html><head><title>Long</title></head><body><h1>Top</h1>"
             + "".join(f"<p><a href=\"#s{i}\">to {i}</a></p>" for i in range(5))
             + "".join(f"<h2 id=\"s{i}\">Section {i}</h2>" + "".join(f"<p>line {i}.{j}</p>" for j in range(30))
                       for i in range(5))
             + "</body></html>")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Test pages (not the shop) in a temporary directory, served by ``http.server``."""
    root = tmp_path_factory.mktemp("test-pages")
    (root / "form.html").write_text(FORM_PAGE)
    (root / "thanks.html").write_text("<html><head><title>Thanks</title></head><body><p>Sent.</p></body></html>")
    (root / "long.html").write_text(LONG_PAGE)
    (root / "notes.txt").write_text("plain <b>text</b>\nsecond line")
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "folder").mkdir()
    (root / "folder" / "index.html").write_text("<html><head><title>Folder</title></head><body>in</body></html>")
    with serve_directory(str(root)) as url:
        yield url


@pytest.fixture
def browser(site: str) -> Iterator[Browser]:
    b = Browser(site + "/form.html")
    yield b
    b.close()


def test_form_fields_select_checkbox_radio_textarea(browser: Browser, site: str) -> None:
    tree = browser.observe().output
    do(browser, f"type [{find_id(tree, 'textbox', 'Name')}] [Ada Lovelace] [0]")
    do(browser, f"type [{find_id(tree, 'combobox', 'Question')}] [Complaint] [0]")
    do(browser, f"click [{find_id(tree, 'checkbox', 'Subscribe')}]")
    do(browser, f"type [{find_id(tree, 'textbox', 'Comment')}] [too loud] [0]")
    tree = browser.observe().output
    assert find_id(tree, "combobox", "Complaint") and "checked: true" in tree
    do(browser, f"click [{find_id(tree, 'StaticText', 'Subscribe')}]")  # a click on the label toggles the box
    assert re.search(r"checkbox 'Subscribe' (focused: True )?checked: false", browser.observe().output)
    do(browser, f"click [{find_id(tree, 'StaticText', 'Subscribe')}]")
    tree = browser.observe().output
    assert re.search(r"checkbox 'Subscribe' (focused: True )?checked: true", tree)
    assert re.search(r"option 'Complaint' selected: True", tree)
    do(browser, f"click [{find_id(tree, 'radio', 'By phone')}]")  # radios of one name: one is checked
    tree = browser.observe().output
    assert re.search(r"radio 'By mail' checked: false", tree) and re.search(r"radio 'By phone' .*checked: true", tree)
    with pytest.raises(BrowserError, match="no option 'Refund'"):
        do(browser, f"type [{find_id(tree, 'combobox', 'Complaint')}] [Refund]")
    with pytest.raises(BrowserError, match="read-only"):
        do(browser, f"type [{find_id(tree, 'textbox', 'fixed')}] [changed]")
    assert re.search(r"textbox 'x' required: False disabled: True", tree)
    do(browser, f"click [{find_id(tree, 'button', 'Send')}]")
    assert browser.observe().data["title"] == "Thanks"
    url = urllib.parse.urlsplit(browser.current_url())
    assert url.path == "/thanks.html"
    assert urllib.parse.parse_qsl(url.query, keep_blank_values=True) == [
        ("form_key", "k3y"), ("name", "Ada Lovelace"), ("topic", "c"), ("subscribe", "yes"), ("reply", "phone"),
        ("comment", "too loud"), ("locked", "fixed"), ("action", "send")]  # disabled fields are not sent


def test_enter_in_a_field_submits_without_the_button(browser: Browser) -> None:
    do(browser, f"type [{find_id(browser.observe().output, 'textbox', 'Name')}] [Ada] [1]")
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(browser.current_url()).query))
    assert query["name"] == "Ada" and "action" not in query  # no submitter: the button's value is not sent


def test_fragments_scroll_without_a_request(site: str) -> None:
    b = Browser(site + "/long.html")
    requests = b.requests
    do(b, f"click [{find_id(b.observe().output, 'link', 'to 3')}]")
    assert b.requests == requests and b.current_url() == site + "/long.html"
    assert re.search(r"^\t\[\d+\] heading 'Section 3'$", b.observe().output.split("\n\n", 1)[1], re.M)
    assert b.observe().output.split("\n")[4].endswith("heading 'Section 3'")  # the section is at the top
    do(b, f"goto [{site}/long.html#s4]")  # the same document: no request either
    assert b.requests == requests and "heading 'Section 4'" in b.observe().output  # as far as the page scrolls
    fresh = Browser(site + "/long.html#s2")  # another document's fragment: loaded, then scrolled
    assert "heading 'Section 2'" in fresh.observe().output.split("\n")[4]
    for x in (b, fresh):
        x.close()


def test_directory_redirect_404_and_content_types(browser: Browser, site: str) -> None:
    do(browser, "goto [/folder]")  # http.server answers 301 to /folder/
    assert browser.current_url() == site + "/folder/" and browser.observe().data["title"] == "Folder"
    do(browser, "goto [/missing.html]")
    obs = browser.observe()
    assert obs.data["status"] == 404 and "404" in obs.output  # the server's error page is shown
    do(browser, "goto [/notes.txt]")
    assert dom.query_selector(browser.page.document, "pre").text_content() == "plain <b>text</b>\nsecond line"
    assert "StaticText 'plain <b>text</b> second line'" in browser.observe().output
    do(browser, "goto [/data.bin]")
    obs = browser.observe()
    assert obs.data["title"] == "data.bin" and "application/octet-stream, 1024 bytes" in obs.output


def _decode(body: bytes, charset: str | None) -> str:
    return Response("http://x/", 200, "text/html", charset, body, False).text()


def test_declared_character_sets() -> None:
    text = "café ü"
    assert _decode(text.encode("latin-1"), "ISO-8859-1") == text
    assert _decode(text.encode("cp1252"), "windows-1252") == text
    assert _decode(text.encode("utf-16"), "utf-16") == text
    assert _decode(text.encode(), None) == text
    assert _decode(text.encode(), "no-such-charset") == text
    # a Python codec that is no web encoding (punycode decodes in quadratic time) is read as UTF-8
    assert _decode(b"abc-xyz" * 10, "punycode") == "abc-xyz" * 10
    assert _decode(b"\xff\xfe", "utf-8") == "\ufffd\ufffd"


def test_a_page_that_is_not_there_leaves_the_browser_usable(browser: Browser, tmp_path: Path) -> None:
    with serve_directory(str(tmp_path)) as gone:
        pass  # served, then shut down: the port is closed now
    with pytest.raises(BrowserError, match="cannot reach"):
        do(browser, f"goto [{gone}/x.html]")
    with pytest.raises(BrowserError, match="not a valid URL"):
        do(browser, "goto [http://[::1/x]")
    with pytest.raises(BrowserError, match="not a valid URL"):  # the page's own link (its image was skipped)
        do(browser, f"click [{find_id(browser.observe().output, 'link', 'Broken link')}]")
    with pytest.raises(BrowserError, match="cannot reach"):  # http.client sends ASCII only
        do(browser, "goto [/caf\u00e9.html]")
    assert browser.observe().data["title"] == "Contact Us"
