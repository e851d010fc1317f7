"""Task files as a user brings them (``bunshin eval --task-dir DIR``): a directory mixing files the suite runs, real
OSWorld / WebArena files without a reference solution, and files it cannot run; the runnable ones run, every other
one is named with its reason, in ``summary.json`` and on stdout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bunshin.engine.commands.eval_command import runnable
from bunshin.engine.records import Step, StepObservation, Trajectory, write_jsonl
from bunshin.envs.desktop.suite import TASKS_DIR, DesktopSuite
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import Refusal
from bunshin.envs.suites.webarena import TaskFileError
from bunshin.envs.webshop import tasks as shop_tasks
from bunshin.envs.webshop.suite import WebShopSuite
from bunshin.policies.replay import ReplayPolicy
from bunshin.policies.scripted import ScriptedPolicy

from .conftest import host_processes

SMALL = {"cache_mb": 8, "recording_frames": 2}
REAL_ID = "0c1e0c5e-4e9f-4f4a-8a51-2d0b8c6b9a01"
# A real OSWorld file (os domain, shaped as the benchmark writes it): no bunshin_* keys, so no reference solution;
# everything in it is something the desktop runs (a shell setup step, OSWorld's focus click, exact_match on a
# command's output).
REAL_OSWORLD = {
    "id": REAL_ID,
    "snapshot": "os",
    "instruction": "Can you move the file 'todo.txt' on the Desktop to the directory 'done/' on the Desktop?",
    "source": "https://github.com/xlang-ai/OSWorld",
    "config": [{"type": "execute", "parameters": {"command": "mkdir -p ~/Desktop/done && touch ~/Desktop/todo.txt",
                                                  "shell": True}},
               {"type": "execute", "parameters": {"command": [
                   "python", "-c", "import pyautogui; import time; pyautogui.click(960, 540); time.sleep(0.5);"]}}],
    "trajectory": "trajectories/",
    "related_apps": ["os"],
    "evaluator": {"func": "exact_match",
                  "result": {"type": "vm_command_line", "shell": True, "command":
                             "if [ -f ~/Desktop/done/todo.txt ]; then echo 'File exists.'; "
                             "else echo 'File does not exist.'; fi"},
                  "expected": {"type": "rule", "rules": {"expected": "File exists.\n"}}},
}
SOLUTION = [ToolCall(name="terminal", args={"command": "mv ~/Desktop/todo.txt ~/Desktop/done/"})]


def committed(template: str) -> Path:
    return sorted((TASKS_DIR / template).glob("*.json"))[0]


def copy_into(src: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(src, directory))


def write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2))
    return path


def mixed_desktop_dir(root: Path) -> tuple[dict[str, Path], dict[str, tuple[Path, str]]]:
    """OSWorld's layout (``evaluation_examples/examples/<domain>/<id>.json``): the files the desktop runs, by id,
    and the files it refuses, each with a piece of the reason it must give."""
    examples = root / "evaluation_examples" / "examples"
    runs: dict[str, Path] = {}
    for template in ("text_edit", "json_config", "infeasible"):
        src = committed(template)
        runs[src.stem] = copy_into(src, examples / template)
    runs[REAL_ID] = write(examples / "os" / f"{REAL_ID}.json", REAL_OSWORLD)

    docx = json.loads(committed("json_config").read_text())
    docx.update(id="6ada715d-3aae-4a32-a6a7-429b2e43fb93", evaluator={
        "func": "compare_docx_files", "result": {"type": "vm_file", "path": "/home/user/a.docx", "dest": "a.docx"},
        "expected": {"type": "cloud_file", "path": "https://example.com/a.docx", "dest": "b.docx"}})
    chrome = dict(REAL_OSWORLD, id="bb5e4c0d-f964-439c-97b6-bdb9747de3f4", config=[
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://www.example.com"]}}])
    text_edit = runs[committed("text_edit").stem]
    refused = {
        "metric": (write(examples / "libreoffice_writer" / f"{docx['id']}.json", docx), "compare_docx_files"),
        "setup": (write(examples / "chrome" / f"{chrome['id']}.json", chrome),
                  "config[0].type 'chrome_open_tabs' is not supported"),
        "not json": (write(examples / "os" / "broken.json", '{"id": "x", "instruction": '), "not JSON"),
        "not a task": (write(root / "evaluation_examples" / "test_all.json", {"os": [REAL_ID]}),
                       "missing required field `id`"),
        "duplicate": (copy_into(text_edit, examples / "vs_code"), f"already taken by {text_edit}"),
    }
    (examples / "README.md").write_text("not a task file, and not *.json: not looked at\n")
    return runs, refused


def bunshin(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "BUNSHIN_STATE_DIR": "/var/lib/bunshin-test"}
    return subprocess.run([sys.executable, "-m", "bunshin.engine.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def small_eval(task_dir: Path, out: Path, policy: str = "scripted") -> subprocess.CompletedProcess[str]:
    return bunshin("eval", "--suite", "desktop", "--task-dir", str(task_dir), "--policy", policy,
                   "--group-size", "2", "--concurrency", "4", "--time-scale", "0", "--max-steps", "12",
                   *[a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")], "--out", str(out))


# -- loading ---------------------------------------------------------------------------------------------------------


def test_a_mixed_directory_loads_what_runs_and_names_the_rest(tmp_path: Path) -> None:
    runs, refused = mixed_desktop_dir(tmp_path)
    suite = DesktopSuite(tasks_dir=tmp_path, lenient=True, **SMALL)
    tasks = suite.tasks()
    assert sorted(t.id for t in tasks) == sorted(runs)
    assert {t.id: t.path for t in tasks} == {i: str(p) for i, p in runs.items()}
    real = next(t for t in tasks if t.id == REAL_ID)
    assert real.reference == [] and real.template == "os" and not real.give_up
    got = {r.file: r.reason for r in suite.refused()}
    assert sorted(got) == sorted(str(path) for path, _ in refused.values())
    for what, (path, reason) in refused.items():
        assert reason in got[str(path)], (what, got[str(path)])
        assert what == "duplicate" or str(path) not in got[str(path)]  # the file is named once, beside the reason
    with pytest.raises(TaskFileError):  # without lenient, the first file refused stops the loading, as before
        DesktopSuite(tasks_dir=tmp_path / "evaluation_examples" / "examples", **SMALL).tasks()
    assert len(DesktopSuite(**SMALL).tasks()) >= 60 and DesktopSuite(**SMALL).refused() == []


def test_a_missing_directory_and_odd_files_are_refused_not_crashes(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="not a directory"):
        DesktopSuite(tasks_dir=tmp_path / "nowhere", lenient=True, **SMALL).tasks()
    write(tmp_path / "a" / "list.json", [1, 2])
    write(tmp_path / "a" / "deep.json", json.dumps(REAL_OSWORLD)[:-1] + ', "extra": ' + "[" * 3000 + "]" * 3000 + "}")
    write(tmp_path / "a" / "private.json", dict(REAL_OSWORLD, id="p", bunshin_private_files=["x"]))
    (tmp_path / "a" / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "a" / "dir.json").mkdir()
    suite = DesktopSuite(tasks_dir=tmp_path, lenient=True, **SMALL)
    assert suite.tasks() == []
    reasons = {Path(r.file).name: r.reason for r in suite.refused()}
    assert sorted(reasons) == ["binary.json", "deep.json", "dir.json", "list.json", "private.json"]
    assert "Expected `object`, got `array`" in reasons["list.json"]
    assert "bunshin_private_files" in reasons["private.json"] and "cannot read" in reasons["dir.json"]
    assert reasons["binary.json"].startswith("not JSON") and "nested deeper" in reasons["deep.json"]


def test_a_real_webarena_file_loads_without_a_reference_and_an_unsupported_one_is_refused(tmp_path: Path) -> None:
    config_files = tmp_path / "config_files"
    real = json.loads((shop_tasks.COMMITTED / "0.json").read_text())
    del real["bunshin_reference"], real["bunshin_template"]
    real["task_id"] = 21
    write(config_files / "21.json", real)
    write(config_files / "3.json", json.loads((shop_tasks.COMMITTED / "3.json").read_text()))
    gitlab = dict(real, task_id=44, sites=["gitlab"], start_url="__GITLAB__")
    write(config_files / "44.json", gitlab)
    write(config_files / "test.raw.json", [real, gitlab])  # WebArena's file of every task: not one task
    write(config_files / "dup" / "21.json", real)
    suite = WebShopSuite(tasks_dir=tmp_path, lenient=True)
    tasks = suite.tasks()
    assert [t.id for t in tasks] == ["3", "21"]  # natural order: 3.json before 21.json
    assert tasks[1].reference == [] and tasks[1].template == "template_1" and tasks[0].reference
    reasons = {str(Path(r.file).relative_to(config_files)): r.reason for r in suite.refused()}
    assert "sites ['gitlab'] are not in the embedded suite" in reasons["44.json"]
    assert "Expected `object`, got `array`" in reasons["test.raw.json"]
    assert "task id '21' is already taken by" in reasons["dup/21.json"]
    assert ScriptedPolicy().refuses(tasks[1]) is not None and ScriptedPolicy().refuses(tasks[0]) is None
    with pytest.raises(TaskFileError, match="bunshin_reference is required"):  # strict, as before
        WebShopSuite(tasks_dir=config_files).tasks()
    with pytest.raises(ValueError, match="give tasks_dir"):
        WebShopSuite(lenient=True)


# -- policies --------------------------------------------------------------------------------------------------------


def recording(task_id: str, samples: int, seed: int = 0) -> list[Trajectory]:
    steps = [Step(index=i, call=c, observation=StepObservation(), reasoning_s=0.0, tool_s=0.0)
             for i, c in enumerate(SOLUTION)]
    return [Trajectory(task_id=task_id, suite="desktop", group_id=f"{seed}:{task_id}", sample=s, seed=0,
                       steps=steps, final=ToolCall(name="DONE")) for s in range(samples)]


def test_policies_refuse_by_name_what_they_cannot_play(tmp_path: Path) -> None:
    runs, _ = mixed_desktop_dir(tmp_path)
    suite = DesktopSuite(tasks_dir=tmp_path, lenient=True, **SMALL)
    tasks = {t.id: t for t in suite.tasks()}
    reason = ScriptedPolicy().refuses(tasks[REAL_ID])
    assert reason is not None and reason.startswith("scripted policy: task ") and REAL_ID in reason
    assert "no reference solution" in reason and "--policy grounded, replay:PATH or openai:URL" in reason
    assert all(ScriptedPolicy().refuses(t) is None for i, t in tasks.items() if i != REAL_ID)
    write_jsonl(tmp_path / "rec.jsonl", recording(REAL_ID, 2))
    replay = ReplayPolicy.from_file(tmp_path / "rec.jsonl")
    assert replay.refuses(tasks[REAL_ID]) is None
    other = next(i for i in tasks if i != REAL_ID)
    assert replay.refuses(tasks[other]) == f"replay policy: {tmp_path / 'rec.jsonl'} has no recorded trajectory " \
                                           f"of task {other}"

    # the eval command's decision: the suite's refusals first, then the policy's, each with the task's file
    suite_refused = [Refusal(file="x.json", reason="not JSON: ...")]
    run, refused = runnable(tasks, None, ScriptedPolicy(), suite_refused)
    assert run == [i for i in tasks if i != REAL_ID]
    assert refused == [*suite_refused, Refusal(file=str(runs[REAL_ID]), reason=reason)]
    run, refused = runnable(tasks, [REAL_ID, other], replay, [])
    assert run == [REAL_ID] and [r.file for r in refused] == [str(runs[other])]


# -- bunshin eval --task-dir -----------------------------------------------------------------------------------------


def test_eval_runs_the_runnable_files_and_names_every_refused_one(tmp_path: Path) -> None:
    runs, refused = mixed_desktop_dir(tmp_path)
    out = tmp_path / "run"
    proc = small_eval(tmp_path / "evaluation_examples", out)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    ran = {i for i in runs if i != REAL_ID}  # the files with a reference solution
    lines = [msgspec.json.decode(line, type=Trajectory) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert {t.task_id for t in lines} == ran and len(lines) == 2 * len(ran) == summary["rollouts"]
    assert all(t.status in ("ok", "max_steps") for t in lines), [(t.task_id, t.status, t.error) for t in lines]

    got = {r["file"]: r["reason"] for r in summary["refused"]}
    assert len(summary["refused"]) == len(refused) + 1
    for what, (path, reason) in refused.items():
        assert reason in got[str(path)], what
    assert got[str(runs[REAL_ID])].startswith(f"scripted policy: task {REAL_ID} has no reference solution")

    table_end = proc.stdout.index(f"refused {len(refused) + 1} task files:\n")
    assert "| tasks | rollouts |" in proc.stdout[:table_end]  # the block comes after the table
    block = proc.stdout[table_end:].splitlines()
    for file, reason in got.items():
        assert f"  {file}: {reason}" in block
    assert host_processes() == []


def test_eval_with_a_recording_runs_the_file_without_a_reference(tmp_path: Path) -> None:
    """A non-scripted policy plays the real OSWorld file: a recording of its solution replays to reward 1."""
    examples = tmp_path / "examples"
    write(examples / "os" / f"{REAL_ID}.json", REAL_OSWORLD)
    other = copy_into(committed("infeasible"), examples / "infeasible")
    write_jsonl(tmp_path / "rec.jsonl", recording(REAL_ID, 2))
    out = tmp_path / "run"
    proc = small_eval(examples, out, policy=f"replay:{tmp_path / 'rec.jsonl'}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    lines = [msgspec.json.decode(line, type=Trajectory) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [(t.task_id, t.status, t.reward) for t in lines] == [(REAL_ID, "ok", 1.0)] * 2, [t.error for t in lines]
    assert [r["file"] for r in summary["refused"]] == [str(other)]
    assert "replay policy" in summary["refused"][0]["reason"] and "no recorded trajectory" in proc.stdout
    assert host_processes() == []


def test_eval_with_nothing_left_to_run_exits_non_zero_and_says_why(tmp_path: Path) -> None:
    write(tmp_path / "os" / f"{REAL_ID}.json", REAL_OSWORLD)
    write(tmp_path / "os" / "broken.json", "{")
    out = tmp_path / "run"
    proc = small_eval(tmp_path, out)
    assert proc.returncode == 1
    assert "nothing to run: 2 task file(s) refused" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 0 and len(summary["refused"]) == 2
    assert "refused 2 task files:" in proc.stdout and "scripted policy" in proc.stdout
    proc = bunshin("eval", "--suite", "desktop", "--task-dir", str(tmp_path), "--tasks", str(tmp_path / "x"),
                   "--out", str(out))
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    proc = bunshin("eval", "--suite", "desktop", "--task-dir", str(tmp_path / "nowhere"), "--out", str(out))
    assert proc.returncode == 1 and "not a directory" in proc.stderr
    assert host_processes() == []


def test_the_grounded_policy_plays_the_file_without_a_reference(tmp_path: Path) -> None:
    """The grounded policy reads the instruction and the screen, never a reference: it does not refuse the real
    OSWorld file and plays it (whatever it scores)."""
    from bunshin.policies.registry import make_policy

    try:
        grounded = make_policy("grounded", 0.0)
    except ValueError:
        pytest.skip("the grounded policy is not registered yet")
    write(tmp_path / "os" / f"{REAL_ID}.json", REAL_OSWORLD)
    [task] = DesktopSuite(tasks_dir=tmp_path, lenient=True, **SMALL).tasks()
    assert grounded.refuses(task) is None
    out = tmp_path / "run"
    proc = small_eval(tmp_path, out, policy="grounded")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    lines = [msgspec.json.decode(line, type=Trajectory) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert summary["refused"] == [] and [t.task_id for t in lines] == [REAL_ID] * 2
    assert all(t.steps or t.final for t in lines), [t.error for t in lines]
    assert host_processes() == []
