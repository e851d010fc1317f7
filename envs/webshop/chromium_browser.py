"""The web shop seen through a real Chromium in the workspace: the ``chromium`` browser backend of ``ShopApp``.

Owns: the same face as the text browser (``act``, ``observe``, ``current_url``, ``fetch_text``, ``find``,
``page_tree``, ``requests``, ``close``) on ``envs/chromium``'s WebArena pages, every call bounded by the tool's
deadline (the runtime's, ``ctx.deadline``, capped by ``CALL_S``), and the browser's part of a fork: the state is
taken in the source before the workspace forks (``before_fork``: a snapshot keeps it as data, it holds no browser),
and a running clone takes a warm-pool slot's Chromium over (``envs/chromium/slot.py``) or starts its own, and is
brought to that state (``after_fork``: the ``replay`` fork of the browser, checked equal or refused with
``BrowserStateMismatch``; a browser behind the workspace's egress proxy is brought there on the clone's first call,
``restore_pending``, since the clone's proxy opens only once the clone is admitted).
Must never: let a clone go on with a browser that is not in its source's state, or touch the source's browser.
"""

from __future__ import annotations

import time
from typing import Any

from ..app import AppContext, ToolError
from ..chromium import state as browser_state
from ..chromium.browser import BrowserError, Chromium
from ..chromium.cdp import CdpError
from ..chromium.webarena import WebArenaPages
from ..records import Observation, ToolCall
from .browser.actions import validate_call

CALL_S = 60.0  # a call without a runtime deadline (setup, a fork's restore) still ends
FORK_S = 60.0


class ChromiumShopBrowser:
    def __init__(self, ctx: AppContext, start_url: str, *, screenshots: bool = True, merge_memory: bool = False,
                 proxy: str | None = None):
        self.ctx, self.start_url, self.screenshots, self.merge_memory = ctx, start_url, screenshots, merge_memory
        self.proxy = proxy  # the workspace's egress proxy (a WebArena deployment's sites), else no network
        self.chromium = Chromium(ctx, merge_memory=merge_memory, proxy=proxy)
        self.pages = WebArenaPages(self.chromium, start_url, screenshots=screenshots)
        self.saved: browser_state.BrowserState | None = None  # taken before a fork, restored in the clone
        self.launch_s = self.restore_s = 0.0  # the last fork's: starting a Chromium, bringing it to the state
        self.restore_steps: dict[str, float] = {}  # the last fork's restore, part by part (``state.restore``)
        self.warm = False  # the last fork's Chromium was a warm-pool slot's (launch_s: only taking it over)
        self.pending = False  # a clone behind a proxy whose browser is not yet restored (``restore_pending``)

    def start(self) -> None:
        self.chromium.start(self._deadline(CALL_S))

    def _deadline(self, cap: float = CALL_S) -> float:
        return min(self.ctx.deadline, time.monotonic() + cap)

    # -- the text browser's face ------------------------------------------------------------------------------
    @property
    def requests(self) -> int:
        return self.pages.requests

    def act(self, call: ToolCall) -> None:
        call = validate_call(call)
        if call.name == "stop":
            raise ToolError("stop is the final action: the suite scores it, the browser does not perform it")
        self._guarded(lambda d: self.pages.act(call, d))

    def observe(self) -> Observation:
        return self._guarded(self.pages.observe)

    def current_url(self) -> str:
        return self._guarded(self.pages.current_url)

    def fetch_text(self, url: str | None, selector: str) -> str:
        return self._guarded(lambda d: self.pages.page_text(url, selector, d))

    def page_tree(self) -> str:
        """The current page's whole tree as text (every line, no viewport cut): what ``observe`` shows a part of."""
        return self._guarded(lambda d: self.pages.chromium.ax_tree(d).render())

    def find(self, role: str, name: str) -> int | None:
        return self._guarded(lambda d: self.pages.find(role, name, d))

    def _guarded(self, work: Any) -> Any:
        try:
            return work(self._deadline())
        except (BrowserError, CdpError) as exc:
            raise ToolError(str(exc)) from exc

    def close(self) -> None:
        self.chromium.close()

    # -- forks ----------------------------------------------------------------------------------------------------
    def before_fork(self) -> None:
        """In the source: take the browser's state (a snapshot has no browser: it keeps the state it was made
        with, which its clones restore)."""
        if self.chromium.pipe is not None:
            self.saved = browser_state.capture(self.chromium, self._deadline(FORK_S))

    def after_fork(self) -> None:
        """In a running clone: a Chromium of its own (a warm-pool slot's when the clone took one: ``ctx.borrowed``,
        else started now), brought to the source's state and checked."""
        started = time.monotonic()
        self.chromium.abandon()
        lent = self.ctx.borrowed if self.proxy is None else None  # a slot's browser has no proxy: not ours then
        deadline = self._deadline(FORK_S)
        if lent is not None:
            self.chromium = Chromium.adopt(self.ctx, lent.fds, lent.data, merge_memory=self.merge_memory)
        else:
            self.chromium = Chromium(self.ctx, merge_memory=self.merge_memory, proxy=self.proxy)
            self.chromium.start(deadline)
        self.pages = WebArenaPages(self.chromium, self.start_url, screenshots=self.screenshots)
        self.warm = lent is not None
        launched = time.monotonic()
        self.launch_s, self.restore_s = launched - started, 0.0
        if self.proxy is not None:  # its proxy opens once the clone is admitted: the first call restores
            self.pending = self.saved is not None
            return
        if self.saved is not None:
            self.restore_steps = browser_state.restore(self.chromium, self.saved, deadline)
        self.restore_s = time.monotonic() - launched

    def restore_pending(self) -> None:
        """In a clone behind a proxy: bring its browser to the source's state now (its first call), checked."""
        if self.pending and self.saved is not None:
            self.pending = False
            started = time.monotonic()
            self.restore_steps = browser_state.restore(self.chromium, self.saved, self._deadline(FORK_S))
            self.restore_s = time.monotonic() - started

    def suspend(self) -> None:
        """In a snapshot: the source's browser is not ours."""
        self.chromium.abandon()
