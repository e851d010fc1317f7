"""The desktop's text editor: open buffers (one per file), unsaved edits, an undo history, save and save-as.

Owns: ``Buffer`` (the lines of one file, its path, whether it has unsaved edits, its undo stack of earlier line
lists bounded by ``undo_depth``) and the edit operations the tools expose (replace, insert, delete lines, undo).
Reading and writing files is the app's job (it checks paths); a buffer only holds text.
Must never: change a buffer when an edit is refused (``ValueError`` with what is wrong).
"""

from __future__ import annotations


class Buffer:
    def __init__(self, path: str, text: str, undo_depth: int = 1000):
        self.path = path
        self.lines: list[str] = text.split("\n")
        self.modified = False
        self.undo: list[list[str]] = []  # earlier versions, newest last: the editor's undo history
        self.undo_depth = undo_depth

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def _remember(self) -> None:
        if self.undo_depth <= 0:
            return
        self.undo.append(list(self.lines))
        if len(self.undo) > self.undo_depth:
            del self.undo[0]

    def replace(self, find: str, replace: str, count: int | None = None) -> int:
        if not find:
            raise ValueError("'find' must be a non-empty string")
        text = self.text
        found = text.count(find)
        if found == 0:
            raise ValueError(f"{find!r} does not occur in {self.path}")
        n = found if count is None else min(count, found)
        self._remember()
        self.lines = text.replace(find, replace, n).split("\n")
        self.modified = True
        return n

    def insert(self, line: int, text: str) -> None:
        """Insert ``text`` (may hold newlines) before line ``line`` (1-based; one past the end appends)."""
        if not 1 <= line <= len(self.lines) + 1:
            raise ValueError(f"line must be in 1..{len(self.lines) + 1}, got {line}")
        self._remember()
        self.lines[line - 1:line - 1] = text.split("\n")
        self.modified = True

    def delete_lines(self, start: int, end: int) -> int:
        if not 1 <= start <= end <= len(self.lines):
            raise ValueError(f"lines {start}..{end} are not within 1..{len(self.lines)}")
        self._remember()
        del self.lines[start - 1:end]
        if not self.lines:
            self.lines = [""]
        self.modified = True
        return end - start + 1

    def undo_last(self) -> None:
        if not self.undo:
            raise ValueError("nothing to undo")
        self.lines = self.undo.pop()
        self.modified = True
