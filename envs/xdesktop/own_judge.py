"""Our fallback for OSWorld's own code, where the ``osworld`` extra is absent: a task's set-up steps, its getters and
its metrics, run against a desktop workspace through its ``vm`` tool (OSWorld's VM API, no HTTP hop).

Owns: ``SETUP_STEPS``, ``GETTERS`` and ``METRICS`` (what this fallback runs, by OSWorld's names), ``setup`` (a
task's ``config`` steps), ``evaluate`` (OSWorld's ``DesktopEnv.evaluate``: FAIL as the last action scores an
infeasible task 1 and any other 0; several metrics joined by ``conj``; a result file that is missing scores 0), the
metrics the real desktop's tasks add to ``envs/suites/osworld.py``'s (``compare_table``'s ``sheet_data`` rule on
.xlsx, ``compare_docx_files``, ``is_expected_tabs``, ``is_vlc_playing``). The suite's check runs both judges on
every embedded task and fails where they disagree (tests/test_osworld_suite.py).
Must never: score what it cannot evaluate (an unknown getter or metric raises; the loader refuses such tasks first).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from xml.etree import ElementTree

import msgspec

from ..errors import EnvsError
from ..records import ToolCall
from ..suites import osworld as shared
from ..workspace import Workspace
from .files_cache import FilesCache
from .office import OfficeFileError, read_docx, read_xlsx
from .vm_api import VmResponse

SETUP_TIMEOUT_S = 180.0


class OwnJudgeError(EnvsError):
    """A set-up step or getter failed in the workspace (the step and the answer named)."""


async def vm(ws: Workspace, method: str, path: str, *, body: Any = None, form: dict[str, str] | None = None,
             files: dict[str, bytes] | None = None) -> VmResponse:
    """One request to the workspace's VM API."""
    args = {"method": method, "path": path, "json": body, "form": form or {}, "files": files or {}}
    obs = await ws.execute(ToolCall(name="vm", args=args), timeout_s=SETUP_TIMEOUT_S)
    if obs.error is not None:
        raise OwnJudgeError(f"{method} {path}: {obs.error}")
    return msgspec.convert(obs.data, VmResponse)


def _ok(answer: VmResponse, what: str) -> VmResponse:
    if answer.status != 200:
        raise OwnJudgeError(f"{what}: {answer.status} {answer.body[:300].decode('utf-8', 'replace')}")
    return answer


# -- set-up steps -------------------------------------------------------------------------------------------------

async def _execute(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    _ok(await vm(ws, "POST", "/setup/execute", body={"command": p["command"], "shell": p.get("shell", False)}),
        "execute")


async def _launch(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    _ok(await vm(ws, "POST", "/setup/launch", body={"command": p["command"], "shell": p.get("shell", False)}),
        "launch")


async def _open(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    _ok(await vm(ws, "POST", "/setup/open_file", body={"path": p["path"]}), f"open {p['path']}")


async def _sleep(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    await asyncio.sleep(float(p.get("seconds", 1)))


async def _download(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    for f in p["files"]:
        data = (await asyncio.to_thread(files.get, f["url"])).read_bytes()
        _ok(await vm(ws, "POST", "/setup/upload", form={"file_path": f["path"]}, files={"file_data": data}),
            f"upload {f['path']}")


async def _activate_window(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    _ok(await vm(ws, "POST", "/setup/activate_window", body=p), f"activate {p.get('window_name')}")


async def _close_window(ws: Workspace, p: dict[str, Any], files: FilesCache) -> None:
    _ok(await vm(ws, "POST", "/setup/close_window", body=p), f"close {p.get('window_name')}")


Step = Callable[[Workspace, dict[str, Any], FilesCache], Awaitable[None]]
SETUP_STEPS: dict[str, Step] = {
    "execute": _execute, "command": _execute, "launch": _launch, "open": _open, "sleep": _sleep,
    "download": _download, "activate_window": _activate_window, "close_window": _close_window,
}


async def setup(ws: Workspace, steps: list[dict[str, Any]], files: FilesCache) -> None:
    for i, step in enumerate(steps):
        kind = step.get("type")
        if kind not in SETUP_STEPS:
            raise OwnJudgeError(f"config[{i}].type {kind!r}: not a step this fallback runs")
        await SETUP_STEPS[kind](ws, step.get("parameters", {}), files)


# -- getters ------------------------------------------------------------------------------------------------------

async def _in_workspace(ws: Workspace, code: str) -> str:
    """Output of ``python3 -c code`` run as the agent (what OSWorld's getters reach from outside: Chromium's
    DevTools, VLC's HTTP interface, both on the workspace's loopback)."""
    answer = _ok(await vm(ws, "POST", "/execute", body={"command": ["python3", "-c", code], "shell": False}),
                 "execute")
    out = json.loads(answer.body)
    if out.get("returncode") != 0:
        raise OwnJudgeError(f"getter: {out.get('error', '')[-300:]}")
    return str(out["output"])


async def get_vm_file(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> str | None:
    answer = await vm(ws, "POST", "/file", form={"file_path": cfg["path"]})
    if answer.status != 200:
        return None
    dest = cache / cfg["dest"]
    dest.write_bytes(answer.body)
    return str(dest)


async def get_cloud_file(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> str:
    """The file from the files cache, copied to ``<cache>/<dest>`` as OSWorld's getter downloads it (its name is
    what some metrics read the file's kind from)."""
    dest = cache / cfg["dest"]
    await asyncio.to_thread(shutil.copyfile, await asyncio.to_thread(files.get, cfg["path"]), dest)
    return str(dest)


async def get_vm_command_line(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> str | None:
    answer = await vm(ws, "POST", "/execute", body={"command": cfg["command"], "shell": cfg.get("shell", False)})
    return str(json.loads(answer.body)["output"]) if answer.status == 200 else None


async def get_rule(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> Any:
    return cfg["rules"]


_TABS = ("import json, urllib.request\n"
         "pages = json.load(urllib.request.urlopen('http://127.0.0.1:9222/json', timeout=20))\n"
         "print(json.dumps([{'title': p['title'], 'url': p['url']} for p in pages if p.get('type') == 'page']))")


async def get_open_tabs_info(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> Any:
    try:
        return json.loads(await _in_workspace(ws, _TABS))
    except OwnJudgeError:
        return []  # no browser answers: no tab is open (OSWorld's getter returns [] too)


_VLC = ("import sys, urllib.request\n"
        "r = urllib.request.Request('http://127.0.0.1:8080/requests/status.xml', "
        "headers={'Authorization': 'Basic %s'})\n"
        "sys.stdout.write(urllib.request.urlopen(r, timeout=20).read().decode('utf-8', 'replace'))")


async def get_vlc_playing_info(ws: Workspace, cfg: dict[str, Any], cache: Path, files: FilesCache) -> str | None:
    try:
        status = await _in_workspace(ws, _VLC % base64.b64encode(b":password").decode())
    except OwnJudgeError:
        return None
    dest = cache / cfg["dest"]
    dest.write_text(status)
    return str(dest)


Getter = Callable[[Workspace, dict[str, Any], Path, FilesCache], Awaitable[Any]]
GETTERS: dict[str, Getter] = {
    "vm_file": get_vm_file, "cloud_file": get_cloud_file, "vm_command_line": get_vm_command_line,
    "rule": get_rule, "open_tabs_info": get_open_tabs_info, "vlc_playing_info": get_vlc_playing_info,
}


# -- metrics ------------------------------------------------------------------------------------------------------

def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    """OSWorld's compare_table for its ``sheet_data`` rule (the first sheets' values equal), on .xlsx files."""
    if result is None or not os.path.exists(result) or expected is None:
        return 0.0
    rules = options.get("rules", [])
    if [r.get("type") for r in rules] != ["sheet_data"] or rules[0].get("sheet_idx0") not in (0, "RI0") or \
            rules[0].get("sheet_idx1") != "EI0":
        raise ValueError("compare_table: only the rule sheet_data of the first sheets runs without the extra")
    try:
        return float(read_xlsx(result) == read_xlsx(expected))
    except OfficeFileError:
        return 0.0


def compare_docx_files(file1: str | None, file2: str | None, **options: Any) -> float:
    """OSWorld's compare_docx_files with its default options (blanks collapsed; ``ignore_case`` honoured)."""
    if not file1 or not file2 or not (file1.endswith(".docx") and file2.endswith(".docx")):
        return 0.0
    try:
        texts = [re.sub(r"\s+", " ", "\n".join(read_docx(f))).strip() for f in (file1, file2)]
    except OfficeFileError:
        return 0.0
    if options.get("ignore_case"):
        texts = [t.lower() for t in texts]
    return float(texts[0] == texts[1])


def _normal_url(url: str) -> tuple[str, str, str, str]:
    if not re.match(r"^[a-zA-Z][a-zA-Z0-9+\-.]*://", url):
        url = "http://" + url
    p = urlparse(url)
    host = p.netloc.lower().removeprefix("www.")
    return p.scheme.lower(), host, p.path if p.path != "/" else "", p.query


def is_expected_tabs(open_tabs: list[dict[str, str]] | None, rule: dict[str, Any]) -> float:
    """OSWorld's is_expected_tabs (``url`` rule): the same URLs open, in any order."""
    if not open_tabs or rule.get("type") != "url":
        return 0.0
    got = [_normal_url(t["url"]) for t in open_tabs]
    want = [_normal_url(u) for u in rule["urls"]]
    return float(len(got) == len(want) and all(w in got for w in want))


def is_vlc_playing(status_path: str | None, rule: dict[str, str]) -> float:
    """OSWorld's is_vlc_playing (``file_name`` rule): VLC plays, and the file it plays has that name."""
    if status_path is None:
        return 0.0
    try:
        tree = ElementTree.fromstring(Path(status_path).read_bytes())
    except ElementTree.ParseError:
        return 0.0
    if tree.findtext("state") != "playing" or rule.get("type") != "file_name":
        return 0.0
    for key in ("filename", "title", "uri", "location", "name"):
        info = tree.find(f'information/category[@name="meta"]/info[@name="{key}"]')
        if info is not None and info.text:
            name = info.text
            return float(os.path.basename(name) == rule["file_name"] or name.endswith(rule["file_name"]))
    return 0.0


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": shared.exact_match, "check_include_exclude": shared.check_include_exclude,
    "compare_text_file": shared.compare_text_file, "check_json": shared.check_json,
    "compare_table": compare_table, "compare_docx_files": compare_docx_files,
    "is_expected_tabs": is_expected_tabs, "is_vlc_playing": is_vlc_playing,
}


async def evaluate(ws: Workspace, evaluator: dict[str, Any], last_action: str, cache: Path,
                   files: FilesCache) -> float:
    """OSWorld's ``DesktopEnv.evaluate`` over our getters and metrics (``cache``: where fetched files go)."""
    for i, step in enumerate(evaluator.get("postconfig", [])):
        kind = step.get("type")
        if kind not in SETUP_STEPS:
            raise OwnJudgeError(f"evaluator.postconfig[{i}].type {kind!r}: not a step this fallback runs")
        await SETUP_STEPS[kind](ws, step.get("parameters", {}), files)
    if evaluator["func"] == "infeasible":
        return float(last_action == "FAIL")
    if last_action == "FAIL":
        return 0.0
    funcs = evaluator["func"] if isinstance(evaluator["func"], list) else [evaluator["func"]]
    results = evaluator["result"] if isinstance(evaluator["func"], list) else [evaluator["result"]]
    expected = evaluator.get("expected")
    expecteds = (expected if isinstance(evaluator["func"], list) else [expected]) if expected else [None] * len(funcs)
    options = evaluator.get("options", {})
    optionses = options if isinstance(options, list) else [options] * len(funcs)
    conj = evaluator.get("conj", "and")
    scores = []
    for func, result_cfg, expected_cfg, opts in zip(funcs, results, expecteds, optionses, strict=True):
        result = await GETTERS[result_cfg["type"]](ws, result_cfg, cache, files)
        metric = METRICS[func]
        if expected_cfg:
            score = float(metric(result, await GETTERS[expected_cfg["type"]](ws, expected_cfg, cache, files),
                                 **(opts or {})))
        else:
            score = float(metric(result, **(opts or {})))
        if len(funcs) > 1 and conj == "and" and score == 0.0:
            return 0.0
        if len(funcs) > 1 and conj == "or" and score == 1.0:
            return 1.0
        scores.append(score)
    if len(funcs) == 1:
        return scores[0]
    return sum(scores) / len(scores) if conj == "and" else max(scores)
