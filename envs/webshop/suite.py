"""The embedded web shop suite: WebArena's task files, action language and evaluators on the shop in a workspace.

Owns: loading the task files (``webarena.load_task``), the workspace application for them (``ShopApp`` with the
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

from ..records import AppSpec, Observation, ToolCall
from ..suites import webarena
from ..suites.base import ActionError, Suite, SuiteTask, checked
from ..workspace import Workspace
from . import tasks as generator
from .browser.actions import parse_action
from .tools import FINAL, SCHEMA

SHOP_APP = "bunshin.envs.webshop.app:ShopApp"
_SYMBOLIC_ID = re.compile(r"@\w+ '(?:[^'\\]|\\.)*'")
_SYMBOLIC = re.compile(rf"\[({_SYMBOLIC_ID.pattern})\]")


class WebShopSuite(Suite):
    """Knobs (defaults calibrated with ``bunshin bench sharing``, see docs/suites.md): ``catalog_size`` 20,000
    products; ``image_px`` 40 (each product's stored image, 40x40 RGB: 94 MiB for the catalog, shared by forks);
    ``device_scale`` 2 (the browser decodes images at displayed size x 2, RGBA, kept per visited page);
    ``keep_rasters`` (the full-page raster of each visited page), ``load_images``, ``screenshots``."""

    name = "webshop"
    sharing_template = "add_to_cart"  # the group ``bunshin bench sharing`` plays by default

    def __init__(self, catalog_size: int = generator.DEFAULT_CATALOG_SIZE,
                 catalog_seed: int = generator.DEFAULT_CATALOG_SEED, image_px: int = 40, screenshots: bool = True,
                 keep_rasters: bool = True, load_images: bool = True, device_scale: float = 2.0,
                 tasks_dir: str | Path | None = None,
                 judge: webarena.Judge = webarena.token_overlap_judge):
        self.app_kwargs = {"catalog_size": catalog_size, "catalog_seed": catalog_seed, "image_px": image_px,
                           "screenshots": screenshots, "keep_rasters": keep_rasters, "load_images": load_images,
                           "device_scale": device_scale}
        self.knobs = dict(self.app_kwargs)
        self.catalog = (catalog_size, catalog_seed)
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else None
        self.judge = judge
        self.base_url = "http://127.0.0.1:7770"
        self._loaded: dict[str, webarena.WebArenaTask] = {}

    def task_files(self) -> list[Path]:
        if self.tasks_dir is not None:
            return sorted(self.tasks_dir.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
        return generator.task_files(*self.catalog)

    def tasks(self) -> list[SuiteTask]:
        out = []
        for path in self.task_files():
            task = webarena.load_task(path)
            if not task.bunshin_reference:
                raise webarena.TaskFileError(path, "bunshin_reference is required by the embedded suite (its "
                                                   "reference solution)")
            reference = [self.parse_reference(step, path) for step in task.bunshin_reference]
            if not self.is_final(reference[-1]):
                raise webarena.TaskFileError(path, "bunshin_reference must end with a stop action")
            self._loaded[str(task.task_id)] = task
            out.append(SuiteTask(suite=self.name, id=str(task.task_id), template=task.bunshin_template,
                                 instruction=task.intent, path=str(path), reference=reference))
        return out

    def parse_reference(self, step: str, path: Path | str = "<reference>") -> ToolCall:
        """A reference step; ``[@role 'name']`` in place of an element id is kept as that string in
        ``element_id`` and resolved by ``concrete`` on the page of the moment."""
        symbolic = _SYMBOLIC.search(step)
        try:
            call = parse_action(_SYMBOLIC.sub("[0]", step, count=1) if symbolic else step)
        except ActionError as exc:
            raise webarena.TaskFileError(path, f"bunshin_reference step {step!r}: {exc}") from exc
        if symbolic:
            call = ToolCall(name=call.name, args={**call.args, "element_id": symbolic.group(1)})
        return call

    def app(self, task: SuiteTask | None = None) -> AppSpec:
        return AppSpec(target=SHOP_APP, kwargs=dict(self.app_kwargs))

    def _task(self, task: SuiteTask) -> webarena.WebArenaTask:
        if task.id not in self._loaded:
            self._loaded[task.id] = webarena.load_task(task.path)
        return self._loaded[task.id]

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        url = webarena.expand_url(self._task(task).start_url, self.base_url)
        return await checked(ws, "_start", {"url": url})

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

    async def concrete(self, ws: Workspace, call: ToolCall) -> ToolCall:
        target = call.args.get("element_id")
        if not isinstance(target, str):
            return call
        found = await checked(ws, "_element", {"target": target})
        return ToolCall(name=call.name, args={**call.args, "element_id": found.data["element_id"]})

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        spec = self._task(task)
        answer = str(final.args.get("answer", "")) if final.name == "stop" else ""
        score = 1.0
        for kind in spec.eval.eval_types:
            if kind == "string_match":
                score *= webarena.string_match(answer, spec.eval.reference_answers or {}, spec.intent, self.judge,
                                               spec.eval.string_note)
            elif kind == "url_match":
                page = await checked(ws, "_url", {})
                score *= webarena.url_match(webarena.expand_url(spec.eval.reference_url or "", self.base_url),
                                            page.output)
            elif kind == "program_html":
                score *= await self._program_html(ws, spec)
        return score

    async def _program_html(self, ws: Workspace, spec: webarena.WebArenaTask) -> float:
        # The evaluator is synchronous and reads through the workspace: fetch what it will read first.
        targets = spec.eval.program_html
        answers: dict[str, Any] = {}
        latest = None
        if webarena.needs_latest_order(targets):
            latest_path = "/rest/V1/orders/latest"
            answers[latest_path] = (await checked(ws, "_shop_json", {"path": latest_path})).data["json"]
            latest = answers[latest_path].get("order_id")
        pages: dict[tuple[str | None, str], str] = {}
        for target, page_url in zip(targets, webarena.target_urls(targets, self.base_url, latest)):
            locator = webarena.parse_locator(target.locator)
            assert locator is not None  # load_task refused anything else
            if locator.kind in ("page", "selector"):
                got = await checked(ws, "_page_text", {"url": page_url, "selector": locator.selector})
                pages[(page_url, locator.selector)] = got.output
            else:
                path = f"/rest/V1/products/{locator.sku}/reviews"
                answers[path] = (await checked(ws, "_shop_json", {"path": path})).data["json"]
        return webarena.program_html(targets, self.base_url, lambda u, s: pages[(u, s)], answers.__getitem__)
