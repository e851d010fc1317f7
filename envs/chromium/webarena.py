"""WebArena's observations and action language on a real Chromium (``browser.py``).

Owns: the observation as WebArena builds it (the tab header ``Tab 0 (current): title | Tab 1: ...``, a blank line,
the accessibility tree of the viewport in ``axtree.py``'s form; ``data`` with the URL, titles, the tab index, the
HTTP status and the viewport PNG), each action as real input (``click``: a mouse click at the element's centre,
scrolled into view first; ``hover``: the mouse moved there; ``type``: a click, the field's text selected and typed
over key by key, then Enter; a drop-down gets the option with that text; ``press``: the key combination; ``scroll``:
one viewport, as WebArena scrolls; tabs; ``goto`` and history), waiting for the page a navigation loads, and what
the evaluators read (a page's text through a selector, in a throw-away tab with the browser's cookies).
Where it differs from WebArena, on purpose: ``type`` replaces the field's text (the tool's contract, and what the
text browser does; WebArena types after whatever was there), and an element outside the viewport is scrolled to
before it is clicked (WebArena clicks its stale centre, off the screen).
Must never: act on an element the agent did not name by an id of the page it saw.
"""

from __future__ import annotations

import re
from typing import Any

from ..records import Observation, ToolCall
from ..suites.webarena import text_expression
from .browser import BrowserError, Chromium
from .keys import parse_combination

_SCHEMES = ("http://", "https://")


class WebArenaPages:
    """The agent's browser of one workspace: ``base_url`` is where paths (``goto [/checkout/cart/]``) resolve;
    ``allowed``: URL prefixes ``goto`` may open (the site; a ``file://`` or another port is refused)."""

    def __init__(self, chromium: Chromium, base_url: str, *, screenshots: bool = True):
        self.chromium, self.base_url, self.screenshots = chromium, base_url.rstrip("/"), screenshots

    # -- helpers ------------------------------------------------------------------------------------------------
    def resolve(self, url: str) -> str:
        url = url.strip()
        if url == "about:blank":
            return url
        if re.match(r"^[A-Za-z0-9.-]+:\d+(/|$)", url):
            url = "http://" + url
        if url.startswith("/"):
            url = self.base_url + url
        if not url.startswith(_SCHEMES):
            raise BrowserError(f"cannot open {url[:200]!r}: only http(s) URLs and paths on this site are supported")
        return url

    @property
    def requests(self) -> int:
        """Documents the browser's tabs have loaded (the latency model's "a page came from the server")."""
        return sum(tab.documents for tab in self.chromium.tabs)

    def _line(self, element_id: int, deadline: float) -> Any:
        tab = self.chromium.tab
        tree = tab.last_tree or self.chromium.ax_tree(deadline)
        line = tree.by_id.get(element_id)
        if line is None or line.backend_id is None:
            raise BrowserError(f"there is no element [{element_id}] on this page; use an id shown in the "
                               f"accessibility tree")
        return line

    # -- actions --------------------------------------------------------------------------------------------------
    def act(self, call: ToolCall, deadline: float) -> None:
        """One action of WebArena's language (not ``stop``), then the page it led to loaded."""
        c, a = self.chromium, call.args
        c.before_input()
        if call.name == "click":
            x, y = c.element_centre(self._line(a["element_id"], deadline).backend_id, deadline)
            c.click(x, y, deadline)
        elif call.name == "hover":
            x, y = c.element_centre(self._line(a["element_id"], deadline).backend_id, deadline)
            c.mouse("mouseMoved", x, y, deadline)
        elif call.name == "type":
            self._type(self._line(a["element_id"], deadline), a["text"], a["press_enter_after"], deadline)
        elif call.name == "press":
            try:
                key, modifiers = parse_combination(a["key_comb"])
            except KeyError as exc:
                raise BrowserError(str(exc.args[0])) from exc
            c.key(key, deadline, modifiers)
        elif call.name == "scroll":
            sign = "+" if a["direction"] == "down" else "-"
            c.evaluate("(() => { const e = document.scrollingElement || document.body; "
                       f"e.scrollTop = e.scrollTop {sign} window.innerHeight; }})()", deadline)
        elif call.name == "new_tab":
            c.new_tab(deadline)
        elif call.name == "tab_focus":
            c.focus(a["tab_index"], deadline)
        elif call.name == "close_tab":
            c.close_tab(deadline)
        elif call.name == "goto":
            c.navigate(self.resolve(a["url"]), deadline)
        elif call.name == "go_back":
            c.history_go(-1, deadline)
        elif call.name == "go_forward":
            c.history_go(1, deadline)
        else:
            raise BrowserError(f"{call.name} is not an action the browser performs")
        c.settle(deadline)
        c.tab.last_tree = None

    def _type(self, line: Any, text: str, enter: bool, deadline: float) -> None:
        c = self.chromium
        if line.role in ("combobox", "listbox") and self._is_select(line.backend_id, deadline):
            self._choose(line, text, deadline)
            return
        x, y = c.element_centre(line.backend_id, deadline)
        c.click(x, y, deadline)
        c.key("a", deadline, modifiers=2)  # Control+a: what was typed before is replaced
        if text:
            c.insert_text(text, deadline)
        else:
            c.key("Backspace", deadline)
        if enter:
            c.key("Enter", deadline)

    def _is_select(self, backend_id: int, deadline: float) -> bool:
        return bool(self._on_node(backend_id, "function() { return this.tagName === 'SELECT'; }", deadline))

    def _choose(self, line: Any, text: str, deadline: float) -> None:
        chosen = self._on_node(line.backend_id, """function(wanted) {
            const o = [...this.options].find(o => o.label.trim().toLowerCase() === wanted
                                                  || o.value.toLowerCase() === wanted);
            if (!o) return [...this.options].slice(0, 20).map(o => o.label.trim());
            this.value = o.value;
            this.dispatchEvent(new Event('input', {bubbles: true}));
            this.dispatchEvent(new Event('change', {bubbles: true}));
            return true; }""", deadline, text.strip().lower())
        if chosen is not True:
            names = ", ".join(repr(str(n)[:100]) for n in (chosen or []))
            raise BrowserError(f"{line.text[:200]} has no option {text[:200]!r}; its options are {names}")

    def _on_node(self, backend_id: int, function: str, deadline: float, *args: Any) -> Any:
        c = self.chromium
        try:
            obj = c.call("DOM.resolveNode", {"backendNodeId": backend_id}, deadline)["object"]["objectId"]
        except Exception as exc:
            raise BrowserError(f"the element is not on the page any more ({exc})") from exc
        try:
            result = c.call("Runtime.callFunctionOn", {"objectId": obj, "functionDeclaration": function,
                                                       "arguments": [{"value": v} for v in args],
                                                       "returnByValue": True}, deadline)
        finally:
            c.cdp.send("Runtime.releaseObject", {"objectId": obj}, session=c.tab.session, forget=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"the page's script failed: {result['exceptionDetails'].get('text', '')}")
        return result.get("result", {}).get("value")

    # -- observing ------------------------------------------------------------------------------------------------
    def observe(self, deadline: float) -> Observation:
        c = self.chromium
        tab = c.tab
        titles = c.titles(deadline)
        header = " | ".join(f"Tab {i} (current): {t}" if i == c.current else f"Tab {i}: {t}"
                            for i, t in enumerate(titles))
        tree = c.ax_tree(deadline)
        x, y = c.scroll_offset(deadline)
        text = f"{header}\n\n{tree.render((x, y, *c.viewport))}"
        data: dict[str, Any] = {"url": c.url(deadline), "title": titles[c.current] if titles else "",
                                "tabs": titles, "tab_index": c.current, "status": tab.status}
        if tree.truncated:
            text += f"\n[page truncated: {tree.truncated}; only the part before it is shown]"
            data["truncated"] = tree.truncated
        if self.screenshots:
            data["screenshot"] = c.screenshot(deadline)
        return Observation(output=text, data=data)

    def find(self, role: str, name: str, deadline: float) -> int | None:
        """The id of the first element of the current page with this role whose name (or placeholder) is
        ``name``; None when there is none."""
        tree = self.chromium.ax_tree(deadline)
        return next((line.node_id for line in tree.lines if line.role == role and line.name == name), None)

    def page_text(self, url: str | None, selector: str, deadline: float) -> str:
        """For WebArena's program_html: the outer text of the first element matching ``selector`` (the body's
        when empty; "" when none) on ``url`` loaded in a throw-away tab, or on the current page when None."""
        expression = text_expression(selector)
        c = self.chromium
        if url is None:
            return str(c.evaluate(expression, deadline) or "")
        return str(c.in_scratch_tab(self.resolve(url), expression, deadline) or "")

    def current_url(self, deadline: float) -> str:
        return self.chromium.url(deadline)
