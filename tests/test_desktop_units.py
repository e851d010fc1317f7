"""The desktop's pieces without a workspace: spreadsheet formulas, the editor buffer, the terminal's directory
tracking, the action language, and the committed task files (they load, and equal what the generator makes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bunshin.envs.desktop import tasks as gen
from bunshin.envs.desktop.editor import Buffer
from bunshin.envs.desktop.spreadsheet import CellError, FormulaError, Sheet, format_value, parse_cell
from bunshin.envs.desktop.suite import TASKS_DIR, DesktopSuite
from bunshin.envs.desktop.terminal import MARKER, Terminal
from bunshin.envs.records import ToolCall
from bunshin.envs.suites.base import ActionError
from bunshin.envs.suites.webarena import TaskFileError


def sheet(csv_text: str = "a,b\n1,2\n3,4\n5,6\n") -> Sheet:
    return Sheet.from_csv(csv_text)


@pytest.mark.parametrize("formula, expected", [
    ("=A2+B2*3", "7"),
    ("=(A2+B2)*3", "9"),
    ("=-A2^2", "1"),  # unary minus binds tighter than ^, as in spreadsheets
    ("=2^3^2", "512"),
    ("=SUM(A2:A4)", "9"),
    ("=SUM(B2:B4, 10, A2)", "23"),
    ("=AVERAGE(A2:B4)", "3.5"),
    ("=MIN(A2:B4)", "1"),
    ("=MAX(A2:B4)", "6"),
    ("=COUNT(A1:B4)", "6"),  # the header texts are not numbers
    ("=SUM(A1:A4)", "9"),  # ranges skip text
    ("=B2/A3", "0.6666666667"),
    ("=B4/B2", "3"),
    ("=ROUND(B2/A3, 2)", "0.67"),
    ("=ABS(A2-B4)", "5"),
    ("=A2/0", "#DIV/0!"),
    ("=A1+1", "#VALUE!"),
    ("=NOPE(A2)", "#NAME?"),
    ("=A9999999+1", "#REF!"),
    ("=SUM(A2:ZZZ9999999)", "#REF!"),
    ("=C2+1", "1"),  # an empty cell is 0
    ("=A2/0+SUM(A2:A4)", "#DIV/0!"),  # errors propagate
    ('="text"', "text"),
    ("=AVERAGE(D1:D9)", "#DIV/0!"),
])
def test_formulas(formula: str, expected: str) -> None:
    s = sheet()
    s.set("C5", formula)
    assert format_value(s.value("C5")) == expected


def test_formulas_follow_their_inputs_and_errors_propagate_through_cells() -> None:
    s = sheet()
    s.set("C2", "=A2*10")
    s.set("C3", "=C2+1")
    assert s.value("C3") == 11
    s.set("A2", "7")
    assert s.value("C3") == 71
    s.set("A2", "0")
    s.set("D1", "=B2/A2")
    s.set("D2", "=D1*2")
    assert s.value("D2") == "#DIV/0!"
    s.set("E1", "=E2+1")
    s.set("E2", "=E1+1")
    assert s.value("E1") == "#CIRC!" and s.value("E2") == "#CIRC!"
    s.set("E1", "")  # clearing a cell removes it
    assert s.input_of("E1") is None and s.value("E2") == 1


@pytest.mark.parametrize("bad", ["=", "=1+", "=SUM(A1:)", "=(1+2", "=1 2", "=A1:B2", "=@A1", "=SUM(A1,,)"])
def test_bad_formulas_are_refused_not_stored(bad: str) -> None:
    s = sheet()
    if bad == "=":  # a lone '=' is text, as in spreadsheets
        s.set("C1", bad)
        assert s.value("C1") == "="
        return
    if bad == "=A1:B2":  # a range outside a function is a #VALUE!, not a syntax error
        s.set("C1", bad)
        assert s.value("C1") == "#VALUE!"
        return
    with pytest.raises(FormulaError):
        s.set("C1", bad)
    assert s.input_of("C1") is None


@pytest.mark.parametrize("name", ["A0", "1A", "A-1", "", "AAAA1", "A1B", "A10000000"])
def test_bad_cell_names(name: str) -> None:
    with pytest.raises(CellError):
        parse_cell(name)


def test_csv_round_trip_saves_computed_values() -> None:
    s = Sheet.from_csv('name,qty,price\n"pens, blue",3,1.5\npaper,10,0.1\n')
    s.set("D1", "amount")
    s.set("D2", "=B2*C2")
    s.set("D3", "=B3*C3")
    s.set("A5", "Total")
    s.set("D5", "=SUM(D2:D3)")
    assert s.to_csv() == ('name,qty,price,amount\n"pens, blue",3,1.5,4.5\npaper,10,0.1,1\n,,,\nTotal,,,5.5\n')
    assert parse_cell("$B$3") == (2, 1) and parse_cell("aa10") == (9, 26)


def test_editor_buffer_edits_and_undo() -> None:
    b = Buffer("/home/agent/x.txt", "one\ntwo\nthree\n", undo_depth=2)
    assert b.replace("o", "0", count=1) == 1 and b.lines[0] == "0ne"
    b.insert(2, "inserted")
    b.delete_lines(3, 4)
    assert b.text == "0ne\ninserted\n" and b.modified and len(b.undo) == 2
    b.undo_last()
    assert b.text == "0ne\ninserted\ntwo\nthree\n"
    for bad in (lambda: b.replace("zzz", "y"), lambda: b.insert(99, "x"), lambda: b.delete_lines(3, 1)):
        before = b.text
        with pytest.raises(ValueError):
            bad()
        assert b.text == before


def test_terminal_keeps_its_directory_and_hides_the_marker() -> None:
    t = Terminal(scrollback_lines=5)
    assert "cd /home/agent" in t.wrap("ls")
    t.begin()
    out = t.record("cd project && ls", f"a.py\nb.py\n\n{MARKER}/home/agent/project\n")
    assert out == "a.py\nb.py\n" and t.cwd == "/home/agent/project" and MARKER not in t.text
    assert t.prompt == "agent@desktop:~/project$ "
    t.begin()
    t.record("seq 10", "\n".join(map(str, range(10))) + f"\n\n{MARKER}/tmp\n")
    assert len(t.scrollback) == 5 and t.cwd == "/tmp"


# -- the action language ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite() -> DesktopSuite:
    return DesktopSuite(cache_mb=8)


def test_parse_action(suite: DesktopSuite) -> None:
    assert suite.parse_action("DONE") == ToolCall(name="DONE") and suite.is_final(suite.parse_action(" fail "))
    assert suite.parse_action("WAIT") == ToolCall(name="WAIT") and not suite.is_final(ToolCall(name="WAIT"))
    assert suite.parse_action("WAIT: 2") == ToolCall(name="WAIT", args={"seconds": 2.0})
    assert suite.parse_action("terminal: ls -la | grep x:y") == ToolCall(name="terminal",
                                                                          args={"command": "ls -la | grep x:y"})
    assert suite.parse_action("editor_open: ~/notes.txt") == ToolCall(name="editor_open", args={"path": "~/notes.txt"})
    call = suite.parse_action('{"name": "sheet_set", "args": {"cell": "B7", "value": "=SUM(B2:B6)"}}')
    assert call == ToolCall(name="sheet_set", args={"cell": "B7", "value": "=SUM(B2:B6)"})
    assert suite.null_action() == ToolCall(name="FAIL")


@pytest.mark.parametrize("text, message", [
    ("", "empty action"),
    ("click 12", "unknown action 'click'"),
    ("rm: -rf /", "unknown action 'rm'"),
    ('{"name": "launch_rockets"}', "unknown tool 'launch_rockets'"),
    ('{"name": "_read_file", "args": {"path": "/etc/shadow"}}', "unknown tool '_read_file'"),
    ('{"name": "terminal"}', "terminal: missing argument 'command'"),
    ('{"name": "terminal", "args": {"command": 3}}', "terminal: command must be str, got 3"),
    ('{"name": "sheet_set", "args": {"cell": "A1"}}', "sheet_set: missing argument 'value'"),
    ('{"name": "editor_open", "args": {"path": "x", "mode": "w"}}', "editor_open: unexpected argument 'mode'"),
    ('{"name": "WAIT", "args": {"seconds": true}}', "WAIT: seconds must be a number in [0, 30], got True"),
    ("WAIT: nan", "WAIT: seconds must be a number in [0, 30], got nan"),
    ("WAIT: 1e999", "WAIT: seconds must be in [0, 30], got inf"),
    ('{"name": "sheet_set", "args": {"cell": "A1", "value": 1e999}}', "of plain values (strings, numbers, booleans, at most 64-bit): Number out of range"),
    ('{"name": "search_files", "args": {"query": "a\\nb"}}', "query must be a non-empty single line"),
    ('{"name": "terminal", "args": []}', "'args' of terminal must be an object"),
    ('{"name": "terminal", "args": {"command": "ls"}, "x": 1}', "only 'name' and 'args'"),
    ("{not json", "not valid JSON"),
    ("terminal:   ", "needs its command"),
    ("WAIT: soon", "WAIT takes a number of seconds"),
    ("sheet_set: A1 3", "sheet_set takes a JSON action"),
])
def test_malformed_actions_are_refused_with_a_clear_message(suite: DesktopSuite, text: str, message: str) -> None:
    with pytest.raises(ActionError) as info:
        suite.parse_action(text)
    assert message in str(info.value)


# -- task files ----------------------------------------------------------------------------------------------------


def test_every_task_file_loads_and_covers_the_templates(suite: DesktopSuite) -> None:
    tasks = suite.tasks()
    assert len(tasks) >= 60 and len({t.id for t in tasks}) == len(tasks)
    by_template: dict[str, int] = {}
    for t in tasks:
        by_template[t.template] = by_template.get(t.template, 0) + 1
        assert t.reference[-1].name == ("FAIL" if t.give_up else "DONE")
        assert Path(t.path).parent.name == t.template
    assert set(by_template) == set(gen.TEMPLATES) and len(by_template) >= 8
    assert sum(t.give_up for t in tasks) == by_template["infeasible"] > 0
    getters, metrics = set(), set()
    for t in tasks:
        ot, _ = suite.load(t.path)
        metrics.update(ot.evaluator.funcs)
        for g in (ot.evaluator.result, ot.evaluator.expected):
            for cfg in (g if isinstance(g, list) else [g] if g else []):
                getters.add(cfg["type"])
    assert getters == {"vm_command_line", "vm_terminal_output", "vm_file", "rule", "list_directory"}
    assert {"exact_match", "check_include_exclude", "compare_text_file", "compare_csv", "compare_table",
            "check_json", "infeasible"} <= metrics


def test_committed_task_files_equal_what_the_generator_makes() -> None:
    made = gen.generate()
    committed = {str(p.relative_to(TASKS_DIR)): p.read_text() for p in TASKS_DIR.glob("*/*.json")}
    assert sorted(committed) == sorted(made), "run: python -m bunshin.envs.desktop.tasks"
    for rel, text in made.items():
        assert committed[rel] == text, f"{rel} drifted from the generator; run python -m bunshin.envs.desktop.tasks"


def test_a_task_file_the_suite_cannot_use_is_refused_with_path_and_field(tmp_path: Path) -> None:
    src = next(TASKS_DIR.glob("json_config/*.json"))
    cases = {
        "no_instruction": (lambda d: d.pop("instruction"), "missing required field `instruction`"),
        "download": (lambda d: d["config"].append({"type": "download", "parameters": {"files": []}}),
                     "downloads from the internet"),
        "setup_type": (lambda d: d["config"].append({"type": "chrome_open_tabs", "parameters": {}}),
                       "'chrome_open_tabs' is not supported"),
        "launch": (lambda d: d["config"].__setitem__(1, {"type": "launch", "parameters": {"command": ["gimp"]}}),
                   "launches 'gimp'"),
        "getter": (lambda d: d["evaluator"]["result"].__setitem__("type", "cloud_file"),
                   "evaluator.result[0].type 'cloud_file' is not supported"),
        "metric": (lambda d: d["evaluator"].__setitem__("func", "compare_docx_files"), "compare_docx_files"),
        "reference": (lambda d: d.__setitem__("bunshin_reference", [{"name": "terminal", "args": {}}]),
                      "bunshin_reference: terminal: missing argument 'command'"),
        "unfinished": (lambda d: d["bunshin_reference"].pop(), "must end with DONE or FAIL"),
    }
    for name, (mutate, message) in cases.items():
        data = json.loads(src.read_text())
        mutate(data)
        (tmp_path / name / "json_config").mkdir(parents=True)
        path = tmp_path / name / "json_config" / "task.json"
        path.write_text(json.dumps(data))
        with pytest.raises(TaskFileError) as info:
            DesktopSuite(tasks_dir=tmp_path / name, cache_mb=8).tasks()
        assert message in str(info.value) and str(path) in str(info.value), name


def test_the_registry_makes_the_desktop_suite_with_its_knobs() -> None:
    from bunshin.envs.suites.registry import get_suite

    suite = get_suite("desktop", cache_mb=8, recording_frames=0, time_scale=0.5)
    assert isinstance(suite, DesktopSuite) and len(suite.tasks()) >= 60
    assert suite.app().kwargs == {"cache_mb": 8, "recording_frames": 0, "time_scale": 0.5}
    with pytest.raises(ValueError):
        DesktopSuite(cache_mb=-1)
    with pytest.raises(TypeError):
        DesktopSuite(no_such_knob=1)


@pytest.mark.parametrize("formula, shown", [
    ("=9^9^9", "#NUM!"), ("=10^5000", "#NUM!"), ("=2^0.5", "1.414213562"), ("=ROUND(2.5, 1000000000)", "2.5"),
    ("=1000000000000000*1000000000000000", "1e+30"),
])
def test_formulas_never_hang_or_break_formatting(formula: str, shown: str) -> None:
    from bunshin.envs.desktop.spreadsheet import Sheet, format_value

    sheet = Sheet.from_csv("", "x")
    sheet.set("A1", formula)
    assert format_value(sheet.value("A1")) == shown
    assert "A1" in sheet.to_csv() or sheet.to_csv()  # saving works too
