"""BrowserGym's own environments on the embedded web tasks: ``gym.make("browsergym/bunshin.webshop.<task_id>")``
once this module is imported.

Owns: ``ShopTask``, BrowserGym's ``AbstractBrowserTask`` for one web-suite task: ``setup`` forks the task's set-up
workspace (a ``TaskSession`` shared by the environments of one task and configuration open in this process), carries
a loopback port of its own to the shop inside that fork only (``TaskSession.expose``) and opens the task's start
page there in BrowserGym's browser; ``validate`` ends the episode when the agent answers (``send_msg_to_user``) or
reports the task infeasible (the answer "N/A", as BrowserGym's WebArena tasks take it) and scores it with WebArena's
evaluators (``envs/suites/webarena.score``) reading BrowserGym's browser: its page's URL, pages in a throw-away tab
with its cookies, the shop's REST routes through the port; ``teardown`` closes the fork (and the set-up workspace
with the last environment of its task; ``ShopEnv``, BrowserGym's ``BrowserEnv``, holds the session from its first reset
to its close, so a reset forks instead of setting up again). ``register`` makes every task of a web suite an environment id; the embedded
web shop's tasks are registered when this module is imported. ``debian_chromium`` points Playwright's browser
registry at Debian's Chromium (Playwright knows only its own builds).
Why BrowserGym's own package: its agents, action set and observations (bids, the accessibility tree, screenshots)
are what its users bring; we provide tasks, not a copy of its environment.
Must never: be imported by bunshin itself (it imports browsergym, the optional extra ``browsergym``); leave a
workspace or a forwarded port behind (teardown, close, the interpreter's exit); give the agent's browser a way to
anything but its own fork's shop.
"""

from __future__ import annotations

import functools
import json
import os
import urllib.error
import urllib.request
import uuid
import weakref
from pathlib import Path
from typing import Any

import playwright.sync_api
from browsergym.core.env import BrowserEnv
from browsergym.core.task import AbstractBrowserTask

from bunshin.envs.records import Limits
from bunshin.envs.suites import webarena
from bunshin.envs.webshop.suite import WebShopSuite

from .gym import find_task
from .session import AdapterError, SessionPool, TaskSession, pool_key

PREFIX = "bunshin"  # environment ids: browsergym/<PREFIX>.<suite>.<task id>
POOL = SessionPool()
SUITES: dict[str, WebShopSuite] = {}  # the registered suites, by the name their ids carry
HOLD = "held-by-env"  # the episode name an environment's hold on its session releases (it has no workspace)
MAX_JSON = 16 << 20  # the largest REST answer an evaluator reads (the agent writes reviews: bounded)
START_TIMEOUT_MS = 30_000  # the start page's load (the shop answers in milliseconds; a loaded machine is slower)
DEBIAN_CHROMIUM = Path("/usr/lib/chromium/chromium")


class ShopUnreachable(AdapterError):
    """The fork's shop did not answer an evaluator's read: names the URL and why."""


class ShopTask(AbstractBrowserTask):
    """One task of a registered web suite, each reset a fresh copy-on-write fork of its set-up workspace."""

    @classmethod
    def get_task_id(cls) -> str:
        return PREFIX

    def __init__(self, seed: int | None, suite: str, task_id: str, backend: str = "cow",
                 state_dir: str | None = None, limits: dict[str, Any] | None = None,
                 call_timeout_s: float = 60.0) -> None:
        super().__init__(seed if seed is not None else 0)
        if suite not in SUITES:
            raise AdapterError(f"no web suite {suite!r} is registered (registered: {', '.join(sorted(SUITES))})")
        self.suite = SUITES[suite]
        self.task = find_task(self.suite, task_id)
        self.spec = webarena.load_task(self.task.path)
        # BrowserGym seeds every reset (None: draw one, as gymnasium does); the fork takes it
        self.seed = seed if seed is not None else int(self.random.randint(0, 2**31 - 1))
        self.backend, self.call_timeout_s = backend, call_timeout_s
        self.state_dir = Path(state_dir) if state_dir else None
        self.limits = Limits(**limits) if limits else None
        self.key = pool_key({"suite": suite, "task_id": task_id, "backend": backend, "state_dir": state_dir,
                             "limits": limits, "call_timeout_s": call_timeout_s})
        self.session: TaskSession | None = None
        self.episode = uuid.uuid4().hex
        self._release: weakref.finalize | None = None
        self.base_url = ""
        self.timeout_ms = int(call_timeout_s * 1000)

    # -- BrowserGym's task contract ---------------------------------------------------------------------------------
    def setup(self, page: playwright.sync_api.Page) -> tuple[str, dict[str, Any]]:
        def make() -> TaskSession:
            return TaskSession(self.suite, self.task, backend=self.backend, state_dir=self.state_dir,
                               limits=self.limits, call_timeout_s=self.call_timeout_s)

        self.session = POOL.acquire(self.key, make)
        self._release = weakref.finalize(self, POOL.release, self.key, self.session, self.episode)
        try:
            self.session.reset(self.seed, episode=self.episode)
            port = self.session.expose(self.suite.shop_port, episode=self.episode)
            self.base_url = f"http://127.0.0.1:{port}"
            page.goto(webarena.expand_url(self.spec.start_url, self.base_url), timeout=START_TIMEOUT_MS)
        except BaseException:
            self.teardown()
            raise
        return self.task.instruction, {"task_id": self.task.id, "seed": self.seed, "base_url": self.base_url}

    def validate(self, page: playwright.sync_api.Page,
                 chat_messages: list[dict[str, Any]]) -> tuple[float, bool, str, dict[str, Any]]:
        last = chat_messages[-1] if chat_messages else None
        if last is None or last.get("role") not in ("assistant", "infeasible"):
            return 0.0, False, "", {}
        answer = "N/A" if last["role"] == "infeasible" else str(last.get("message", ""))
        reward = webarena.score(self.spec, answer, self.base_url, page.url, _PageReader(page, self.timeout_ms),
                                self._read_json, self.suite.judge)
        return reward, True, "", {"answer": answer, "task_id": self.task.id}

    def teardown(self) -> None:
        """Close this episode's fork; the session closes with the last task and environment that hold it."""
        self.session = None
        if self._release is not None:
            self._release()

    # -- what the evaluators read --------------------------------------------------------------------------------
    def _read_json(self, path: str) -> Any:
        url = f"{self.base_url}{path}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_ms / 1000) as answer:
                body = answer.read(MAX_JSON + 1)
        except (OSError, urllib.error.URLError) as exc:
            raise ShopUnreachable(f"{url}: {exc}") from exc
        if len(body) > MAX_JSON:
            raise ShopUnreachable(f"{url}: the answer is over {MAX_JSON} bytes")
        return json.loads(body)


class ShopEnv(BrowserEnv):
    """BrowserGym's ``BrowserEnv``, holding its task's session from its first reset to its close: BrowserGym makes a
    new task object at every reset and tears the last one down first, so without the hold every reset would set the
    task up again (seconds) where a fork of the set-up workspace takes a tenth of one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold: weakref.finalize | None = None

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        result = super().reset(*args, **kwargs)
        task = self.task
        session = task.session if isinstance(task, ShopTask) else None
        if self._hold is None and session is not None:
            POOL.acquire(task.key, lambda: session)  # it is pooled: this counts one user more
            self._hold = weakref.finalize(self, POOL.release, task.key, session, HOLD)
        return result

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._hold is not None:
                self._hold()
                self._hold = None


class _PageReader:
    """WebArena's program_html reads in BrowserGym's browser: the agent's page as it is (``url`` None), or ``url``
    in a throw-away tab of its context (the agent's cookies, so its cart), closed after."""

    def __init__(self, page: playwright.sync_api.Page, timeout_ms: int):
        self.page, self.timeout_ms = page, timeout_ms

    def __call__(self, url: str | None, selector: str) -> str:
        expression = webarena.text_expression(selector)
        if url is None:
            return str(self.page.evaluate(expression) or "")
        tab = self.page.context.new_page()
        try:
            tab.goto(url, timeout=self.timeout_ms)
            return str(tab.evaluate(expression) or "")
        finally:
            tab.close()


def register(suite: WebShopSuite, name: str = "webshop") -> list[str]:
    """Make every task of ``suite`` a BrowserGym environment, ``browsergym/bunshin.<name>.<task id>``; returns the
    ids. Environment keywords (``task_kwargs={...}`` of ``gym.make``) may give ``backend``, ``state_dir``,
    ``limits`` (``Limits``'s fields) and ``call_timeout_s``."""
    import gymnasium

    SUITES[name] = suite
    ids = []
    for task in suite.tasks():
        env_id = f"{PREFIX}.{name}.{task.id}"
        if f"browsergym/{env_id}" not in gymnasium.registry:
            # as browsergym.core.registration.register_task registers, with ShopEnv for BrowserEnv
            gymnasium.register(id=f"browsergym/{env_id}", nondeterministic=True,
                               entry_point=functools.partial(_make_env, name, task.id))
        ids.append(f"browsergym/{env_id}")
    return ids


def _make_env(suite: str, task_id: str, *args: Any, **kwargs: Any) -> ShopEnv:
    return ShopEnv(functools.partial(ShopTask, suite=suite, task_id=task_id), *args, **kwargs)


def debian_chromium(registry: str | Path | None = None, executable: Path = DEBIAN_CHROMIUM) -> Path:
    """Point Playwright's browser registry (``PLAYWRIGHT_BROWSERS_PATH``) at Debian's Chromium: a directory in which
    the builds the installed Playwright expects (``chromium``, ``chromium-headless-shell``, by revision) are links to
    ``executable``. Returns the directory (default: ``~/.cache/bunshin/playwright-debian``)."""
    if not executable.exists():
        raise AdapterError(f"{executable} is missing: install Debian's Chromium (apt-get install chromium)")
    import playwright as pw

    browsers = json.loads((Path(pw.__file__).parent / "driver" / "package" / "browsers.json").read_text())
    root = Path(registry) if registry is not None else Path.home() / ".cache" / "bunshin" / "playwright-debian"
    layouts = {"chromium": ("chrome-linux", "chrome"), "chromium-headless-shell":
               ("chrome-headless-shell-linux64", "chrome-headless-shell")}
    for browser in browsers["browsers"]:
        if browser["name"] not in layouts:
            continue
        folder, binary = layouts[browser["name"]]
        home = root / f"{browser['name'].replace('-', '_')}-{browser['revision']}"
        targets = [home / folder / binary]
        if browser["name"] == "chromium":  # newer Playwright looks in chrome-linux64
            targets.append(home / "chrome-linux64" / binary)
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.exists():
                target.unlink()
            target.symlink_to(executable)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(root)
    return root


register(WebShopSuite())
