"""Reading the desktop's text observations: what the editor, the spreadsheet and the terminal showed, and the edits
a reader makes to what it read (a JSON key, an INI value, a line of a letter).

Owns: parsing one observation (an ``opened PATH (...)`` header followed by the document, a CSV table, a directory
listing, the last number a command printed), the text edits computed on what was read (each with the text it
predicts, so the policy can read the buffer back and check), and the shell spelling of a path under ``~``.
Must never: read anything but the observation texts given to it (no files, no task data), or run anything.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from dataclasses import dataclass

from bunshin.envs.desktop.spreadsheet import col_letters

_OPENED = re.compile(r"^opened (\S+) \(([^)]*)\)$")
_INT = re.compile(r"-?\d+")


def failed(obs: str | None) -> bool:
    """Whether the step that answered ``obs`` failed (the suite prefixes a failure with ``ERROR:``)."""
    return obs is None or obs.startswith("ERROR:")


def opened(obs: str | None) -> tuple[str, str, str] | None:
    """(path, the header's counts, the document text) of an ``editor_open`` / ``sheet_open`` observation."""
    if failed(obs):
        return None
    head, _, body = obs.partition("\n")
    m = _OPENED.match(head)
    return (m.group(1), m.group(2), body) if m else None


def document(obs: str | None) -> str | None:
    """The text an ``editor_open`` showed; None if it showed no file (an error, or a new empty buffer)."""
    got = opened(obs)
    if got is None or got[1] == "1 lines" and not got[2]:
        return None
    return got[2]


def table(obs: str | None) -> list[list[str]] | None:
    """The rows a ``sheet_open`` showed (CSV); None if it showed no sheet or an empty one."""
    got = opened(obs)
    if got is None or got[1].startswith("0 rows"):
        return None
    return [row for row in csv.reader(io.StringIO(got[2]))]


def column_letter(index: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA (the spreadsheet convention, as the desktop's sheets name columns)."""
    return col_letters(index)


def find_column(header: list[str], name: str) -> int | None:
    """The index of the header cell named ``name`` (case and spaces ignored)."""
    want = name.strip().lower()
    for i, cell in enumerate(header):
        if cell.strip().lower() == want:
            return i
    return None


def last_row_with(rows: list[list[str]], col: int) -> int:
    """The 1-based number of the last row with a value in column ``col`` (the header is row 1)."""
    last = 1
    for r, row in enumerate(rows, start=1):
        if col < len(row) and row[col].strip():
            last = r
    return last


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def listing(obs: str | None) -> list[str] | None:
    """Names an ``ls -Ap`` printed, one a line (directories end with ``/``)."""
    if failed(obs):
        return None
    return [line for line in obs.splitlines() if line.strip()]


def last_int(obs: str | None) -> str | None:
    """The last integer a command printed (a count, a sum), as printed."""
    if failed(obs):
        return None
    found = _INT.findall(obs)
    return found[-1] if found else None


def shell_path(path: str) -> str:
    """``path`` for the shell: ``~/`` stays unquoted (so it expands), the rest is quoted."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


# -- edits ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edit:
    """One editor action and the text the reader expects the buffer to hold after it."""

    action: str
    after: str


def call(name: str, **args: object) -> str:
    """A tool call in the suite's JSON action form."""
    return json.dumps({"name": name, "args": args})


def unique_find(text: str, index: int) -> tuple[str, int, int]:
    """The smallest run of whole lines around line ``index`` (0-based) that occurs once in ``text``: (the run,
    first line, last line). The editor replaces text, so an edit of one line names enough context to be unique."""
    lines = text.split("\n")
    lo = hi = index
    while True:
        run = "\n".join(lines[lo:hi + 1])
        if text.count(run) == 1 or (lo == 0 and hi == len(lines) - 1):
            return run, lo, hi
        lo, hi = max(lo - 1, 0), min(hi + 1, len(lines) - 1)


def replace_line(text: str, index: int, new: str) -> Edit:
    """Replace line ``index`` (0-based) of ``text`` with ``new``, naming a unique run of lines around it."""
    lines = text.split("\n")
    run, lo, hi = unique_find(text, index)
    changed = lines[lo:index] + [new] + lines[index + 1:hi + 1]
    after = "\n".join(lines[:index] + [new] + lines[index + 1:])
    return Edit(call("editor_replace", find=run, replace="\n".join(changed), count=1), after)


def json_value_edit(text: str, key: str, value: object, parent_hint: str | None = None) -> Edit | None:
    """Set ``key`` to ``value`` in the JSON ``text`` by rewriting the line that holds the key (the file keeps its
    layout). With several lines naming the key, the one inside an object whose name contains ``parent_hint``
    ("features" for a feature) is taken. None when no line holds the key."""
    lines = text.split("\n")
    stack: list[str] = []
    found: list[tuple[int, str]] = []
    key_re = re.compile(r'^(\s*)"((?:[^"\\]|\\.)*)"\s*:\s*(.*?)(,?)\s*$')
    for i, line in enumerate(lines):
        m = key_re.match(line)
        if m and m.group(3) not in ("{", "["):
            if json.loads(f'"{m.group(2)}"') == key:
                found.append((i, "/".join(stack)))
        elif m:
            stack.append(json.loads(f'"{m.group(2)}"'))
        elif line.strip().startswith(("}", "]")) and stack:
            stack.pop()
    if parent_hint is not None:
        hinted = [f for f in found if parent_hint in f[1]]
        found = hinted or found
    if not found:
        return None
    index = found[0][0]
    m = key_re.match(lines[index])
    assert m is not None
    new = f'{m.group(1)}"{m.group(2)}": {json.dumps(value)}{m.group(4)}'
    return replace_line(text, index, new)


def ini_value_edit(text: str, section: str, key: str, value: str) -> Edit | None:
    """Set ``key`` in ``[section]`` of the INI ``text`` to ``value``: its line rewritten (the separator kept), or
    a new ``key = value`` line at the end of the section. None when there is no such section."""
    lines = text.split("\n")
    current, start, end = None, None, None
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("[") and s.endswith("]"):
            current = s[1:-1].strip()
            if current == section:
                start = i
            elif start is not None and end is None:
                end = i
            continue
        if current == section:
            m = re.match(r"^(\s*([^=:#;\s][^=:]*?)\s*[=:]\s*)(.*)$", line)
            if m and m.group(2).strip().lower() == key.lower():
                return replace_line(text, i, m.group(1) + value)
    if start is None:
        return None
    end = len(lines) if end is None else end
    at = end
    while at - 1 > start and not lines[at - 1].strip():
        at -= 1
    after = "\n".join(lines[:at] + [f"{key} = {value}"] + lines[at:])
    return Edit(call("editor_insert", line=at + 1, text=f"{key} = {value}"), after)


def delete_line_edits(text: str, wanted: str) -> list[Edit]:
    """Delete every line that reads ``wanted`` (spaces around ignored), from the bottom up so line numbers hold."""
    lines = text.split("\n")
    edits = []
    for i in reversed([i for i, line in enumerate(lines) if line.strip() == wanted.strip()]):
        del lines[i]
        edits.append(Edit(call("editor_delete_lines", start=i + 1, end=i + 1), "\n".join(lines)))
    return edits
