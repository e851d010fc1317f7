"""The ``osworld`` suite: OSWorld tasks on a real desktop (Xvfb, openbox, LibreOffice, Chromium, gedit, VLC, ...),
set up and judged by OSWorld's own code when the ``osworld`` extra is installed, by our fallback otherwise.

Owns: loading task files (the embedded ones, ``tasks.py``, or a user's OSWorld ``evaluation_examples`` directory
with ``lenient``: each file that cannot run here is set aside with its reason, ``support.py``), putting the
embedded tasks' files in the files cache, the agent's action language (OSWorld's ``pyautogui`` action space: Python
code, or ``WAIT``/``DONE``/``FAIL``), the task's set-up (``start``) and its score (``evaluate``), and both judges'
scores side by side (``judge_all``, what ``bunshin suite check`` compares).
A desktop workspace cannot be forked live by the userspace fork (``XDesktopApp.before_fork``): ``forks_live`` is
False, so every sample gets a workspace of its own set up from the task (docs/osworld.md); the tree fork
(``--backend kmod``) forks it live, every program of it (``fork/registry.py``'s ``forks_live``).
Must never: score with a judge the user did not get: ``judge="osworld"`` without the extra raises at construction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from ..records import AppSpec, Observation, ToolCall
from ..suites.base import ActionError, Refusal, Suite, SuiteTask
from ..suites.errors import SuiteError, TaskFileError
from ..suites.task_dir import load_tasks
from ..suites.tools import ToolArgs, ToolSchema, check_action_text
from ..workspace import Workspace
from . import osworld_judge, own_judge
from .app import MAX_WAIT_S, OBSERVATIONS, XDesktopApp, desktop_app
from .files_cache import FilesCache
from .http import Endpoint
from .session import SCREEN
from .support import refusal
from .tasks import TASKS_DIR, embedded_files

JUDGES = ("auto", "osworld", "own")
SETUP_TIMEOUT_S = 600.0
EVALUATE_TIMEOUT_S = 240.0
FINAL = ("DONE", "FAIL")
JUDGE_THREADS = 64


class PyautoguiArgs(ToolArgs, kw_only=True):
    """Run Python code on the desktop, as OSWorld's controller runs an action (``pyautogui`` and ``time`` are
    imported): ``pyautogui.click(960, 540)``, ``pyautogui.write('text')``, ``pyautogui.hotkey('ctrl', 's')``."""

    code: Annotated[str, Meta(min_length=1, max_length=100_000, description="Python code using pyautogui.")]


class WaitArgs(ToolArgs, kw_only=True):
    """Wait, doing nothing, then observe."""

    seconds: Annotated[float, Meta(ge=0, le=MAX_WAIT_S, description="How long to wait.")] = 1.0


class DoneArgs(ToolArgs, kw_only=True):
    """The task is complete: end the episode."""


class FailArgs(ToolArgs, kw_only=True):
    """The task cannot be done: end the episode, giving up."""


SCHEMA = ToolSchema({"pyautogui": PyautoguiArgs, "WAIT": WaitArgs, "DONE": DoneArgs, "FAIL": FailArgs})


class OSWorldSuite(Suite):
    """Knobs: ``tasks_dir`` (default: the embedded tasks), ``lenient`` (a user's directory: refuse per file),
    ``judge`` (``auto``: OSWorld's code when the extra is installed, else ours; ``osworld``; ``own``),
    ``files_cache`` (a directory; default ``$BUNSHIN_FILES_CACHE`` or /var/lib/bunshin/files), ``network``
    (download what the cache lacks), ``ksm``, ``observe`` (what each action answers with: ``screenshot``,
    ``a11y_tree``; a list, or a comma-separated string; ``""``: nothing), ``screen``."""

    name = "osworld"
    tool_schema = SCHEMA
    forks_live: ClassVar[bool] = False
    setup_timeout_s: ClassVar[float | None] = 600.0  # LibreOffice's first window on a loaded 2-core machine

    def __init__(self, tasks_dir: str | Path | None = None, lenient: bool = False, judge: str = "auto",
                 files_cache: str | Path | None = None, network: bool = False, ksm: bool = False,
                 observe: list[str] | tuple[str, ...] = OBSERVATIONS, screen: list[int] | tuple[int, int] = SCREEN,
                 time_scale: float = 0.0):
        if judge not in JUDGES:
            raise SuiteError(f"judge {judge!r}: one of {', '.join(JUDGES)}")
        self.has_osworld = osworld_judge.available()
        if judge == "osworld" and not self.has_osworld:
            raise SuiteError("judge 'osworld' needs the osworld extra (./scripts/setup.sh --osworld)")
        self.judge = ("osworld" if self.has_osworld else "own") if judge == "auto" else judge
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else TASKS_DIR
        self.lenient = lenient
        self.files = FilesCache(files_cache, network=network)
        if isinstance(observe, str):  # from the command line: --set observe=screenshot,a11y_tree
            observe = [part for part in observe.split(",") if part]
        XDesktopApp(screen=screen, ksm=ksm, observe=observe)  # bad knobs fail here, not in every workspace
        self.spec = desktop_app(ksm=ksm, screen=(int(screen[0]), int(screen[1])), observe=list(observe))
        self.knobs = {"judge": self.judge, "ksm": ksm, "observe": list(observe), "screen": list(screen)}
        self._raw: dict[str, dict[str, Any]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._tasks: list[SuiteTask] | None = None
        self._refused: list[Refusal] = []

    # -- tasks ------------------------------------------------------------------------------------------------
    def raw(self, task: SuiteTask) -> dict[str, Any]:
        return self._raw[task.path]

    def task_from_file(self, path: Path) -> SuiteTask:
        try:
            raw = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            raise TaskFileError(path, f"format: not a JSON task file: {type(exc).__name__}: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or \
                not isinstance(raw.get("instruction"), str) or not isinstance(raw.get("evaluator"), dict):
            raise TaskFileError(path, "format: an OSWorld task has a string id and instruction and an evaluator "
                                      "object")
        why = refusal(raw, self.files, osworld=self.judge == "osworld")
        if why is not None:
            raise TaskFileError(path, f"{why[0]}: {why[1]}")
        try:
            reference = msgspec.convert(raw.get("bunshin_reference", []), list[ToolCall])
            for call in reference:
                SCHEMA.decode(call)
        except (msgspec.ValidationError, ActionError) as exc:
            raise TaskFileError(path, f"bunshin_reference: {exc}") from exc
        self._raw[str(path)] = raw
        funcs = raw["evaluator"].get("func")
        return SuiteTask(suite=self.name, id=raw["id"], template=str(raw.get("bunshin_template") or path.parent.name),
                         instruction=raw["instruction"], path=str(path), reference=reference,
                         give_up=funcs == "infeasible" or funcs == ["infeasible"])

    def tasks(self) -> list[SuiteTask]:
        if self._tasks is None:
            if self.tasks_dir == TASKS_DIR:
                for url, data in embedded_files().items():
                    if not self.files.has(url):
                        self.files.put(url, data)
            self._tasks, self._refused = load_tasks(self.tasks_dir, self.task_from_file, self.lenient)
        return list(self._tasks)

    def refused(self) -> list[Refusal]:
        return list(self._refused)

    # -- episodes ---------------------------------------------------------------------------------------------
    def app(self, task: SuiteTask | None = None) -> AppSpec:
        return self.spec

    async def start(self, ws: Workspace, task: SuiteTask) -> Observation:
        raw = self.raw(task)
        if self.judge == "osworld":
            await self._with_osworld(ws, lambda judge: judge.setup(raw), SETUP_TIMEOUT_S)
        else:
            await asyncio.wait_for(own_judge.setup(ws, raw.get("config", []), self.files), SETUP_TIMEOUT_S)
        return await ws.execute(ToolCall(name="observe"))

    async def _with_osworld(self, ws: Workspace, work: Any, timeout_s: float) -> Any:
        """``work(judge)`` on a thread, with an ``OSWorldJudge`` attached to ``ws`` over HTTP (served by this
        loop meanwhile) and a scratch cache directory removed after."""
        cache = tempfile.mkdtemp(prefix="bunshin-osworld-")
        loop = asyncio.get_running_loop()
        try:
            async with Endpoint(ws) as endpoint:  # type: ignore[arg-type]  # a HostWorkspace: desktops run there
                judge = await loop.run_in_executor(self._threads(), osworld_judge.OSWorldJudge, endpoint.address,
                                                   cache, self.files)
                return await asyncio.wait_for(loop.run_in_executor(self._threads(), work, judge), timeout_s)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    def _threads(self) -> ThreadPoolExecutor:
        """OSWorld's code waits on HTTP answers the loop gives, and the runtime itself runs blocking steps on the
        loop's default executor (few threads): the judges get threads of their own, or enough waiting judges
        would take every default thread and the answers they wait for would never come."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=JUDGE_THREADS, thread_name_prefix="osworld-judge")
        return self._executor

    def parse_action(self, text: str) -> ToolCall:
        """``WAIT``, ``DONE``, ``FAIL`` alone, ``WAIT: <seconds>``, a JSON ``{"name": ..., "args": ...}`` call of
        the schema, or else Python code (OSWorld's ``pyautogui`` action)."""
        s = check_action_text(text).strip()
        if not s:
            raise ActionError("empty action; expected Python code (pyautogui), WAIT, DONE or FAIL")
        if s.upper() in ("WAIT", "DONE", "FAIL"):
            return ToolCall(name=s.upper())
        head, sep, rest = s.partition(":")
        if sep and head.strip().upper() == "WAIT":
            try:
                call = ToolCall(name="WAIT", args={"seconds": float(rest)})
            except ValueError as exc:
                raise ActionError(f"WAIT takes a number of seconds, got {rest.strip()[:40]!r}") from exc
        elif s.startswith("{"):
            try:
                call = msgspec.json.decode(s, type=ToolCall)
            except msgspec.MsgspecError as exc:
                raise ActionError(f'a JSON action is {{"name": "<tool>", "args": {{...}}}}: {exc}') from exc
        else:
            call = ToolCall(name="pyautogui", args={"code": s})
        SCHEMA.decode(call)
        return call

    def normalize(self, call: ToolCall) -> ToolCall:
        return SCHEMA.normalize(call)

    def is_final(self, call: ToolCall) -> bool:
        return call.name in FINAL

    def null_action(self) -> ToolCall:
        return ToolCall(name="FAIL")

    def done_action(self) -> ToolCall:
        """``DONE`` at once: OSWorld's getters and metrics then read the set-up state (``FAIL`` skips them)."""
        return ToolCall(name="DONE")

    def nondeterministic(self, call: ToolCall) -> bool:
        """A GUI action's effect depends on timing (what is drawn, focused, loaded when the keys arrive)."""
        return call.name in ("pyautogui", "WAIT")

    async def evaluate(self, ws: Workspace, task: SuiteTask, final: ToolCall) -> float:
        return (await self.judge_all(ws, task, final, both=False))[self.judge]

    async def judge_all(self, ws: Workspace, task: SuiteTask, final: ToolCall, both: bool = True) -> dict[str, float]:
        """The score by this suite's judge and, with ``both`` and the extra installed, by the other one too where
        our fallback runs the task's steps, getters and metrics (ours first: OSWorld's evaluation may run
        ``postconfig`` steps that change the desktop)."""
        raw = self.raw(task)
        last = final.name if final.name in FINAL else "DONE"
        scores: dict[str, float] = {}
        # ours as the second judge only where it can judge the task (OSWorld has getters and metrics we lack)
        ours_too = both and self.has_osworld and refusal(raw, self.files, osworld=False) is None
        if self.judge == "own" or ours_too:
            cache = Path(tempfile.mkdtemp(prefix="bunshin-own-judge-"))
            try:
                scores["own"] = await asyncio.wait_for(
                    own_judge.evaluate(ws, raw["evaluator"], last, cache, self.files), EVALUATE_TIMEOUT_S)
            finally:
                with contextlib.suppress(OSError):
                    shutil.rmtree(cache)
        if self.judge == "osworld" or (both and self.has_osworld):
            scores["osworld"] = await self._with_osworld(ws, lambda judge: judge.evaluate(raw, last),
                                                          EVALUATE_TIMEOUT_S)
        return scores
