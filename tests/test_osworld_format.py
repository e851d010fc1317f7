"""OSWorld task files and metrics (the getters live with the desktop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bunshin.envs.suites import osworld as ow
from bunshin.envs.suites.webarena import TaskFileError

TASK = {  # real-shaped: fields we do not use are present
    "id": "6f56bf42-85b8-4fbb-8e06-6c44960184ba",
    "snapshot": "terminal", "source": "author", "trajectory": "trajectories/", "related_apps": ["terminal"],
    "instruction": "Copy config.json to backup/ and set \"debug\" to false in the copy.",
    "config": [{"type": "execute", "parameters": {"command": ["mkdir", "-p", "/home/user/backup"]}},
               {"type": "sleep", "parameters": {"seconds": 0.1}}],
    "evaluator": {"func": "check_json",
                  "result": {"type": "vm_file", "path": "/home/user/backup/config.json", "dest": "config.json"},
                  "expected": {"type": "rule", "rules": {"expect": [{"key": ["debug"], "method": "eq", "ref": False}]}}},
}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / f"{data.get('id', 'x')}.json"
    path.write_text(json.dumps(data))
    return path


def test_real_shaped_file_loads(tmp_path: Path) -> None:
    task = ow.load_task(write(tmp_path, TASK))
    assert task.evaluator.funcs == ["check_json"] and task.config[0].type == "execute"
    assert not task.infeasible


def assert_refused(tmp_path: Path, mutate, message: str) -> None:
    """The task file ``mutate`` makes from TASK is refused with a TaskFileError naming the file and ``message``."""
    data = json.loads(json.dumps(TASK))
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(TaskFileError) as info:
        ow.load_task(path)
    assert message in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("instruction"), "missing required field `instruction`"),
    (lambda d: d["config"].append({"type": "download", "parameters": {"files": []}}),
     "config[2] downloads from the internet"),
    (lambda d: d["config"].append({"type": "chrome_open_tabs"}), "config[2].type 'chrome_open_tabs' is not supported"),
    (lambda d: d["config"].append({"type": "launch", "parameters": {"command": ["google-chrome", "--x"]}}),
     "config[2].parameters.command launches 'google-chrome'"),
    (lambda d: d["config"].append({"type": "execute", "parameters": {}}),
     "config[2].parameters.command must be a non-empty string or list of strings"),
    (lambda d: d["config"].append({"type": "open", "parameters": {"file": "x"}}), "config[2].parameters.path"),
    (lambda d: d["evaluator"].__setitem__("postconfig", [{"type": "launch", "parameters": {"command": "vlc x"}}]),
     "evaluator.postconfig[0].parameters.command launches 'vlc'"),
    (lambda d: d["config"].append({"type": "execute", "parameters": {
        "command": "echo 'password' | sudo -S mkdir ~/Desktop/done", "shell": True}}),
     "config[2].parameters.command needs 'sudo'"),
    (lambda d: d["config"].append({"type": "execute", "parameters": {
        "command": ["python", "-c", "import pyautogui; pyautogui.hotkey('ctrl', 's')"]}}),
     "config[2].parameters.command needs 'pyautogui'"),
    (lambda d: d["evaluator"].__setitem__("result", {"type": "vm_command_line",
                                                     "command": "gsettings get org.gnome.desktop.interface gtk-theme"}),
     "evaluator.result[0].command needs 'gsettings'"),
    (lambda d: d["evaluator"].__setitem__("func", "compare_pptx_files"), "evaluator.func ['compare_pptx_files']"),
    (lambda d: d["evaluator"]["result"].__setitem__("type", "vlc_playing_info"),
     "evaluator.result[0].type 'vlc_playing_info' is not supported"),
    (lambda d: d["evaluator"].__setitem__("conj", "xor"), "evaluator.conj 'xor'"),
])
def test_unsupported_files_are_refused_naming_the_field(tmp_path: Path, mutate, message: str) -> None:
    assert_refused(tmp_path, mutate, message)


def test_supported_launch_and_open_steps_load(tmp_path: Path) -> None:
    data = json.loads(json.dumps(TASK))
    data["config"] += [{"type": "launch", "parameters": {"command": ["/usr/bin/gedit", "/home/user/a.txt"]}},
                       {"type": "launch", "parameters": {"command": "libreoffice --calc /home/user/b.csv"}},
                       {"type": "open", "parameters": {"path": "/home/user/b.csv"}}]
    assert [s.type for s in ow.load_task(write(tmp_path, data)).config][-3:] == ["launch", "launch", "open"]


def test_osworlds_focus_click_is_accepted_as_a_no_op(tmp_path: Path) -> None:
    click = ["python", "-c", "import pyautogui; import time; pyautogui.click(960, 540); time.sleep(0.5);"]
    data = json.loads(json.dumps(TASK))
    data["config"].append({"type": "execute", "parameters": {"command": click}})
    assert ow.load_task(write(tmp_path, data)).config[-1].parameters["command"] == click
    assert ow.gui_noop(click) and not ow.gui_noop(["python", "-c", "import os; os.remove('x')"])
    assert ow.missing_program("cat /etc/apt/sources.list ~/sudoers") is None


def test_infeasible_task(tmp_path: Path) -> None:
    data = dict(TASK, evaluator={"func": "infeasible"})
    assert ow.load_task(write(tmp_path, data)).infeasible
    assert ow.score_infeasible("FAIL") == 1.0 and ow.score_infeasible("DONE") == 0.0


def test_metrics_pass_and_fail(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text('{"debug": false, "tags": ["x", "y"]}')
    rules_ok = {"expect": [{"key": ["debug"], "method": "eq", "ref": False},
                           {"key": ["tags", 1], "method": "eq", "ref": "y"}]}
    assert ow.check_json(str(tmp_path / "a.json"), rules_ok) == 1.0
    assert ow.check_json(str(tmp_path / "a.json"), {"expect": [{"key": ["debug"], "method": "eq", "ref": True}]}) == 0.0
    assert ow.check_json(str(tmp_path / "missing.json"), rules_ok) == 0.0
    assert ow.check_include_exclude("3 passed", {"include": ["passed"], "exclude": ["failed"]}) == 1.0
    assert ow.check_include_exclude("1 failed, 2 passed", {"include": ["passed"], "exclude": ["failed"]}) == 0.0
    assert ow.exact_match("42", {"expected": "42"}) == 1.0 and ow.exact_match("41", {"expected": "42"}) == 0.0
    (tmp_path / "x.txt").write_text("Hello  World\n")
    (tmp_path / "y.txt").write_text("hello world")
    assert ow.compare_text_file(str(tmp_path / "x.txt"), str(tmp_path / "y.txt")) == 0.0
    assert ow.compare_text_file(str(tmp_path / "x.txt"), str(tmp_path / "y.txt"), ignore_blanks=True,
                                ignore_case=True) == 1.0
    (tmp_path / "p.csv").write_text("a,b\n1, 2\n")
    (tmp_path / "q.csv").write_text("a,b\n1,2\n")
    (tmp_path / "r.csv").write_text("a,b\n1,3\n")
    assert ow.compare_csv(str(tmp_path / "q.csv"), str(tmp_path / "q.csv")) == 1.0
    assert ow.compare_csv(str(tmp_path / "p.csv"), str(tmp_path / "q.csv")) == 0.0  # lines, exactly (OSWorld)
    assert ow.compare_table(str(tmp_path / "p.csv"), str(tmp_path / "q.csv")) == 1.0  # the data
    assert ow.compare_table(str(tmp_path / "p.csv"), str(tmp_path / "r.csv")) == 0.0
    assert ow.combine([1.0, 0.0], "and") == 0.0 and ow.combine([1.0, 0.0], "or") == 1.0


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["evaluator"].update(options={"strict": False}), "evaluator.options ['strict'] not supported by "
                                                                  "check_json"),
    (lambda d: d["evaluator"].update(options={"is_yaml": True}), "evaluator.options.is_yaml"),
    (lambda d: d["evaluator"]["expected"]["rules"]["expect"][0].update(method="approx:0.1"),
     "evaluator.expected[0].rules.expect[0].method 'approx:0.1'"),
    (lambda d: d["evaluator"].update(func="compare_table", options={"rules": [{"type": "sheet_fuzzy"}]}),
     "evaluator.options ['rules'] not supported by compare_table"),
])
def test_options_and_rules_we_do_not_implement_are_refused(tmp_path: Path, mutate, message: str) -> None:
    assert_refused(tmp_path, mutate, message)


def test_metrics_follow_osworld_on_details(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x, y\n1,2.50\n")
    b.write_text("x,y\n1,2.5\n")
    assert ow.compare_csv(str(a), str(b)) == 0.0  # OSWorld compares the lines
    assert ow.compare_table(str(a), str(b)) == 1.0  # ...and compare_table the data
    b.write_text("X, Y\n1,2.50\n")
    assert ow.compare_csv(str(a), str(b), ignore_case=True) == 1.0
    j = tmp_path / "c.json"
    j.write_text('{"level": "debug", "n": 3}')
    rule = lambda method, ref, key="level": {"expect": [{"key": [key], "method": method, "ref": ref}]}  # noqa: E731
    assert ow.check_json(str(j), rule("re", "^deb")) == 1.0
    assert ow.check_json(str(j), rule("re.I", "^DEB")) == 1.0
    assert ow.check_json(str(j), rule("gt", 2, "n")) == 1.0 and ow.check_json(str(j), rule("lt", 2, "n")) == 0.0
    assert ow.check_json(str(j), rule("gt", "2", "n")) == 0.0  # another type: not a crash
    assert ow.check_json(str(j), rule("eq", 1, "missing")) == 0.0
    j.write_text("[" * 200_000)
    assert ow.check_json(str(j), rule("eq", 1)) == 0.0  # nested beyond recursion: not JSON we accept
