"""The embedded desktop in real workspaces: every template's reference solution scores 1 and its null attempt 0,
wrong answers score 0 under every metric, forks diverge on their own, malformed actions leave the workspace
working, and the screen is a 1920x1080 PNG."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import pytest
from PIL import Image

from bunshin.envs import ToolCall
from bunshin.envs.desktop import tasks as gen
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.suites.base import SuiteTask

SMALL = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 2, "time_scale": 0.0}


@pytest.fixture(scope="module")
def suite() -> DesktopSuite:
    return DesktopSuite(**SMALL)


def first(suite: DesktopSuite, template: str, index: int = 0) -> SuiteTask:
    return [t for t in suite.tasks() if t.template == template][index]


def C(name: str, **args: object) -> ToolCall:
    return ToolCall(name=name, args=args)


def _swap_formula(calls: list[ToolCall]) -> list[ToolCall]:
    out = []
    for c in calls:
        if c.name == "sheet_set" and str(c.args["value"]).startswith("="):
            c = C("sheet_set", cell=c.args["cell"], value="=1+" + c.args["value"][1:])
        out.append(c)
    return out


def _wrong_json(calls: list[ToolCall]) -> list[ToolCall]:
    # the asked-for changes, plus one that breaks a setting the task says to keep
    return calls[:-2] + [C("editor_replace", find='"name": "', replace='"name": "old-'), *calls[-2:]]


def _extra_line(calls: list[ToolCall]) -> list[ToolCall]:
    return calls[:-2] + [C("editor_insert", line=1, text="P.S."), *calls[-2:]]


def _wrong_ini(calls: list[ToolCall]) -> list[ToolCall]:
    return [C(c.name, find=c.args["find"], replace=c.args["replace"] + "1") if c.name == "editor_replace" else c
            for c in calls]


def _half_tidy(calls: list[ToolCall]) -> list[ToolCall]:
    return [C("terminal", command=calls[0].args["command"].rsplit(" && mv", 1)[0]), calls[-1]]


# template -> a plausible wrong attempt (ending with DONE), built from the reference
WRONG: dict[str, Callable[[list[ToolCall]], list[ToolCall]]] = {
    "sheet_total": _swap_formula,  # compare_csv
    "sheet_formula": _swap_formula,  # compare_table
    "json_config": _wrong_json,  # check_json
    "text_edit": _extra_line,  # compare_text_file
    "ini_setting": _wrong_ini,  # exact_match on vm_command_line
    "organize_files": _half_tidy,  # exact_match on list_directory
    # check_include_exclude (tests fail) and exact_match on the tests' hashes (tests deleted)
    "project_tests": lambda calls: [C("terminal", command="cd ~/project && rm tests/test_*.py && python3 -m unittest"),
                                    calls[-1]],
    "log_query": lambda calls: [C("terminal", command="echo 12345 > answer.txt"), calls[-1]],
    "infeasible": lambda calls: [C("DONE")],  # infeasible: anything but FAIL
}


async def run(ws, calls: list[ToolCall]) -> None:
    for call in calls:
        obs = await ws.execute(call)
        assert obs.error is None, (call, obs.error, obs.output[-500:])


@pytest.mark.asyncio
@pytest.mark.parametrize("template", list(gen.TEMPLATES))
async def test_reference_scores_1_null_and_wrong_attempts_score_0(runtime, suite: DesktopSuite,
                                                                   template: str) -> None:
    task = first(suite, template)
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    null, wrong = await ws.fork(), await ws.fork()
    *steps, final = task.reference
    await run(ws, steps)
    assert suite.is_final(final)
    assert await suite.evaluate(ws, task, final) == 1.0
    # the null attempt gives up at once: right only on infeasible tasks; claiming DONE at once is right nowhere
    assert suite.null_action() == C("FAIL")
    assert await suite.evaluate(null, task, suite.null_action()) == (1.0 if task.give_up else 0.0)
    assert await suite.evaluate(null, task, C("DONE")) == 0.0
    *steps, final = WRONG[template](task.reference)
    await run(wrong, steps)
    assert await suite.evaluate(wrong, task, final) == 0.0


@pytest.mark.asyncio
async def test_forks_diverge_in_files_buffers_sheets_and_terminal(runtime, suite: DesktopSuite) -> None:
    task = first(suite, "json_config", 4)  # two changes asked
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    path = task.reference[0].args["path"]
    first_change = task.reference[1]
    await run(ws, [C("terminal", command="cd Documents && echo before-fork"), first_change,
                   C("sheet_open", path="~/Documents/budget.csv"), C("sheet_set", cell="F1", value="total"),
                   C("sheet_set", cell="F2", value="=SUM(B2:E2)")])
    right = await ws.fork()
    wrong = await ws.fork()
    await run(right, [C("terminal", command="echo right-$(pwd)"), C("sheet_set", cell="F2", value="=B2*2"),
                      C("sheet_save"), *task.reference[2:-1]])
    await run(wrong, [C("terminal", command="echo wrong"), C("sheet_set", cell="F3", value="=MAX(B3:E3)"),
                      C("editor_undo"), C("editor_replace", find='"workers"', replace='"threads"'),
                      C("editor_save"), C("editor_open", path="~/config/settings.json")])
    obs = [(await w.execute(C("_screen"))) for w in (ws, right, wrong)]
    texts = [o.output for o in obs]
    assert "right-/home/agent/Documents" in texts[1] and "wrong" not in texts[1]
    assert "wrong" in texts[2] and "right-" not in texts[2] and "right-" not in texts[0] and "wrong" not in texts[0]
    a11y = [o.data["a11y"] for o in obs]
    assert 'F2="12000"' in a11y[0] and 'F3=' not in a11y[0]
    assert 'F2="6000"' in a11y[1]
    assert 'F3="22400"' in a11y[2] and 'F2="12000"' in a11y[2]
    assert "settings.json - Text Editor\" focused" in a11y[2] and "settings.json" not in a11y[1]
    files = [(await w.execute(C("_read_file", path=path))).data["content"] for w in (ws, right, wrong)]
    assert b'"threads"' in files[2] and b'"threads"' not in files[1] + files[0]
    assert files[0] == files[2].replace(b'"threads"', b'"workers"')  # the source never saved its edit
    budget = [(await w.execute(C("_read_file", path="/home/agent/Documents/budget.csv"))).data["content"]
              for w in (ws, right, wrong)]
    assert budget[0] == budget[2] and budget[1].splitlines()[1].endswith(b",6000")
    assert await suite.evaluate(right, task, C("DONE")) == 1.0
    assert await suite.evaluate(wrong, task, C("DONE")) == 0.0
    assert await suite.evaluate(ws, task, C("DONE")) == 0.0  # its edit is still unsaved
    await run(ws, [C("editor_save")])
    assert await suite.evaluate(ws, task, C("DONE")) == 0.0  # only one of the two changes


@pytest.mark.asyncio
async def test_malformed_actions_give_an_error_and_the_desktop_goes_on(runtime, suite: DesktopSuite) -> None:
    ws = await runtime.create(suite.app())
    cases = [
        (C("no_such_tool"), "unknown tool 'no_such_tool'"),
        (C("terminal"), "terminal: missing argument 'command'"),
        (C("terminal", command="ls", timeout_s=-1), "timeout_s must be in"),
        (C("editor_replace", find="a", replace="b"), "no file is open in the editor"),
        (C("editor_save"), "no file is open in the editor"),
        (C("sheet_set", cell="A1", value="1"), "no sheet is open"),
        (C("editor_open", path="/var/lib/desktop/expected/x.csv"), "permission denied"),
        (C("editor_open", path="~/../../etc/shadow"), "permission denied"),
        (C("sheet_open", path="~/Documents"), "is a directory"),
    ]
    for call, message in cases:
        obs = await ws.execute(call)
        assert obs.error and message in obs.error, (call, obs.error)
    await run(ws, [C("terminal", command="ln -s /var/lib/desktop ~/sneaky && mkfifo ~/pipe")])
    assert "permission denied" in (await ws.execute(C("editor_open", path="~/sneaky/x"))).error
    assert "not a regular file" in (await ws.execute(C("editor_open", path="~/pipe"))).error  # and no hang
    await run(ws, [C("sheet_open", path="~/Documents/budget.csv")])
    for call, message in [
        (C("sheet_set", cell="A0", value="1"), "'A0' is not a cell name"),
        (C("sheet_set", cell="B2", value="=SUM(B2:"), "bad formula"),
        (C("sheet_set", cell="B2", value=["x"]), "sheet_set: value must be str or int or a number, got ['x']"),
        (C("sheet_get", cell="ZZZZ1"), "is not a cell name"),
    ]:
        obs = await ws.execute(call)
        assert obs.error and message in obs.error, (call, obs.error)
    assert (await ws.execute(C("sheet_get", cell="B2"))).output == "3000"  # unchanged by the refused edits
    await run(ws, [C("editor_open", path="~/Documents/meeting_notes.txt")])
    for call, message in [
        (C("editor_replace", find="no such text", replace="x"), "does not occur"),
        (C("editor_insert", line=99, text="x"), "line must be in 1.."),
        (C("editor_delete_lines", start=5, end=2), "are not within"),
        (C("editor_undo"), "nothing to undo"),
        (C("editor_replace", find="Friday", replace="Monday", count=0), "count must be >= 1"),
        (C("WAIT", seconds=999), "seconds must be in"),
    ]:
        obs = await ws.execute(call)
        assert obs.error and message in obs.error, (call, obs.error)
    obs = await ws.execute(C("terminal", command="sleep 5", timeout_s=0.5))
    assert obs.error and "timed out" in obs.error
    obs = await ws.execute(C("terminal", command="id -u && pwd && cat /var/lib/desktop/x 2>&1; exit 3"))
    assert obs.error is None and obs.exit_code == 3
    assert obs.output.startswith("65000\n/home/agent\n") and "Permission denied" in obs.output
    assert (await ws.execute(C("WAIT", seconds=0))).error is None
    assert "/usr/lib/python3.11/json/decoder.py" in (await ws.execute(C("search_files", query="decoder"))).output


@pytest.mark.asyncio
async def test_the_first_observation_has_terminal_windows_and_a_1920x1080_screenshot(runtime,
                                                                                   suite: DesktopSuite) -> None:
    task = first(suite, "sheet_total")
    ws = await runtime.create(suite.app(task))
    obs = await suite.start(ws, task)
    image = Image.open(io.BytesIO(obs.data["screenshot"]))
    assert image.format == "PNG" and image.size == (1920, 1080)
    assert re.search(r'window name="sales_\d+\.csv - Spreadsheet" focused', obs.data["a11y"])
    assert 'window name="Terminal - /home/agent"' in obs.data["a11y"]
    step = await ws.execute(C("terminal", command="echo hello"))
    assert step.output == "hello\n" and "agent@desktop:~$ echo hello" in step.data["a11y"]
    assert Image.open(io.BytesIO(step.data["screenshot"])).size == (1920, 1080)
    assert step.data["screenshot"] != obs.data["screenshot"]
    again = await ws.execute(C("_screen"))
    assert again.data["screenshot"] == (await ws.execute(C("_screen"))).data["screenshot"]  # deterministic


@pytest.mark.asyncio
async def test_the_session_cache_is_shared_by_forks_and_steps_grow_private_memory(runtime) -> None:
    suite = DesktopSuite(cache_mb=96, index_roots=["/usr/lib/python3.11"], recording_frames=4, time_scale=0.0)
    ws = await runtime.create(suite.app())
    after_setup = ws.memory()
    assert after_setup.rss > 96 << 20 and after_setup.anon_huge > 64 << 20  # the cache is resident, in huge pages
    clone = await ws.fork()
    right_after = clone.memory().private
    for i in range(4):  # each step keeps a recorded frame (6 MiB) and re-rendered textures: private growth
        await run(clone, [C("terminal", command=f"echo step {i}")])
    grown = clone.memory().private - right_after
    assert 4 * 6 << 20 <= grown < 96 << 20, grown / 2**20
    before = clone.memory().private  # the recorder is full: steps now replace frames
    for query in ["json", "decoder", "__init__.py", "unittest", "zzz-none"] * 2:  # reading the cache copies nothing
        assert (await clone.execute(C("search_files", query=query))).error is None
    # steps still churn frames and textures (a frame more while the oldest is dropped): well under the 96 MiB cache
    assert clone.memory().private - before < 40 << 20


@pytest.mark.slow
@pytest.mark.asyncio
async def test_every_tasks_reference_scores_1_and_its_null_attempt_0(runtime, suite: DesktopSuite,
                                                                    request: pytest.FixtureRequest) -> None:
    """All the committed tasks, each in a fork of one set-up desktop (once, on one event loop)."""
    if "uvloop" in request.node.name:
        pytest.skip("the event loop does not matter here; one pass over the tasks is enough")
    base = await runtime.create(suite.app())
    failures = []
    for task in suite.tasks():
        ws = await base.fork()
        print("TASK", task.template, task.path, flush=True)
        try:
            await suite.start(ws, task)
            null = await ws.fork()
            try:
                *steps, final = task.reference
                for call in steps:
                    obs = await ws.execute(call)
                    if obs.error:
                        failures.append((task.path, call.name, obs.error))
                score = await suite.evaluate(ws, task, final)
                null_score = await suite.evaluate(null, task, suite.null_action())
                if (score, null_score) != (1.0, 1.0 if task.give_up else 0.0):
                    failures.append((task.path, score, null_score))
            finally:
                await null.close()
        finally:
            await ws.close()
    assert not failures, failures


@pytest.mark.asyncio
async def test_the_private_restore_baseline_restores_the_desktop(make_runtime, suite: DesktopSuite) -> None:
    rt = await make_runtime(backend="restore")
    task = first(suite, "text_edit")
    ws = await rt.create(suite.app(task))
    await suite.start(ws, task)
    *steps, final = task.reference
    await run(ws, [C("terminal", command="cd Documents && echo restored"), *steps[:-1]])  # edited, unsaved
    clone = await ws.fork()
    screen = (await clone.execute(C("_screen"))).data["a11y"]
    assert "Terminal - /home/agent/Documents" in screen and 'modified=true' in screen and "restored" in screen
    await run(clone, [steps[-1]])
    assert await suite.evaluate(clone, task, final) == 1.0
    assert await suite.evaluate(ws, task, final) == 0.0  # the source never saved


@pytest.mark.asyncio
async def test_a_real_shaped_osworld_file_without_our_keys_runs_as_it_is(runtime, tmp_path) -> None:
    import json

    task_file = {  # the shape of OSWorld's os-domain tasks: a string command, the focus click, a shell getter
        "id": "0c1e0c5e-real-shaped", "snapshot": "os", "source": "x", "trajectory": "trajectories/",
        "instruction": "Can you move the file 'todo.txt' on the Desktop to the directory 'done/' on the Desktop?",
        "config": [{"type": "execute", "parameters": {"command": "mkdir -p ~/Desktop/done && touch ~/Desktop/todo.txt",
                                                      "shell": True}},
                   {"type": "execute", "parameters": {"command": [
                       "python", "-c", "import pyautogui; import time; pyautogui.click(960, 540); time.sleep(0.5);"]}}],
        "related_apps": ["os"],
        "evaluator": {"func": "exact_match",
                      "result": {"type": "vm_command_line", "shell": True, "command":
                                 "if [ -f ~/Desktop/done/todo.txt ]; then echo 'File exists.'; "
                                 "else echo 'File does not exist.'; fi"},
                      "expected": {"type": "rule", "rules": {"expected": "File exists.\n"}}},
    }
    (tmp_path / "os").mkdir()
    (tmp_path / "os" / "0c1e0c5e.json").write_text(json.dumps(task_file))
    suite = DesktopSuite(tasks_dir=tmp_path, **SMALL)
    [task] = suite.tasks()
    assert task.template == "os" and task.reference == [] and not task.give_up
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    null = await ws.fork()
    await run(ws, [suite.parse_action("terminal: mv /home/user/Desktop/todo.txt ~/Desktop/done/")])
    assert await suite.evaluate(ws, task, suite.parse_action("DONE")) == 1.0
    assert await suite.evaluate(null, task, suite.null_action()) == 0.0


@pytest.mark.asyncio
async def test_a_result_file_linked_to_the_expected_file_scores_0(runtime, suite: DesktopSuite) -> None:
    """The grader reads as root: a symlink needs no access to its target, so it must not be followed."""
    task = first(suite, "sheet_total")
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    expected = next(c["path"] for c in [suite.load(task.path)[0].evaluator.expected] if isinstance(c, dict))
    result = suite.load(task.path)[0].evaluator.result["path"]
    await run(ws, [C("terminal", command=f"ln -sf {expected} {result.replace('/home/user', '~')} && ls -l "
                                         f"{result.replace('/home/user', '~')}")])
    assert await suite.evaluate(ws, task, C("DONE")) == 0.0
    fresh = await ws.fork()
    await run(fresh, [C("terminal", command=f"rm {result.replace('/home/user', '~')}"), *task.reference[:-1]])
    assert await suite.evaluate(fresh, task, C("DONE")) == 1.0  # the same path, written for real, passes


@pytest.mark.asyncio
async def test_a_fake_unittest_module_does_not_pass_the_project_tests(runtime, suite: DesktopSuite) -> None:
    task = first(suite, "project_tests")
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    fake = "mkdir -p ~/project/unittest && printf 'print(\"Ran 6 tests\\\\n\\\\nOK\")\\n' > ~/project/unittest/__main__.py"
    await run(ws, [C("terminal", command=fake), C("terminal", command="cd ~/project && python3 -m unittest")])
    assert "Ran 6 tests" in (await ws.execute(C("_terminal_output"))).output  # the fake fools a plain run...
    assert await suite.evaluate(ws, task, C("DONE")) == 0.0  # ...not the grader's isolated one


@pytest.mark.asyncio
async def test_a_fix_saved_within_the_second_of_the_last_test_run_is_what_the_next_run_tests(runtime,
                                                                                           suite: DesktopSuite) -> None:
    """CPython trusts a cached ``.pyc`` whose source has the same size and the same whole-second mtime. With no
    modelled latency an agent fixes a same-length bug (``a + b`` for ``a - b``) within a second of the failing run,
    so a cached bytecode would answer for the old source (it did, in CI). Agent commands write no bytecode; the
    mtime is pinned here to make the same second certain."""
    task = first(suite, "project_tests", 0)
    *steps, final = task.reference
    assert steps[2].name == "editor_replace" and len(steps[2].args["find"]) == len(steps[2].args["replace"])
    pin = C("terminal", command="touch -d @1700000000 ~/project/calc/ops.py")
    ws = await runtime.create(suite.app(task))
    await suite.start(ws, task)
    await run(ws, [pin, steps[0], *steps[1:4], pin, steps[4]])
    assert "Ran 6 tests" in (out := (await ws.execute(C("_terminal_output"))).output) and out.rstrip().endswith("OK")
    assert await suite.evaluate(ws, task, final) == 1.0


@pytest.mark.asyncio
async def test_a_runaway_formula_is_an_error_value_and_the_desktop_goes_on(runtime, suite: DesktopSuite) -> None:
    ws = await runtime.create(suite.app())
    await run(ws, [C("sheet_open", path="~/Documents/budget.csv")])
    for formula in ("=9^9^9", "=10^5000", "=ROUND(1, 1000000000)"):
        obs = await ws.execute(C("sheet_set", cell="H1", value=formula))
        assert obs.error is None and ("#NUM!" in obs.output or "= 1" in obs.output), obs
    obs = await ws.execute(C("terminal", command="echo still-here"))
    assert obs.error is None and "still-here" in obs.output
