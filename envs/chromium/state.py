"""A browser's state as data, taken from one Chromium and brought into another: the ``replay`` fork of a browser.

Owns: ``BrowserState`` (every tab's history and position in it, scroll offsets, the values typed into fields but
not submitted, the focused field, the cookies, and what the current tab showed: its URL and accessibility tree),
``capture`` (from a running browser, in the source before its workspace forks), ``restore`` (into a fresh browser
in the clone: cookies first, then every tab's history entry by entry, then fields, focus and scroll), and the
check that the clone shows what the source showed (URL and tree of the current tab), else ``BrowserStateMismatch``
naming what differs. Only the entry shown is loaded from the server: every other entry of a tab's history is
committed with an empty stand-in document served through Chromium's request interception and never stored (the
back-forward cache is off, so going back or forward to an entry loads its URL from the server then, as the
source's browser would), which spares a restore every page's load but one per tab. A page reached by a POST is
never posted again: the shop answers its POSTs with a redirect, so history mostly holds the GET that followed; a
page shown that is a POST's answer (a form sent back with its errors) at the end of its tab's history is served to
the clone's browser from what the source showed (its document as it stands, intercepted the same way: nothing
reaches the server); one anywhere else in history is refused (``BrowserStateUnsupported``): going back or forward
to it would post again.
Must never: hand back a clone that differs from its source without saying so.
"""

from __future__ import annotations

import json
import time
from dataclasses import field
from typing import Any

import msgspec

from ..errors import EnvsError
from .browser import Chromium

# Field values and focus by a path of child indices from <html>: stable for the same document.
_CAPTURE_FIELDS = """(() => {
  const path = (el) => { const p = []; for (; el && el.parentElement; el = el.parentElement)
      p.unshift([...el.parentElement.children].indexOf(el)); return p; };
  const fields = [...document.querySelectorAll('input, textarea, select')].map((el) => ({
      path: path(el), value: el.value, checked: !!el.checked,
      changed: el.value !== (el.defaultValue ?? el.value) || el.checked !== !!el.defaultChecked
               || (el.tagName === 'SELECT' && [...el.options].some(o => o.selected !== o.defaultSelected)) }))
    .filter((f) => f.changed);
  const active = document.activeElement && document.activeElement !== document.body ? path(document.activeElement) : null;
  return {fields, active, scroll: [window.scrollX, window.scrollY]};
})()"""

_RESTORE_FIELDS = """((state) => {
  const at = (p) => { let el = document.documentElement; for (const i of p) { el = el && el.children[i]; } return el; };
  for (const f of state.fields) { const el = at(f.path); if (!el) return 'no field at ' + JSON.stringify(f.path);
    el.value = f.value; if ('checked' in el) el.checked = f.checked; }
  if (state.active) { const el = at(state.active); if (el) el.focus({preventScroll: true}); }
  window.scrollTo(state.scroll[0], state.scroll[1]);
  return '';
})"""


# an entry of history that is not shown: only its URL matters (history brings its page from the server)
STAND_IN = "<!DOCTYPE html><title></title>"

_DOCUMENT = ("(document.doctype ? '<!DOCTYPE ' + document.doctype.name + '>' : '') "
             "+ document.documentElement.outerHTML")


class BrowserStateMismatch(EnvsError):
    """The restored browser does not show what the source showed; the message names the difference."""


class BrowserStateUnsupported(EnvsError):
    """The source's browser is in a state this restore cannot bring about without side effects."""


class TabState(msgspec.Struct, frozen=True):
    urls: list[str]
    index: int
    page: dict[str, Any]  # fields, active, scroll of the page shown
    served: dict[int, str] = {}  # history index -> the document of a POST's answer, served instead of posting again
    pointer: tuple[float, float] = (-1.0, -1.0)  # the mouse, in viewport coordinates (a ``hover`` left it there)


class BrowserState(msgspec.Struct, frozen=True):
    tabs: list[TabState]
    current: int
    cookies: list[dict[str, Any]]
    url: str
    tree: str = field(default="")


def capture(browser: Chromium, deadline: float) -> BrowserState:
    """The state of ``browser`` now (its current tab's tree rendered whole, for the check after a restore)."""
    cdp = browser.cdp
    tabs = []
    for tab in list(browser.tabs):
        history = cdp.call("Page.getNavigationHistory", deadline=deadline, session=tab.session)
        entries, current = history["entries"], int(history["currentIndex"])
        served: dict[int, str] = {}
        for k, entry in enumerate(entries):
            if entry["url"] not in tab.posted:
                continue
            if k != current or k != len(entries) - 1:
                raise BrowserStateUnsupported(
                    f"tab {browser.tabs.index(tab)} has a page reached by a POST in its history "
                    f"({entry['url'][:200]}) it is not at the end of; going back or forward to it would post "
                    f"again, so it cannot be restored")
            served[k] = str(browser.evaluate(_DOCUMENT, deadline, session=tab.session))
        page = browser.evaluate(_CAPTURE_FIELDS, deadline, session=tab.session) or {}
        tabs.append(TabState(urls=[str(e["url"]) for e in entries], index=current, page=page, served=served,
                             pointer=tab.pointer))
    # the tabs' own context's (an off-the-record one: ``browser.flags``), through a tab's session
    cookies = browser.call("Network.getAllCookies", {}, deadline).get("cookies", [])
    return BrowserState(tabs=tabs, current=browser.current, cookies=cookies, url=browser.url(deadline),
                        tree=browser.ax_tree(deadline).render())


def restore(browser: Chromium, state: BrowserState, deadline: float) -> dict[str, float]:
    """Bring the freshly started ``browser`` to ``state``; ``BrowserStateMismatch`` if the result differs. The
    seconds each part took: ``cookies``, ``stand_ins`` (the entries not shown), ``loads`` (``pages`` loaded whole),
    ``history`` (the way back to the shown entry), ``fields`` (typed values, focus, scroll), ``check``."""
    cdp = browser.cdp
    steps = dict.fromkeys(("cookies", "stand_ins", "loads", "pages", "history", "fields", "check"), 0.0)
    mark = time.monotonic()

    def lap(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        steps[step] += now - mark
        mark = now

    if state.cookies:
        browser.call("Network.setCookies", {"cookies": [_settable(c) for c in state.cookies]}, deadline)
    lap("cookies")
    for i, tab_state in enumerate(state.tabs):
        if i > 0:
            browser.new_tab(deadline)
        browser.current = i
        urls, last = tab_state.urls, len(tab_state.urls) - 1
        shown_last = tab_state.index == last
        # a fresh tab has its about:blank already (the source's first page replaced its own, a tab that waited in
        # the pool keeps it: history is reset after the first entry); every entry but the shown one is a stand-in
        entries = [k for k, url in enumerate(urls) if url != "about:blank" or last == 0]
        stand_ins = [k for k in entries if not (shown_last and k == last)]
        with browser.intercepting([urls[k] for k in stand_ins], deadline):
            for n, k in enumerate(stand_ins):
                browser.navigate_served(urls[k], STAND_IN, deadline, post_answer=False, intercepted=True)
                if n == 0:
                    cdp.call("Page.resetNavigationHistory", deadline=deadline, session=browser.tab.session)
        lap("stand_ins")
        if shown_last and last in entries:
            if last in tab_state.served:
                browser.navigate_served(urls[last], tab_state.served[last], deadline)
            else:
                browser.navigate(urls[last], deadline)
            steps["pages"] += 1
            if not stand_ins:
                cdp.call("Page.resetNavigationHistory", deadline=deadline, session=browser.tab.session)
        lap("loads")
        back = last - tab_state.index
        history = cdp.call("Page.getNavigationHistory", deadline=deadline, session=browser.tab.session)
        made = [str(e["url"]) for e in history["entries"]]
        if made != [urls[k] for k in entries]:  # an entry lost or replaced on the way: never a silent difference
            raise BrowserStateMismatch(f"tab {i}'s history came out as {_short(made)}, the source's is "
                                       f"{_short([urls[k] for k in entries])}")
        if back:  # the shown entry's page, loaded from the server now
            browser.go_to_entry(history["entries"][history["currentIndex"] - back]["id"], deadline)
            steps["pages"] += 1
        lap("history")
        if tab_state.page:
            problem = browser.evaluate(f"{_RESTORE_FIELDS}({json.dumps(tab_state.page)})", deadline)
            if problem:
                raise BrowserStateMismatch(f"tab {i}: {problem}")
        if tuple(tab_state.pointer) != tuple(browser.tab.pointer):  # what a hover left hovered
            browser.mouse("mouseMoved", *tab_state.pointer, deadline)
        lap("fields")
    browser.current = state.current
    check(browser, state, deadline)
    lap("check")
    return steps


def check(browser: Chromium, state: BrowserState, deadline: float) -> None:
    """The restored browser's current tab shows the source's URL and accessibility tree."""
    url = browser.url(deadline)
    if url != state.url:
        raise BrowserStateMismatch(f"the restored tab is at {url[:200]}, the source's was at {state.url[:200]}")
    tree = browser.ax_tree(deadline).render()
    if tree != state.tree:
        mine, theirs = tree.splitlines(), state.tree.splitlines()
        at = next((k for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b),
                  min(len(mine), len(theirs)))
        raise BrowserStateMismatch(
            f"the restored page's accessibility tree differs from the source's at line {at + 1}: "
            f"{(mine[at] if at < len(mine) else '<end>')[:200]!r} against "
            f"{(theirs[at] if at < len(theirs) else '<end>')[:200]!r}")


def _short(urls: list[str]) -> str:
    return "[" + ", ".join(u[:120] for u in urls[:20]) + (", ..." if len(urls) > 20 else "") + "]"


def _settable(cookie: dict[str, Any]) -> dict[str, Any]:
    keep = ("name", "value", "domain", "path", "secure", "httpOnly", "sameSite", "expires")
    out = {k: cookie[k] for k in keep if k in cookie}
    if out.get("expires", -1) in (-1, 0):
        out.pop("expires", None)  # a session cookie
    return out
