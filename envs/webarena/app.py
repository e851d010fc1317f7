"""The workspace application for WebArena's own tasks: Debian's Chromium, its every request through the workspace's
egress proxy (``runtime/egress.py``: the deployment's sites and nothing else), driven in WebArena's action language.

Owns: the agent's tools (one per WebArena verb but ``stop``, as the web shop's, each answered with the page's
accessibility tree and screenshot), and the hidden ones the suite sets a task up and scores it with: ``_sign_in``
(WebArena's account on a site, ``sign_in.py``), ``_start`` (the task's start URLs, one tab each, as WebArena opens
``start_url`` split on ``|AND|``), ``_url`` (the agent's page), ``_element`` (a reference step's element by role and
name), ``_evaluate`` (JavaScript on the agent's page or on a
URL in a throw-away tab with the browser's cookies: what program_html reads); the browser's part of a fork is
``ChromiumShopBrowser``'s (its state replayed in the clone's own Chromium, which has the same proxy, before the
clone's first call: its proxy opens once the clone is admitted).
Must never: start a browser without the proxy (it would have no network, and no way to tell), or let a malformed
action or an unreachable page end the workspace (``ToolError``s).
"""

from __future__ import annotations

import time
from typing import Any

from ..app import AppContext, Tool, ToolError, WorkspaceApp
from ..chromium.browser import BrowserError
from ..chromium.cdp import CdpError
from ..records import Observation, ToolCall
from ..runtime.egress import EGRESS_PORT
from ..suites.base import ActionError
from ..webshop.app import element
from ..webshop.chromium_browser import CALL_S, ChromiumShopBrowser
from ..webshop.tools import FINAL, SCHEMA
from .sign_in import sign_in

PROXY = f"http://127.0.0.1:{EGRESS_PORT}"


class SitesApp(WorkspaceApp):
    def __init__(self, screenshots: bool = True):
        self.screenshots = screenshots

    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.browser = ChromiumShopBrowser(ctx, "about:blank", screenshots=self.screenshots, proxy=PROXY)
        ctx.on_clone(self.browser.suspend)
        self.browser.start()

    def before_fork(self, ctx: AppContext) -> None:
        super().before_fork(ctx)
        self.browser.before_fork()

    def after_fork(self, ctx: AppContext) -> None:
        try:
            self.browser.after_fork()
        except (BrowserError, CdpError) as exc:
            raise ToolError(f"the clone's browser could not be brought to its source's state: {exc}") from exc

    def tools(self) -> dict[str, Tool]:
        tools: dict[str, Tool] = {verb: self._action(verb) for verb in SCHEMA.names if verb != FINAL}
        tools.update({"observe": lambda a: self.browser.observe(), "_sign_in": self._sign_in, "_start": self._start,
                      "_url": lambda a: Observation(output=self.browser.current_url()),
                      "_element": lambda a: element(self.browser, a), "_evaluate": self._evaluate})
        return {name: self._restored(tool) for name, tool in tools.items()}

    def _restored(self, tool: Tool) -> Tool:
        """A clone's browser is brought to its source's state before its first call (``restore_pending``)."""
        def call(args: dict[str, Any]) -> Observation:
            if self.browser.pending:
                try:
                    self.browser.restore_pending()
                except (BrowserError, CdpError) as exc:
                    raise ToolError(f"the clone's browser could not be brought to its source's state: {exc}") from exc
            return tool(args)
        return call

    def _deadline(self) -> float:
        return min(self.ctx.deadline, time.monotonic() + CALL_S)

    def _action(self, verb: str) -> Tool:
        def act(args: dict[str, Any]) -> Observation:
            try:
                self.browser.act(ToolCall(name=verb, args=args))  # checked by the schema: ActionError
            except (ActionError, BrowserError) as exc:
                raise ToolError(str(exc)) from exc
            return self.browser.observe()
        return act

    def _sign_in(self, args: dict[str, Any]) -> Observation:
        site, url = str(args.get("site", "")), str(args.get("url", ""))
        landed = sign_in(self.browser.chromium, site, url, self._deadline())
        return Observation(output=landed, data={"site": site, "url": landed})

    def _start(self, args: dict[str, Any]) -> Observation:
        """The task's start: its first URL in the current tab, each other in a tab of its own (the first focused)."""
        urls = [str(u) for u in args.get("urls") or []]
        if not urls:
            raise ToolError("_start needs the task's start URLs")
        try:
            for i, url in enumerate(urls):
                if i:
                    self.browser.act(ToolCall(name="new_tab", args={}))
                self.browser.act(ToolCall(name="goto", args={"url": url}))
                status = self.browser.chromium.tab.status
                if status == 0 or status >= 500:  # no answer, or the egress proxy's 502: the site is down
                    raise ToolError(f"the task's start page {url} does not answer (HTTP status {status or 'none'})")
            if len(urls) > 1:
                self.browser.act(ToolCall(name="tab_focus", args={"tab_index": 0}))
        except (ActionError, BrowserError) as exc:
            raise ToolError(f"the task's start page: {exc}") from exc
        return self.browser.observe()

    def _evaluate(self, args: dict[str, Any]) -> Observation:
        """``script`` (a JavaScript expression, WebArena's locator) evaluated on ``url`` loaded in a throw-away tab,
        or on the agent's page when no URL is given, after ``prep`` (scripts whose failures WebArena ignores); the
        value as JSON in ``data["value"]``."""
        url, script = args.get("url"), str(args.get("script", ""))
        prep = [str(p) for p in args.get("prep") or []]
        chromium, deadline = self.browser.chromium, self._deadline()
        steps = "".join(f"try {{ (() => {{ {p} }})(); }} catch (e) {{}}\n" for p in prep)
        expression = f"(() => {{ {steps} return ({script}); }})()"
        try:
            if url:
                value = chromium.in_scratch_tab(str(url), expression, deadline)
            else:
                value = chromium.evaluate(expression, deadline)
        except (BrowserError, CdpError) as exc:
            raise ToolError(f"evaluating {script[:200]!r} on {url or 'the agent page'}: {exc}") from exc
        return Observation(output="" if value is None else str(value), data={"value": value})

    def close(self) -> None:
        self.browser.close()
