"""OSWorld task files (``evaluation_examples/examples/<domain>/<uuid>.json``) and the metrics the embedded desktop
uses, named as OSWorld names them.

Owns: decoding a task file into a typed ``OSWorldTask`` (fields we do not use are accepted), refusing a task whose
setup step, getter or metric the embedded desktop lacks (or that downloads from the internet) with its path and the
field named, and the metrics: ``exact_match``, ``check_include_exclude``, ``compare_text_file``, ``compare_csv``,
``check_json``, ``infeasible``. Getters read the workspace and live with the desktop.
Must never: score a task it cannot evaluate as 0 silently.
"""

from __future__ import annotations

import csv
import json
import operator
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .webarena import TaskFileError, decode_task_file

SETUP_TYPES = frozenset({"execute", "command", "sleep", "open", "launch"})
GETTER_TYPES = frozenset({"vm_command_line", "vm_terminal_output", "vm_file", "rule", "list_directory"})
# Programs a ``launch`` step may start on the embedded desktop (files open in its editor or spreadsheet).
EDITOR_PROGRAMS = frozenset({"gedit", "xed", "code", "mousepad", "kate", "nano", "vim", "vi", "gnome-text-editor"})
SHEET_PROGRAMS = frozenset({"libreoffice", "soffice", "localc"})
TERMINAL_PROGRAMS = frozenset({"gnome-terminal", "xterm", "x-terminal-emulator", "bash", "sh"})
LAUNCH_PROGRAMS = EDITOR_PROGRAMS | SHEET_PROGRAMS | TERMINAL_PROGRAMS
# Commands a setup step or a ``vm_command_line`` getter may not use: the desktop's user has no root and no real
# GUI session (OSWorld's VM user runs ``echo password | sudo -S ...``, gsettings, xdotool, pyautogui).
MISSING_PROGRAMS = ("sudo", "su", "apt", "apt-get", "dpkg", "snap", "gsettings", "dconf", "xdotool", "xdg-open",
                    "xdg-settings", "xdg-mime", "update-alternatives", "systemctl", "dbus-send", "pactl", "amixer",
                    "gnome-extensions", "pyautogui")
_MISSING_RE = re.compile(r"(?:^|[\s;|&(`'\"])(" + "|".join(re.escape(p) for p in MISSING_PROGRAMS) + r")(?=$|[\s;|&)`'\".])")
# OSWorld's boilerplate focus click (``python -c "import pyautogui; import time; pyautogui.click(960, 540);
# time.sleep(0.5);"``): on the embedded desktop there is nothing to focus, so the step is a no-op.
_GUI_NOOP_RE = re.compile(r"^\s*(import pyautogui|import time|pyautogui\.(click|moveTo)\([0-9, .]*\)|"
                          r"time\.sleep\([0-9.]*\))\s*$")


class SetupStep(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    parameters: dict[str, Any] = {}


class Evaluator(msgspec.Struct, frozen=True, kw_only=True):
    func: str | list[str]
    result: dict[str, Any] | list[dict[str, Any]] | None = None
    expected: dict[str, Any] | list[dict[str, Any]] | None = None
    options: dict[str, Any] | list[dict[str, Any]] = {}
    postconfig: list[SetupStep] = []
    conj: str = "and"

    @property
    def funcs(self) -> list[str]:
        return [self.func] if isinstance(self.func, str) else list(self.func)


class OSWorldTask(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    instruction: str
    evaluator: Evaluator
    snapshot: str = ""
    config: list[SetupStep] = []
    related_apps: list[str] = []

    @property
    def infeasible(self) -> bool:
        return self.evaluator.funcs == ["infeasible"]


_decoder = msgspec.json.Decoder(OSWorldTask)


def load_task(path: str | Path) -> OSWorldTask:
    task = decode_task_file(path, _decoder)
    check_supported(task, path)
    return task


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def check_supported(task: OSWorldTask, path: str | Path) -> None:
    for where, steps in (("config", task.config), ("evaluator.postconfig", task.evaluator.postconfig)):
        for i, step in enumerate(steps):
            if step.type == "download":
                raise TaskFileError(path, f"{where}[{i}] downloads from the internet, which the embedded desktop "
                                          "cannot do")
            if step.type not in SETUP_TYPES:
                raise TaskFileError(path, f"{where}[{i}].type {step.type!r} is not supported (known: "
                                          f"{sorted(SETUP_TYPES)})")
            _check_step_parameters(step, f"{where}[{i}]", path)
    ev = task.evaluator
    unknown = [f for f in ev.funcs if f not in METRICS]
    if unknown:
        raise TaskFileError(path, f"evaluator.func {unknown} not supported (known: {sorted(METRICS)})")
    if ev.conj not in ("and", "or"):
        raise TaskFileError(path, f"evaluator.conj {ev.conj!r} must be 'and' or 'or'")
    options = ev.options if isinstance(ev.options, list) else [ev.options] * len(ev.funcs)
    for i, (name, opts) in enumerate(zip(ev.funcs, options, strict=False)):
        where = f"evaluator.options[{i}]" if isinstance(ev.options, list) else "evaluator.options"
        extra = sorted(set(opts or {}) - METRIC_OPTIONS[name])
        if extra:
            raise TaskFileError(path, f"{where} {extra} not supported by {name} (it takes: "
                                      f"{sorted(METRIC_OPTIONS[name]) or 'no options'})")
        if name == "check_json" and (opts or {}).get("is_yaml"):
            raise TaskFileError(path, f"{where}.is_yaml: YAML files are not supported (no YAML parser here)")
    if task.infeasible:
        return
    results, expected = _as_list(ev.result), _as_list(ev.expected)
    if len(results) != len(ev.funcs):
        raise TaskFileError(path, f"evaluator.result has {len(results)} getter(s) for {len(ev.funcs)} func(s)")
    for name, getters in (("result", results), ("expected", expected)):
        for i, getter in enumerate(getters):
            kind = getter.get("type") if isinstance(getter, dict) else None
            if kind not in GETTER_TYPES:
                raise TaskFileError(path, f"evaluator.{name}[{i}].type {kind!r} is not supported (known: "
                                          f"{sorted(GETTER_TYPES)})")
            if name == "expected" and kind == "rule" and i < len(ev.funcs) and ev.funcs[i] == "check_json":
                _check_json_rules(getter.get("rules"), f"evaluator.expected[{i}].rules", path)
            if kind == "vm_command_line" and (prog := missing_program(getter.get("command"))):
                raise TaskFileError(path, f"evaluator.{name}[{i}].command needs {prog!r}, which the embedded "
                                          "desktop lacks (its user has no root and no GUI session)")


def _check_json_rules(rules: Any, where: str, path: str | Path) -> None:
    if not isinstance(rules, dict):
        raise TaskFileError(path, f"{where} must be an object with 'expect' and/or 'unexpect' lists")
    for group in ("expect", "unexpect"):
        for j, rule in enumerate(rules.get(group, [])):
            if not isinstance(rule, dict) or not isinstance(rule.get("key"), list) or "method" not in rule:
                raise TaskFileError(path, f"{where}.{group}[{j}] needs 'key' (a list) and 'method'")
            if not json_method_supported(rule["method"]):
                raise TaskFileError(path, f"{where}.{group}[{j}].method {rule['method']!r} is not supported "
                                          f"(known: {sorted(JSON_METHODS)}, re[.FLAGS])")


def gui_noop(command: Any) -> bool:
    """Whether ``command`` is OSWorld's focus click (pyautogui click/move/sleep only), a no-op on this desktop."""
    if not (isinstance(command, list) and len(command) == 3 and command[0] in ("python", "python3")
            and command[1] == "-c" and isinstance(command[2], str)):
        return False
    statements = [x for x in re.split(r"[;\n]", command[2]) if x.strip()]
    return bool(statements) and all(_GUI_NOOP_RE.match(x) for x in statements)


def missing_program(command: Any) -> str | None:
    """The first program of ``MISSING_PROGRAMS`` that ``command`` (string or argv) runs, if any."""
    text = command if isinstance(command, str) else " ".join(str(c) for c in command or [])
    m = _MISSING_RE.search(text)
    return m.group(1) if m else None


def _check_step_parameters(step: SetupStep, where: str, path: str | Path) -> None:
    params = step.parameters
    if step.type in ("execute", "command", "launch"):
        command = params.get("command")
        ok = isinstance(command, str) and command.strip() or (
            isinstance(command, list) and command and all(isinstance(c, str) for c in command))
        if not ok:
            raise TaskFileError(path, f"{where}.parameters.command must be a non-empty string or list of strings")
        if step.type != "launch" and not gui_noop(command) and (prog := missing_program(command)):
            raise TaskFileError(path, f"{where}.parameters.command needs {prog!r}, which the embedded desktop "
                                      "lacks (its user has no root and no GUI session)")
        if step.type == "launch":
            program = (command.split() if isinstance(command, str) else command)[0].rsplit("/", 1)[-1]
            if program not in LAUNCH_PROGRAMS:
                raise TaskFileError(path, f"{where}.parameters.command launches {program!r}, which the embedded "
                                          f"desktop lacks (known: {sorted(LAUNCH_PROGRAMS)})")
    elif step.type == "open" and not isinstance(params.get("path"), str):
        raise TaskFileError(path, f"{where}.parameters.path must be a string")
    elif step.type == "sleep" and not isinstance(params.get("seconds", 1), int | float):
        raise TaskFileError(path, f"{where}.parameters.seconds must be a number")


# -- metrics ----------------------------------------------------------------------------------------------------------


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return float(result == rules["expected"])


def check_include_exclude(result: str, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    return float(all(s in result for s in rules.get("include", []))
                 and not any(s in result for s in rules.get("exclude", [])))


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def compare_text_file(result_path: str | None, expected_path: str | None, ignore_blanks: bool = False,
                      ignore_case: bool = False) -> float:
    got, want = _read(result_path), _read(expected_path)
    if got is None or want is None:
        return 0.0
    if ignore_blanks:
        got, want = " ".join(got.split()), " ".join(want.split())
    if ignore_case:
        got, want = got.lower(), want.lower()
    return float(got == want)


def compare_csv(result_path: str | None, expected_path: str | None, strict: bool = True,
                ignore_case: bool = False) -> float:
    """OSWorld's compare_csv: the files' lines, exactly (``strict=False`` strips each line first)."""
    got, want = _read(result_path), _read(expected_path)
    if got is None or want is None:
        return 0.0
    got_lines, want_lines = got.splitlines(), want.splitlines()
    if not strict:
        got_lines, want_lines = [x.strip() for x in got_lines], [x.strip() for x in want_lines]
    if ignore_case:
        got_lines, want_lines = [x.lower() for x in got_lines], [x.lower() for x in want_lines]
    return float(got_lines == want_lines)


def _cell(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text.strip()


def compare_table(result_path: str | None, expected_path: str | None) -> float:
    """OSWorld's compare_table with its default rule (the sheets' data equal, as pandas compares them), for the
    desktop's CSV sheets: cell by cell, numbers by value (``12.5`` equals ``12.50``), text stripped. OSWorld's
    ``rules`` option (formatting, charts, pivot tables of xlsx files) is refused when a task file is loaded."""
    got, want = _read(result_path), _read(expected_path)
    if got is None or want is None:
        return 0.0
    try:
        rows = lambda text: [[_cell(c) for c in row] for row in csv.reader(text.splitlines()) if row]  # noqa: E731
        return float(rows(got) == rows(want))
    except csv.Error:  # not a CSV file (a field too large, a NUL byte): not the expected table
        return 0.0


def _dig(data: Any, keys: list[Any]) -> tuple[bool, Any]:
    for key in keys:
        if (isinstance(data, dict) and key in data) or \
                (isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data)):
            data = data[key]
        else:
            return False, None
    return True, data


JSON_METHODS = frozenset({"eq", "ne", "le", "lt", "ge", "gt", "str_list_eq", "str_set_eq"})
RE_FLAGS = frozenset({"I", "M", "S", "X", "A", "IGNORECASE", "MULTILINE", "DOTALL", "VERBOSE", "ASCII"})


def json_method_supported(method: Any) -> bool:
    if not isinstance(method, str):
        return False
    head, *flags = method.split(".")
    return method in JSON_METHODS or (head == "re" and all(f in RE_FLAGS for f in flags))


def _match_rule(value: Any, rule: dict[str, Any]) -> bool:
    """OSWorld's ``_match_value_to_rule`` for the methods the desktop supports (``JSON_METHODS``, ``re[.FLAGS]``)."""
    method, ref = rule["method"], rule.get("ref")
    if method == "re" or method.startswith("re."):
        flags = 0
        for name in method.split(".")[1:]:
            flags |= getattr(re, name)
        return isinstance(value, str) and re.search(ref, value, flags) is not None
    if method in ("eq", "ne", "le", "lt", "ge", "gt"):
        return bool(getattr(operator, method)(value, ref))
    if method == "str_list_eq":
        return isinstance(value, str) and value.split(",") == ref
    if method == "str_set_eq":
        return isinstance(value, str) and set(value.split(",")) == set(ref)
    raise ValueError(f"check_json: method {method!r} is not supported")  # load_task refuses these first


def check_json(result_path: str | None, rules: dict[str, Any], is_yaml: bool = False) -> float:
    """OSWorld's check_json: every ``expect`` rule holds and no ``unexpect`` rule does. A rule is
    ``{"key": [path...], "method": ..., "ref": value}``; a missing key fails the whole check, as in OSWorld."""
    text = _read(result_path)
    if text is None or is_yaml:  # YAML is refused when the task file is loaded
        return 0.0
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than any real config
        return 0.0
    ok = True
    for expect, group in ((True, rules.get("expect", [])), (False, rules.get("unexpect", []))):
        for rule in group:
            found, value = _dig(data, rule["key"])
            if not found:
                return 0.0
            try:
                ok = ok and _match_rule(value, rule) == expect
            except TypeError:  # comparing what the agent wrote with a reference of another type
                return 0.0
    return float(ok)


def infeasible(*_: Any, **__: Any) -> float:
    """Scored by the harness: 1 when the agent's last action is FAIL (OSWorld's convention)."""
    raise RuntimeError("infeasible is scored from the agent's last action, not by a metric call")


METRICS: dict[str, Callable[..., float]] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "compare_text_file": compare_text_file,
    "compare_csv": compare_csv,
    "compare_table": compare_table,
    "check_json": check_json,
    "infeasible": infeasible,
}


METRIC_OPTIONS: dict[str, frozenset[str]] = {
    "exact_match": frozenset(), "check_include_exclude": frozenset(),
    "compare_text_file": frozenset({"ignore_blanks", "ignore_case"}),
    "compare_csv": frozenset({"strict", "ignore_case"}), "compare_table": frozenset(),
    "check_json": frozenset({"is_yaml"}), "infeasible": frozenset(),
}
if set(METRIC_OPTIONS) != set(METRICS):  # every metric we run says which OSWorld options it implements
    raise ImportError(f"METRIC_OPTIONS and METRICS disagree: {sorted(set(METRIC_OPTIONS) ^ set(METRICS))}")


def combine(scores: list[float], conj: str) -> float:
    """OSWorld's conjunction of several metrics: all of them (``and``, the product) or any (``or``, the max)."""
    if not scores:
        return 0.0
    if conj == "or":
        return max(scores)
    product = 1.0
    for s in scores:
        product *= s
    return product


def score_infeasible(last_action: str) -> float:
    return float(last_action.strip().upper() == "FAIL")
