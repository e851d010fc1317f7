"""A directory of task files a user brings (``bunshin eval --task-dir DIR``), loaded leniently.

Owns: walking every ``*.json`` under a directory (recursively, symlinked directories not followed, in natural path
order: ``2.json`` before ``10.json``), loading each through its suite's loader, and sorting the files into the tasks
the suite can run and the refusals: the loader's ``TaskFileError`` (not JSON, not a task file, a field missing or of
the wrong type, a feature the suite lacks, named by the loader), and a task id an earlier file already has.
Must never: stop at a refused file, run two files under one task id, or refuse a file without saying why.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from .base import Refusal, SuiteTask
from .webarena import TaskFileError


def _natural(path: Path, root: Path) -> list[tuple[int, int | str]]:
    """Sort key: the path under ``root`` with its runs of digits compared as numbers."""
    parts = re.split(r"(\d+)", path.relative_to(root).as_posix())
    return [(0, int(p)) if p.isdigit() else (1, p) for p in parts]


def task_files(directory: Path) -> list[Path]:
    """Every ``*.json`` under ``directory``, in natural path order."""
    return sorted(directory.rglob("*.json"), key=lambda p: _natural(p, directory))


def load_dir(directory: str | Path, load: Callable[[Path], SuiteTask]) -> tuple[list[SuiteTask], list[Refusal]]:
    """The tasks ``load`` makes of the files under ``directory`` and the files it refused, each with its reason.
    ``load`` raises ``TaskFileError`` for a file the suite cannot run; anything else it raises is refused too,
    named as our loader's failure (one user's file never stops the others). The first file of a task id wins."""
    directory = Path(directory)
    if not directory.is_dir():
        raise TaskFileError(directory, "not a directory")
    tasks: list[SuiteTask] = []
    refused: list[Refusal] = []
    seen: dict[str, str] = {}
    for path in task_files(directory):
        try:
            task = load(path)
        except TaskFileError as exc:
            refused.append(Refusal(file=str(path), reason=exc.detail))
            continue
        except Exception as exc:  # a loader bug on a user's file refuses that file, not the whole run
            refused.append(Refusal(file=str(path), reason=f"the suite's loader failed on it ({type(exc).__name__}: "
                                                          f"{exc}); a bug of ours, not of the file"))
            continue
        if task.id in seen:
            refused.append(Refusal(file=str(path), reason=f"task id {task.id!r} is already taken by {seen[task.id]}"))
            continue
        seen[task.id] = str(path)
        tasks.append(task)
    return tasks, refused


def load_tasks(directory: Path, load: Callable[[Path], SuiteTask], lenient: bool) -> tuple[list[SuiteTask],
                                                                                           list[Refusal]]:
    """A suite's tasks under ``directory``: ``lenient`` (a user's directory), every ``*.json`` recursively with the
    refused files set aside (``load_dir``); else its own ``<template>/<id>.json`` files, a refused one raising."""
    if lenient:
        return load_dir(directory, load)
    return [load(p) for p in sorted(Path(directory).glob("*/*.json"))], []
