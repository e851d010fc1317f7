"""The embedded desktop suite (OSWorld stand-in): tasks in OSWorld's JSON format under ``envs/desktop/tasks``,
run on ``DesktopApp``, scored with OSWorld's getters and metrics.

Owns: loading the task files (through ``envs/suites/osworld.py``, which refuses what the desktop cannot run; our
extra keys ``bunshin_template``, ``bunshin_reference`` and ``bunshin_private_files`` ride along as real OSWorld
files carry unused keys; a real OSWorld file has no reference solution: its ``SuiteTask.reference`` is empty), the task's setup (private expected files written root-only under /var/lib/desktop,
then OSWorld's ``config`` steps), the action language, and scoring.

Action language (``parse_action``): OSWorld's special actions ``WAIT``, ``DONE``, ``FAIL``; a JSON object
``{"name": "<tool>", "args": {...}}`` for any agent tool of ``DesktopApp`` (see envs/desktop/app.py); and a compact
form ``<tool>: <text>`` for the tools whose one argument is text: ``terminal: ls -la`` (command),
``editor_open: ~/notes.txt``, ``sheet_open:``, ``editor_save:``, ``sheet_save:`` (path), ``search_files:`` (query),
``WAIT: 2`` (seconds). The null attempt is ``FAIL`` at once (giving up: 1 only on infeasible tasks, which are
``SuiteTask.give_up``); ``DONE`` at once scores 0 everywhere.

Knobs (constructor keywords): ``tasks_dir`` (default: the committed tasks) and every ``DesktopApp`` knob
(``cache_mb=48``, ``index_roots``, ``window_w``, ``window_h``, ``scrollback_lines``, ``undo_depth``,
``screenshots``, ``png_level``, ``recording_frames=16``), passed to each workspace's app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from ..records import AppSpec, Observation, ToolCall
from ..suites import osworld as ow
from ..suites.base import ActionError, Suite, SuiteTask
from ..suites.webarena import TaskFileError
from ..workspace import Workspace
from .getters import SetupError, evaluate_task, run_setup_step

TASKS_DIR = Path(__file__).parent / "tasks"
APP_TARGET = "bunshin.envs.desktop.app:DesktopApp"
FINAL = frozenset({"DONE", "FAIL"})

# tool -> (required args, optional args); a type per argument
NUMBER = (int, float)
SCHEMA: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "terminal": ({"command": str}, {"timeout_s": NUMBER}),
    "editor_open": ({"path": str}, {}),
    "editor_replace": ({"find": str, "replace": str}, {"count": int, "path": str}),
    "editor_insert": ({"line": int, "text": str}, {"path": str}),
    "editor_delete_lines": ({"start": int}, {"end": int, "path": str}),
    "editor_undo": ({}, {"path": str}),
    "editor_save": ({}, {"path": str}),
    "editor_close": ({}, {"path": str}),
    "sheet_open": ({"path": str}, {}),
    "sheet_set": ({"cell": str, "value": (str, int, float)}, {"path": str}),
    "sheet_get": ({"cell": str}, {"path": str}),
    "sheet_save": ({}, {"path": str}),
    "sheet_close": ({}, {"path": str}),
    "search_files": ({"query": str}, {}),
    "WAIT": ({}, {"seconds": NUMBER}),
    "DONE": ({}, {}),
    "FAIL": ({}, {}),
}
COMPACT = {"terminal": "command", "editor_open": "path", "sheet_open": "path", "editor_save": "path",
           "sheet_save": "path", "search_files": "query"}


def check_args(name: str, args: dict[str, Any]) -> None:
    """``ActionError`` naming the tool and the argument when ``args`` do not fit the tool."""
    if name not in SCHEMA:
        raise ActionError(f"unknown action {name!r}; known: {', '.join(sorted(SCHEMA))}")
    required, optional = SCHEMA[name]
    for key, kind in required.items():
        if key not in args:
            raise ActionError(f"{name} needs the argument {key!r}")
    for key, value in args.items():
        kind = required.get(key, optional.get(key))
        if kind is None:
            raise ActionError(f"{name} takes no argument {key!r} (takes {sorted([*required, *optional])})")
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ActionError(f"{name}: argument {key!r} has the wrong type ({type(value).__name__})")


class DesktopSuite(Suite):
    name = "desktop"
    sharing_template = "project_tests"  # the group ``bunshin bench sharing`` plays by default: run, read, fix, rerun

    def __init__(self, tasks_dir: str | Path | None = None, **app_kwargs: Any):
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else TASKS_DIR
        self.app_kwargs = dict(app_kwargs)
        self.knobs = dict(app_kwargs)
        if "index_roots" in self.app_kwargs:
            self.app_kwargs["index_roots"] = list(self.app_kwargs["index_roots"])
        from .app import DesktopApp
        DesktopApp(**self.app_kwargs)  # bad knobs fail here, not in every workspace
        self._loaded: dict[str, tuple[ow.OSWorldTask, dict[str, Any]]] = {}
        self._tasks: list[SuiteTask] | None = None

    # -- tasks ------------------------------------------------------------------------------------------------
    def load(self, path: str | Path) -> tuple[ow.OSWorldTask, dict[str, Any]]:
        """The task file decoded (refused with ``TaskFileError`` if the desktop cannot run it) and its raw JSON."""
        key = str(path)
        if key not in self._loaded:
            task = ow.load_task(path)
            raw = json.loads(Path(path).read_text())
            self._loaded[key] = (task, raw)
        return self._loaded[key]

    def task_from_file(self, path: str | Path) -> SuiteTask:
        task, raw = self.load(path)
        ref = raw.get("bunshin_reference", [])
        try:
            reference = msgspec.convert(ref, list[ToolCall])
        except msgspec.ValidationError as exc:
            raise TaskFileError(path, f"bunshin_reference: {exc}") from None
        for call in reference:
            try:
                check_args(call.name, call.args)
            except ActionError as exc:
                raise TaskFileError(path, f"bunshin_reference: {exc}") from None
        if "bunshin_reference" in raw and (not reference or reference[-1].name not in FINAL):
            raise TaskFileError(path, "bunshin_reference must end with DONE or FAIL")
        template = raw.get("bunshin_template") or Path(path).parent.name
        return SuiteTask(suite=self.name, id=task.id, template=str(template), instruction=task.instruction,
                         path=str(path), reference=reference, give_up=task.infeasible)

    def tasks(self) -> list[SuiteTask]:
        if self._tasks is None:
            self._tasks = [self.task_from_file(p) for p in sorted(self.tasks_dir.glob("*/*.json"))]
        return list(self._tasks)

    # -- episodes -----------------------------------------------------------------------------------------------
    def app(self, task: SuiteTask | None = None) -> AppSpec:
        return AppSpec(target=APP_TARGET, kwargs=self.app_kwargs)

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        ot, raw = self.load(task.path)
        for path, content in sorted(raw.get("bunshin_private_files", {}).items()):
            obs = await ws.execute(ToolCall(name="_put_file", args={"path": path, "content": content}))
            if obs.error:
                raise SetupError(f"{task.path}: private file {path}: {obs.error}")
        for step in ot.config:
            await run_setup_step(ws, step)
        return await ws.execute(ToolCall(name="_screen"))

    def parse_action(self, text: str) -> ToolCall:
        if not isinstance(text, str) or not text.strip():
            raise ActionError("empty action; expected WAIT, DONE, FAIL, a JSON tool call or '<tool>: <text>'")
        s = text.strip()
        if s.upper() in ("WAIT", "DONE", "FAIL"):
            return ToolCall(name=s.upper())
        if s.startswith("{"):
            try:
                obj = json.loads(s)
            except ValueError as exc:
                raise ActionError(f"action is not valid JSON: {exc}") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise ActionError('a JSON action is {"name": "<tool>", "args": {...}}')
            extra = set(obj) - {"name", "args"}
            if extra:
                raise ActionError(f"a JSON action has only 'name' and 'args', got also {sorted(extra)}")
            args = obj.get("args", {})
            if not isinstance(args, dict):
                raise ActionError(f"'args' of {obj['name']} must be an object")
            check_args(obj["name"], args)
            return ToolCall(name=obj["name"], args=args)
        verb, sep, rest = s.partition(":")
        verb = verb.strip()
        if sep and verb.upper() == "WAIT":
            try:
                seconds = float(rest)
            except ValueError:
                raise ActionError(f"WAIT takes a number of seconds, got {rest.strip()!r}") from None
            return ToolCall(name="WAIT", args={"seconds": seconds})
        if sep and verb in COMPACT:
            value = rest.strip() if verb != "terminal" else rest.lstrip()
            if not value:
                raise ActionError(f"{verb}: needs its {COMPACT[verb]} after ':'")
            return ToolCall(name=verb, args={COMPACT[verb]: value})
        if sep and verb in SCHEMA:
            raise ActionError(f"{verb} takes a JSON action: {{\"name\": \"{verb}\", \"args\": {{...}}}}")
        raise ActionError(f"unknown action {verb.split()[0] if verb.split() else s[:20]!r}; known: "
                          f"{', '.join(sorted(SCHEMA))}")

    def is_final(self, call: ToolCall) -> bool:
        return call.name in FINAL

    def null_action(self) -> ToolCall:
        """Stopping at once: giving up (OSWorld's FAIL), right only on infeasible tasks (``give_up``)."""
        return ToolCall(name="FAIL")

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        ot, _ = self.load(task.path)
        if final.name == "FAIL":
            return ow.score_infeasible("FAIL") if ot.infeasible else 0.0
        if final.name != "DONE":
            raise ValueError(f"evaluate needs the final action (DONE or FAIL), got {final.name!r}")
        if ot.infeasible:
            return 0.0
        return await evaluate_task(ws, ot)
