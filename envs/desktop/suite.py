"""The embedded desktop suite (OSWorld stand-in): tasks in OSWorld's JSON format under ``envs/desktop/tasks``,
run on ``DesktopApp``, scored with OSWorld's getters and metrics.

Owns: loading the task files (through ``envs/suites/osworld.py``, which refuses what the desktop cannot run; our
extra keys ``bunshin_template``, ``bunshin_reference`` and ``bunshin_private_files`` ride along as real OSWorld
files carry unused keys; a real OSWorld file has no reference solution: its ``SuiteTask.reference`` is empty), the
task's setup (private expected files written root-only under /var/lib/desktop, then OSWorld's ``config`` steps), the
action language, and scoring.

Action language (``parse_action``): OSWorld's special actions ``WAIT``, ``DONE``, ``FAIL``; a JSON object
``{"name": "<tool>", "args": {...}}`` for any agent tool (``tools.SCHEMA``: names, arguments, types, defaults;
every parsed action is checked against it, and so is every reference step); and a compact
form ``<tool>: <text>`` for the tools whose one argument is text: ``terminal: ls -la`` (command),
``editor_open: ~/notes.txt``, ``sheet_open:``, ``editor_save:``, ``sheet_save:`` (path), ``search_files:`` (query),
``WAIT: 2`` (seconds). The null attempt is ``FAIL`` at once (giving up: 1 only on infeasible tasks, which are
``SuiteTask.give_up``); ``DONE`` at once scores 0 everywhere.

Knobs (constructor keywords): ``tasks_dir`` (default: the committed tasks, ``<template>/<id>.json``), ``lenient``
(load every ``*.json`` under ``tasks_dir``, recursively, as a user's directory such as OSWorld's
``evaluation_examples/examples``: files the desktop cannot run are set aside in ``refused()`` instead of raising;
``envs/suites/task_dir.py``) and every ``DesktopApp`` knob
(``cache_mb=48``, ``index_roots``, ``window_w``, ``window_h``, ``scrollback_lines``, ``undo_depth``,
``screenshots``, ``png_level``, ``recording_frames=16``, ``time_scale=1.0``: the modelled pause after each
action, ``envs/latency.py``, times this; 0: none), passed to each workspace's app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from ..latency import check_time_scale
from ..records import AppSpec, Observation, ToolCall
from ..suites import osworld as ow
from ..suites.base import ActionError, Refusal, Suite, SuiteTask
from ..suites.task_dir import load_tasks
from ..suites.tools import check_action_text
from ..suites.webarena import TaskFileError
from ..workspace import Workspace
from . import tools as agent_tools
from .getters import SetupError, evaluate_task, run_setup_step

TASKS_DIR = Path(__file__).parent / "tasks"
APP_TARGET = "bunshin.envs.desktop.app:DesktopApp"
FINAL = agent_tools.FINAL
SPECIAL = ("WAIT", "DONE", "FAIL")  # OSWorld's special actions, written alone
COMPACT = {"terminal": "command", "editor_open": "path", "sheet_open": "path", "editor_save": "path",
           "sheet_save": "path", "search_files": "query"}  # ``<tool>: <text>``: the one text argument
if not all(arg in {a.name for a in agent_tools.SCHEMA.args(tool)} for tool, arg in COMPACT.items()):
    raise ImportError("a compact form names an argument the schema does not have")

# A JSON action as plain values, at most three containers deep (an object, its "args" object, a list in an argument):
# deeper nesting is refused where it starts instead of recursing through it (msgspec, like json, would recurse
# until a RecursionError).
_Leaf = str | int | float | bool | None
_Inner = _Leaf | list[_Leaf] | dict[str, _Leaf]
_json_action = msgspec.json.Decoder(dict[str, _Leaf | list[_Inner] | dict[str, _Inner]])


def _decode_json_action(text: str) -> tuple[str, dict[str, Any]]:
    """``{"name": "<tool>", "args": {...}}`` as (name, args); ``ActionError`` for anything else."""
    try:
        obj = _json_action.decode(text)
    except msgspec.ValidationError as exc:
        raise ActionError('a JSON action is {"name": "<tool>", "args": {...}} of plain values (strings, numbers, '
                          f"booleans, at most 64-bit): {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ActionError(f"action is not valid JSON: {exc}") from exc
    name = obj.get("name")
    if not isinstance(name, str):
        raise ActionError('a JSON action is {"name": "<tool>", "args": {...}}')
    extra = set(obj) - {"name", "args"}
    if extra:
        shown = sorted(repr(k if len(k) <= 40 else k[:37] + "...") for k in extra)[:5]
        raise ActionError(f"a JSON action has only 'name' and 'args', got also {', '.join(shown)}")
    args = obj.get("args", {})
    if not isinstance(args, dict):
        raise ActionError(f"'args' of {name[:60]} must be an object")
    return name, args


READ_ONLY = frozenset({"sheet_get", "search_files", "WAIT"})


class DesktopSuite(Suite):
    name = "desktop"
    tool_schema = agent_tools.SCHEMA

    def __init__(self, tasks_dir: str | Path | None = None, lenient: bool = False, time_scale: float = 1.0,
                 **app_kwargs: Any):
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else TASKS_DIR
        self.lenient = lenient
        self.app_kwargs = {**app_kwargs, "time_scale": check_time_scale(time_scale)}
        self.knobs = dict(self.app_kwargs)
        if "index_roots" in self.app_kwargs:
            self.app_kwargs["index_roots"] = list(self.app_kwargs["index_roots"])
        from .app import DesktopApp
        DesktopApp(**self.app_kwargs)  # bad knobs fail here, not in every workspace
        self._loaded: dict[str, tuple[ow.OSWorldTask, dict[str, Any]]] = {}
        self._tasks: list[SuiteTask] | None = None
        self._refused: list[Refusal] = []

    # -- tasks ------------------------------------------------------------------------------------------------
    def load(self, path: str | Path) -> tuple[ow.OSWorldTask, dict[str, Any]]:
        """The task file decoded (refused with ``TaskFileError`` if the desktop cannot run it) and its raw JSON."""
        key = str(path)
        if key not in self._loaded:
            task = ow.load_task(path)
            try:  # msgspec read it as JSON already; this fails only on nesting deeper than json recurses
                raw = json.loads(Path(path).read_bytes())
            except (ValueError, RecursionError) as exc:
                raise TaskFileError(path, f"not JSON: {type(exc).__name__}") from exc
            if not isinstance(raw.get("bunshin_private_files", {}), dict) or not all(
                    isinstance(v, str) for v in raw.get("bunshin_private_files", {}).values()):
                raise TaskFileError(path, "bunshin_private_files must be an object of path -> content strings")
            self._loaded[key] = (task, raw)
        return self._loaded[key]

    def task_from_file(self, path: str | Path) -> SuiteTask:
        task, raw = self.load(path)
        ref = raw.get("bunshin_reference", [])
        try:
            reference = msgspec.convert(ref, list[ToolCall])
        except msgspec.ValidationError as exc:
            raise TaskFileError(path, f"bunshin_reference: {exc}") from exc
        for call in reference:
            try:
                agent_tools.SCHEMA.decode(call)
            except ActionError as exc:
                raise TaskFileError(path, f"bunshin_reference: {exc}") from exc
        if "bunshin_reference" in raw and (not reference or reference[-1].name not in FINAL):
            raise TaskFileError(path, "bunshin_reference must end with DONE or FAIL")
        template = raw.get("bunshin_template") or Path(path).parent.name
        return SuiteTask(suite=self.name, id=task.id, template=str(template), instruction=task.instruction,
                         path=str(path), reference=reference, give_up=task.infeasible)

    def tasks(self) -> list[SuiteTask]:
        """Every task under ``tasks_dir``; a file the desktop cannot run raises ``TaskFileError`` naming it, or,
        ``lenient``, is set aside in ``refused()`` with the reason."""
        if self._tasks is None:
            self._tasks, self._refused = load_tasks(self.tasks_dir, self.task_from_file, self.lenient)
        return list(self._tasks)

    def refused(self) -> list[Refusal]:
        return list(self._refused)

    # -- episodes -----------------------------------------------------------------------------------------------
    def app(self, task: SuiteTask | None = None) -> AppSpec:
        """The drawn desktop, on the image ``base``: what a task's commands find (``python3``, coreutils) is that
        image's, whatever the host has installed (the infeasible tasks stay infeasible on a host with xrandr)."""
        return AppSpec(target=APP_TARGET, kwargs=self.app_kwargs, image="base")

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
        """The action as written (``WAIT: 2`` is ``{"seconds": 2.0}``), checked by the schema; ``ActionError``
        naming the tool and the argument otherwise."""
        s = check_action_text(text).strip()
        if not s:
            raise ActionError("empty action; expected WAIT, DONE, FAIL, a JSON tool call or '<tool>: <text>'")
        if s.upper() in SPECIAL:
            return ToolCall(name=s.upper())
        if s.startswith("{"):
            name, args = _decode_json_action(s)
            call = ToolCall(name=name, args=args)
        else:
            call = self._compact(s)
        agent_tools.SCHEMA.decode(call)
        return call

    @staticmethod
    def _compact(s: str) -> ToolCall:
        verb, sep, rest = s.partition(":")
        verb = verb.strip()
        if sep and verb.upper() == "WAIT":
            try:
                seconds = float(rest)
            except ValueError as exc:
                raise ActionError(f"WAIT takes a number of seconds, got {rest.strip()[:40]!r}") from exc
            return ToolCall(name="WAIT", args={"seconds": seconds})
        if sep and verb in COMPACT:
            value = rest.strip() if verb != "terminal" else rest.lstrip()
            if not value:
                raise ActionError(f"{verb}: needs its {COMPACT[verb]} after ':'")
            return ToolCall(name=verb, args={COMPACT[verb]: value})
        if sep and verb in agent_tools.SCHEMA:
            raise ActionError(f"{verb} takes a JSON action: {{\"name\": \"{verb}\", \"args\": {{...}}}}")
        word = verb.split()[0] if verb.split() else s[:20]
        raise ActionError(f"unknown action {word[:40]!r}; known: {', '.join(sorted(agent_tools.SCHEMA.names))}")

    def normalize(self, call: ToolCall) -> ToolCall:
        """The call in the schema's normal form (``tools.SCHEMA``): defaults filled in (``path`` null: the active
        window; ``end`` the ``start`` line), numbers of their declared types."""
        return agent_tools.SCHEMA.normalize(call)

    def is_final(self, call: ToolCall) -> bool:
        return call.name in FINAL

    def null_action(self) -> ToolCall:
        """Stopping at once: giving up (OSWorld's FAIL), right only on infeasible tasks (``give_up``)."""
        return ToolCall(name="FAIL")

    def read_only(self, call: ToolCall) -> bool:
        """Reading a cell, searching files and waiting change nothing. A ``terminal`` command may do anything,
        so none is declared, not even ``ls``."""
        return call.name in READ_ONLY

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        ot, _ = self.load(task.path)
        if final.name == "FAIL":
            return ow.score_infeasible("FAIL") if ot.infeasible else 0.0
        if final.name != "DONE":
            raise ValueError(f"evaluate needs the final action (DONE or FAIL), got {final.name!r}")
        if ot.infeasible:
            return 0.0
        return await evaluate_task(ws, ot)
