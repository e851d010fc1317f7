"""``bunshin webarena tasks``: which of WebArena's own tasks a deployment can run, before anything runs.

Owns: reading the sites (``--site NAME=URL``, else the ``WA_*`` variables) and the task file (``--task-file``,
default libwebarena's ``test.raw.json``), and the report: prepared and refused tasks by site and by evaluator as a
table (``--json`` for the numbers), each refusal with its reason on request (``--refusals``).
Must never: contact a site (this reads files only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bunshin.envs.suites.errors import SuiteError
from bunshin.envs.webarena.sites import SITES, Deployment
from bunshin.envs.webarena.task_file import Loaded, libwebarena_tasks, load

from ..errors import CommandError


def tasks_report(task_file: Path | None, sites: list[str], judge: bool) -> tuple[Path, Deployment, Loaded]:
    """The task file read, the deployment parsed and what it gives (``CommandError`` naming a bad site or file)."""
    try:
        path = task_file if task_file is not None else libwebarena_tasks()
        deployment = Deployment.parse(sites, os.environ)
        return path, deployment, load(path, deployment, judge=judge)
    except SuiteError as exc:
        raise CommandError(f"bunshin webarena tasks: {exc}") from exc


def table(path: Path, deployment: Deployment, loaded: Loaded) -> list[str]:
    counts: dict[str, Any] = loaded.counts()
    given = ", ".join(f"{name}={site.url}" for name, site in deployment.sites.items()) or "none"
    lines = [f"{path}: {counts['prepared']} tasks prepared, {counts['refused']} refused (sites given: {given})", "",
             "| site | prepared | refused |", "|---|---|---|"]
    for name in [*SITES, *sorted(set(counts["by_site"]) - set(SITES))]:
        if name in counts["by_site"]:
            row = counts["by_site"][name]
            lines.append(f"| {name} | {row.get('prepared', 0)} | {row.get('refused', 0)} |")
    lines += ["", "| evaluator | prepared |", "|---|---|"]
    lines += [f"| {kind} | {row.get('prepared', 0)} |" for kind, row in counts["by_evaluator"].items()]
    return lines
