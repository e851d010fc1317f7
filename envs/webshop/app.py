"""The web shop as a workspace application: the shop's HTTP server runs in a worker process (``ShopServer``), the
text browser (``bunshin.envs.webshop.browser``) in the host, and every action of WebArena's language is a tool.

Owns: the tools an agent has (one per WebArena verb of ``tools.SCHEMA`` but ``stop``, their arguments decoded
through the schema; each answers with the page's accessibility tree and a screenshot), the hidden tools the suite
uses to set a task up and to evaluate it (``_start``, ``_element``, ``_page_text``, ``_shop_json``, ``_url``;
``_latency`` shows the latency state, ``_tree`` the current page's whole tree, no viewport cut, for tests that
compare the two browsers), the page-ready wait (``envs/latency.py``, profile ``WEBSHOP``: after an agent
action, before its observation, the host waits as long as the real shop's page would take: ``page`` when the action
loaded a page from the server, ``in_page`` otherwise; times ``time_scale``; internal tools never wait), and
re-homing the browser after a fork (its cookie jar and pages are plain memory and fork with the host; its
connections are made per request, so nothing needs re-opening). For the private-restore backend,
``checkpoint``/``restore`` image the whole browser and the latency chain (the server images itself: its catalog,
index and images are read back, not rebuilt).
Must never: let a malformed action or an unreachable page end the workspace: those are ``ToolError``s.
"""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

from .. import state_image
from ..app import AppContext, Tool, ToolError, WorkspaceApp, dont_fork_into_workers
from ..chromium.browser import BrowserError as ChromiumError
from ..chromium.cdp import CdpError
from ..latency import ToolLatency
from ..records import Observation, ToolCall
from ..runtime.workers import WorkerHandle
from ..suites.base import ActionError
from .browser.browser import Browser, BrowserError
from .chromium_browser import ChromiumShopBrowser
from .tools import FINAL, SCHEMA

_TARGET = re.compile(r"^@(\w+) (['\"])(.*)\2$", re.S)


BROWSERS = ("text", "chromium")


class ShopApp(WorkspaceApp):
    def __init__(self, catalog_size: int = 20_000, catalog_seed: int = 0, port: int = 7770, image_px: int = 40,
                 screenshots: bool = True, keep_rasters: bool = True, load_images: bool = True,
                 device_scale: float = 2.0, time_scale: float = 1.0, browser: str = "text", ksm: bool = False):
        if catalog_size < 1:
            raise ValueError(f"catalog_size must be >= 1, got {catalog_size}")
        if browser not in BROWSERS:
            raise ValueError(f"browser must be one of {', '.join(BROWSERS)}, got {browser!r}")
        self.browser_kind, self.ksm = browser, ksm
        self.latency = ToolLatency("webshop", time_scale)
        self.server_kwargs = {"catalog_size": catalog_size, "catalog_seed": catalog_seed, "port": port,
                              "image_px": image_px}
        self.browser_kwargs = {"screenshots": screenshots, "keep_rasters": keep_rasters, "load_images": load_images,
                               "device_scale": device_scale}

    def setup(self, ctx: AppContext) -> None:
        self.server: WorkerHandle = ctx.spawn("bunshin.envs.webshop.server:ShopServer", **self.server_kwargs)
        self.port = int(self.server.call("port"))
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.browser = self._browser(ctx)

    def _browser(self, ctx: AppContext) -> Browser | ChromiumShopBrowser:
        if self.browser_kind == "text":
            return Browser(self.base_url + "/", **self.browser_kwargs)
        chromium = ChromiumShopBrowser(ctx, self.base_url + "/", screenshots=self.browser_kwargs["screenshots"],
                                       merge_memory=self.ksm)
        ctx.on_clone(chromium.suspend)
        chromium.start()
        return chromium

    def before_fork(self, ctx: AppContext) -> None:
        super().before_fork(ctx)
        if isinstance(self.browser, ChromiumShopBrowser):
            self.browser.before_fork()

    def after_fork(self, ctx: AppContext) -> None:
        if isinstance(self.browser, ChromiumShopBrowser):
            try:
                self.browser.after_fork()
            except (ChromiumError, CdpError) as exc:
                raise ToolError(f"the clone's browser could not be brought to its source's state: {exc}") from exc

    # -- the private-restore baseline ------------------------------------------------------------------------------
    def checkpoint(self) -> list[bytes | memoryview]:
        """The host process's image (``state_image``): the whole browser (its pages, rasters and decoded images
        written out of band, straight from their arrays), the latency chain and the server's port. The server
        images itself. A Chromium cannot be imaged: its state as data (``before_fork`` took it) is, and the
        restored shop starts a Chromium and brings it there, as a clone does."""
        if isinstance(self.browser, ChromiumShopBrowser):
            return state_image.dump({"port": self.port, "browser_state": self.browser.saved, "latency": self.latency})
        return state_image.dump({"port": self.port, "browser": self.browser, "latency": self.latency})

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        """A shop going on exactly where the dumped one was, in private memory: the server is spawned again with
        the source's arguments and restores from its own image (``ShopServer.restore``), then the browser is read
        back from this image (nothing stays backed by the image file, which is removed once it is not needed)."""
        dont_fork_into_workers(data)
        self.server = ctx.spawn("bunshin.envs.webshop.server:ShopServer", **self.server_kwargs)  # binds its port
        self.port = int(self.server.call("port"))
        state = state_image.load(data)  # after the spawn: the server process need not inherit the browser
        if self.browser_kind == "chromium" and isinstance(state.get("latency"), ToolLatency) \
                and state.get("port") == self.port and "browser_state" in state:
            self.base_url = f"http://127.0.0.1:{self.port}"
            self.latency = state["latency"]
            self.browser = self._browser(ctx)
            self.browser.saved = state["browser_state"]
            self.browser.after_fork()
            return
        if not isinstance(state.get("browser"), Browser) or not isinstance(state.get("latency"), ToolLatency) \
                or state.get("port") != self.port:
            raise ValueError(f"not this web shop's image: a {type(state.get('browser')).__name__} on port "
                             f"{state.get('port')}, the restored server is on {self.port}")
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.browser, self.latency = state["browser"], state["latency"]

    def tools(self) -> dict[str, Tool]:
        tools: dict[str, Tool] = {verb: self._action(verb) for verb in SCHEMA.names if verb != FINAL}
        tools.update({"observe": self._observe, "_start": self._start, "_element": self._element,
                      "_page_text": self._page_text, "_shop_json": self._shop_json,
                      "_url": lambda a: Observation(output=self.browser.current_url()),
                      "_latency": lambda a: Observation(data=self.latency.state()),
                      "_browser": self._browser_state,
                      "_tree": lambda a: Observation(output=self._guarded_tree())})
        return tools

    def _guarded_tree(self) -> str:
        try:
            return self.browser.page_tree()
        except BrowserError as exc:
            raise ToolError(str(exc)) from exc

    def _browser_state(self, args: dict[str, Any]) -> Observation:
        """Which browser this workspace has and, for Chromium, what its last fork cost (starting one, restoring)."""
        data: dict[str, Any] = {"browser": self.browser_kind}
        if isinstance(self.browser, ChromiumShopBrowser):
            data.update(launch_s=self.browser.launch_s, restore_s=self.browser.restore_s,
                        restore_steps=self.browser.restore_steps,
                        started_s=self.browser.chromium.started_s, warm=self.browser.warm)
        return Observation(data=data)

    def _action(self, verb: str) -> Tool:
        def act(args: dict[str, Any]) -> Observation:
            draw = self.latency.begin(verb, args)
            requests = self.browser.requests
            try:
                self.browser.act(ToolCall(name=verb, args=args))  # it checks the call by the schema: ActionError
            except (ActionError, BrowserError) as exc:
                raise ToolError(str(exc)) from exc
            self.latency.wait(draw, "page" if self.browser.requests > requests else "in_page")
            return self.browser.observe()
        return act

    def _observe(self, args: dict[str, Any]) -> Observation:
        draw = self.latency.begin("observe", args)
        self.latency.wait(draw, "in_page")
        return self.browser.observe()

    def _start(self, args: dict[str, Any]) -> Observation:
        """A task's start: the current tab goes to ``url`` (WebArena opens the task's start_url)."""
        try:
            self.browser.act(ToolCall(name="goto", args={"url": str(args.get("url") or self.base_url + "/")}))
        except BrowserError as exc:
            raise ToolError(str(exc)) from exc
        return self.browser.observe()

    def _element(self, args: dict[str, Any]) -> Observation:
        return element(self.browser, args)

    def _page_text(self, args: dict[str, Any]) -> Observation:
        url = args.get("url")
        try:
            return Observation(output=self.browser.fetch_text(url if url else None, str(args.get("selector", ""))))
        except BrowserError as exc:
            raise ToolError(str(exc)) from exc

    def _shop_json(self, args: dict[str, Any]) -> Observation:
        """A read-only REST answer of the shop (what WebArena's evaluator functions read)."""
        path = str(args.get("path", ""))
        if not path.startswith("/rest/"):
            raise ToolError(f"_shop_json reads /rest/ routes only, not {path!r}")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read().decode()
        finally:
            conn.close()
        if response.status != 200:
            raise ToolError(f"{path}: HTTP {response.status}")
        return Observation(output=body, data={"json": json.loads(body)})

    def close(self) -> None:
        self.browser.close()


def element(browser: Browser | ChromiumShopBrowser, args: dict[str, Any]) -> Observation:
    """The id of the first element on the browser's current page with this role and name (``args["target"]``:
    ``@button 'Add to Cart'``): how a reference step names an element (the ``_element`` tool)."""
    target = str(args.get("target", ""))
    match = _TARGET.match(target)
    if not match:
        raise ToolError(f"element target {target!r} is not of the form @role 'name'")
    role, name = match.group(1), match.group(3)
    element_id = browser.find(role, name)
    if element_id is None:
        raise ToolError(f"no element {target!r} on {browser.current_url()}")
    return Observation(output=str(element_id), data={"element_id": element_id})
