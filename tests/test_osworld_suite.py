"""The osworld suite: OSWorld tasks on a real desktop, set up and judged by OSWorld's own code and by our fallback.

Fast tests: the committed tasks are the generator's, the files cache, the refusals by kind, the action language, the
office files, and our fallback metrics against OSWorld's on the same files. Real desktops: ``suite check`` on one
task of every template (every application the tasks use) with both judges agreeing (CI), on every task (the
``full`` tier: ``pytest -m full``), and OSWorld's ``DesktopEnv`` adapter playing an embedded task.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bunshin.engine.commands.suite_check import check
from bunshin.envs import Limits, WorkspaceRuntime
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.suites.errors import SuiteError
from bunshin.envs.xdesktop import osworld_judge, own_judge, support
from bunshin.envs.xdesktop import tasks as generator
from bunshin.envs.xdesktop.files_cache import FilesCache, MissingFile
from bunshin.envs.xdesktop.office import OfficeFileError, read_docx, read_xlsx, write_docx, write_xlsx
from bunshin.envs.xdesktop.suite import OSWorldSuite

from .conftest import host_processes

HAS_OSWORLD = osworld_judge.available()
needs_osworld = pytest.mark.skipif(not HAS_OSWORLD, reason="needs the osworld extra (./scripts/setup.sh --osworld)")
TEMPLATES = sorted(t.__name__ for t in generator.TEMPLATES)


# -- the task files --------------------------------------------------------------------------------------------------

def test_the_committed_tasks_are_what_the_generator_writes(tmp_path: Path) -> None:
    generator.write(tmp_path)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.json"))
    committed = sorted(p.relative_to(generator.TASKS_DIR) for p in generator.TASKS_DIR.rglob("*.json"))
    assert made == committed
    for rel in made:
        assert (tmp_path / rel).read_text() == (generator.TASKS_DIR / rel).read_text(), rel


def test_every_template_loads_and_the_tasks_use_the_shipped_applications(tmp_path: Path) -> None:
    suite = OSWorldSuite(files_cache=tmp_path / "files")
    tasks = suite.tasks()
    assert sorted({t.template for t in tasks}) == TEMPLATES and len(tasks) == 3 * len(TEMPLATES)
    apps = {app for t in tasks for app in suite.raw(t)["related_apps"]}
    assert {"libreoffice_calc", "libreoffice_writer", "gedit", "os", "chrome", "vlc"} <= apps
    assert sum(t.give_up for t in tasks) == 3
    for task in tasks:  # every reference ends the episode, in the action language the agent has
        assert task.reference and suite.is_final(task.reference[-1]), task.id
    # the embedded tasks' files are in the cache now, by URL, with the bytes the generator makes
    for url, data in generator.embedded_files().items():
        assert suite.files.path(url).read_bytes() == data


# -- the files cache -------------------------------------------------------------------------------------------------

def test_the_files_cache_is_addressed_by_url_and_checksum(tmp_path: Path) -> None:
    cache = FilesCache(tmp_path)
    url = "https://example.invalid/a.xlsx"
    with pytest.raises(MissingFile, match="https://example.invalid/a.xlsx"):
        cache.path(url)
    blob = cache.put(url, b"one")
    assert blob.name == hashlib.sha256(b"one").hexdigest() and cache.path(url).read_bytes() == b"one"
    cache.put("https://example.invalid/b.xlsx", b"one")  # the same bytes are kept once
    assert len(list((tmp_path / "blobs").iterdir())) == 1
    blob.write_bytes(b"tampered")
    with pytest.raises(MissingFile, match="does not match its checksum"):
        cache.path(url)
    with pytest.raises(MissingFile, match="not in the files cache"):  # offline: never downloads
        cache.get("https://example.invalid/other")


def test_a_fetch_that_fails_names_the_url(tmp_path: Path) -> None:
    cache = FilesCache(tmp_path, network=True)
    with pytest.raises(MissingFile, match="files.bunshin.invalid/x.*the download failed"):
        cache.get("https://files.bunshin.invalid/x")
    with pytest.raises(MissingFile, match="only http"):
        cache.fetch("file:///etc/passwd")


# -- refusals ---------------------------------------------------------------------------------------------------------

def _task(**over: Any) -> dict[str, Any]:
    task = {"id": "t", "instruction": "x", "snapshot": "os", "related_apps": ["os"], "config": [],
            "evaluator": {"func": "exact_match", "result": {"type": "vm_command_line", "command": "true"},
                          "expected": {"type": "rule", "rules": {"expected": ""}}}}
    task.update(over)
    return task


REFUSED = [
    ("app", _task(related_apps=["vs_code"]), "VS Code"),
    ("app", _task(evaluator={"func": "is_utc_0", "result": {"type": "vm_command_line", "command": "timedatectl"}}),
     "timedatectl"),
    ("windows", _task(config=[{"type": "open", "parameters": {"path": "C:\\Users\\x\\a.xlsx"}}]), "Windows"),
    ("proxy", _task(proxy=True), "proxy"),
    ("setup", _task(config=[{"type": "googledrive", "parameters": {}}]), "Google Drive"),
    ("setup", _task(config=[{"type": "teleport", "parameters": {}}]), "'teleport'"),
    ("getter", _task(evaluator={"func": "exact_match", "result": {"type": "x_getter"}}), "'x_getter'"),
    ("metric", _task(evaluator={"func": "no_such_metric", "result": {"type": "rule", "rules": {}}}),
     "'no_such_metric'"),
    ("metric", _task(evaluator={"func": "compare_image_text", "result": {"type": "rule", "rules": {}}}), "easyocr"),
    ("internet", _task(config=[{"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.x.com/"]}},
                               ]), "https://www.x.com/"),
    ("file", _task(config=[{"type": "download", "parameters": {"files": [
        {"url": "https://huggingface.co/x/y.xlsx", "path": "/home/agent/y.xlsx"}]}}]), "huggingface.co/x/y.xlsx"),
]


@pytest.mark.parametrize(("kind", "task", "named"), REFUSED, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(REFUSED)])
def test_a_task_that_cannot_run_here_is_refused_by_kind_naming_the_culprit(tmp_path: Path, kind: str,
                                                                            task: dict[str, Any], named: str) -> None:
    for osworld in ([True, False] if HAS_OSWORLD else [False]):
        why = support.refusal(task, FilesCache(tmp_path), osworld=osworld)
        assert why is not None and why[0] == kind and named in why[1], (osworld, why)
    assert support.refusal(_task(), FilesCache(tmp_path), osworld=False) is None


def test_a_file_in_the_cache_lets_the_task_run_and_localhost_is_not_the_internet(tmp_path: Path) -> None:
    cache = FilesCache(tmp_path)
    url = "https://huggingface.co/x/y.xlsx"
    task = _task(config=[{"type": "download", "parameters": {"files": [{"url": url, "path": "/home/agent/y"}]}},
                         {"type": "launch", "parameters": {"command": ["google-chrome", "http://localhost:8080/"]}}])
    assert support.refusal(task, cache, osworld=False) == ("file", f"needs {url}, which is not in the files cache")
    cache.put(url, b"sheet")
    assert support.refusal(task, cache, osworld=False) is None


def test_a_users_directory_loads_what_runs_and_refuses_the_rest_per_file(tmp_path: Path) -> None:
    tasks_dir = tmp_path / "examples"
    (tasks_dir / "os").mkdir(parents=True)
    (tasks_dir / "vs_code").mkdir()
    (tasks_dir / "os" / "ok.json").write_text(json.dumps(_task(id="ok")))
    (tasks_dir / "vs_code" / "code.json").write_text(json.dumps(_task(id="code", related_apps=["vs_code"])))
    (tasks_dir / "os" / "broken.json").write_text("{not json")
    suite = OSWorldSuite(tasks_dir=tasks_dir, lenient=True, files_cache=tmp_path / "files")
    assert [t.id for t in suite.tasks()] == ["ok"]
    reasons = {Path(r.file).name: r.reason for r in suite.refused()}
    assert reasons.keys() == {"code.json", "broken.json"}
    assert reasons["code.json"].startswith("app: needs VS Code")
    assert reasons["broken.json"].startswith("format: not a JSON task file")


def test_judge_osworld_without_the_extra_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(osworld_judge, "available", lambda: False)
    with pytest.raises(SuiteError, match="needs the osworld extra"):
        OSWorldSuite(judge="osworld", files_cache=tmp_path)
    assert OSWorldSuite(files_cache=tmp_path).judge == "own"
    with pytest.raises(SuiteError, match="one of auto, osworld, own"):
        OSWorldSuite(judge="mine", files_cache=tmp_path)
    with pytest.raises(ValueError, match=r"observe \['video'\]"):
        OSWorldSuite(observe="screenshot,video", files_cache=tmp_path)
    assert OSWorldSuite(observe="screenshot", files_cache=tmp_path).spec.kwargs["observe"] == ["screenshot"]


# -- the action language ----------------------------------------------------------------------------------------------

def test_actions_are_osworlds_pyautogui_space(tmp_path: Path) -> None:
    suite = OSWorldSuite(files_cache=tmp_path)
    assert suite.parse_action("pyautogui.click(10, 20)") == ToolCall(name="pyautogui",
                                                                     args={"code": "pyautogui.click(10, 20)"})
    assert suite.parse_action(" done ") == ToolCall(name="DONE")
    assert suite.parse_action("FAIL") == ToolCall(name="FAIL") == suite.null_action()
    assert suite.parse_action("WAIT: 2.5") == ToolCall(name="WAIT", args={"seconds": 2.5})
    assert suite.parse_action('{"name": "WAIT", "args": {"seconds": 1}}').name == "WAIT"
    assert suite.is_final(ToolCall(name="DONE")) and not suite.is_final(ToolCall(name="WAIT"))
    for bad, said in (("", "empty action"), ("WAIT: soon", "number of seconds"), ("WAIT: 999", "seconds"),
                      ('{"name": "vm", "args": {}}', "vm"), ('{"name": 3}', "JSON action")):
        with pytest.raises(ActionError, match=said):
            suite.parse_action(bad)


# -- office files and the fallback metrics ----------------------------------------------------------------------------

def test_office_files_round_trip_and_a_hostile_zip_is_refused(tmp_path: Path) -> None:
    rows = [["item", "units"], ["pens", 12], ["tape", 3.5], ["<&>", None, "far"]]
    (tmp_path / "a.xlsx").write_bytes(write_xlsx(rows))
    assert read_xlsx(str(tmp_path / "a.xlsx")) == rows
    (tmp_path / "a.docx").write_bytes(write_docx(["Title", "", "a & b"]))
    assert read_docx(str(tmp_path / "a.docx")) == ["Title", "", "a & b"]
    (tmp_path / "bad.xlsx").write_bytes(b"PK not really")
    with pytest.raises(OfficeFileError, match="not a zip"):
        read_xlsx(str(tmp_path / "bad.xlsx"))
    assert own_judge.compare_table(str(tmp_path / "bad.xlsx"), str(tmp_path / "a.xlsx"),
                                   rules=[{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]) == 0.0


VLC_STATUS = ('<?xml version="1.0" encoding="utf-8" standalone="yes" ?><root><state>{state}</state><information>'
              '<category name="meta"><info name="filename">{name}</info></category></information></root>')


def _metric_cases(tmp: Path) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    def put(name: str, data: bytes) -> str:
        (tmp / name).write_bytes(data)
        return str(tmp / name)

    sheet = [["item", "units"], ["pens", 12], ["tape", 30]]
    rules = {"rules": [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]}
    want_xlsx = put("want.xlsx", write_xlsx([*sheet, ["Total", 42]]))
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("compare_table", (put("same.xlsx", write_xlsx([*sheet, ["Total", 42]])), want_xlsx), rules),
        ("compare_table", (put("wrong.xlsx", write_xlsx([*sheet, ["Total", 41]])), want_xlsx), rules),
        ("compare_table", (put("short.xlsx", write_xlsx(sheet)), want_xlsx), rules),
        ("compare_table", (None, want_xlsx), rules),
    ]
    want_docx = put("want.docx", write_docx(["Memo", "Dear team,", "", "Bye"]))
    for name, paragraphs in (("same", ["Memo", "Dear team,", "", "Bye"]), ("blanks", ["Memo", "Dear  team,", "Bye"]),
                             ("other", ["Dear team,", "", "Bye"]), ("case", ["MEMO", "Dear team,", "", "Bye"])):
        cases.append(("compare_docx_files", (put(f"{name}.docx", write_docx(paragraphs)), want_docx), {}))
    cases.append(("compare_docx_files", (str(tmp / "case.docx"), want_docx), {"ignore_case": True}))
    for name, state, file in (("on", "playing", "clip.mp4"), ("paused", "paused", "clip.mp4"),
                              ("other", "playing", "movie.mp4")):
        path = put(f"{name}.xml", VLC_STATUS.format(state=state, name=file).encode())
        cases.append(("is_vlc_playing", (path, {"type": "file_name", "file_name": "clip.mp4"}), {}))
    url = "file:///home/agent/Documents/site/report.html"
    for tabs in ([{"title": "R", "url": url}], [{"title": "N", "url": "chrome://newtab/"}],
                 [{"title": "R", "url": url}, {"title": "N", "url": "chrome://newtab/"}], []):
        cases.append(("is_expected_tabs", (tabs, {"type": "url", "urls": [url]}), {}))
    return cases


@needs_osworld
def test_our_fallback_metrics_agree_with_osworlds_own(tmp_path: Path) -> None:
    from desktop_env.evaluators import metrics

    scores = []
    for name, args, options in _metric_cases(tmp_path):
        ours, theirs = own_judge.METRICS[name](*args, **options), getattr(metrics, name)(*args, **options)
        assert float(ours) == float(theirs), (name, args, options, ours, theirs)
        scores.append(float(ours))
    assert 0.0 in scores and 1.0 in scores  # the cases are not all of one verdict


# -- real desktops -----------------------------------------------------------------------------------------------------

def _representative(tmp_path: Path) -> Path:
    """One task of every template (every application the tasks use), as a directory of their own."""
    chosen = tmp_path / "tasks"
    for template in TEMPLATES:
        first = sorted((generator.TASKS_DIR / template).glob("*.json"))[0]
        (chosen / template).mkdir(parents=True)
        shutil.copy(first, chosen / template / first.name)
    return chosen


def _fill(files: Path) -> None:
    for url, data in generator.embedded_files().items():  # the suite fills the cache for its own directory only
        FilesCache(files).put(url, data)


async def _check(tmp_path: Path, tasks_dir: Path, judge: str = "auto") -> dict[str, Any]:
    files = tmp_path / "files"
    await asyncio.to_thread(_fill, files)
    suite = OSWorldSuite(tasks_dir=tasks_dir, files_cache=files, observe=["screenshot"], judge=judge)
    async with WorkspaceRuntime(state_dir=tmp_path / "state",
                                limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150)) as rt:
        report = await check(suite, runtime=rt, concurrency=2, log=open("/dev/null", "w"))  # noqa: SIM115
        assert rt.workspaces == {}
    assert host_processes() == []
    return report


@pytest.mark.slow
@pytest.mark.asyncio
async def test_suite_check_on_one_task_of_every_template_with_the_judges_agreeing(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """OSWorld's metrics (with the extra) and our fallback both score every reference 1 and every null attempt 0
    (1 on the infeasible task); ``suite check`` fails a task whose judges disagree. On uvloop, the engine's loop."""
    if "uvloop" not in request.node.name:
        pytest.skip("one pass is enough: on the engine's loop, uvloop")
    report = await _check(tmp_path, _representative(tmp_path))
    assert report["failures"] == [], report["failures"]
    assert report["oracle_pass"] == report["tasks"] == len(TEMPLATES)
    assert report["null_pass"] == 1 == len(report["null_pass_expected"])


@pytest.mark.slow
@pytest.mark.asyncio
async def test_without_the_extra_our_fallback_sets_up_and_judges_one_task_of_every_template(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``judge="own"`` (what a machine without the osworld extra gets): the set-up steps run through the
    workspace's ``vm`` tool and our getters and metrics score every reference 1 and every null attempt 0."""
    if "uvloop" in request.node.name:
        pytest.skip("one pass is enough")
    report = await _check(tmp_path, _representative(tmp_path), judge="own")
    assert report["failures"] == [], report["failures"]
    assert report["oracle_pass"] == report["tasks"] == len(TEMPLATES) and report["null_pass"] == 1


@pytest.mark.full
@pytest.mark.asyncio
async def test_suite_check_on_every_embedded_task(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "uvloop" in request.node.name:
        pytest.skip("one pass is enough")
    report = await _check(tmp_path, generator.TASKS_DIR)
    assert report["failures"] == [], report["failures"]
    assert report["oracle_pass"] == report["tasks"] == 3 * len(TEMPLATES)
    assert report["null_pass"] == 3


@needs_osworld
@pytest.mark.slow
def test_osworlds_desktop_env_plays_an_embedded_task(tmp_path: Path) -> None:
    """The adapter's ``DesktopEnv``: reset runs the task's config (a download from the files cache), step runs its
    reference actions, evaluate scores 1 with OSWorld's metric; FAIL then scores 0."""
    from bunshin.engine.adapters.osworld_env import desktop_env

    files = FilesCache(tmp_path / "files")
    for url, data in generator.embedded_files().items():
        files.put(url, data)
    path = sorted((generator.TASKS_DIR / "gedit_edit").glob("*.json"))[0]
    task = json.loads(path.read_text())
    env = desktop_env(state_dir=tmp_path / "state", cache_dir=str(tmp_path / "cache"), files=files,
                      action_space="pyautogui", require_a11y_tree=False)
    try:
        env.reset(task_config=task)
        assert env.evaluate() == 0.0
        for call in task["bunshin_reference"][:-1]:
            obs, reward, done, info = env.step(call["args"]["code"], pause=0.5)
            assert not done
        env.step("DONE")
        assert env.evaluate() == 1.0
        env.step("FAIL")
        assert env.evaluate() == 0.0
    finally:
        env.close()
        env.provider.close_runtime()
    assert host_processes() == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_the_engine_runs_groups_on_set_up_desktops(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``RolloutEngine`` on the osworld suite: every sample takes a desktop of its own from its group's set-up pool
    (more set-ups waiting on OSWorld's code than the loop's default threads once deadlocked the run), plays the
    reference and scores 1; nothing is left."""
    from bunshin.engine.records import Status
    from bunshin.engine.rollout import RolloutEngine
    from bunshin.policies.scripted import ScriptedPolicy

    if "uvloop" not in request.node.name:
        pytest.skip("one pass is enough: on the engine's loop, uvloop")
    suite = OSWorldSuite(files_cache=tmp_path / "files", observe=["screenshot"])
    tasks = await asyncio.to_thread(suite.tasks)  # (fills the files cache: off the loop)
    chosen = [t.id for t in tasks if t.template in ("gedit_edit", "json_settings", "terminal_files")][::3]
    policy = ScriptedPolicy(detour_p=0.0, fail_p=0.0, time_scale=0)
    async with RolloutEngine(suite, policy, concurrency=6, state_dir=tmp_path / "state", call_timeout_s=150,
                             limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150)) as engine:
        results = await engine.run(engine.requests(chosen, group_size=2, seed=3))
        runtime = engine.runtime
    trajectories = [r.trajectory for r in results]
    assert len(trajectories) == 6
    assert all(t.status is Status.OK and t.reward == 1.0 for t in trajectories), [
        (t.task_id, t.status, t.error) for t in trajectories]
    assert len({t.lineage[1] for t in trajectories}) == 6
    assert all(t.lineage[0] == f"setup-pool:{t.task_id}" for t in trajectories)
    assert runtime.workspaces == {}
    assert host_processes() == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_users_directory_is_checked_by_set_up_and_evaluation(tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    """Files without a reference solution (OSWorld's own examples): the refused ones are listed with their reason;
    each one that loads runs its set-up, its null attempt, and a done-at-once attempt that runs its evaluation."""
    if "uvloop" not in request.node.name:
        pytest.skip("one pass is enough")
    user = tmp_path / "examples"
    (user / "os").mkdir(parents=True)
    echo = _task(id="echo", config=[{"type": "execute", "parameters": {"command": "echo hi > ~/hi.txt",
                                                                        "shell": True}}],
                 evaluator={"func": "exact_match",
                            "result": {"type": "vm_command_line", "command": "cat ~/hi.txt", "shell": True},
                            "expected": {"type": "rule", "rules": {"expected": "hi\n"}}})
    (user / "os" / "echo.json").write_text(json.dumps(echo))
    (user / "os" / "no.json").write_text(json.dumps(_task(id="no", evaluator={"func": "infeasible"})))
    (user / "os" / "code.json").write_text(json.dumps(_task(id="code", related_apps=["vs_code"])))
    suite = OSWorldSuite(tasks_dir=user, lenient=True, files_cache=tmp_path / "files", observe=["screenshot"])
    async with WorkspaceRuntime(state_dir=tmp_path / "state",
                                limits=Limits(memory_bytes=4 << 30, pids=1024, command_timeout_s=150)) as rt:
        report = await check(suite, runtime=rt, concurrency=2, log=open("/dev/null", "w"))  # noqa: SIM115
    assert report["failures"] == [] and report["tasks"] == report["no_reference"] == 2
    assert report["evaluated"] == 2 and report["null_pass"] == 1 == len(report["null_pass_expected"])
    assert [Path(r["file"]).name for r in report["refused"]] == ["code.json"]
    assert host_processes() == []
