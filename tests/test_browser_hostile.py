"""Hostile pages against the text browser, each served by a real HTTP server (the standard library's, on a
directory of generated files, with a few routes it answers itself: a redirect loop, a trickle, an endless body,
a header and cookie flood): every load finishes fast with a bounded page and says when it was cut, or is refused
with a ``BrowserError`` written for the agent, and the browser goes on. The probes this answers: 200,000 nested
``<div>``s (minutes of CPU: quadratic parsing), twenty 12000 x 12000 PNGs shown at 1 x 1 (seconds and ~720 MB
each to decode), and the rest of what an agent controls: body size, titles, redirects, slow servers, cookies,
tabs, history, raster height, the back/forward cache."""

from __future__ import annotations

import io
import struct
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import pytest
from PIL import Image

from bunshin.envs.webshop.browser import browser as browser_module
from bunshin.envs.webshop.browser import dom, images, loader, screenshot
from bunshin.envs.webshop.browser.browser import Browser, BrowserError

from .shop_server import QuietFiles, do, serve_directory

HUGE = 12_000  # px per side of the probe's PNGs: 144 M pixels each, ~430 KB of PNG (one colour)
FAST_S = 20.0  # what "returns within a few seconds" is held to here (the loads measure well under 3 s)
T = TypeVar("T")


def write_solid_png(path: str, width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> None:
    """A valid ``width`` x ``height`` RGB PNG of one colour, written by streaming rows through zlib a block at a
    time (a 12000 x 12000 one is 432 MB of pixels, never all in memory)."""
    def chunk(f: BinaryIO, kind: bytes, data: bytes) -> None:
        f.write(struct.pack(">I", len(data)) + kind + data)
        f.write(struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)) & 0xFFFFFFFF))
    row = b"\x00" + bytes(rgb) * width  # filter byte "none", then the pixels
    rows_per_block = max(1, (8 << 20) // len(row))
    compressor = zlib.compressobj(6)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        chunk(f, b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        for start in range(0, height, rows_per_block):
            data = compressor.compress(row * min(rows_per_block, height - start))
            if data:
                chunk(f, b"IDAT", data)
        chunk(f, b"IDAT", compressor.flush())
        chunk(f, b"IEND", b"")


def hostile_pages(root: Path) -> None:
    """Every page and image the tests load (generated once per session)."""
    (root / "divs.html").write_text("<div>" * 200_000)
    write_solid_png(str(root / "huge.png"), HUGE, HUGE)
    write_solid_png(str(root / "bomb.png"), 200, 1_000_000)  # 200 M pixels: Pillow's bomb *error* territory
    write_solid_png(str(root / "small.png"), 40, 30)
    for i in range(20):
        (root / f"huge{i}.png").symlink_to("huge.png")
    (root / "images.html").write_text(
        "<html><head><title>Pictures</title></head><body>"
        + "".join(f'<img src="huge{i}.png" width="1" height="1" alt="huge {i}">' for i in range(20))
        + '<img src="bomb.png" width="1" height="1" alt="bomb"><img src="/endless" alt="endless">'
        + '<img src="small.png" width="40" height="30" alt="small"></body></html>')
    (root / "many-images.html").write_text(
        "<html><body>" + "".join(f'<img src="small.png?{i}" alt="s{i}">' for i in range(300)) + "</body></html>")
    (root / "big.html").write_text("<html><body>" + "<p>filler text for a long page</p>" * 200_000)
    (root / "title.html").write_text("<html><head><title>" + "T" * 3_000_000 + "</title></head><body>x</body>")
    (root / "lines.html").write_text("<html><body>" + "".join(f"<p>line {i}</p>" for i in range(10_000)))
    (root / "plain.html").write_text("<html><head><title>Plain</title></head><body><p>fine</p></body></html>")


class HostileHandler(QuietFiles):
    """The directory's files, and a few routes a file server cannot misbehave with."""

    def do_GET(self) -> None:  # noqa: N802 (the http.server interface)
        if self.path == "/loop":
            self.send_response(302)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif self.path == "/to-ftp":
            self.send_response(302)
            self.send_header("Location", "ftp://127.0.0.1/x")
            self.end_headers()
        elif self.path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            try:
                for _ in range(600):  # a byte every 0.1 s: each read is quick, the page never ends
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass  # the browser gave up: what is being tested
        elif self.path == "/endless":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"<p>more</p>" * 10_000)
            except OSError:
                pass
        elif self.path == "/headers":
            self.send_response(200)
            for i in range(200):
                self.send_header(f"X-Flood-{i}", "x")
            self.end_headers()
        elif self.path.startswith("/cookies"):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            batch = self.path.rsplit("/", 1)[-1]
            for i in range(90):  # (http.client reads at most 100 header lines)
                self.send_header("Set-Cookie", f"c{batch}x{i}={'v' * 100}; Path=/")
            self.send_header("Set-Cookie", f"huge{batch}={'h' * 5000}; Path=/")
            self.end_headers()
            self.wfile.write(b"<html><body>cookies</body></html>")
        else:
            super().do_GET()


@pytest.fixture(scope="session")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-pages")
    hostile_pages(root)
    return root


@pytest.fixture(scope="module")
def site(hostile_dir: Path) -> Iterator[str]:
    with serve_directory(str(hostile_dir), HostileHandler) as url:
        yield url


def timed(action: Callable[..., T], *args: object) -> tuple[T, float]:
    started = time.monotonic()
    result = action(*args)
    return result, time.monotonic() - started


def test_200k_nested_divs_load_fast_bounded_and_truncated(site: str) -> None:
    b, took = timed(Browser, site + "/divs.html")
    assert took < FAST_S, took
    page = b.page
    assert "more than 50,000 elements" in page.truncated
    assert sum(1 for _ in page.document.iter()) == dom.MAX_NODES
    obs, observe_took = timed(b.observe)
    assert observe_took < FAST_S and len(obs.output) < 10_000
    assert "[page truncated: it has more than 50,000 elements and text runs" in obs.output
    assert obs.data["truncated"] == page.truncated
    _, took = timed(b.fetch_text, None, "div div div div span, div > div > div")  # selectors stay linear
    assert took < FAST_S
    do(b, "goto [/plain.html]")  # and the browser goes on
    assert b.observe().data["title"] == "Plain" and "[page truncated" not in b.observe().output
    b.close()


def test_twenty_huge_pngs_are_refused_before_decoding(site: str, hostile_dir: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        with Image.open(hostile_dir / "huge.png") as image:
            assert image.size == (HUGE, HUGE) and image.format == "PNG"
            image.verify()  # every chunk's CRC: a real, valid PNG
    b, took = timed(Browser, site + "/images.html")
    assert took < FAST_S, took
    assert [i.shape for i in b.page.images] == [(60, 80, 4)]  # only the small one, after 22 broken ones
    tree = b.page.tree.text()
    assert "img 'huge 19'" in tree and "img 'bomb'" in tree  # placeholders, as a browser shows
    b.close()


def test_decoding_bounds_one_by_one(hostile_dir: Path) -> None:
    page = dom.parse_html('<img src="x" width="2" height="2">')
    data = {name: (hostile_dir / name).read_bytes() for name in ("huge.png", "bomb.png", "small.png")}
    for name in ("huge.png", "bomb.png"):  # a bomb warning (144 M px) and a bomb error (200 M px): refused
        assert images.decode_images(page, lambda src, limit, n=name: data[n], 1.0) == []
    assert [i.shape for i in images.decode_images(page, lambda src, limit: data["small.png"], 1.0)] == [(2, 2, 4)]
    buffer = io.BytesIO()
    Image.new("RGB", (4097, 4096)).save(buffer, format="PNG")
    assert images.decode_images(page, lambda src, limit: buffer.getvalue(), 1.0) == []  # one pixel row too many
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64)).save(buffer, format="TIFF")  # not a format browsers show
    assert images.decode_images(page, lambda src, limit: buffer.getvalue(), 1.0) == []
    asked = []
    many = dom.parse_html("".join(f'<img src="{i}" width="4000" height="4000">' for i in range(150)))
    shown = images.decode_images(many, lambda src, limit: asked.append(limit) or data["small.png"], 1.0)
    assert len(asked) == images.MAX_IMAGES  # the rest are never fetched
    assert len(shown) == images.MAX_PAGE_SHOWN_PIXELS // (4000 * 4000)  # 16 M displayed pixels per page
    assert all(limit <= images.MAX_IMAGE_BYTES for limit in asked)


def test_many_images_and_endless_bodies_are_bounded(site: str) -> None:
    b = Browser(site + "/many-images.html")
    assert len(b.page.images) == images.MAX_IMAGES
    assert b._fetch_image(site + "/", "/endless", loader.Deadline(10), 1 << 20) is None  # past its bytes: broken
    do(b, "goto [/endless]")
    page = b.page
    assert "longer than 4 MiB" in page.truncated and page.url.endswith("/endless")
    assert "[page truncated: the document is longer than 4 MiB" in b.observe().output
    b.close()


def test_big_document_and_long_title_are_cut(site: str) -> None:
    b = Browser(site + "/big.html")
    assert "the document is longer than 4 MiB" in b.page.truncated
    do(b, "goto [/title.html]")
    obs = b.observe()
    assert len(obs.data["title"]) == browser_module.MAX_TITLE_CHARS and obs.data["title"].endswith("\u2026")
    assert len(obs.output) < 10_000 and not b.page.truncated
    b.close()


def test_redirect_loops_foreign_schemes_and_header_floods_are_refused(site: str) -> None:
    b = Browser(site + "/plain.html")
    with pytest.raises(BrowserError, match="redirects too many times"):
        do(b, "goto [/loop]")
    with pytest.raises(BrowserError, match=r"redirected to 'ftp://127\.0\.0\.1/x'.*only http and https"):
        do(b, "goto [/to-ftp]")
    with pytest.raises(BrowserError, match="cannot reach.*more than 100 headers"):
        do(b, "goto [/headers]")
    assert b.observe().data["title"] == "Plain" and len(b.tab.history) == 1  # nothing of them was kept
    b.close()


def test_a_trickling_server_cannot_stall_a_load(site: str) -> None:
    b = Browser(site + "/plain.html", timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(BrowserError, match=r"did not finish loading within 2 s"):
        do(b, "goto [/trickle]")  # every read returns within 0.1 s: only the load's deadline ends it
    assert time.monotonic() - started < 6
    assert b.observe().data["title"] == "Plain"
    b.close()


def test_cookies_are_bounded_like_a_browser(site: str) -> None:
    b = Browser(site + "/plain.html")
    for batch in range(4):
        do(b, f"goto [/cookies/{batch}]")
    cookies = list(b.cookies)
    assert len(cookies) == loader.MAX_COOKIES_PER_DOMAIN  # 360 small ones set: the oldest went first
    assert not any(c.name.startswith("huge") for c in cookies)  # over 4096 bytes: refused
    assert {c.name for c in cookies} >= {f"c3x{i}" for i in range(90)} and "c0x0" not in {c.name for c in cookies}
    b.close()


def test_tabs_and_history_are_capped(site: str) -> None:
    b = Browser(site + "/plain.html", screenshots=False, load_images=False)
    refused = 0
    for _ in range(100_000):
        try:
            do(b, "new_tab")
        except BrowserError as error:
            refused += 1
            assert "32 tabs are open" in str(error) and "close_tab" in str(error)
    assert len(b.tabs) == browser_module.MAX_TABS and refused == 100_000 - (browser_module.MAX_TABS - 1)
    do(b, "tab_focus [0]")
    for i in range(browser_module.MAX_HISTORY + 10):
        do(b, f"goto [/plain.html?{i}]")
    assert len(b.tab.history) == browser_module.MAX_HISTORY and b.tab.index == browser_module.MAX_HISTORY - 1
    assert b.tab.history[0].url.endswith(f"?{10}")  # the oldest went
    b.close()


def test_a_tall_page_has_a_capped_raster_and_true_screenshots(site: str) -> None:
    b = Browser(site + "/lines.html")
    assert len(b.page.tree.lines) == 10_000 and b.page.raster.shape[0] == screenshot.MAX_RASTER_HEIGHT
    do(b, "press [End]")  # below the raster: drawn from the lines, the same as a browser that keeps no raster
    bottom = b.observe()
    assert "line 9999" in bottom.output
    light = Browser(site + "/lines.html", keep_rasters=False)
    do(light, "press [End]")
    assert light.observe().data["screenshot"] == bottom.data["screenshot"]
    pixels = np.asarray(Image.open(io.BytesIO(bottom.data["screenshot"])))
    assert (pixels < 100).any()  # text, not a white page
    for x in (b, light):
        x.close()


def test_the_back_forward_cache_is_trimmed_oldest_first(site: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browser_module, "MAX_CACHE_BYTES", 12 << 20)  # about four 2.7 MB rasters
    b = Browser(site + "/plain.html")
    for i in range(10):
        do(b, f"goto [/plain.html?{i}]")
        assert b.raster_bytes() <= browser_module.MAX_CACHE_BYTES
    kept = [p.raster is not None for p in b.tab.history]
    assert kept[-1] and not kept[0] and kept == sorted(kept)  # the most recently shown keep theirs
    first = b.tab.history[0]
    while b.tab.index:
        do(b, "go_back")
    assert b.page is first and first.raster is not None  # redrawn when shown again
    assert b.raster_bytes() <= browser_module.MAX_CACHE_BYTES
    b.close()
