"""OSWorld's getters for the embedded desktop, named as OSWorld names them: they read a running workspace through
the desktop's internal tools, and the evaluation that combines them with the metrics.

Owns: ``vm_command_line`` (a command's output, run as the user, outside the terminal), ``vm_terminal_output``
(the terminal's text), ``vm_file`` (a file fetched into a temporary directory on the engine's side; ``multi`` and
``gives`` as in OSWorld), ``rule`` (the ``rules`` object itself), ``list_directory`` (a directory tree:
``{"name", "type", "children"}``, children sorted by name), the setup steps (``execute``/``command``, ``sleep``,
``open``, ``launch``) and ``evaluate_task`` (postconfig, getters, metrics with their options, ``conj``).
Must never: leave a fetched file behind (the temporary directory is removed whatever happens).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..records import Observation, ToolCall
from ..suites import osworld as ow
from ..suites.base import SuiteStepFailed
from ..workspace import Workspace

EDITOR_PROGRAMS, SHEET_PROGRAMS, TERMINAL_PROGRAMS = ow.EDITOR_PROGRAMS, ow.SHEET_PROGRAMS, ow.TERMINAL_PROGRAMS
SHEET_SUFFIXES = (".csv",)
log = logging.getLogger(__name__)


class SetupError(SuiteStepFailed):
    """A task's setup step failed in the workspace (the task file or the desktop is wrong, not the agent)."""


async def _call(ws: Workspace, name: str, **args: Any) -> Observation:
    return await ws.execute(ToolCall(name=name, args=args))


def _command_text(params: dict[str, Any]) -> str:
    command = params.get("command")
    if isinstance(command, list):
        argv = [str(c) for c in command]
        if argv and argv[0] == "python":  # OSWorld's VM has `python`; Debian has python3 only
            argv[0] = "python3"
        return shlex.join(argv)
    if isinstance(command, str):
        return command
    raise SetupError(f"a command must be a string or a list of strings, got {command!r}")


async def open_in_app(ws: Workspace, path: str) -> Observation:
    tool = "sheet_open" if path.lower().endswith(SHEET_SUFFIXES) else "editor_open"
    obs = await _call(ws, tool, path=path)
    if obs.error:
        raise SetupError(f"opening {path}: {obs.error}")
    return obs


async def run_setup_step(ws: Workspace, step: ow.SetupStep) -> None:
    params = step.parameters
    if step.type in ("execute", "command"):
        if ow.gui_noop(params.get("command")):
            return  # OSWorld's focus click: nothing to focus on this desktop
        obs = await _call(ws, "_exec", command=_command_text(params), timeout_s=float(params.get("timeout", 300)))
        if obs.error or obs.exit_code not in (0, None):
            raise SetupError(f"setup command failed (exit {obs.exit_code}, {obs.error}): {obs.output[-2000:]}")
    elif step.type == "sleep":
        await asyncio.sleep(float(params.get("seconds", 1)))
    elif step.type == "open":
        await open_in_app(ws, str(params["path"]))
    elif step.type == "launch":
        command = params.get("command")
        argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command or []]
        program = os.path.basename(argv[0]) if argv else ""
        files = [a for a in argv[1:] if not a.startswith("-")]
        if program in TERMINAL_PROGRAMS:
            return  # the terminal is always open
        if program in EDITOR_PROGRAMS or program in SHEET_PROGRAMS:
            for path in files:
                await open_in_app(ws, path)
            return
        raise SetupError(f"launch: the desktop has no program {program!r}")
    else:
        raise SetupError(f"setup step type {step.type!r} is not supported")


# -- getters -----------------------------------------------------------------------------------------------------------


async def get_vm_command_line(ws: Workspace, config: dict[str, Any], tmp: Path) -> str | None:
    obs = await _call(ws, "_exec", command=_command_text(config), timeout_s=float(config.get("timeout", 120)))
    return None if obs.error else obs.output


async def get_vm_terminal_output(ws: Workspace, config: dict[str, Any], tmp: Path) -> str:
    return (await _call(ws, "_terminal_output")).output


async def _fetch(ws: Workspace, path: str, dest: str, tmp: Path) -> str | None:
    obs = await _call(ws, "_read_file", path=path)
    content = obs.data.get("content")
    if content is None:
        return None
    local = tmp / f"{len(os.listdir(tmp))}-{Path(dest).name or 'file'}"  # never two getters on one file
    await asyncio.to_thread(local.write_bytes, content)
    return str(local)


async def get_vm_file(ws: Workspace, config: dict[str, Any], tmp: Path) -> str | list[str | None] | None:
    if config.get("multi"):
        paths, dests = list(config["path"]), list(config["dest"])
        got = [await _fetch(ws, p, d, tmp) for p, d in zip(paths, dests, strict=False)]
        gives = config.get("gives", [0])
        return got[gives[0]] if len(gives) == 1 else [got[i] for i in gives]
    return await _fetch(ws, str(config["path"]), str(config.get("dest") or os.path.basename(config["path"])), tmp)


async def get_rule(ws: Workspace, config: dict[str, Any], tmp: Path) -> Any:
    return config["rules"]


async def get_list_directory(ws: Workspace, config: dict[str, Any], tmp: Path) -> dict[str, Any] | None:
    return (await _call(ws, "_list_directory", path=str(config["path"]))).data.get("tree")


GETTERS = {
    "vm_command_line": get_vm_command_line,
    "vm_terminal_output": get_vm_terminal_output,
    "vm_file": get_vm_file,
    "rule": get_rule,
    "list_directory": get_list_directory,
}
if set(GETTERS) != set(ow.GETTER_TYPES):  # the loader accepts exactly the getters we run
    raise ImportError(f"GETTERS and osworld.GETTER_TYPES disagree: {sorted(set(GETTERS) ^ set(ow.GETTER_TYPES))}")


async def get(ws: Workspace, config: dict[str, Any] | None, tmp: Path) -> Any:
    if config is None:
        return None
    return await GETTERS[config["type"]](ws, config, tmp)


def _nth(value: Any, i: int, n: int) -> Any:
    """OSWorld's per-metric field: a list holds one entry per metric; a single value serves them all."""
    if isinstance(value, list) and n > 1:
        return value[i] if i < len(value) else None
    if isinstance(value, list) and n == 1:
        return value[0] if value else None
    return value


async def evaluate_task(ws: Workspace, task: ow.OSWorldTask) -> float:
    """Run ``postconfig``, then every metric on its getters' values, combined with ``conj`` (a feasible task)."""
    ev = task.evaluator
    for step in ev.postconfig:
        await run_setup_step(ws, step)
    funcs = ev.funcs
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="bunshin-osworld-"))
    try:
        scores = []
        for i, name in enumerate(funcs):
            result = await get(ws, _nth(ev.result, i, len(funcs)), tmp)
            expected_cfg = _nth(ev.expected, i, len(funcs))
            options = _nth(ev.options, i, len(funcs)) or {}
            metric = ow.METRICS[name]
            args = [result] if expected_cfg is None else [result, await get(ws, expected_cfg, tmp)]
            try:
                score = metric(*args, **options)
            except (RecursionError, TypeError, ValueError, KeyError, IndexError, UnicodeError) as exc:
                # what the agent left cannot be compared (a file of another shape, deeply nested JSON...): not
                # the expected result. Options and rules were checked when the task file was loaded.
                log.info("task %s: %s on the agent's result: %s: %s", task.id, name, type(exc).__name__, exc)
                score = 0.0
            scores.append(float(score))
            if ev.conj == "and" and score == 0.0:
                break  # OSWorld stops at the first failed metric of a conjunction
        return ow.combine(scores, ev.conj)
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)
