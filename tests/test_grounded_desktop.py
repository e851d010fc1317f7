"""The grounded policy's desktop reader: its plans on canned observations (no workspace), every desktop task through
the real engine (it must solve most feasible tasks and give up on the infeasible ones), and a corrupted observation
that changes its answer and its reward."""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from bunshin.engine.rollout import RolloutEngine
from bunshin.envs.desktop.suite import DesktopSuite
from bunshin.envs.suites.base import SuiteTask
from bunshin.policies.base import Decision, PolicyContext
from bunshin.policies.grounded import GroundedPolicy
from bunshin.policies.grounded import desktop as reader
from bunshin.policies.grounded import desktop_reading as rd
from bunshin.policies.grounded import desktop_repair as rp

from .conftest import assert_no_leaks

SMALL = {"cache_mb": 8, "index_roots": ["/usr/lib/python3.11/json"], "recording_frames": 2, "screenshots": False,
         "time_scale": 0.0}
TARGET = 0.6  # the bar: at least 60% of each suite's feasible tasks


@pytest.fixture(scope="module")
def suite() -> DesktopSuite:
    return DesktopSuite(**SMALL)


def ctx_for(instruction: str, observations: list[str] | None = None) -> PolicyContext:
    return PolicyContext(suite="desktop", task_id="t", group_id="g", sample=0, seed=0, instruction=instruction,
                         reference=[], observations=observations if observations is not None else [""])


def drive(instruction: str, answer: Callable[[str], str], limit: int = 40,
          detours: tuple[int, ...] = ()) -> list[str]:
    """The reader's actions, each answered by ``answer(action)`` (a canned desktop); ``detours``: steps at which a
    ``terminal: pwd`` is taken instead (as the grounded policy's seeded detours are)."""
    ctx = ctx_for(instruction)
    for step in range(limit):
        action = "terminal: pwd" if step in detours else reader.act(ctx)
        if action in ("DONE", "FAIL"):
            ctx.actions.append(action)
            return ctx.actions
        ctx.observations.append("/home/agent" if step in detours else answer(action))
        ctx.actions.append(action)
        ctx.step += 1
    raise AssertionError(f"no final action within {limit} steps: {ctx.actions}")


# -- plans on canned observations -------------------------------------------------------------------------------------

SALES = "region,sales\nnorth,120\nsouth,340\neast,95\n"


def test_sheet_total_reads_the_sales_column_and_the_last_row_and_survives_detours() -> None:
    instruction = ('In the spreadsheet ~/Documents/s.csv (already open), add a row below the data with "Maximum" in '
                   "column A and the maximum of the sales column in column B, computed by a formula. Save the sheet "
                   "as CSV to ~/Documents/s_max.csv.")

    def answer(action: str) -> str:
        if action.startswith("sheet_open"):
            return f"opened /home/agent/Documents/s.csv (4 rows, 2 columns)\n{SALES}"
        return "saved /home/agent/Documents/s_max.csv" if "sheet_save" in action else "A5 = Maximum"

    plain = drive(instruction, answer)
    assert plain == ["sheet_open: ~/Documents/s.csv",
                     rd.call("sheet_set", cell="A5", value="Maximum"), rd.call("sheet_set", cell="B5", value="=MAX(B2:B4)"),
                     rd.call("sheet_save", path="~/Documents/s_max.csv"), "DONE"]
    detoured = drive(instruction, answer, detours=(0, 2, 3))
    assert [a for a in detoured if a != "terminal: pwd"] == plain
    shorter = SALES.rsplit("east", 1)[0]  # a line less read: the formula and the new row move up
    moved = drive(instruction, lambda a: f"opened x (3 rows, 2 columns)\n{shorter}" if "open" in a else "ok")
    assert rd.call("sheet_set", cell="B4", value="=MAX(B2:B3)") in moved


def test_sheet_formula_writes_one_formula_per_item_read() -> None:
    instruction = ('Open ~/Documents/o.csv in the spreadsheet. Add a column D with the header "amount" holding qty '
                   "times price for every item (use formulas), then save the file in place as CSV.")
    sheet = "item,price,qty\npens,1.5,4\ntape,2,3\n"  # the columns in another order than the instruction names them
    actions = drive(instruction, lambda a: f"opened x (3 rows, 3 columns)\n{sheet}" if "open" in a else "ok")
    assert actions[1:] == [rd.call("sheet_set", cell="D1", value="amount"),
                           rd.call("sheet_set", cell="D2", value="=C2*B2"),
                           rd.call("sheet_set", cell="D3", value="=C3*B3"), rd.call("sheet_save"), "DONE"]


class Editor:
    """A canned editor: one file, with the replace / insert / delete-lines semantics of the desktop's buffer."""

    def __init__(self, text: str):
        self.text, self.saved = text, None

    def __call__(self, action: str) -> str:
        if action.startswith("editor_open:"):
            return f"opened /home/agent/f ({len(self.text.split(chr(10)))} lines)\n{self.text}"
        call = json.loads(action)
        a, lines = call["args"], self.text.split("\n")
        if call["name"] == "editor_replace":
            self.text = self.text.replace(a["find"], a["replace"], a.get("count") or -1)
        elif call["name"] == "editor_insert":
            lines[a["line"] - 1:a["line"] - 1] = a["text"].split("\n")
            self.text = "\n".join(lines)
        elif call["name"] == "editor_delete_lines":
            del lines[a["start"] - 1:a["end"]]
            self.text = "\n".join(lines)
        elif call["name"] == "editor_save":
            self.saved = self.text
        return "ok"


def test_json_config_rewrites_only_the_lines_of_the_keys_asked_for() -> None:
    text = json.dumps({"name": "x", "port": 8000, "debug": True, "cache": "outer",
                       "features": {"cache": False, "beta": True}}, indent=2) + "\n"
    editor = Editor(text)
    actions = drive('In the configuration file ~/config/x.json, change "port" to 9001 and turn the "cache" feature '
                    "on. Keep the file valid JSON and leave the other settings as they are.", editor)
    assert actions[-1] == "DONE"
    assert json.loads(editor.saved) == {"name": "x", "port": 9001, "debug": True, "cache": "outer",
                                        "features": {"cache": True, "beta": True}}


def test_ini_setting_changes_the_key_of_the_named_section_only() -> None:
    text = "[server]\nhost = 127.0.0.1\nmethod = a\n\n[auth]\nuser = u\nmethod = password\n"
    editor = Editor(text)
    actions = drive('In ~/config/q.ini, set "method" in the [auth] section to token and save the file.', editor)
    assert actions[-1] == "DONE" and editor.saved == text.replace("method = password", "method = token")


@pytest.mark.parametrize("what, expect", [
    ('replace every occurrence of "Acme" with "Globex"', lambda t: t.replace("Acme", "Globex")),
    ('delete the line "DRAFT"', lambda t: t.replace("DRAFT\n", "")),
    ('insert the title line "Hello" followed by an empty line at the very top', lambda t: "Hello\n\n" + t),
])
def test_text_edits_are_read_back_before_saving(what: str, expect: Callable[[str], str]) -> None:
    text = "Dear Acme,\n\nThanks.\nDRAFT\nAcme team\n"
    editor = Editor(text)
    actions = drive(f"Open the letter ~/Documents/l.txt in the text editor, {what}, and save it.", editor)
    assert actions[-1] == "DONE" and editor.saved == expect(text)


def test_a_line_the_file_does_not_have_is_not_deleted_and_the_reader_gives_up() -> None:
    editor = Editor("Dear Acme,\nThanks.\n")
    assert drive('Open the letter ~/l.txt in the text editor, delete the line "DRAFT", and save it.',
                 editor)[-1] == "FAIL"
    assert editor.saved is None


LOG_TASK = ("The web server's log is ~/logs/server.log (fields: time, level, [service], client IP, method, path, "
            "status, bytes). {} Write just the answer into ~/answer.txt.")
LOG_HEAD = "1 INFO [auth] 10.0.0.1 GET /api/pay 200 123\n2 ERROR [cart] 10.0.0.2 POST /api/pay 503 55\n"


@pytest.mark.parametrize("question, awk, printed, answer", [
    ("How many ERROR lines does the auth service ([auth]) have?", '$2 == "ERROR" && $3 == "[auth]" {n++}', "41", "41"),
    ("How many POST requests were made to /api/pay?", '$5 == "POST" && $6 == "/api/pay" {n++}', "7", "7"),
    ("How many distinct client IP addresses appear on ERROR lines?", '$2 == "ERROR" {print $4}', "12", "12"),
    ("Which client IP address made the most requests?", "1 {print $4}", "  90 10.1.2.3\n  80 10.0.0.1", "10.1.2.3"),
    ("What is the sum of the last field (response bytes) over the [search] service's requests with status 200?",
     '$3 == "[search]" && $7 == 200 {s += $NF}', "123456789", "123456789"),
    ("Which request path got the most responses with status 500?", "$7 == 500 {print $6}", " 9 /api/cart\n 3 /x",
     "/api/cart"),
])
def test_log_questions_become_awk_and_the_answer_is_read_off_its_output(question, awk, printed, answer) -> None:
    def desktop(action: str) -> str:
        if "awk" in action:
            return printed + "\n"
        if "head -n 3" in action:
            return LOG_HEAD
        return answer + "\n" if "cat " in action else ""

    actions = drive(LOG_TASK.format(question), desktop)
    query = json.loads(actions[1])["args"]["command"]
    assert awk in query, query
    assert actions[2:] == [f"terminal: printf '%s\\n' {answer} > ~/answer.txt", "terminal: cat ~/answer.txt", "DONE"]


def test_organize_files_moves_the_files_it_listed() -> None:
    names = ["a.pdf", "b c.pdf", "x.png", "n.txt", "old/"]
    moved = ("cd ~/Downloads && mkdir -p pdfs notes && mv -- a.pdf 'b c.pdf' pdfs/ && mv -- n.txt notes/")
    found = "./pdfs/a.pdf\n./pdfs/b c.pdf\n./notes/n.txt\n./x.png\n"
    actions = drive("Tidy up ~/Downloads: move every .pdf file into a new folder ~/Downloads/pdfs and every .txt "
                    "file into a new folder ~/Downloads/notes. Leave all other files where they are.",
                    lambda a: "\n".join(names) if "ls -Ap" in a else found if "find" in a else "")
    assert actions == ["terminal: ls -Ap ~/Downloads", f"terminal: {moved}",
                       "terminal: cd ~/Downloads && find . -type f | sort", "DONE"]


UNITTEST_FAIL = """.F..
======================================================================
FAIL: test_mean (tests.test_stats.TestStats.test_mean)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/home/agent/project/tests/test_stats.py", line 6, in test_mean
    self.assertEqual(stats.mean([1, 2, 3, 4]), 2.5)
AssertionError: 3.3333333333333335 != 2.5

----------------------------------------------------------------------
Ran 4 tests in 0.010s

FAILED (failures=1)
"""
GREP = """calc/ops.py:1:def add(a, b):
calc/ops.py:2:    return a + b
calc/stats.py:1:from . import ops
calc/stats.py:2:
calc/stats.py:3:def total(xs):
calc/stats.py:4:    return sum(xs)
calc/stats.py:5:
calc/stats.py:6:def mean(xs):
calc/stats.py:7:    return total(xs) / (len(xs) - 1)
tests/test_stats.py:5:    def test_mean(self):
tests/test_stats.py:6:        self.assertEqual(stats.mean([1, 2, 3, 4]), 2.5)
"""


def test_the_failing_assertion_points_at_the_suspect_and_its_off_by_one_is_the_first_candidate() -> None:
    fails = rp.failures(UNITTEST_FAIL)
    assert [(f.test_id, f.method) for f in fails] == [("tests.test_stats.TestStats.test_mean", "test_mean")]
    files = rp.sources(GREP)
    package = {p: v for p, v in files.items() if p.startswith("calc/")}
    order = rp.suspects(fails, {"tests/test_stats.py": files["tests/test_stats.py"]}, package)
    assert [f.name for f in order] == ["mean", "total"]
    first = rp.candidates(package, order)[0]
    assert (first.path, first.line, first.new) == ("calc/stats.py", 7, "    return total(xs) / (len(xs))")
    assert not rp.passed(UNITTEST_FAIL) and rp.passed("......\nRan 6 tests in 1.2s\n\nOK\n")


def test_project_tests_tries_candidates_in_the_terminal_then_applies_the_one_that_passed() -> None:
    instruction = ("The unit tests of the Python project in ~/project fail. Find and fix the bug in the package "
                   "`calc` (do not change the tests), then run the whole test suite in the terminal "
                   "(python3 -m unittest, from ~/project) and make sure that it passes.")
    editor = Editor("\n".join(line.split(":", 2)[2] for line in GREP.splitlines() if line.startswith("calc/stats")))
    runs = iter([UNITTEST_FAIL, "Ran 4 tests in 0.1s\n\nOK\n"])

    def desktop(action: str) -> str:
        if action.startswith("{") and '"terminal"' in action:
            command = json.loads(action)["args"]["command"]
            if "<<'EOF'" in command:
                return "candidate 0: passes\n"
            return next(runs)
        if action.startswith("terminal: cd ~/project && grep"):
            return GREP
        return editor(action)

    actions = drive(instruction, desktop)
    assert actions[-1] == "DONE"
    assert "return total(xs) / (len(xs))" in editor.saved


def probing(present: set[str], ics_files: int = 0) -> Callable[[str], str]:
    """A canned desktop answering the reader's probe: which programs are there, how many calendar files."""
    def answer(action: str) -> str:
        programs = re.search(r"for p in ([^;]+);", action)
        out = [f"{'found' if p in present else 'missing'}: {p}" for p in (programs.group(1).split() if programs else [])]
        out += [f"files *.ics: {ics_files}"] if "*.ics" in action else []
        return "\n".join(out) + "\n"
    return answer


@pytest.mark.parametrize("instruction, present, final", [
    ("Send ~/Documents/contacts.csv to ana@example.org with Thunderbird.", set(), "FAIL"),
    ("Send ~/Documents/contacts.csv to ana@example.org with Thunderbird.", {"thunderbird"}, "DONE"),
    ("Print ~/notes.txt on the office printer.", set(), "FAIL"),
    ("Print ~/notes.txt on the office printer.", {"lpr"}, "DONE"),
    ("Join the video call in the calendar invitation and share the screen.", set(), "FAIL"),
    ("Make me a sandwich.", set(), "DONE"),  # nothing read shows it cannot be done
])
def test_an_instruction_without_a_plan_is_given_up_only_when_the_probe_shows_it_cannot_be_done(
        instruction: str, present: set[str], final: str) -> None:
    actions = drive(instruction, probing(present))
    assert actions[-1] == final


def test_the_reader_never_looks_at_the_reference() -> None:
    class Trap(list):
        def __getattribute__(self, name: str):  # noqa: ANN204
            raise AssertionError("the reader read the reference")

    ctx = ctx_for('In ~/config/q.ini, set "x" in the [a] section to 1 and save the file.')
    ctx.reference = Trap()  # type: ignore[assignment]
    assert reader.act(ctx) == "editor_open: ~/config/q.ini"


# -- the whole suite through the engine -------------------------------------------------------------------------------


def per_template(tasks: list[SuiteTask], rewards: dict[str, float]) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in tasks:
        out[t.template][0] += rewards[t.id] == 1.0
        out[t.template][1] += 1
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


async def run_all(suite: DesktopSuite, policy, state_dir: Path, task_ids: list[str] | None = None,
                  seed: int = 0) -> dict[str, float]:
    engine = RolloutEngine(suite, policy, concurrency=4, state_dir=state_dir)
    async with engine:
        results = await engine.run(engine.requests(task_ids, group_size=1, seed=seed))
    await assert_no_leaks(engine.runtime)
    for r in results:
        t = r.trajectory
        if t.reward != 1.0:
            print("MISS", t.task_id, t.status, t.error, [s.action_text for s in t.steps][-4:], t.final_text)
    return {r.trajectory.task_id: r.trajectory.reward for r in results}


@pytest.mark.slow
@pytest.mark.asyncio
# with detours (0.15) the same reader runs a minute longer: the full tier's (pytest -m full)
@pytest.mark.parametrize("detour_p", [0.0, pytest.param(0.15, marks=pytest.mark.full)])
async def test_the_reader_solves_most_feasible_desktop_tasks(suite: DesktopSuite, state_dir: Path, detour_p: float,
                                                             request: pytest.FixtureRequest) -> None:
    if "uvloop" in request.node.name:
        pytest.skip("the event loop does not matter here; one pass over the tasks is enough")
    tasks = suite.tasks()
    rewards = await run_all(suite, GroundedPolicy(detour_p=detour_p, time_scale=0), state_dir)
    table = per_template(tasks, rewards)
    print(f"\ngrounded desktop reader, detour_p={detour_p}, seed 0:")
    for template, (solved, total) in table.items():
        print(f"  {template:15s} {solved}/{total}")
    feasible = [t for t in tasks if not t.give_up]
    solved = sum(rewards[t.id] == 1.0 for t in feasible)
    print(f"  feasible: {solved}/{len(feasible)}; infeasible given up: {table['infeasible'][0]}/8")
    assert solved >= TARGET * len(feasible)
    assert table["infeasible"][0] == table["infeasible"][1]


# -- a corrupted observation changes the answer and the reward -------------------------------------------------------


class Corrupting(GroundedPolicy):
    """The grounded policy, shown observations altered by ``corrupt(observation, the action it answered)``."""

    def __init__(self, corrupt: Callable[[str, str], str]):
        super().__init__(detour_p=0.0, time_scale=0)
        self.corrupt = corrupt

    async def decide(self, ctx: PolicyContext) -> Decision:
        shown = [ctx.observations[0]] + [self.corrupt(obs, action)
                                         for obs, action in zip(ctx.observations[1:], ctx.actions, strict=False)]
        return await super().decide(dataclasses.replace(ctx, observations=shown))  # same memory (ctx.extra)


def count_plus_one(obs: str, action: str) -> str:
    """The count the log query printed, off by one."""
    return f"{int(obs.strip()) + 1}\n" if "awk" in action and obs.strip().isdigit() else obs


def drop_last_row(obs: str, action: str) -> str:
    """The sheet as opened, without its last line."""
    return obs.rstrip("\n").rsplit("\n", 1)[0] + "\n" if action.startswith("sheet_open") else obs


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.parametrize("template, pick, corrupt", [
    ("log_query", "HTTP status 503", count_plus_one),
    ("sheet_total", "sales_0.csv", drop_last_row),
])
async def test_a_corrupted_observation_changes_the_answer_and_the_reward(
        suite: DesktopSuite, state_dir: Path, template: str, pick: str, corrupt: Callable[[str, str], str],
        request: pytest.FixtureRequest) -> None:
    if "uvloop" in request.node.name:
        pytest.skip("the event loop does not matter here")
    task = next(t for t in suite.tasks() if t.template == template and pick in t.instruction)
    trajectories = {}
    for name, policy in [("clean", GroundedPolicy(detour_p=0.0, time_scale=0)), ("corrupted", Corrupting(corrupt))]:
        engine = RolloutEngine(suite, policy, concurrency=1, state_dir=state_dir)
        async with engine:
            (result,) = await engine.run(engine.requests([task.id], group_size=1, seed=3))
        await assert_no_leaks(engine.runtime)
        trajectories[name] = result.trajectory
    clean, corrupted = trajectories["clean"], trajectories["corrupted"]
    clean_actions = [s.action_text for s in clean.steps]
    corrupted_actions = [s.action_text for s in corrupted.steps]
    print("clean:", clean_actions[-2:], "\ncorrupted:", corrupted_actions[-2:])
    assert clean.reward == 1.0 and corrupted.reward == 0.0
    assert clean_actions != corrupted_actions
    if template == "log_query":  # the answer written is the number read, as it was shown
        written = [int(re.search(r"printf '%s\\n' (\d+)", a).group(1)) for a in clean_actions + corrupted_actions
                   if a and a.startswith("terminal: printf")]
        assert written[1] == written[0] + 1
