"""The text browser: tabs, history with a back/forward cache, cookies, forms, and WebArena's actions on them.

Owns: ``Browser`` (what a workspace's host process drives for the web-shop suites); it raises ``BrowserError``
(``errors.py``: an action the page refuses: unknown element id, typing into something that is not a field, a bad
tab index, a site that cannot be reached; the message is written for the agent).

- HTTP through ``loader.py`` (urllib, no proxy): one cookie jar shared by every tab (the standard jar with a
  browser's limits; urllib's cookie processor stores cookies from intermediate redirect responses too, which a
  POST -> 302 -> GET flow needs); redirects are followed by urllib (a 301/302/303 after a POST becomes a GET, as
  browsers do). A non-2xx status is not an error: its page is shown, as a browser shows a 404 page.
- A tab is a list of history entries (``Page``) and a current index. A navigation drops the forward entries and
  appends; ``go_back``/``go_forward`` re-show the cached entry without a request (bfcache), with its scroll
  position, focus and typed form values. Each entry keeps its decoded page: the DOM, the laid-out accessibility
  tree, with ``keep_rasters`` the full-page raster (``H x 1280 x 3`` bytes) and, with ``load_images``, the page's
  images decoded at their displayed size in device pixels (``device_scale``, 2 as on a HiDPI screen): the browser's
  memory grows with every page visited, which is what makes a rollout's workspace diverge from its siblings.
- The viewport is ``viewport[1] // LINE_HEIGHT`` lines of the tree (36 for 720 px); ``scroll`` moves one viewport,
  clamped to the page, like ``scrollTop += innerHeight``. Same page state, same text, ids and pixels.
- A browser pickles whole (the private-restore backend's checkpoint of a web shop): every tab and history entry
  with its DOM, tree, raster and images, and the cookie jar's cookies; the loader is rebuilt when unpickled.

Bounded whatever the agent opens (it can serve any page on its workspace's loopback): a load (the document and its
redirects) has ``timeout_s`` in all, and the page's images another ``timeout_s``; at most ``MAX_PAGE_BYTES`` of a
document are read and parsed (``dom`` bounds the tree, ``images`` the pictures); a title is cut at
``MAX_TITLE_CHARS``; at most ``MAX_TABS`` tabs (a clear ``BrowserError`` past it) and ``MAX_HISTORY`` entries per
tab (the oldest is dropped, as browsers do); the rasters and decoded images kept in the back/forward cache take at
most ``MAX_CACHE_BYTES`` (the least recently shown entries give theirs up first; a raster is redrawn when its page
is shown again, images are not reloaded). A page cut by a bound says so: ``Page.truncated`` and a
``[page truncated: ...]`` line in the observation.
Must never: import the shop (it only speaks HTTP), run scripts, or perform ``stop`` (the suite's final action).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...records import Observation, ToolCall
from ...suites.base import ActionError
from . import accessibility, dom, images, screenshot
from .accessibility import LINE_HEIGHT
from .actions import validate_call
from .errors import BrowserError, PageSelectorError
from .loader import BoundedCookieJar, Deadline, Loader, join_url

__all__ = ["BLANK", "Browser", "BrowserError", "Page", "PageSelectorError", "Tab"]

BLANK = "about:blank"
# Bytes of a document read and parsed; more is cut (the page says so). A Magento page is a few hundred KB.
MAX_PAGE_BYTES = 4 << 20
MAX_TITLE_CHARS = 1024  # a title (tab header, RootWebArea name) is cut past this; real ones are under 100
# Open tabs: a WebArena task uses one or two. new_tab past it is refused (each tab holds at least a blank raster).
MAX_TABS = 32
# Entries per tab's history, as Chromium keeps at most 50 per tab; a navigation past it drops the oldest.
MAX_HISTORY = 50
# Rasters and decoded images kept in all tabs' back/forward cache. A shop page keeps about 4-8 MB, so a long
# rollout stays far below; past it the least recently shown entries give theirs up (the current page never).
MAX_CACHE_BYTES = 512 << 20


@dataclass(eq=False)
class Page:
    """One history entry: the decoded page and its state (scroll line, focus, typed values in the DOM)."""

    url: str
    status: int
    document: dom.Node
    title: str
    scroll: int = 0  # index of the first content line in the viewport
    focused: int | None = None
    select_all: bool = False  # Control/Meta+a pressed in the focused field: the next Backspace clears it
    raster: np.ndarray | None = None
    images: list[np.ndarray] = field(default_factory=list)  # decoded <img>s at their displayed size
    _tree: accessibility.Tree | None = field(default=None, repr=False)
    _raster_stale: bool = True
    truncated: str = ""  # why a bound cut the page ("" when none did), shown to the agent
    shown: int = 0  # when the page was last shown (the browser's clock): the cache's eviction order

    @property
    def tree(self) -> accessibility.Tree:
        if self._tree is None:
            self._tree = accessibility.build(self.document, self.title, self.focused)
        return self._tree

    def changed(self) -> None:
        """The page state (a value, the focus) changed: lay out and draw it again when next needed."""
        self._tree = None
        self._raster_stale = True

    def cached_bytes(self) -> int:
        return (self.raster.nbytes if self.raster is not None else 0) + sum(i.nbytes for i in self.images)


@dataclass(eq=False)
class Tab:
    history: list[Page]
    index: int = 0

    @property
    def page(self) -> Page:
        return self.history[self.index]


def _blank_page() -> Page:
    return Page(url=BLANK, status=200, document=dom.parse_html("<html><head></head><body></body></html>"), title="")


def _title(text: str) -> str:
    return text if len(text) <= MAX_TITLE_CHARS else text[:MAX_TITLE_CHARS - 1] + "\u2026"


class Browser:
    """A text browser over HTTP with WebArena's action set; see the module docstring. ``timeout_s`` is the time one
    load may take in all (the document with its redirects; the page's images get as long again)."""

    def __init__(self, start_url: str, *, viewport: tuple[int, int] = (1280, 720), screenshots: bool = True,
                 keep_rasters: bool = True, load_images: bool = True, device_scale: float = 2.0,
                 timeout_s: float = 10.0):
        self.start_url = start_url
        self.viewport = (int(viewport[0]), int(viewport[1]))
        self.lines_per_viewport = max(1, self.viewport[1] // LINE_HEIGHT)
        self.screenshots = screenshots
        self.keep_rasters = keep_rasters
        self.load_images, self.device_scale = load_images, float(device_scale)
        self.timeout_s = timeout_s
        self.cookies = BoundedCookieJar()
        self._loader = Loader(self.cookies)
        self.tabs: list[Tab] = [Tab([_blank_page()])]
        self.current = 0
        self.closed = False
        self.requests = 0  # HTTP requests sent (redirect hops counted once)
        self._clock = 0  # counts pages being shown (Page.shown: the cache's eviction order)
        self._navigate(self.tabs[0], self._resolve(start_url))

    # -- serialisation (the private-restore backend's checkpoint) ------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Everything a restored browser needs to go on exactly where this one is: tabs, every history entry (its
        DOM with typed values and checked boxes, laid-out tree, scroll, focus, raster and decoded images), the
        current tab, the request count, and the cookie jar's cookies (the jar itself holds a lock). Not the
        loader: it holds nothing but handlers, and is rebuilt around the restored jar. Pickle it in one piece,
        so the accessibility trees keep pointing at their documents' nodes."""
        state = self.__dict__.copy()
        del state["_loader"]
        state["cookies"] = list(self.cookies)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        cookies = state.pop("cookies")
        self.__dict__.update(state)
        self.cookies = BoundedCookieJar()
        for cookie in cookies:
            self.cookies.set_cookie(cookie)
        self._loader = Loader(self.cookies)

    # -- public API ------------------------------------------------------------------------------------------

    @property
    def tab(self) -> Tab:
        return self.tabs[self.current]

    @property
    def page(self) -> Page:
        return self.tab.page

    def current_url(self) -> str:
        if self.closed:
            raise BrowserError("the browser is closed")
        return self.page.url

    def act(self, call: ToolCall) -> None:
        """Perform one action (any verb but ``stop``); ``ActionError`` for a malformed call, ``BrowserError`` for
        one the page refuses."""
        if self.closed:
            raise BrowserError("the browser is closed")
        call = validate_call(call)
        a = call.args
        name = call.name
        if name == "stop":
            raise ActionError("stop is the final action: the suite scores it, the browser does not perform it")
        if name == "click":
            self._click(a["element_id"])
        elif name == "hover":
            self._focus(self._element(a["element_id"]))
        elif name == "type":
            self._type(a["element_id"], a["text"], a["press_enter_after"])
        elif name == "press":
            self._press(a["key_comb"])
        elif name == "scroll":
            self._scroll(1 if a["direction"] == "down" else -1)
        elif name == "new_tab":
            if len(self.tabs) >= MAX_TABS:
                raise BrowserError(f"cannot open a new tab: {MAX_TABS} tabs are open, the most this browser keeps; "
                                   f"close one (close_tab) or reuse one (tab_focus)")
            self.tabs.append(Tab([_blank_page()]))
            self.current = len(self.tabs) - 1
        elif name == "tab_focus":
            index = a["tab_index"]
            if not 0 <= index < len(self.tabs):
                raise BrowserError(f"there is no tab {index}: the open tabs are 0 to {len(self.tabs) - 1}")
            self.current = index
        elif name == "close_tab":
            del self.tabs[self.current]
            if not self.tabs:
                self.tabs.append(Tab([_blank_page()]))
            self.current = len(self.tabs) - 1  # as WebArena: the last open tab gets the focus
        elif name == "goto":
            self._navigate(self.tab, self._resolve(a["url"]))
        elif name == "go_back" and self.tab.index > 0:
            self.tab.index -= 1
        elif name == "go_forward" and self.tab.index < len(self.tab.history) - 1:
            self.tab.index += 1
        self._keep_raster(self.page)

    def observe(self) -> Observation:
        """WebArena's text observation of the current tab's viewport, with the tab header (and a line saying so
        when a bound cut the page); ``data`` carries the URL, the title, every tab's title, the status,
        ``truncated`` (only when cut) and (with ``screenshots``) the viewport PNG."""
        if self.closed:
            raise BrowserError("the browser is closed")
        page = self.page
        tree = page.tree
        page.scroll = min(page.scroll, accessibility.max_scroll(tree, self.lines_per_viewport))
        header = " | ".join(f"Tab {i} (current): {t.page.title}" if i == self.current else f"Tab {i}: {t.page.title}"
                            for i, t in enumerate(self.tabs))
        text = f"{header}\n\n{accessibility.render_viewport(tree, page.scroll, self.lines_per_viewport)}"
        data: dict[str, Any] = {"url": page.url, "title": page.title, "tabs": [t.page.title for t in self.tabs],
                                "tab_index": self.current, "status": page.status}
        if page.truncated:
            text += f"\n[page truncated: {page.truncated}; only the part before it is shown]"
            data["truncated"] = page.truncated
        if self.screenshots:
            data["screenshot"] = self.screenshot()
        return Observation(output=text, data=data)

    def screenshot(self) -> bytes:
        """The current viewport as PNG bytes, exactly ``viewport`` pixels: cropped from the kept raster, or drawn
        from the page's lines where the raster does not reach (or is not kept)."""
        page = self.page
        top = page.scroll * LINE_HEIGHT
        raster = self._keep_raster(page) if self.keep_rasters else None
        capped = raster is not None and raster.shape[0] < screenshot.page_height(page.tree, self.viewport[1])
        if raster is None or (capped and top + self.viewport[1] > raster.shape[0]):
            raster, top = screenshot.render_lines(page.tree, page.scroll, *self.viewport, page.focused), 0
        return screenshot.viewport_png(raster, top, self.viewport)

    def page_tree(self) -> str:
        """The current page's whole tree as text (every line, no viewport): what ``observe`` shows a window of."""
        if self.closed:
            raise BrowserError("the browser is closed")
        return self.page.tree.text()

    def find(self, role: str, name: str) -> int | None:
        """The id of the first element of the current page with this role and this name (or placeholder)."""
        tree = self.page.tree
        return next((line.node_id for line in (tree.root, *tree.lines)
                     if line.role == role and name in (line.name, line.placeholder)), None)

    def fetch_text(self, url: str | None, selector: str) -> str:
        """For WebArena's program_html evaluator: the outer text of the first element matching ``selector`` (the
        page's body when ``selector`` is empty; "" when nothing matches) on ``url`` fetched with the browser's
        cookies in a throw-away page (no history change), or on the current page as it is now when ``url`` is
        None (typed values included: the text of a form field is its value). ``PageSelectorError`` (a
        ``BrowserError`` and a ``dom.SelectorError``) for a selector outside the supported subset."""
        document = self.page.document if url is None else self._load(self._resolve(url)).document
        if not selector.strip():
            return dom.outer_text(dom.body_of(document))
        try:
            node = dom.query_selector(document, selector)
        except dom.SelectorError as error:
            raise PageSelectorError(str(error)) from error
        return dom.outer_text(node) if node is not None else ""

    def raster_bytes(self) -> int:
        """Bytes of page rasters and decoded images kept in every tab's history (the back/forward cache)."""
        return sum(p.cached_bytes() for t in self.tabs for p in t.history)

    def close(self) -> None:
        self.tabs = []
        self.closed = True
        self.cookies.clear()

    # -- loading -----------------------------------------------------------------------------------------------

    def _resolve(self, url: str) -> str:
        url = url.strip()
        if url == BLANK:
            return url
        if re.match(r"^[A-Za-z0-9.-]+:\d+(/|$)", url):  # "localhost:7770/x": no scheme
            url = "http://" + url
        base = self.page.url if self.tabs and self.page.url != BLANK else self.start_url
        resolved = join_url(base, url)
        if urllib.parse.urlsplit(resolved).scheme not in ("http", "https"):
            raise BrowserError(f"cannot open {url[:200]!r}: only http(s) URLs and paths on this site are supported")
        return resolved

    def _load(self, url: str, data: bytes | None = None) -> Page:
        """GET (or POST ``data``) ``url`` following redirects, parsed into a new page (not in any history)."""
        if url == BLANK:
            return _blank_page()
        url = urllib.parse.urldefrag(url).url
        self.requests += 1
        response = self._loader.load(url, Deadline(self.timeout_s), MAX_PAGE_BYTES, data)
        body, final = response.body, response.url
        text = response.text()
        if response.content_type == "text/plain":
            text = f"<html><body><pre>{html.escape(text)}</pre></body></html>"
        elif response.content_type not in ("text/html", "application/xhtml+xml"):
            name = urllib.parse.urlsplit(final).path.rsplit("/", 1)[-1] or final
            size = f"more than {len(body)}" if response.truncated else f"{len(body)}"
            text = (f"<html><head><title>{html.escape(name)}</title></head><body><p>"
                    f"{html.escape(response.content_type)}, {size} bytes</p></body></html>")
        parsed = dom.parse(text)
        cut = [f"the document is longer than {MAX_PAGE_BYTES >> 20} MiB"] if response.truncated and \
            response.content_type in ("text/html", "application/xhtml+xml", "text/plain") else []
        cut += [f"it has {parsed.truncated}"] if parsed.truncated else []
        title = _title(dom.page_title(parsed.document))
        return Page(url=final, status=response.status, document=parsed.document, title=title or _title(final),
                    truncated="; ".join(cut))

    def _fetch_image(self, page_url: str, src: str, deadline: Deadline, max_bytes: int) -> bytes | None:
        """An image's bytes, with the browser's cookies; None when it cannot be loaded, is not a 200, or is longer
        than ``max_bytes`` (a broken image)."""
        try:
            url = join_url(page_url, src)
        except BrowserError:
            return None
        if urllib.parse.urlsplit(url).scheme not in ("http", "https") or deadline.left() <= 0:
            return None
        self.requests += 1
        try:
            response = self._loader.load(url, deadline, max_bytes, accept="image/*")
        except BrowserError:
            return None
        return response.body if response.status == 200 and not response.truncated else None

    def _navigate(self, tab: Tab, url: str, data: bytes | None = None) -> None:
        current = tab.page
        target, fragment = urllib.parse.urldefrag(url)
        if data is None and fragment and target == urllib.parse.urldefrag(current.url).url and url != BLANK:
            self._scroll_to_fragment(current, fragment)  # same-document navigation: no request
            return
        page = self._load(url, data)
        if fragment:
            self._scroll_to_fragment(page, fragment)
        if self.load_images and page.url != BLANK:
            deadline = Deadline(self.timeout_s)
            page.images = images.decode_images(
                page.document, lambda src, limit: self._fetch_image(page.url, src, deadline, limit),
                self.device_scale)
        del tab.history[tab.index + 1:]
        if len(tab.history) == 1 and tab.history[0].url == BLANK:
            tab.history[0] = page  # a fresh tab's initial blank page is replaced, as browsers do
        else:
            tab.history.append(page)
            del tab.history[:-MAX_HISTORY]  # the oldest entries go, as a browser's session history does
            tab.index = len(tab.history) - 1
        self._keep_raster(page)
        self._trim_cache(page)

    def _scroll_to_fragment(self, page: Page, fragment: str) -> None:
        target = next((n for n in page.document.elements() if n.attrs.get("id") == fragment
                       or (n.tag == "a" and n.attrs.get("name") == fragment)), None)
        if target is None:
            return
        inside = {n.node_id for n in target.iter()}
        for index, line in enumerate(page.tree.lines):
            if line.node_id in inside or line.node_id > target.node_id:
                page.scroll = min(index, accessibility.max_scroll(page.tree, self.lines_per_viewport))
                return

    # -- pixels ------------------------------------------------------------------------------------------------

    def _draw(self, page: Page) -> np.ndarray:
        return screenshot.render_raster(page.tree, self.viewport[0], self.viewport[1], page.focused)

    def _keep_raster(self, page: Page) -> np.ndarray:
        """The page's kept raster, drawn if stale (then the cache is trimmed); the page becomes the most recently
        shown."""
        self._clock += 1
        page.shown = self._clock
        if not self.keep_rasters:
            return page.raster  # type: ignore[return-value]
        if page.raster is None or page._raster_stale:
            page.raster = self._draw(page)
            page._raster_stale = False
            self._trim_cache(page)
        return page.raster

    def _trim_cache(self, keep: Page) -> None:
        """Give up the rasters and images of the least recently shown entries (never ``keep``'s) until the cache
        fits ``MAX_CACHE_BYTES``, as a browser evicts back/forward cache entries."""
        total = self.raster_bytes()
        if total <= MAX_CACHE_BYTES:
            return
        for page in sorted((p for t in self.tabs for p in t.history if p is not keep), key=lambda p: p.shown):
            if total <= MAX_CACHE_BYTES:
                break
            total -= page.cached_bytes()
            page.raster, page._raster_stale, page.images = None, True, []

    # -- elements and actions ------------------------------------------------------------------------------------

    def _element(self, element_id: int) -> dom.Node:
        node = self.page.tree.nodes.get(element_id)
        if node is None:
            raise BrowserError(f"there is no element [{element_id}] on this page; use an id shown in the "
                               f"accessibility tree")
        return node

    def _describe(self, node: dom.Node) -> str:
        line = next((line for line in self.page.tree.lines if line.node_id == node.node_id), None)
        return f"[{node.node_id}] {line.role} {line.name!r}" if line is not None else f"[{node.node_id}]"

    def _focus(self, node: dom.Node) -> None:
        page = self.page
        if page.focused != node.node_id:
            page.focused = node.node_id
            page.select_all = False
            page.changed()

    def _click(self, element_id: int) -> None:
        node = self._element(element_id)
        focusable = next((n for n in [node, *node.ancestors()] if n.tag in ("input", "textarea", "select", "button")
                          or (n.tag == "a" and "href" in n.attrs)), None)
        self._focus(focusable if focusable is not None and focusable.node_id in self.page.tree.nodes else node)
        element = node if node.is_element else node.parent
        if element is None:
            return
        if element.tag == "input" and dom.input_type(element) in ("checkbox", "radio"):
            self._check(element)
            return
        if element.tag in ("input", "textarea", "select") and not dom.is_submit(element):
            return  # a click on a field focuses it
        label = element.closest("label")
        if label is not None:  # a click on a label acts on its control
            control = self._labelled(label)
            if control is not None and control is not element:
                if control.node_id in self.page.tree.nodes:
                    self._focus(control)
                if control.tag == "input" and dom.input_type(control) in ("checkbox", "radio"):
                    self._check(control)
                return
        option = element.closest("option")
        if option is not None:
            select = option.closest("select")
            if select is not None:
                select.value = dom.option_value(option)
                self.page.changed()
            return
        button = element if dom.is_submit(element) else element.closest("button")
        if button is not None and "disabled" not in button.attrs:
            if dom.is_submit(button):
                form = dom.enclosing_form(button)
                if form is not None:
                    self._submit(form, button)
            return
        link = next((n for n in [element, *element.ancestors()] if n.tag == "a" and "href" in n.attrs), None)
        if link is not None:
            self._follow(link)
        # anything else: focused, nothing more (WebArena clicks there and nothing happens)

    def _labelled(self, label: dom.Node) -> dom.Node | None:
        target = label.attrs.get("for")
        if target:
            return next((n for n in self.page.document.elements() if n.attrs.get("id") == target), None)
        return next((n for n in label.elements() if n.tag in ("input", "textarea", "select")), None)

    def _check(self, box: dom.Node) -> None:
        if dom.input_type(box) == "radio":
            name, form = box.attrs.get("name"), dom.enclosing_form(box)
            root = form if form is not None else self.page.document
            for other in root.elements():
                if other.tag == "input" and dom.input_type(other) == "radio" and other.attrs.get("name") == name:
                    other.checked = False
            box.checked = True
        else:
            box.checked = not dom.is_checked(box)
        self.page.changed()

    def _base_url(self) -> str:
        base = dom.query_selector(self.page.document, "base[href]")
        try:
            return join_url(self.page.url, base.attrs["href"]) if base is not None else self.page.url
        except BrowserError:
            return self.page.url  # an invalid <base> is ignored, as browsers do

    def _follow(self, link: dom.Node) -> None:
        href = link.attrs.get("href", "").strip()
        if not href or href.lower().startswith(("javascript:", "mailto:", "tel:")):
            return
        url = join_url(self._base_url(), href)
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            return
        self._navigate(self.tab, url)

    def _submit(self, form: dom.Node, submitter: dom.Node | None) -> None:
        attrs = submitter.attrs if submitter is not None else {}
        method = (attrs.get("formmethod") or form.attrs.get("method") or "get").strip().lower()
        action = (attrs.get("formaction") or form.attrs.get("action") or "").strip()
        url = join_url(self._base_url(), action) if action else urllib.parse.urldefrag(self.page.url).url
        body = urllib.parse.urlencode(dom.form_fields(form, submitter))
        if method == "post":
            self._navigate(self.tab, url, body.encode())
        else:
            parts = urllib.parse.urlsplit(urllib.parse.urldefrag(url).url)
            self._navigate(self.tab, urllib.parse.urlunsplit(parts._replace(query=body)))

    def _type(self, element_id: int, text: str, press_enter: bool) -> None:
        node = self._element(element_id)
        if node.tag == "select":
            wanted = text.strip().lower()
            options = dom.options_of(node)
            chosen = next((o for o in options if dom.option_label(o).lower() == wanted
                           or dom.option_value(o).lower() == wanted), None)
            if chosen is None:
                names = ", ".join(repr(dom.option_label(o)[:100]) for o in options[:20])
                more = f" and {len(options) - 20} more" if len(options) > 20 else ""
                raise BrowserError(f"{self._describe(node)} has no option {text[:200]!r}; its options are "
                                   f"{names}{more}")
            node.value = dom.option_value(chosen)
        elif dom.is_text_field(node):
            if "disabled" in node.attrs or "readonly" in node.attrs:
                raise BrowserError(f"{self._describe(node)} is read-only")
            node.value = text  # the field's value is replaced (as after select-all), not appended to
        else:
            raise BrowserError(f"cannot type into {self._describe(node)}: it is not a text box or a combobox")
        self._focus(node)
        self.page.changed()
        if press_enter:
            self._enter(node)

    def _enter(self, node: dom.Node) -> None:
        """Enter with ``node`` focused: submit a field's form, follow a link, press a button."""
        if node.tag == "textarea":
            node.value = dom.field_value(node) + "\n"
            self.page.changed()
            return
        if dom.is_submit(node) or node.tag == "button":
            self._click(node.node_id)
            return
        if node.tag == "input" and dom.input_type(node) not in ("checkbox", "radio") or node.tag == "select":
            form = dom.enclosing_form(node)
            if form is not None:
                self._submit(form, None)
            return
        self._click(node.node_id)

    def _press(self, key_comb: str) -> None:
        page = self.page
        key = key_comb.strip().lower().replace("arrow", "")
        focused = page.tree.nodes.get(page.focused) if page.focused is not None else None
        in_field = focused is not None and dom.is_text_field(focused)
        if key in ("enter", "return"):
            if focused is not None and focused is not page.document:
                self._enter(focused)
        elif key in ("control+a", "meta+a", "ctrl+a"):
            page.select_all = in_field
        elif key in ("backspace", "delete") and in_field:
            assert focused is not None
            focused.value = "" if page.select_all else dom.field_value(focused)[:-1]
            page.select_all = False
            page.changed()
        elif key in ("alt+left", "meta+["):
            self.act(ToolCall(name="go_back"))
        elif key in ("alt+right", "meta+]"):
            self.act(ToolCall(name="go_forward"))
        elif not in_field and key in ("pagedown", "space"):
            self._scroll(1)
        elif not in_field and key == "pageup":
            self._scroll(-1)
        elif not in_field and key in ("home", "end"):
            page.scroll = 0 if key == "home" else accessibility.max_scroll(page.tree, self.lines_per_viewport)
        # other keys: nothing visible happens

    def _scroll(self, sign: int) -> None:
        page = self.page
        last = accessibility.max_scroll(page.tree, self.lines_per_viewport)
        page.scroll = min(max(0, page.scroll + sign * self.lines_per_viewport), last)
