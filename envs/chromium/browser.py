"""One headless Chromium inside a workspace, driven by the workspace host over its DevTools pipe.

Owns: starting Debian's Chromium as the agent user (``ctx.launch``: its own PID and mount namespaces, a private
tmpfs /tmp for its profile and caches, fds 3 and 4 for the pipe) with fixed flags (headless, no sandbox of its own:
the workspace is the sandbox; viewport, device scale 1, locale, time zone, no network beyond the workspace's
loopback, no background traffic), its tabs (the pages it has, popups included, at most ``MAX_TABS``), navigation
that waits for the page's load event, real input (mouse and keyboard events through ``Input``), script
evaluation, screenshots, the accessibility tree (``axtree.py``), and closing it. Every call takes a deadline.
Must never: wait past a deadline, let a page open tabs without bound, or keep a tab the browser closed.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..app import AppContext
from ..errors import EnvsError
from ..runtime.app_processes import AdoptedProcess
from . import axtree
from .cdp import BrowserGone, CdpError, CdpPipe, CdpTimeout
from .keys import char_events, key_events

BINARY = "/usr/lib/chromium/chromium"  # Debian's build; /usr/bin/chromium is a wrapper script reading /etc/chromium.d
VIEWPORT = (1280, 720)  # WebArena's
MAX_TABS = 16  # a popup storm beyond it: the newest are closed as they come
TMPFS_BYTES = 512 << 20  # the browser's /tmp: profile, caches, downloads; charged to the workspace's memory
LAUNCH_S = 30.0
MAX_ELEMENTS = 50_000  # a page with more is not read whole (the text browser's bound too)
PAGE_S = 10.0  # one page's load, at most (the text browser's budget too)
STOP_MARGIN_S = 1.0
SETTLE_PROBE_S = 1.0  # what is left of a call's deadline to stop a page that would not load and answer
PROFILE = "/tmp/chromium-profile"
ENV = {"HOME": "/tmp", "LANG": "en_US.UTF-8", "TZ": "UTC", "PATH": "/usr/bin:/bin",
       "XDG_CONFIG_HOME": "/tmp/.config", "XDG_CACHE_HOME": "/tmp/.cache", "FONTCONFIG_PATH": "/etc/fonts"}


def flags(viewport: tuple[int, int], proxy: str | None = None) -> list[str]:
    """Chromium's command line: what every workspace's browser runs with (and nothing from the host's
    /etc/chromium.d); ``proxy``: every request through it, loopback too (the workspace's egress proxy,
    ``runtime/egress.py``)."""
    through = [f"--proxy-server={proxy}", "--proxy-bypass-list=<-loopback>"] if proxy else []
    return [*through,
        "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
        f"--user-data-dir={PROFILE}", f"--window-size={viewport[0]},{viewport[1]}", "--force-device-scale-factor=1",
        "--lang=en-US", "--no-first-run", "--no-default-browser-check", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-default-apps", "--disable-extensions",
        "--disable-breakpad", "--disable-crash-reporter", "--metrics-recording-only", "--mute-audio",
        "--disable-dev-shm-usage", "--password-store=basic", "--use-mock-keychain", "--hide-scrollbars",
        "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,"
        "DialMediaRouteProvider,InterestFeedContentSuggestions,CalculateNativeWinOcclusion",
        "--disable-background-timer-throttling", "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows", "--font-render-hinting=none", "--disable-ipc-flooding-protection",
        "--disable-back-forward-cache",
        "about:blank",
    ]


# A page may open a few windows of its own; past that ``window.open`` answers null, as a pop-up blocker does (a
# loop of thousands would keep the renderer busy creating windows long after every call's bound)
OPEN_LIMIT = 4
_OPEN_LIMIT = f"""(() => {{ const open = window.open; let opened = 0;
  window.open = function (...args) {{ return ++opened > {OPEN_LIMIT} ? null : open.apply(this, args); }}; }})()"""
# A screenshot shows no text caret (Playwright's default too): a caret blinks, and whether a capture falls on its
# on or off phase is timing, not the page's state: the same page would give two screenshots
_CARET_HIDDEN = """(() => { const sheet = new CSSStyleSheet();
  sheet.replaceSync('*, *::before, *::after { caret-color: transparent !important; }');
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  return () => { document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet); }; })()"""
PARKED = (-1.0, -1.0)  # the pointer after a click: outside the page, hovering nothing

KEPT_EVENTS = frozenset({"Target.attachedToTarget", "Target.targetDestroyed", "Page.lifecycleEvent",
                         "Page.frameRequestedNavigation", "Page.frameStartedLoading", "Network.requestWillBeSent",
                         "Network.responseReceived", "Fetch.requestPaused"})


def _fetch_pattern(url: str) -> str:
    """``url`` as a Fetch domain pattern matching only itself (``*``, ``?`` and backslash are its wildcards)."""
    return url.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


class BrowserError(EnvsError):
    """The browser could not do what a tool asked (a page that would not load, a tab that is not there)."""


@dataclass
class Tab:
    """One page target and our flat session to it; ``frame_id``: its main frame."""

    target_id: str
    session: str
    frame_id: str = ""
    opener: str | None = None
    posted: set[str] = field(default_factory=set)  # URLs whose document came as the answer to a POST
    documents: int = 0  # main-frame documents loaded (a navigation happened when it grew)
    status: int = 0  # the HTTP status of the document shown
    last_tree: axtree.AxTree | None = field(default=None, repr=False)
    pointer: tuple[float, float] = (-1.0, -1.0)  # where the mouse is (viewport coordinates; outside: nowhere)


class Chromium:
    """A Chromium of this workspace: ``start`` it, then tabs, navigation, input, evaluation, observation."""

    def __init__(self, ctx: AppContext, *, viewport: tuple[int, int] = VIEWPORT, merge_memory: bool = False,
                 proxy: str | None = None):
        self.ctx, self.viewport, self.merge_memory, self.proxy = ctx, viewport, merge_memory, proxy
        self.pipe: CdpPipe | None = None
        self.process: Any = None
        self.tabs: list[Tab] = []
        self.current = 0
        self.started_s = 0.0
        self.context_id: str | None = None  # the browser context its tabs live in (``_first_tab``)
        self.dialogs = 0

    # -- life ---------------------------------------------------------------------------------------------------
    def start(self, deadline: float | None = None) -> None:
        """Launch the browser and attach to its first tab (ready when its blank page has loaded)."""
        started = time.monotonic()
        deadline = deadline if deadline is not None else started + LAUNCH_S
        if not os.path.exists(BINARY):
            raise BrowserError(f"Chromium is not installed in this workspace's image ({BINARY} is missing)")
        commands_r, commands_w = os.pipe2(os.O_CLOEXEC)
        replies_r, replies_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.process = self.ctx.launch("chromium", [BINARY, *flags(self.viewport, self.proxy)], env=ENV,
                                           fds={3: commands_r, 4: replies_w}, tmpfs={"/tmp": TMPFS_BYTES},
                                           merge_memory=self.merge_memory)
        except BaseException:
            for fd in (commands_r, commands_w, replies_r, replies_w):
                os.close(fd)
            raise
        os.close(commands_r)
        os.close(replies_w)
        self.pipe = CdpPipe(commands_w, replies_r, keep=KEPT_EVENTS, on_event=self._on_event)
        try:
            self._first_tab(deadline)
        except CdpError as exc:
            log = self.process.log_tail() if self.process is not None else ""
            self.close()
            raise BrowserError(f"Chromium did not start: {exc}; its last words: {log[-2000:]}") from exc
        self.started_s = time.monotonic() - started

    def _first_tab(self, deadline: float) -> None:
        """The browser context every tab of this browser lives in, and its first tab. The context is off the
        record, as Playwright's contexts are: it keeps no history, so no link is drawn visited (a clone's fresh
        browser could not draw the same ones: its screenshots would differ from its source's), and nothing of it
        is written to the profile; the browser's own first page, in its default context, is closed."""
        self.cdp.call("Target.setDiscoverTargets", {"discover": True}, deadline=deadline)
        self.cdp.call("Target.setAutoAttach", {"autoAttach": True, "waitForDebuggerOnStart": False,
                                                "flatten": True}, deadline=deadline)
        default_pages = [t["targetId"] for t in self.cdp.call("Target.getTargets", deadline=deadline)["targetInfos"]
                         if t.get("type") == "page"]
        self.context_id = self.cdp.call("Target.createBrowserContext", {}, deadline=deadline)["browserContextId"]
        for context in (None, self.context_id):  # nothing lands on disk, from either context
            self.cdp.call("Browser.setDownloadBehavior", {"behavior": "deny",
                                                          **({"browserContextId": context} if context else {})},
                          deadline=deadline)
        first = self._create_target(deadline)
        self.tabs = [self._attach(first, deadline)]
        self._drop_attached(first)
        self.current = 0
        for target in default_pages:
            with contextlib.suppress(CdpError):
                self.cdp.call("Target.closeTarget", {"targetId": target}, deadline=deadline)
            self._drop_attached(target)  # not a pop-up of ours
        self.cdp.take_events("Target.targetDestroyed")

    def _create_target(self, deadline: float, **params: Any) -> str:
        """A new page target in this browser's context (``context_id``); its id."""
        if self.context_id:
            params["browserContextId"] = self.context_id
        return str(self.cdp.call("Target.createTarget", {"url": "about:blank", **params},
                                 deadline=deadline)["targetId"])

    def close(self) -> None:
        """Close the pipe and kill the browser (its whole PID namespace)."""
        if self.pipe is not None:
            self.pipe.close()
            self.pipe = None
        if self.process is not None:
            process, self.process = self.process, None
            process.kill()
        self.tabs = []

    def abandon(self) -> None:
        """In a clone: the pipe and the process are the source's browser; let go of them without a word."""
        if self.pipe is not None:
            self.pipe.close()
        if self.process is not None:
            self.process.forget()
        self.pipe, self.process, self.tabs = None, None, []

    # -- a warm-pool slot's browser, lent to a clone --------------------------------------------------------------
    def lend(self) -> tuple[dict[str, int], dict[str, Any]]:
        """Hand this started browser over (a warm-pool slot's, ``slot.py``): the pipe's descriptor numbers, and
        as data what ``adopt`` needs (the connection's state, the tabs, the process, the flags it runs with).
        This object never touches the browser again; the descriptors stay open for the taker to copy."""
        if self.pipe is None or self.process is None:
            raise BrowserError("the browser is not running: there is nothing to lend")
        fds = {"cdp_commands": self.pipe.write_fd, "cdp_replies": self.pipe.read_fd}
        data = {"browser": "chromium", "pid": self.process.pid, "viewport": list(self.viewport),
                "merge_memory": self.merge_memory, "started_s": self.started_s, "current": self.current,
                "context_id": self.context_id,
                "tabs": [{"target_id": t.target_id, "session": t.session, "frame_id": t.frame_id,
                          "documents": t.documents, "status": t.status} for t in self.tabs],
                "pipe": self.pipe.hand_over()}
        self.pipe, self.tabs = None, []
        return fds, data

    @classmethod
    def adopt(cls, ctx: AppContext, fds: dict[str, int], data: dict[str, Any], *, merge_memory: bool) -> Chromium:
        """The browser a warm-pool slot lent (``lend``), driven from here on: the same pipe, tabs and process (killed
        through a pidfd: it is the slot host's child). Refused when it runs with other settings than asked."""
        if data.get("browser") != "chromium":
            raise BrowserError(f"the warm slot lent {data.get('browser')!r}, not a Chromium")
        if tuple(data["viewport"]) != VIEWPORT or bool(data["merge_memory"]) != merge_memory:
            raise BrowserError(f"the warm slot's Chromium runs with viewport {data['viewport']} and KSM "
                               f"{data['merge_memory']}, this workspace's with {list(VIEWPORT)} and {merge_memory}")
        browser = cls(ctx, merge_memory=merge_memory)
        browser.process = AdoptedProcess("chromium", int(data["pid"]))
        browser.pipe = CdpPipe(fds["cdp_commands"], fds["cdp_replies"], keep=KEPT_EVENTS,
                               on_event=browser._on_event, handed=data["pipe"])
        browser.tabs = [Tab(**t) for t in data["tabs"]]
        browser.current, browser.started_s = int(data["current"]), float(data["started_s"])
        browser.context_id = data.get("context_id")
        return browser

    def _on_event(self, event: dict[str, Any]) -> None:
        """A page's alert, confirm or prompt is dismissed as it opens (it would block the page's scripts and our
        evaluations; WebArena's Playwright dismisses them the same way)."""
        if event.get("method") == "Target.attachedToTarget" and self.pipe is not None:
            # a new page (a pop-up) waits for its debugger before it runs, whatever auto-attach asked, and its opener
            # waits for it: let it run at once (Playwright does the same)
            self.pipe.send("Runtime.runIfWaitingForDebugger", session=event["params"]["sessionId"], forget=True)
        if event.get("method") == "Page.javascriptDialogOpening" and self.pipe is not None:
            self.dialogs += 1
            self.pipe.send("Page.handleJavaScriptDialog", {"accept": False}, session=event.get("sessionId"),
                           forget=True)

    @property
    def cdp(self) -> CdpPipe:
        if self.pipe is None:
            raise BrowserError("the browser is not running")
        return self.pipe

    # -- tabs -----------------------------------------------------------------------------------------------------
    def _attach(self, target_id: str, deadline: float, opener: str | None = None) -> Tab:
        """Our session to page ``target_id`` (the auto-attached one if it came), its domains on, its emulation
        (viewport, scale 1, locale, time zone) set."""
        session = None
        for event in self.cdp.take_events("Target.attachedToTarget"):
            info = event["params"]["targetInfo"]
            if info["targetId"] == target_id:
                session = event["params"]["sessionId"]
            else:
                self.cdp.events.append(event)  # another page's: kept for ``_adopt_popups``
        if session is None:
            session = self.cdp.call("Target.attachToTarget", {"targetId": target_id, "flatten": True},
                                    deadline=deadline)["sessionId"]
        tab = Tab(target_id=target_id, session=session, opener=opener)
        ids = [self.cdp.send(method, params, session=session) for method, params in (
            ("Page.enable", {}), ("Page.setLifecycleEventsEnabled", {"enabled": True}), ("Runtime.enable", {}),
            ("Network.enable", {}), ("DOM.enable", {}), ("Accessibility.enable", {}),
            ("Emulation.setDeviceMetricsOverride", {"width": self.viewport[0], "height": self.viewport[1],
                                                    "deviceScaleFactor": 1, "mobile": False}),
            ("Emulation.setTimezoneOverride", {"timezoneId": "UTC"}),
            ("Emulation.setLocaleOverride", {"locale": "en-US"}),
            ("Emulation.setFocusEmulationEnabled", {"enabled": True}),  # as Playwright: the page has the focus
            ("Page.addScriptToEvaluateOnNewDocument", {"source": _OPEN_LIMIT, "runImmediately": True}),
            ("Page.getFrameTree", {}),
        )]
        for command_id in ids[:-1]:
            try:
                self.cdp.reply(command_id, "attach", deadline)
            except CdpError as exc:  # a popup shares its opener's locale override: it is in effect already
                if "override is already in effect" not in str(exc):
                    raise
        tab.frame_id = self.cdp.reply(ids[-1], "Page.getFrameTree", deadline)["frameTree"]["frame"]["id"]
        return tab

    @property
    def tab(self) -> Tab:
        self._adopt_popups(time.monotonic() + 5)
        if not self.tabs:
            raise BrowserError("the browser has no tab")
        return self.tabs[self.current]

    def _adopt_popups(self, deadline: float) -> None:
        """Pages the browser opened itself (``target=_blank``, ``window.open``) become tabs, in the order they
        came; over ``MAX_TABS`` they are closed. Tabs the browser destroyed are dropped."""
        cdp = self.cdp
        cdp.pump()
        for event in cdp.take_events("Target.targetDestroyed"):
            gone = event["params"]["targetId"]
            for i, tab in enumerate(self.tabs):
                if tab.target_id == gone:
                    del self.tabs[i]
                    if self.current >= i and self.current > 0:
                        self.current -= 1
                    break
        for event in cdp.take_events("Target.attachedToTarget"):
            info = event["params"]["targetInfo"]
            if info.get("type") != "page" or any(t.target_id == info["targetId"] for t in self.tabs):
                continue
            if len(self.tabs) >= MAX_TABS:
                with contextlib.suppress(CdpError):
                    cdp.call("Target.closeTarget", {"targetId": info["targetId"]}, deadline=deadline)
                continue
            cdp.events.append(event)
            tab = self._attach(info["targetId"], deadline, opener=info.get("openerId"))
            self.tabs.append(tab)
            self.current = len(self.tabs) - 1  # the page a click opened is where the agent is now, as in a browser

    def new_tab(self, deadline: float) -> Tab:
        if len(self.tabs) >= MAX_TABS:
            raise BrowserError(f"at most {MAX_TABS} tabs are open at once")
        target = self._create_target(deadline)
        tab = self._attach(target, deadline)
        self._drop_attached(target)
        self.tabs.append(tab)
        self.current = len(self.tabs) - 1
        return tab

    def _drop_attached(self, target_id: str) -> None:
        for event in self.cdp.take_events("Target.attachedToTarget"):
            if event["params"]["targetInfo"]["targetId"] != target_id:
                self.cdp.events.append(event)

    def focus(self, index: int, deadline: float) -> None:
        self._adopt_popups(deadline)
        if not 0 <= index < len(self.tabs):
            raise BrowserError(f"there is no tab {index} (tabs 0 to {len(self.tabs) - 1})")
        self.current = index
        self.call("Page.bringToFront", {}, deadline)

    def close_tab(self, deadline: float) -> None:
        """Close the current tab; the last one left gets the focus (a new blank one if none is left)."""
        tab = self.tab
        self.cdp.call("Target.closeTarget", {"targetId": tab.target_id}, deadline=deadline)
        self.tabs.remove(tab)
        with contextlib.suppress(CdpError):
            self.cdp.take_events("Target.targetDestroyed")
        if not self.tabs:
            self.new_tab(deadline)
        self.current = len(self.tabs) - 1

    # -- pages ----------------------------------------------------------------------------------------------------
    def call(self, method: str, params: dict[str, Any] | None, deadline: float,
             session: str | None = None) -> dict[str, Any]:
        """``method`` in the current tab's session (or ``session``), answered within ``PAGE_S`` and never closer to
        ``deadline`` than ``STOP_MARGIN_S``: a page whose script keeps it from answering (an endless loop, a storm
        of pop-ups) has that script terminated, and the call is refused."""
        session = session or self.tab.session
        started = time.monotonic()
        limit = max(started, min(started + PAGE_S, deadline - STOP_MARGIN_S))
        try:
            return self.cdp.call(method, params, deadline=limit, session=session)
        except CdpTimeout as exc:
            self.cdp.send("Runtime.terminateExecution", session=session, forget=True)
            raise BrowserError(f"the page did not answer {method} within {time.monotonic() - started:.1f} s; its "
                               f"running script was stopped") from exc

    def navigate(self, url: str, deadline: float) -> None:
        """Load ``url`` in the current tab and wait for its load event (an error page counts as loaded)."""
        tab = self.tab
        self._clear_loads(tab)
        result = self.cdp.call("Page.navigate", {"url": url}, deadline=deadline, session=tab.session)
        if result.get("errorText") and not result.get("loaderId"):
            raise BrowserError(f"cannot open {url[:200]}: {result['errorText']}")
        if result.get("loaderId"):
            self._wait_load(tab, deadline, loader=result["loaderId"])
        self._clear_loads(tab)  # this navigation's: ``settle`` after it must not wait for it again
        self._note_documents(tab)
        if result.get("errorText"):
            tab.status = 0  # Chromium's own error page ("This site can't be reached"): no answer came

    @contextlib.contextmanager
    def intercepting(self, urls: list[str], deadline: float) -> Iterator[None]:
        """While inside: the current tab's requests for ``urls`` stop in the browser (``Fetch.requestPaused``)
        for ``navigate_served(..., intercepted=True)`` to answer (nothing when ``urls`` is empty)."""
        if not urls:
            yield
            return
        patterns = [{"urlPattern": _fetch_pattern(url), "requestStage": "Request"} for url in dict.fromkeys(urls)]
        self.call("Fetch.enable", {"patterns": patterns}, deadline)
        try:
            yield
        finally:
            self.call("Fetch.disable", {}, deadline)

    def navigate_served(self, url: str, document: str, deadline: float, *, post_answer: bool = True,
                        intercepted: bool = False) -> None:
        """Load ``url`` in the current tab with ``document`` as its answer, intercepted before it leaves the browser
        (nothing reaches the server; the page's own resources load as usual). ``post_answer``: the document is a
        POST's answer (a fork of this browser serves it the same way); else it is a stand-in never stored (the
        entry's page loads from the server when history comes back to it). ``intercepted``: inside
        ``intercepting`` for ``url`` already (else it intercepts for this one load)."""
        if not intercepted:
            with self.intercepting([url], deadline):
                self.navigate_served(url, document, deadline, post_answer=post_answer, intercepted=True)
            return
        tab = self.tab
        self._clear_loads(tab)
        navigating = self.cdp.send("Page.navigate", {"url": url}, session=tab.session)
        paused = self.cdp.wait_event("Fetch.requestPaused", deadline, session=tab.session)
        body = base64.b64encode(document.encode()).decode()
        self.call("Fetch.fulfillRequest", {"requestId": paused["params"]["requestId"], "responseCode": 200,
                                           "responseHeaders": [{"name": "Content-Type",
                                                                "value": "text/html; charset=utf-8"},
                                                               {"name": "Cache-Control", "value": "no-store"}],
                                           "body": body}, deadline)
        self.cdp.reply(navigating, "Page.navigate", deadline)
        self._wait_load(tab, deadline)
        self._clear_loads(tab)
        self._note_documents(tab)
        if post_answer:
            tab.posted.add(url)  # still a POST's answer: a fork of this clone serves it the same way

    def history_go(self, delta: int, deadline: float) -> bool:
        """Back (-1) or forward (+1) in the current tab's history; False when there is nowhere to go."""
        history = self.cdp.call("Page.getNavigationHistory", deadline=deadline, session=self.tab.session)
        index = history["currentIndex"] + delta
        if not 0 <= index < len(history["entries"]):
            return False
        self.go_to_entry(history["entries"][index]["id"], deadline)
        return True

    def go_to_entry(self, entry_id: int, deadline: float) -> None:
        tab = self.tab
        self._clear_loads(tab)
        self.cdp.call("Page.navigateToHistoryEntry", {"entryId": entry_id}, deadline=deadline, session=tab.session)
        self.settle(deadline, tab)

    def settle(self, deadline: float, tab: Tab | None = None) -> None:
        """After input: if the page started a navigation, wait until the new page has loaded."""
        tab = tab or self.tab
        # a round trip through the page's main thread: a form the input submitted has asked to navigate by then (a
        # page busy in a script does not answer: what it started is seen below, and the next call bounds it; a page
        # that navigated while the probe was on its way answers "Inspected target navigated or closed": the same)
        try:
            self.cdp.call("Runtime.evaluate", {"expression": "0"}, session=tab.session,
                          deadline=min(deadline - STOP_MARGIN_S, time.monotonic() + SETTLE_PROBE_S))
        except BrowserGone:
            raise
        except CdpError:
            pass
        started = [e for e in self.cdp.take_events("Page.frameRequestedNavigation", tab.session)
                   + self.cdp.take_events("Page.frameStartedLoading", tab.session)
                   if e["params"].get("frameId") == tab.frame_id]
        loaded = any(e["params"].get("frameId") == tab.frame_id and e["params"].get("name") == "load"
                     for e in self.cdp.events if e.get("sessionId") == tab.session
                     and e.get("method") == "Page.lifecycleEvent")
        if started and not loaded:
            self._wait_load(tab, deadline)
        self._clear_loads(tab)
        self._note_documents(tab)
        self._adopt_popups(deadline)

    def _note_documents(self, tab: Tab) -> None:
        """Count the documents the tab's main frame loaded, their status, and which came as a POST's answer
        (the last request of a redirect chain is the one whose answer is shown)."""
        cdp = self.cdp
        for event in cdp.take_events("Network.requestWillBeSent", tab.session):
            params = event["params"]
            if params.get("type") != "Document" or params.get("frameId") != tab.frame_id:
                continue
            request = params.get("request", {})
            url = str(request.get("url", ""))
            if request.get("method") == "POST":
                tab.posted.add(url)
            else:
                tab.posted.discard(url)
        for event in cdp.take_events("Network.responseReceived", tab.session):
            params = event["params"]
            if params.get("type") == "Document" and params.get("frameId") == tab.frame_id:
                tab.documents += 1
                tab.status = int(params.get("response", {}).get("status", 0))

    def before_input(self) -> None:
        """Forget the current tab's page-load events so far: ``settle`` then sees only what the input caused."""
        self._clear_loads(self.tab)

    def in_scratch_tab(self, url: str, expression: str, deadline: float) -> Any:
        """Load ``url`` in a tab the agent never sees (the browser's cookies, no history of any tab changes),
        evaluate ``expression`` there, close it."""
        target = self._create_target(deadline, background=True)
        try:
            tab = self._attach(target, deadline)
            self._drop_attached(target)
            self._clear_loads(tab)
            result = self.cdp.call("Page.navigate", {"url": url}, deadline=deadline, session=tab.session)
            if result.get("loaderId"):
                self._wait_load(tab, deadline)
            return self.evaluate(expression, deadline, session=tab.session)
        finally:
            with contextlib.suppress(CdpError):
                self.cdp.call("Target.closeTarget", {"targetId": target}, deadline=deadline)
            self.cdp.take_events("Target.targetDestroyed")

    def _clear_loads(self, tab: Tab) -> None:
        for method in ("Page.lifecycleEvent", "Page.frameRequestedNavigation", "Page.frameStartedLoading"):
            self.cdp.take_events(method, tab.session)

    def _wait_load(self, tab: Tab, deadline: float, loader: str | None = None) -> None:
        """Until the tab's page fired its load event, at most ``PAGE_S`` and never closer to ``deadline`` than
        ``STOP_MARGIN_S``; a page still loading then has its loading stopped and its running script terminated (an
        endless loop would keep the page from answering anything else), and the action is refused."""
        started = time.monotonic()
        limit = min(started + PAGE_S, deadline - STOP_MARGIN_S)
        while True:
            try:
                event = self.cdp.wait_event("Page.lifecycleEvent", limit, session=tab.session)
            except CdpTimeout as exc:
                self.cdp.send("Runtime.terminateExecution", session=tab.session, forget=True)
                self.cdp.send("Page.stopLoading", session=tab.session, forget=True)
                raise BrowserError(f"the page did not finish loading within {time.monotonic() - started:.1f} s "
                                   f"(the browser's time for one page); its scripts were stopped and the page left "
                                   f"as it was") from exc
            params = event["params"]
            # ``loader``: this navigation's document (a page left before it loaded fires its load late)
            if (params.get("frameId") == tab.frame_id and params.get("name") == "load"
                    and loader in (None, params.get("loaderId"))):
                return

    def evaluate(self, expression: str, deadline: float, *, session: str | None = None) -> Any:
        """The value of ``expression`` in the page (``returnByValue``); a thrown error is a ``BrowserError``."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True, "timeout": 5000}
        try:
            result = self.call("Runtime.evaluate", params, deadline, session=session)
        except CdpError as exc:  # right after a script was terminated, V8 refuses one evaluation
            if "Internal error" not in str(exc):
                raise
            result = self.call("Runtime.evaluate", params, deadline, session=session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserError(f"the page's script failed: {text}")
        return result.get("result", {}).get("value")

    def url(self, deadline: float) -> str:
        history = self.cdp.call("Page.getNavigationHistory", deadline=deadline, session=self.tab.session)
        return str(history["entries"][history["currentIndex"]]["url"])

    def titles(self, deadline: float) -> list[str]:
        infos = {t["targetId"]: t for t in self.cdp.call("Target.getTargets", deadline=deadline)["targetInfos"]}
        return [str(infos.get(t.target_id, {}).get("title", "")) for t in self.tabs]

    # -- observing ------------------------------------------------------------------------------------------------
    def ax_tree(self, deadline: float) -> axtree.AxTree:
        """The current tab's accessibility tree (main frame), with each node's layout box; a page with more than
        ``MAX_ELEMENTS`` elements is not read (Chromium would take tens of seconds to build it, and the host would
        hold it): its tree is the root alone, ``truncated`` saying why."""
        tab = self.tab
        count = self.evaluate("document.getElementsByTagName('*').length", min(deadline, time.monotonic() + 5))
        if isinstance(count, int) and count > MAX_ELEMENTS:
            title = self.titles(deadline)[self.current] if self.tabs else ""
            root = axtree.AxLine(node_id=1, role="RootWebArea", name=title, depth=0,
                                 text=f"[1] RootWebArea {title!r}", backend_id=None, box=None)
            tab.last_tree = axtree.AxTree(lines=(root,), truncated=f"it has {count:,} elements, more than "
                                                                   f"{MAX_ELEMENTS:,}")
            return tab.last_tree
        snapshot_id = self.cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": [], "includeDOMRects": True},
                                    session=tab.session)
        tree_id = self.cdp.send("Accessibility.getFullAXTree", {}, session=tab.session)
        boxes = axtree.layout_boxes(self.cdp.reply(snapshot_id, "DOMSnapshot.captureSnapshot", deadline))
        nodes = self.cdp.reply(tree_id, "Accessibility.getFullAXTree", deadline).get("nodes", [])
        tab.last_tree = axtree.build(nodes, boxes)
        return tab.last_tree

    def scroll_offset(self, deadline: float) -> tuple[float, float]:
        value = self.evaluate("[window.scrollX, window.scrollY]", deadline)
        return (float(value[0]), float(value[1])) if isinstance(value, list) and len(value) == 2 else (0.0, 0.0)

    def screenshot(self, deadline: float) -> bytes:
        """The current tab's viewport as PNG bytes."""
        # Headless Chromium composites no frame for a tab in the background, and a capture of one waits for a
        # frame forever: the tab is brought to the front first (it is the agent's current tab anyway).
        self.call("Page.bringToFront", {}, deadline)
        shown = self.call("Runtime.evaluate", {"expression": _CARET_HIDDEN}, deadline).get("result", {})
        try:
            data = self.call("Page.captureScreenshot", {"format": "png"}, deadline)["data"]
        finally:
            if shown.get("objectId"):  # the caret back as the page had it
                self.cdp.send("Runtime.callFunctionOn", {"objectId": shown["objectId"],
                                                         "functionDeclaration": "function () { this(); }"},
                              session=self.tab.session, forget=True)
                self.cdp.send("Runtime.releaseObject", {"objectId": shown["objectId"]}, session=self.tab.session,
                              forget=True)
        return base64.b64decode(data)

    # -- input ----------------------------------------------------------------------------------------------------
    def element_centre(self, backend_id: int, deadline: float) -> tuple[float, float]:
        """Scroll the element into view if needed; the centre of its first box in viewport coordinates."""
        with contextlib.suppress(CdpError):
            self.call("DOM.scrollIntoViewIfNeeded", {"backendNodeId": backend_id}, deadline)
        try:
            quads = self.call("DOM.getContentQuads", {"backendNodeId": backend_id}, deadline).get("quads", [])
        except CdpError as exc:
            raise BrowserError(f"the element is not on the page any more ({exc})") from exc
        for quad in quads:
            xs, ys = quad[0::2], quad[1::2]
            if max(xs) - min(xs) > 0 and max(ys) - min(ys) > 0:
                return (sum(xs) / 4, sum(ys) / 4)
        raise BrowserError("the element has no visible box to act on")

    def mouse(self, kind: str, x: float, y: float, deadline: float, clicks: int = 1) -> None:
        params: dict[str, Any] = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=clicks)
        self.call("Input.dispatchMouseEvent", params, deadline)
        self.tab.pointer = (x, y)

    def click(self, x: float, y: float, deadline: float) -> None:
        """A click at (x, y), then the pointer parked outside the page (``PARKED``): where a click landed would
        otherwise stay hovered, and whether the page it led to shows a hover depends on when Chromium notices the
        pointer over it (timing: an executed step and a forked one would see other screenshots). ``hover`` keeps
        the pointer where it moved it, and a fork brings it there (``state.py``)."""
        self.mouse("mouseMoved", x, y, deadline)
        self.mouse("mousePressed", x, y, deadline)
        self.mouse("mouseReleased", x, y, deadline)
        self.mouse("mouseMoved", *PARKED, deadline)

    def key(self, key: str, deadline: float, modifiers: int = 0) -> None:
        """Press and release one key (``keys.py``'s names: Enter, Backspace, a...), with modifier bits."""
        for params in key_events(key, modifiers):
            self.call("Input.dispatchKeyEvent", params, deadline)

    def insert_text(self, text: str, deadline: float) -> None:
        """Type ``text`` as key presses, one character after the other (pipelined, the last one awaited)."""
        session = self.tab.session
        ids = [self.cdp.send("Input.dispatchKeyEvent", params, session=session)
               for ch in text for params in char_events(ch)]
        for command_id in ids:
            self.cdp.reply(command_id, "Input.dispatchKeyEvent", deadline)

