"""What an OSWorld task file needs, and whether this desktop can give it: the osworld suite's refusals.

Owns: ``refusal(task, files, osworld)``: None when the task can run here, else the one reason it cannot, named as a
user fixes it: ``windows`` (a Windows path: the task was written for OSWorld's Windows VM), ``app`` (an application the desktop image does not ship, e.g. VS Code), ``proxy``, ``internet`` (a
URL on the internet in its set-up or evaluation: the workspace has no network), ``setup`` / ``getter`` / ``metric``
(a step, getter or metric neither OSWorld's package, when the extra is installed, nor our fallback, without it,
runs; the easyocr shim's one metric by name) and ``file`` (a download or cloud file the files cache lacks, by URL).
``KINDS`` lists the kinds in the order they are checked, for the per-reason counts of a directory.
Must never: let a task through that would then fail for a reason known at load time.
"""

from __future__ import annotations

import re
from typing import Any

from . import own_judge
from .files_cache import FilesCache
from .osworld_judge import needed_files

KINDS = ("windows", "app", "proxy", "internet", "setup", "getter", "metric", "file")
SHIPPED_APPS = frozenset({"chrome", "libreoffice_calc", "libreoffice_writer", "libreoffice_impress", "gimp", "vlc",
                          "thunderbird", "os", "gedit", "terminal"})
MISSING_APPS = {"vs_code": "VS Code", "vscode": "VS Code", "excel": "Microsoft Excel (a Windows task)",
                "word": "Microsoft Word (a Windows task)", "ppt": "Microsoft PowerPoint (a Windows task)"}
# what some tasks' commands need that this desktop does not run (found in a task's set-up or evaluation)
NOT_RUN = {"timedatectl": "systemd's timedatectl (the workspace runs no systemd)",
           "org.gnome.shell": "GNOME Shell's settings (the desktop runs openbox, not GNOME Shell)",
           "gnome-control-center": "GNOME's settings application (the desktop runs openbox)"}
# steps OSWorld's SetupController has that reach accounts on the internet
NETWORK_STEPS = {"googledrive": "a Google Drive account", "login": "a web account login", "proxy": "a proxy"}
# the metric of desktop-env that needs easyocr, which the extra replaces by a shim that refuses it
OCR_METRICS = frozenset({"compare_image_text"})
_URL = re.compile(r"https?://[^\s\"'<>)]+")
_WINDOWS_PATH = re.compile(r"(?i)(?:^|[\s\"'])[a-z]:\\")
_LOCAL = re.compile(r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0)([:/]|$)")


def _osworld_names() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    from desktop_env.controllers.setup import SetupController
    from desktop_env.evaluators import getters, metrics

    steps = frozenset(n[1:-6] for n in dir(SetupController) if n.startswith("_") and n.endswith("_setup"))
    return (steps, frozenset(n[4:] for n in dir(getters) if n.startswith("get_")),
            frozenset(n for n in dir(metrics) if not n.startswith("_")))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def refusal(task: dict[str, Any], files: FilesCache, osworld: bool) -> tuple[str, str] | None:
    """(kind, reason) when ``task`` (a decoded OSWorld task file) cannot run here; None when it can. ``osworld``:
    judge and set up with OSWorld's own code (the extra), else with our fallback."""
    for text in _strings(task.get("config", [])) + _strings(task.get("evaluator", {})):
        if _WINDOWS_PATH.search(text):
            return "windows", f"written for Windows (the path {text[:80]!r})"
    apps = [*task.get("related_apps", []), task.get("snapshot", "")]
    for app in apps:
        if app in MISSING_APPS:
            return "app", f"needs {MISSING_APPS[app]}, which the desktop image does not ship"
    for text in _strings(task.get("config", [])) + _strings(task.get("evaluator", {})):
        for word, what in NOT_RUN.items():
            if word in text:
                return "app", f"needs {what}"
    if task.get("proxy"):
        return "proxy", "needs a proxy to the internet (the workspace has no network)"
    evaluator = task.get("evaluator") or {}
    downloads = set(needed_files(task))
    for text in _strings(task.get("config", [])) + _strings(evaluator):
        for url in _URL.findall(text):
            if url not in downloads and not _LOCAL.match(url):
                return "internet", f"needs the internet ({url[:120]})"
    steps_known, getters_known, metrics_known = (_osworld_names() if osworld else (
        frozenset(own_judge.SETUP_STEPS), frozenset(own_judge.GETTERS), frozenset(own_judge.METRICS)))
    hint = "" if osworld else " without the osworld extra (install it: ./scripts/setup.sh --osworld)"
    for where, steps in (("config", task.get("config", [])), ("postconfig", evaluator.get("postconfig", []))):
        for i, step in enumerate(steps):
            kind = step.get("type") if isinstance(step, dict) else None
            if kind in NETWORK_STEPS:
                return "setup", f"{where}[{i}] {kind} needs {NETWORK_STEPS[kind]} on the internet"
            if kind not in steps_known:
                return "setup", f"{where}[{i}].type {kind!r} does not run here{hint}"
    funcs = evaluator.get("func", [])
    funcs = funcs if isinstance(funcs, list) else [funcs]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        return "metric", "the evaluator names no metric (evaluator.func is empty)"
    if funcs != ["infeasible"]:
        for key in ("result", "expected"):
            getters = evaluator.get(key) or []
            for getter in getters if isinstance(getters, list) else [getters]:
                kind = getter.get("type") if isinstance(getter, dict) else None
                if kind not in getters_known:
                    return "getter", f"evaluator.{key} getter {kind!r} does not run here{hint}"
        for func in funcs:
            if func in OCR_METRICS:
                return "metric", f"metric {func} needs easyocr (the osworld extra's easyocr is a shim that refuses)"
            if func not in metrics_known:
                return "metric", f"metric {func!r} does not run here{hint}"
    for url in sorted(downloads):
        if not files.has(url) and not files.network:
            return "file", f"needs {url[:160]}, which is not in the files cache"
    return None
