"""The embedded web shop suite: WebArena's task files, action language and evaluators on the shop in a workspace.

Owns: loading the task files (``webarena.load_task``; the suite's own tasks carry their reference solution in
``bunshin_reference``, a real WebArena file has none and loads with an empty ``SuiteTask.reference`` when a user's
directory is loaded ``lenient``ly), the workspace application for them (``ShopApp`` with the
catalog knobs), a task's start (the browser goes to ``start_url``), turning a reference step that names an element
(``click [@link 'My Account']``) into the id on the page, and scoring: the product of the task's evaluators
(string_match on the final answer, url_match on the current page, program_html reading the shop's pages and REST
routes), as WebArena scores.
Must never: score a task whose evaluator it cannot run: such files are refused when loaded.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..chromium import slot as chromium_slot
from ..latency import check_time_scale
from ..records import AppSpec, Observation, ToolCall
from ..suites import webarena
from ..suites.base import ActionError, Refusal, Suite, SuiteTask, checked
from ..suites.task_dir import load_dir
from ..workspace import Workspace
from . import tasks as generator
from .app import BROWSERS
from .browser.actions import parse_action
from .tools import FINAL, SCHEMA

SHOP_APP = "bunshin.envs.webshop.app:ShopApp"
_SYMBOLIC_ID = re.compile(r"@\w+ '(?:[^'\\]|\\.)*'")
_SYMBOLIC = re.compile(rf"\[({_SYMBOLIC_ID.pattern})\]")


READ_ONLY = frozenset({"scroll", "hover", "tab_focus", "goto", "go_back", "go_forward"})


class WebArenaActions(Suite):
    """WebArena's action language as a suite speaks it (the web shop's tasks and WebArena's own on a deployment):
    parsing its text, the calls' normal form, the final ``stop``, looking-only actions, and reference steps that name
    an element by role and name, resolved on the page of the moment."""

    tool_schema = SCHEMA

    def parse_action(self, text: str) -> ToolCall:
        return parse_action(text)

    def normalize(self, call: ToolCall) -> ToolCall:
        """The call in the schema's normal form (``tools.SCHEMA``): defaults filled in, values as declared. A
        reference step's symbolic ``element_id`` (``@link 'My Account'``) is kept for ``concrete`` to resolve."""
        target = call.args.get("element_id") if isinstance(call.args, dict) else None
        if isinstance(target, str) and _SYMBOLIC_ID.fullmatch(target):
            checked = SCHEMA.normalize(ToolCall(name=call.name, args={**call.args, "element_id": 0}))
            return ToolCall(name=call.name, args={**checked.args, "element_id": target})
        return SCHEMA.normalize(call)

    def is_final(self, call: ToolCall) -> bool:
        return call.name == FINAL

    def null_action(self) -> ToolCall:
        return SCHEMA.normalize(ToolCall(name=FINAL))  # stop []

    def read_only(self, call: ToolCall) -> bool:
        """Looking, not doing: scrolling, hovering, switching tabs and GET navigation (``goto``, back, forward)
        change nothing on the server. A ``click`` or ``type`` may submit a form (add to cart, check out, post a
        review), and which one does depends on the page, so none is declared."""
        return call.name in READ_ONLY

    async def concrete(self, ws: Workspace, call: ToolCall) -> ToolCall:
        target = call.args.get("element_id")
        if not isinstance(target, str):
            return call
        found = await checked(ws, "_element", {"target": target})
        return ToolCall(name=call.name, args={**call.args, "element_id": found.data["element_id"]})


class WebShopSuite(WebArenaActions):
    """Knobs (defaults calibrated with ``bunshin bench sharing``, see docs/suites.md): ``catalog_size`` 20,000
    products; ``image_px`` 40 (each product's stored image, 40x40 RGB: 94 MiB for the catalog, shared by forks);
    ``browser`` ``text`` (the embedded text browser, fast) or ``chromium`` (Debian's Chromium in every workspace,
    driven over its DevTools pipe: ``envs/chromium``), ``ksm`` (Chromium workspaces opt into KSM);
    ``device_scale`` 2 (the browser decodes images at displayed size x 2, RGBA, kept per visited page);
    ``keep_rasters`` (the full-page raster of each visited page), ``load_images``, ``screenshots``; ``time_scale``
    1.0 (the modelled page-ready time of the agent's actions, ``envs/latency.py``, times this; 0: none). Task files:
    ``tasks_dir`` (``<id>.json``; default: the committed or generated tasks of the catalog), ``lenient`` (load every
    ``*.json`` under ``tasks_dir``, recursively, as a user's directory such as WebArena's ``config_files``: a file
    without ``bunshin_reference`` loads with an empty reference, files the shop cannot run are set aside in
    ``refused()`` instead of raising; ``envs/suites/task_dir.py``)."""

    name = "webshop"

    def __init__(self, catalog_size: int = generator.DEFAULT_CATALOG_SIZE,
                 catalog_seed: int = generator.DEFAULT_CATALOG_SEED, image_px: int = 40, screenshots: bool = True,
                 keep_rasters: bool = True, load_images: bool = True, device_scale: float = 2.0,
                 tasks_dir: str | Path | None = None, lenient: bool = False,
                 judge: webarena.Judge = webarena.token_overlap_judge, time_scale: float = 1.0,
                 browser: str = "text", ksm: bool = False):
        if browser not in BROWSERS:
            raise ValueError(f"browser must be one of {', '.join(BROWSERS)}, got {browser!r}")
        if ksm and browser == "text":
            raise ValueError("ksm: only Chromium workspaces opt into KSM (the text browser's are forked whole); "
                             "use browser='chromium'")
        self.app_kwargs = {"catalog_size": catalog_size, "catalog_seed": catalog_seed, "image_px": image_px,
                           "screenshots": screenshots, "keep_rasters": keep_rasters, "load_images": load_images,
                           "device_scale": device_scale, "time_scale": check_time_scale(time_scale)}
        if browser != "text":  # the text browser's namespaces (and recorded prefix trees) stay what they were
            self.app_kwargs.update(browser=browser, ksm=ksm)
        self.knobs = dict(self.app_kwargs)
        self.catalog = (catalog_size, catalog_seed)
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else None
        if lenient and self.tasks_dir is None:
            raise ValueError("lenient loads a directory of task files a user brings: give tasks_dir too")
        self.lenient = lenient
        self._refused: list[Refusal] = []
        self.judge = judge
        self.shop_port = 7770  # where the shop listens inside a workspace (ShopApp's default)
        self.base_url = f"http://127.0.0.1:{self.shop_port}"
        self._loaded: dict[str, webarena.WebArenaTask] = {}  # by path

    def task_files(self) -> list[Path]:
        if self.tasks_dir is not None:
            return sorted(self.tasks_dir.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
        return generator.task_files(*self.catalog)

    def tasks(self) -> list[SuiteTask]:
        """Every task; a file the shop cannot run, or (but ``lenient``) without a reference solution, raises
        ``TaskFileError`` naming it; ``lenient``, it is set aside in ``refused()`` with the reason instead."""
        if self.lenient:
            assert self.tasks_dir is not None  # the constructor checked
            tasks, self._refused = load_dir(self.tasks_dir, self.task_from_file)
            return tasks
        out = []
        for path in self.task_files():
            task = self.task_from_file(path)
            if not task.reference:
                raise webarena.TaskFileError(path, "bunshin_reference is required by the embedded suite (its "
                                                   "reference solution)")
            out.append(task)
        return out

    def refused(self) -> list[Refusal]:
        return list(self._refused)

    def task_from_file(self, path: str | Path) -> SuiteTask:
        """One task file (``TaskFileError`` naming it and the field if the shop cannot run it). Without
        ``bunshin_reference`` (a real WebArena file) the task's reference is empty; a reference given must end with
        ``stop``. The template is ``bunshin_template``, else WebArena's ``intent_template_id``."""
        task = webarena.load_task(path)
        reference = [self.parse_reference(step, path) for step in task.bunshin_reference]
        if reference and not self.is_final(reference[-1]):
            raise webarena.TaskFileError(path, "bunshin_reference must end with a stop action")
        self._loaded[str(path)] = task
        template = task.bunshin_template or (f"template_{task.intent_template_id}"
                                             if task.intent_template_id is not None else "webarena")
        return SuiteTask(suite=self.name, id=str(task.task_id), template=template, instruction=task.intent,
                         path=str(path), reference=reference)

    def parse_reference(self, step: str, path: Path | str = "<reference>") -> ToolCall:
        return reference_call(step, path)

    def app(self, task: SuiteTask | None = None) -> AppSpec:
        """The shop's app, on the image ``base`` (the text browser is ours) or ``chromium``; with Chromium, its live
        clones take their browser from warm-pool slots, which stand on the same image."""
        warm, ksm, image = None, bool(self.app_kwargs.get("ksm", False)), "base"
        if self.app_kwargs.get("browser") == "chromium":
            image = "chromium"
            warm = AppSpec(target=chromium_slot.TARGET, kwargs={"merge_memory": ksm}, merge_memory=ksm, image=image)
        return AppSpec(target=SHOP_APP, kwargs=dict(self.app_kwargs), warm=warm, merge_memory=ksm, image=image)

    def _task(self, task: SuiteTask) -> webarena.WebArenaTask:
        if task.path not in self._loaded:
            self._loaded[task.path] = webarena.load_task(task.path)
        return self._loaded[task.path]

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        url = webarena.expand_url(self._task(task).start_url, self.base_url)
        return await checked(ws, "_start", {"url": url})

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        spec = self._task(task)
        answer = str(final.args.get("answer", "")) if final.name == "stop" else ""
        page_url = (await checked(ws, "_url", {})).output if "url_match" in spec.eval.eval_types else ""
        pages: dict[tuple[str | None, str], str] = {}
        answers: dict[str, Any] = {}
        if "program_html" in spec.eval.eval_types:
            pages, answers = await self._program_html_reads(ws, spec)
        return webarena.score(spec, answer, self.base_url, page_url, lambda u, s: pages[(u, s)], answers.__getitem__,
                              self.judge)

    async def _program_html_reads(self, ws: Workspace, spec: webarena.WebArenaTask) -> tuple[
            dict[tuple[str | None, str], str], dict[str, Any]]:
        # The evaluator is synchronous and reads through the workspace: fetch what it will read first.
        targets = spec.eval.program_html
        answers: dict[str, Any] = {}
        latest = None
        if webarena.needs_latest_order(targets):
            latest_path = "/rest/V1/orders/latest"
            answers[latest_path] = (await checked(ws, "_shop_json", {"path": latest_path})).data["json"]
            latest = answers[latest_path].get("order_id")
        pages: dict[tuple[str | None, str], str] = {}
        for target, page_url in zip(targets, webarena.target_urls(targets, self.base_url, latest), strict=True):
            locator = webarena.parse_locator(target.locator)
            assert locator is not None  # load_task refused anything else
            if locator.kind in ("page", "selector"):
                got = await checked(ws, "_page_text", {"url": page_url, "selector": locator.selector})
                pages[(page_url, locator.selector)] = got.output
            else:
                path = f"/rest/V1/products/{locator.sku}/reviews"
                answers[path] = (await checked(ws, "_shop_json", {"path": path})).data["json"]
        return pages, answers


def reference_call(step: str, path: Path | str = "<reference>") -> ToolCall:
    """A reference step; ``[@role 'name']`` in place of an element id is kept as that string in ``element_id`` and
    resolved by ``WebArenaActions.concrete`` on the page of the moment."""
    symbolic = _SYMBOLIC.search(step)
    try:
        call = parse_action(_SYMBOLIC.sub("[0]", step, count=1) if symbolic else step)
    except ActionError as exc:
        raise webarena.TaskFileError(path, f"bunshin_reference step {step!r}: {exc}") from exc
    if symbolic:
        call = ToolCall(name=call.name, args={**call.args, "element_id": symbolic.group(1)})
    return call
