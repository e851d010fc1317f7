"""The desktop's agent tools, written once: the terminal, the editor, the spreadsheet, file search and OSWorld's
special actions as msgspec Structs.

Owns: ``SCHEMA``, what each tool is called, takes (arguments, types, defaults, ranges) and does (the docstrings are
the descriptions a model reads). The suite's action language (``suite.py``: JSON calls, ``terminal: ls``, ``WAIT``)
and its reference checks, the desktop application (``app.py``, which decodes every agent call through it) and the
OpenAI policy's function definitions and prompt are all derived from it. ``FINAL``: ``DONE`` and ``FAIL`` end the
episode; the suite scores them, the application never runs them.
Must never: list the application's internal tools (``_exec``, ``_read_file``...: the suite's, not the agent's), or
decide what a path may name (``files.resolve_user_path`` does, in the workspace).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta
from msgspec.structs import force_setattr

from ..suites.tools import MAX_INT, ToolArgs, ToolSchema

FilePath = Annotated[str, Meta(min_length=1, description="A file under the home directory or /tmp: absolute, "
                                                         "relative to the home directory, or starting with ~/.")]
OpenFile = Annotated[str | None, Meta(description="Which open file to act on (as it was opened); null: the active "
                                                  "one.")]
SaveAs = Annotated[str | None, Meta(description="Save as this file instead (then the window edits it); null: save "
                                                "the file itself.")]
LineNumber = Annotated[int, Meta(ge=1, le=MAX_INT, description="A line number, from 1.")]
Count = Annotated[int, Meta(ge=1, le=MAX_INT)]


class TerminalArgs(ToolArgs, kw_only=True):
    """Run a shell command in the terminal, as the user, in the terminal's current directory (cd persists); the
    observation's output is the command's output."""

    command: Annotated[str, Meta(description="The shell command line.")]
    timeout_s: Annotated[float, Meta(gt=0, le=300, description="Stop the command after this many seconds.")] = 30.0


class OnOpenFileArgs(ToolArgs, kw_only=True):
    """(A base: the tools whose only argument is which open document they act on, the active one by default.)"""

    path: OpenFile = None


class SaveAsArgs(ToolArgs, kw_only=True):
    """(A base: the save tools, which save the active document, or save it as ``path``.)"""

    path: SaveAs = None


class EditorOpenArgs(ToolArgs, kw_only=True):
    """Open a text file in the editor (an empty buffer if the file does not exist yet); it becomes the active
    file."""

    path: FilePath


class EditorReplaceArgs(ToolArgs, kw_only=True):
    """Replace occurrences of a text in the active file, or in the open file at path (unsaved until editor_save)."""

    find: Annotated[str, Meta(min_length=1, description="The text to find (may span lines).")]
    replace: Annotated[str, Meta(description="What replaces it.")]
    count: Annotated[Count | None, Meta(description="Replace at most this many occurrences; null: all.")] = None
    path: OpenFile = None


class EditorInsertArgs(ToolArgs, kw_only=True):
    """Insert text (it may hold several lines) before a line of the active file, or of the open file at path; one
    past the last line appends."""

    line: LineNumber
    text: Annotated[str, Meta(description="The text to insert.")]
    path: OpenFile = None


class EditorDeleteLinesArgs(ToolArgs, kw_only=True):
    """Delete the lines start to end (both included) of the active file, or of the open file at path."""

    start: LineNumber
    end: Annotated[LineNumber | None, Meta(description="The last line to delete; null: start (one line).")] = None
    path: OpenFile = None

    def __post_init__(self) -> None:
        if self.end is None:
            force_setattr(self, "end", self.start)  # one spelling per call: the default written out


class EditorUndoArgs(OnOpenFileArgs, kw_only=True):
    """Undo the last edit of the active file, or of the open file at path."""


class EditorSaveArgs(SaveAsArgs, kw_only=True):
    """Save the active file; with path, save it as that file (the window then edits the new file)."""


class EditorCloseArgs(OnOpenFileArgs, kw_only=True):
    """Close the active file, or the open file at path, discarding unsaved edits."""


class SheetOpenArgs(ToolArgs, kw_only=True):
    """Open a CSV file in the spreadsheet (an empty sheet if the file does not exist yet); it becomes the active
    sheet."""

    path: FilePath


class SheetSetArgs(ToolArgs, kw_only=True):
    """Set a cell of the active sheet (or of the open sheet at path) to a value, or to a formula starting with =
    (=SUM(B2:B6), =A2*3, =ROUND(x, 2); SUM, AVERAGE, MIN, MAX, COUNT, ROUND, ABS)."""

    cell: Annotated[str, Meta(description="The cell's name, like B7.")]
    value: Annotated[str | int | float, Meta(description="A number, a text, or a formula starting with =.")]
    path: OpenFile = None


class SheetGetArgs(ToolArgs, kw_only=True):
    """Read a cell of the active sheet, or of the open sheet at path: its computed value (the observation's data
    also has what was typed)."""

    cell: Annotated[str, Meta(description="The cell's name, like B7.")]
    path: OpenFile = None


class SheetSaveArgs(SaveAsArgs, kw_only=True):
    """Save the active sheet as CSV (computed values, not formulas); with path, save it as that file."""


class SheetCloseArgs(OnOpenFileArgs, kw_only=True):
    """Close the active sheet, or the open sheet at path, discarding unsaved changes."""


class SearchFilesArgs(ToolArgs, kw_only=True):
    """Search the session's file index (like locate) for paths that contain the query; at most 50 paths."""

    query: Annotated[str, Meta(min_length=1, description="Part of a path, on one line.")]

    def __post_init__(self) -> None:
        if "\n" in self.query:
            raise ValueError("query must be a non-empty single line")


class WaitArgs(ToolArgs, kw_only=True):
    """Wait, doing nothing (for something running to finish)."""

    seconds: Annotated[float, Meta(ge=0, le=30, description="How long to wait.")] = 1.0


class DoneArgs(ToolArgs, kw_only=True):
    """The task is complete: end the episode."""


class FailArgs(ToolArgs, kw_only=True):
    """The task cannot be done: end the episode, giving up."""


SCHEMA = ToolSchema({
    "terminal": TerminalArgs,
    "editor_open": EditorOpenArgs,
    "editor_replace": EditorReplaceArgs,
    "editor_insert": EditorInsertArgs,
    "editor_delete_lines": EditorDeleteLinesArgs,
    "editor_undo": EditorUndoArgs,
    "editor_save": EditorSaveArgs,
    "editor_close": EditorCloseArgs,
    "sheet_open": SheetOpenArgs,
    "sheet_set": SheetSetArgs,
    "sheet_get": SheetGetArgs,
    "sheet_save": SheetSaveArgs,
    "sheet_close": SheetCloseArgs,
    "search_files": SearchFilesArgs,
    "WAIT": WaitArgs,
    "DONE": DoneArgs,
    "FAIL": FailArgs,
})
FINAL = frozenset({"DONE", "FAIL"})
