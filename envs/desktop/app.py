"""The embedded desktop (OSWorld stand-in) as a workspace application: a home directory with task files, a terminal,
a text editor and a spreadsheet with live in-memory state, and a rendered 1920x1080 screen.

Owns: the agent's tools (``tools.SCHEMA``: their arguments are decoded through it, a call that does not fit is a
``ToolError`` naming the tool and the argument; ``DONE``/``FAIL`` end the episode and are handled by the suite,
never executed here), the internal tools the suite uses for setup and evaluation (names starting with ``_``;
``DesktopSuite.parse_action`` never produces them), windows and observations, and the per-step private state
(window textures, scrollback, undo history). The shared warmed-up session cache is ``session_cache.py``; how files
are read and written for the agent and the grader (never through a symlink, never a FIFO, only what the agent may
open) is ``files.py``.

The terminal runs commands as the agent user (uid 65000) in its current directory (``cd`` persists), output
appended to the scrollback; the observation's output is the command's output. Edits act on the active buffer or
sheet (the last opened or saved) unless a ``path`` names another open one.

Every agent tool's observation carries ``data["a11y"]`` (an accessibility-tree-like text of the open windows) and
``data["screenshot"]`` (PNG, 1920x1080) unless ``screenshots=False``.

Paths given to the editor and the spreadsheet are relative to the home directory (``~/`` too) and must resolve
inside ``/home/agent`` or ``/tmp``: the host reads and writes as root, so this is what keeps ``/var/lib/desktop``
(the task's private expected files, mode 0700) out of the agent's reach (``files.resolve_user_path``). Files are
never kept open (a fork needs no re-opening).

Knobs (``DesktopApp(...)`` keyword arguments) and their defaults:

- ``cache_mb=48``: size of the session cache in a ``HugeHeap`` (anonymous THP memory, built in ``setup()``,
  identical in every workspace, only read afterwards so forks keep sharing it): the file-search index of
  ``index_roots`` (paths, like locate's database, ~10 MiB for Debian's /usr), a glyph cache (ASCII glyph masks of
  the UI font at 16 sizes, rendered with Pillow) and an icon cache (128x128 RGBA icons) filling the rest.
  The cache never shrinks below index + glyphs. Measured host RSS after setup: ~218 MiB at 128 (PSS ~207),
  ~282 MiB at 192; building it takes ~3 s (walking /usr is most of it). The default, 48, is calibrated with
  ``bunshin bench sharing --suite desktop`` (docs/suites.md): the screens a desktop renders are mostly flat colour,
  identical by content between samples, so what separates two samples is text and app state, and a larger
  shared cache would hold the identical fraction above the seed's 0.5-0.7 after ten steps.
- ``index_roots=("/usr",)``: what the file-search index covers (tests pass a small directory to start faster).
- ``window_w=1100, window_h=700``: size of each window's RGBA texture (3 MiB at the default), re-rendered whenever
  the window changes: each step that changes a window allocates a fresh private texture.
- ``scrollback_lines=10000``: terminal scrollback kept; ``undo_depth=1000``: editor undo steps kept per buffer
  (each a full copy of the buffer's lines).
- ``screenshots=True``: every agent tool's observation carries a PNG screenshot (``png_level=1``: zlib level).
- ``time_scale=1.0``: the tool latency OSWorld's desktop has (``envs/latency.py``, profile ``DESKTOP``): after an
  editor, spreadsheet or search action the host waits the modelled action time plus OSWorld's pause, before the
  screenshot; a ``terminal`` command keeps its real time and ``WAIT`` its own seconds (no added wait); internal tools
  never wait. Times this scale; 0: no added latency. The chain it is drawn from is in the state image.
- ``virtual_clock=True``: the terminal's Python programs read the workspace's virtual clock (``envs/virtual_clock.py``:
  a fixed start, a second per agent call plus what ``WAIT`` waited; in a program one microsecond per read plus
  what it slept), so the project's test runs print the same duration whenever they run the same code and the
  prefix cache can serve them. False: they read the real clock.
- ``recording_frames=16``: the screen recorder (OSWorld records every episode) keeps the last N composited frames
  raw (1920x1080 RGB, 6 MiB each), one per agent step: the main private growth of a sample's first steps.

Measured with the defaults (``bunshin bench sharing --suite desktop --steps 10``, BENCHMARKS.md): a workspace of
~116 MiB after setup, ~157 MiB after ten steps (median over the tasks); two samples of one task are ~0.81 identical
by content and ~0.57 physically shared.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from typing import Any

from .. import state_image
from ..app import AppContext, Tool, ToolError, WorkspaceApp
from ..latency import ToolLatency
from ..records import Observation, ToolCall
from ..runtime.image import AGENT_GID, AGENT_HOME, AGENT_UID
from ..suites.base import ActionError
from ..virtual_clock import VirtualClock
from . import home
from . import tools as agent_tools
from .editor import Buffer
from .files import PRIVATE_DIR, directory_tree, read_bytes, read_text, resolve_user_path, write_text
from .render import Compositor, Window, font
from .session_cache import SessionCache
from .spreadsheet import CellError, FormulaError, Sheet, cell_name, format_value
from .terminal import Terminal

__all__ = ["PRIVATE_DIR", "DesktopApp"]


LATENCY_KIND = {"terminal": "command", "WAIT": "wait"}  # the rest are "action"s: OSWorld's pause after each


def _q(text: str, limit: int = 200) -> str:
    return text[:limit].replace("\\", "\\\\").replace('"', '\\"')


class DesktopApp(WorkspaceApp):
    def __init__(self, cache_mb: float = 48, index_roots: tuple[str, ...] | list[str] = ("/usr",),
                 window_w: int = 1100, window_h: int = 700, scrollback_lines: int = 10_000,
                 undo_depth: int = 1000, screenshots: bool = True, png_level: int = 1, home_files: bool = True,
                 recording_frames: int = 16, time_scale: float = 1.0, virtual_clock: bool = True):
        if cache_mb < 0:
            raise ValueError(f"cache_mb must be >= 0, got {cache_mb}")
        if not (200 <= window_w <= 1800 and 150 <= window_h <= 1000):
            raise ValueError(f"window size {window_w}x{window_h} must fit the 1920x1080 screen")
        self.cache_mb, self.index_roots = cache_mb, tuple(index_roots)
        self.window_w, self.window_h = window_w, window_h
        self.scrollback_lines, self.undo_depth = scrollback_lines, undo_depth
        self.screenshots, self.png_level, self.home_files = screenshots, png_level, home_files
        if recording_frames < 0:
            raise ValueError(f"recording_frames must be >= 0, got {recording_frames}")
        self.recording_frames = recording_frames
        self.latency = ToolLatency("desktop", time_scale)
        if not isinstance(virtual_clock, bool):
            raise ValueError(f"virtual_clock must be true or false, got {virtual_clock!r}")
        self.virtual_clock = virtual_clock
        self.cache: SessionCache | None = None
        self._init_state()

    def _init_state(self) -> None:
        self.terminal = Terminal(self.scrollback_lines)
        self.buffers: dict[str, Buffer] = {}
        self.sheets: dict[str, Sheet] = {}
        self.sheet_modified: dict[str, bool] = {}
        self.order: list[str] = ["terminal"]  # window keys, bottom to top; the last is active
        self.versions: dict[str, int] = {"terminal": 0}
        self.compositor = Compositor(self.window_w, self.window_h)
        self.recording: list[bytes] = []  # the screen recorder's last frames, raw RGB
        self.clock = VirtualClock()

    # -- lifecycle --------------------------------------------------------------------------------------------
    def setup(self, ctx: AppContext) -> None:
        self.ctx = ctx
        if self.home_files:
            for rel, text in sorted(home.base_files().items()):
                path = os.path.join(AGENT_HOME, rel)
                self._mkdirs_as_agent(os.path.dirname(path))
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                os.chown(path, AGENT_UID, AGENT_GID)
        os.makedirs(PRIVATE_DIR, mode=0o700, exist_ok=True)
        os.chmod(PRIVATE_DIR, 0o700)
        if self.virtual_clock:
            VirtualClock.install()
        if not os.path.lexists("/home/user"):  # OSWorld's task files name the user's home /home/user
            os.symlink(AGENT_HOME, "/home/user")
        self._warm_up()

    def _warm_up(self) -> None:
        self.cache = SessionCache(self.cache_mb, self.index_roots)
        font()
        self.compositor.screenshot(self._windows(), self.active, self.png_level)  # background and first textures

    @staticmethod
    def _mkdirs_as_agent(path: str) -> None:
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            os.chown(d, AGENT_UID, AGENT_GID)

    def checkpoint(self) -> list[bytes | memoryview]:
        """The session's image (``state_image``): windows, documents, the warmed-up session cache (its heap out
        of band), the compositor's textures, the screen recording, the latency chain and the virtual clock."""
        return state_image.dump((self.terminal, self.buffers, self.sheets, self.sheet_modified, self.order,
                                 self.versions, self.cache, self.compositor, self.recording, self.latency,
                                 self.clock))

    def restore(self, ctx: AppContext, data: memoryview) -> None:
        """Instead of ``setup``: the session read back from its image into private memory (the cache is not
        rebuilt, the textures not re-rendered)."""
        self.ctx = ctx
        (self.terminal, self.buffers, self.sheets, self.sheet_modified, self.order, self.versions, self.cache,
         self.compositor, self.recording, self.latency, self.clock) = state_image.load(data)
        font()  # the UI font, loaded as the process's libraries are

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def tools(self) -> dict[str, Tool]:
        agent: dict[str, Callable[[Any], Observation]] = {
            "terminal": self._terminal, "WAIT": self._wait, "search_files": self._search_files,
            "editor_open": self._editor_open, "editor_replace": self._editor_replace,
            "editor_insert": self._editor_insert, "editor_delete_lines": self._editor_delete_lines,
            "editor_undo": self._editor_undo, "editor_save": self._editor_save, "editor_close": self._editor_close,
            "sheet_open": self._sheet_open, "sheet_set": self._sheet_set, "sheet_get": self._sheet_get,
            "sheet_save": self._sheet_save, "sheet_close": self._sheet_close,
        }
        drift = set(agent) ^ (set(agent_tools.SCHEMA.names) - agent_tools.FINAL)
        if drift:
            raise TypeError(f"the desktop's tools and its schema drifted: {sorted(drift)}")
        tools: dict[str, Tool] = {name: self._screen_after(name, fn) for name, fn in agent.items()}
        tools.update({"_exec": self._exec, "_read_file": self._read_file, "_list_directory": self._list_directory,
                      "_terminal_output": self._terminal_output, "_put_file": self._put_file,
                      "_screen": self._screen,
                      "_latency": lambda a: Observation(data=self.latency.state())})
        return tools

    # -- windows and observations -------------------------------------------------------------------------------
    @property
    def active(self) -> str:
        return self.order[-1]

    def _touch(self, key: str, raise_: bool = True) -> None:
        self.versions[key] = self.versions.get(key, 0) + 1
        if key not in self.order:
            self.order.append(key)
        elif raise_ and self.order[-1] != key:
            self.order.remove(key)
            self.order.append(key)

    def _drop(self, key: str) -> None:
        if key in self.order:
            self.order.remove(key)
        self.versions.pop(key, None)
        self.compositor.forget(key)

    def _title(self, key: str) -> str:
        if key == "terminal":
            return f"Terminal - {self.terminal.cwd}"
        kind, _, path = key.partition(":")
        if kind == "editor":
            return f"{'*' if self.buffers[path].modified else ''}{os.path.basename(path)} - Text Editor"
        return f"{'*' if self.sheet_modified.get(path) else ''}{os.path.basename(path)} - Spreadsheet"

    def _windows(self) -> list[Window]:
        out = []
        for i, key in enumerate(self.order):
            kind, _, path = key.partition(":")
            content: Any = (self.terminal.scrollback if key == "terminal" else
                            self.buffers[path] if kind == "editor" else self.sheets[path])
            x, y = (40, 60) if key == "terminal" else (min(300 + 60 * i, 1920 - self.window_w),
                                                        min(90 + 40 * i, 1080 - 40 - self.window_h))
            out.append(Window(key=key, title=self._title(key), version=self.versions.get(key, 0), x=x, y=y,
                              kind=kind, content=content))
        return out

    def a11y(self) -> str:
        """The open windows as an accessibility-tree-like text (top window first); quotes inside are escaped."""
        lines = ["desktop-frame name=\"Desktop\""]
        for key in reversed(self.order):
            kind, _, path = key.partition(":")
            state = " focused" if key == self.active else ""
            lines.append(f"  window name=\"{_q(self._title(key))}\"{state}")
            if key == "terminal":
                lines.append(f"    terminal cwd=\"{self.terminal.cwd}\"")
                for text in self.terminal.scrollback[-20:]:
                    lines.append(f"      text \"{_q(text)}\"")
            elif kind == "editor":
                buf = self.buffers[path]
                lines.append(f"    document path=\"{path}\" lines={len(buf.lines)} modified={str(buf.modified).lower()}")
                for i, text in enumerate(buf.lines[:60]):
                    lines.append(f"      line {i + 1} \"{_q(text)}\"")
            else:
                sheet = self.sheets[path]
                rows, cols = sheet.extent
                lines.append(f"    table path=\"{path}\" rows={rows} columns={cols}")
                for r in range(min(rows, 40)):
                    cells = []
                    for c in range(min(cols, 12)):
                        if (r, c) in sheet.inputs:
                            raw = sheet.inputs[(r, c)]
                            shown = format_value(sheet.value_at(r, c))
                            formula = f" formula=\"{_q(str(raw))}\"" if (r, c) in sheet.formulas else ""
                            cells.append(f"{cell_name(r, c)}=\"{_q(shown)}\"{formula}")
                    lines.append(f"      row {r + 1}: " + " ".join(cells))
        return "\n".join(lines)

    def observe(self, obs: Observation) -> Observation:
        data = dict(obs.data)
        data["a11y"] = self.a11y()
        if self.screenshots or self.recording_frames:
            png = self.compositor.screenshot(self._windows(), self.active, self.png_level)
            if self.screenshots:
                data["screenshot"] = png
            if self.recording_frames and self.compositor.last_frame is not None:
                self.recording.append(self.compositor.last_frame.tobytes())
                del self.recording[:-self.recording_frames]
        return Observation(output=obs.output, exit_code=obs.exit_code, error=obs.error, data=data)

    def _screen_after(self, name: str, fn: Callable[[Any], Observation]) -> Tool:
        """The agent tool ``name``: its arguments decoded through the schema (a mismatch is a ``ToolError`` naming
        the tool and the argument), then ``fn``, then the modelled latency (``LATENCY_KIND``), then the screen."""
        kind = LATENCY_KIND.get(name, "action")

        def tool(args: dict[str, Any]) -> Observation:
            draw = self.latency.begin(name, args)
            try:
                decoded = agent_tools.SCHEMA.decode(ToolCall(name=name, args=args))
            except ActionError as exc:
                raise ToolError(str(exc)) from exc
            done = fn(decoded)
            self.clock.step()
            self.latency.wait(draw, kind)
            return self.observe(done)
        return tool

    def _screen(self, args: dict[str, Any]) -> Observation:
        return self.observe(Observation(output=self.terminal.text))

    # -- terminal -----------------------------------------------------------------------------------------------
    def _terminal(self, a: agent_tools.TerminalArgs) -> Observation:
        self.terminal.begin()
        result = self.ctx_run(self.terminal.wrap(a.command), a.timeout_s)
        output = self.terminal.record(a.command, result.output)
        if result.error:
            self.terminal.append(f"[{result.error}]")
        self._touch("terminal")
        return Observation(output=output, exit_code=result.exit_code, error=result.error)

    def ctx_run(self, cmd: str, timeout: float) -> Observation:
        """``cmd`` as the agent (its Python programs on the virtual clock, unless it is off)."""
        return self.ctx.run_agent(self.clock.prelude() + cmd if self.virtual_clock else cmd, timeout)

    def _wait(self, a: agent_tools.WaitArgs) -> Observation:
        time.sleep(a.seconds)
        self.clock.wait(a.seconds)
        return Observation(output="")

    def _search_files(self, a: agent_tools.SearchFilesArgs) -> Observation:
        if self.cache is None:
            raise ToolError("search_files: the session's file index is not built")
        hits = self.cache.search(a.query)
        return Observation(output="\n".join(hits), data={"count": len(hits)})

    # -- editor -------------------------------------------------------------------------------------------------
    def _document(self, kind: str, path: str | None, tool: str) -> tuple[str, Any]:
        """The open document of ``kind`` ("editor" or "sheet") that ``path`` names, or the active one (``None``)."""
        docs, where, none_open = self._kind(kind)
        if path is not None:
            path = resolve_user_path(path)
            if path not in docs:
                raise ToolError(f"{tool}: {path} is not open {where}")
            return path, docs[path]
        for key in reversed(self.order):
            if key.startswith(f"{kind}:"):
                path = key.partition(":")[2]
                return path, docs[path]
        raise ToolError(f"{tool}: {none_open} (use {kind}_open first)")

    def _kind(self, kind: str) -> tuple[dict[str, Any], str, str]:
        """A kind of document's open documents, where they are open, and what to say when none is."""
        if kind == "editor":
            return self.buffers, "in the editor", "no file is open in the editor"
        return self.sheets, "in the spreadsheet", "no sheet is open"

    def _save(self, kind: str, path: str, target: str, text: str) -> Observation:
        """Write the document at ``path`` to ``target``; with another target, the window now edits that file."""
        write_text(target, text)
        if target != path:  # save as
            docs, _, _ = self._kind(kind)
            if target in docs:
                self._drop(f"{kind}:{target}")
            self._drop(f"{kind}:{path}")
            docs[target] = docs.pop(path)
            if kind == "sheet":
                self.sheet_modified.pop(path, None)
        self._touch(f"{kind}:{target}")
        return Observation(output=f"saved {target}")

    def _close(self, kind: str, path: str, modified: bool) -> Observation:
        docs, _, _ = self._kind(kind)
        self._drop(f"{kind}:{path}")
        del docs[path]
        if kind == "sheet":
            self.sheet_modified.pop(path, None)
        return Observation(output=f"closed {path}" + (" (unsaved changes discarded)" if modified else ""))

    def _editor_open(self, a: agent_tools.EditorOpenArgs) -> Observation:
        path = resolve_user_path(a.path)
        if path not in self.buffers:
            text = read_text(path) if os.path.exists(path) else ""
            self.buffers[path] = Buffer(path, text, self.undo_depth)
        self._touch(f"editor:{path}")
        buf = self.buffers[path]
        return Observation(output=f"opened {path} ({len(buf.lines)} lines)\n{buf.text}")

    def _edit(self, tool: str, path: str | None, change: Callable[[Buffer, str], str]) -> Observation:
        """Apply ``change(buffer, path)`` (which returns what to say) to the open file ``path`` or the active one;
        a change the buffer refuses (a line out of range, nothing to undo) is the agent's ``ToolError``."""
        path, buf = self._document("editor", path, tool)
        try:
            message = change(buf, path)
        except ValueError as exc:
            raise ToolError(f"{tool}: {exc}") from exc
        self._touch(f"editor:{path}")
        return Observation(output=message)

    def _editor_replace(self, a: agent_tools.EditorReplaceArgs) -> Observation:
        return self._edit("editor_replace", a.path, lambda buf, path:
                          f"replaced {buf.replace(a.find, a.replace, a.count)} occurrence(s) in {path}")

    def _editor_insert(self, a: agent_tools.EditorInsertArgs) -> Observation:
        def insert(buf: Buffer, path: str) -> str:
            buf.insert(a.line, a.text)
            return f"inserted {a.text.count(chr(10)) + 1} line(s) at line {a.line} of {path}"
        return self._edit("editor_insert", a.path, insert)

    def _editor_delete_lines(self, a: agent_tools.EditorDeleteLinesArgs) -> Observation:
        end = a.start if a.end is None else a.end
        return self._edit("editor_delete_lines", a.path, lambda buf, path:
                          f"deleted {buf.delete_lines(a.start, end)} line(s) from {path}")

    def _editor_undo(self, a: agent_tools.EditorUndoArgs) -> Observation:
        def undo(buf: Buffer, path: str) -> str:
            buf.undo_last()
            return f"undid the last edit of {path}"
        return self._edit("editor_undo", a.path, undo)

    def _editor_save(self, a: agent_tools.EditorSaveArgs) -> Observation:
        path, buf = self._document("editor", None, "editor_save")
        target = resolve_user_path(a.path) if a.path is not None else path
        saved = self._save("editor", path, target, buf.text)
        buf.path, buf.modified = target, False
        return saved

    def _editor_close(self, a: agent_tools.EditorCloseArgs) -> Observation:
        path, buf = self._document("editor", a.path, "editor_close")
        return self._close("editor", path, buf.modified)

    # -- spreadsheet --------------------------------------------------------------------------------------------
    def _sheet_open(self, a: agent_tools.SheetOpenArgs) -> Observation:
        path = resolve_user_path(a.path)
        if path not in self.sheets:
            text = read_text(path) if os.path.exists(path) else ""
            self.sheets[path] = Sheet.from_csv(text, os.path.basename(path))
            self.sheet_modified[path] = False
        self._touch(f"sheet:{path}")
        rows, cols = self.sheets[path].extent
        return Observation(output=f"opened {path} ({rows} rows, {cols} columns)\n{self.sheets[path].to_csv()}")

    def _sheet_set(self, a: agent_tools.SheetSetArgs) -> Observation:
        path, sheet = self._document("sheet", a.path, "sheet_set")
        try:
            sheet.set(a.cell, a.value if isinstance(a.value, str) else format_value(a.value))
            shown = format_value(sheet.value(a.cell))
        except CellError as exc:
            raise ToolError(f"sheet_set: {exc}") from exc
        except FormulaError as exc:
            raise ToolError(f"sheet_set: bad formula {a.value!r}: {exc}") from exc
        self.sheet_modified[path] = True
        self._touch(f"sheet:{path}")
        return Observation(output=f"{a.cell.upper()} = {shown}")

    def _sheet_get(self, a: agent_tools.SheetGetArgs) -> Observation:
        _, sheet = self._document("sheet", a.path, "sheet_get")
        try:
            raw, shown = sheet.input_of(a.cell), format_value(sheet.value(a.cell))
        except CellError as exc:
            raise ToolError(f"sheet_get: {exc}") from exc
        return Observation(output=shown, data={"input": format_value(raw)})

    def _sheet_save(self, a: agent_tools.SheetSaveArgs) -> Observation:
        path, sheet = self._document("sheet", None, "sheet_save")
        target = resolve_user_path(a.path) if a.path is not None else path
        saved = self._save("sheet", path, target, sheet.to_csv())
        self.sheet_modified[target] = False
        return saved

    def _sheet_close(self, a: agent_tools.SheetCloseArgs) -> Observation:
        path, _ = self._document("sheet", a.path, "sheet_close")
        return self._close("sheet", path, self.sheet_modified.get(path, False))

    # -- internal tools (setup and evaluation) -------------------------------------------------------------------
    def _exec(self, args: dict[str, Any]) -> Observation:
        """Run a command as the agent user without touching the terminal (OSWorld's ``execute``)."""
        command = args.get("command")
        if isinstance(command, list) and all(isinstance(c, str) for c in command):
            command = shlex.join(command)
        if not isinstance(command, str):
            raise ToolError("_exec needs 'command' as a string or a list of strings")
        return self.ctx_run(command, float(args.get("timeout_s", 120)))

    def _read_file(self, args: dict[str, Any]) -> Observation:
        """A file for a getter, read as root without following symlinks: an agent cannot point its result file at
        the task's private expected file (a symlink needs no access to its target). OSWorld's ``/home/user`` is
        our link to the agent's home and is the one alias taken."""
        path = os.path.normpath(str(args["path"]))
        if path == "/home/user" or path.startswith("/home/user/"):
            path = AGENT_HOME + path[len("/home/user"):]
        try:  # what the agent left is read only if the agent could read it (a hard link to a private file is not)
            data = read_bytes(path, as_agent=not path.startswith(PRIVATE_DIR + "/"))
        except ToolError as exc:
            return Observation(error=str(exc), data={"content": None})
        return Observation(output=f"{len(data)} bytes", data={"content": data})

    def _list_directory(self, args: dict[str, Any]) -> Observation:
        path = str(args["path"])
        try:
            return Observation(data={"tree": directory_tree(path)})
        except OSError as exc:
            return Observation(error=f"{path}: {exc.strerror}", data={"tree": None})

    def _terminal_output(self, args: dict[str, Any]) -> Observation:
        return Observation(output=self.terminal.text)

    def _put_file(self, args: dict[str, Any]) -> Observation:
        """Write a file as root (the task's private expected files)."""
        path, content = str(args["path"]), args["content"]
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else bytes(content))
        os.chmod(path, int(args.get("mode", 0o600)))
        return Observation(output=f"wrote {path}")
