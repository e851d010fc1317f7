"""The embedded desktop (OSWorld stand-in) as a workspace application: a home directory with task files, a terminal,
a text editor and a spreadsheet with live in-memory state, and a rendered 1920x1080 screen.

Owns: the tools an agent uses (below), the internal tools the suite uses for setup and evaluation (names starting
with ``_``; ``DesktopSuite.parse_action`` never produces them), the shared warmed-up session cache, and the
per-step private state (window textures, scrollback, undo history).

Agent tools (``ToolCall.name`` -> args):

- ``terminal`` {"command": str, "timeout_s"?: number (default 30, at most 300)}: runs as the agent user (uid 65000)
  in the terminal's current directory (``cd`` persists), output appended to the scrollback; the observation's
  output is this command's output.
- ``editor_open`` {"path"}, ``editor_replace`` {"find", "replace", "count"?}, ``editor_insert`` {"line", "text"},
  ``editor_delete_lines`` {"start", "end"?}, ``editor_undo`` {}, ``editor_save`` {"path"?} (save as),
  ``editor_close`` {"path"?}; edits act on the active buffer (the last opened or saved).
- ``sheet_open`` {"path"} (CSV), ``sheet_set`` {"cell", "value"} (``=`` starts a formula), ``sheet_get``
  {"cell"}, ``sheet_save`` {"path"?} (CSV of computed values), ``sheet_close`` {"path"?}.
- ``search_files`` {"query"}: the session's file-search index (like ``locate``), at most 50 paths.
- ``WAIT`` {"seconds"?: default 1, at most 30}.
- ``DONE`` / ``FAIL`` end the episode and are handled by the suite, never executed here.

Every agent tool's observation carries ``data["a11y"]`` (an accessibility-tree-like text of the open windows) and
``data["screenshot"]`` (PNG, 1920x1080) unless ``screenshots=False``.

Paths given to the editor and the spreadsheet are relative to the home directory (``~/`` too) and must resolve
inside ``/home/agent`` or ``/tmp``: the host reads and writes as root, so this is what keeps ``/var/lib/desktop``
(the task's private expected files, mode 0700) out of the agent's reach. Files are never kept open (a fork needs
no re-opening).

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
- ``recording_frames=16``: the screen recorder (OSWorld records every episode) keeps the last N composited frames
  raw (1920x1080 RGB, 6 MiB each), one per agent step: the main private growth of a sample's first steps.

Measured with the defaults (``bunshin bench sharing --suite desktop --steps 10``, BENCHMARKS.md): a workspace of
~116 MiB after setup, ~190 MiB after ten steps of the project_tests group, of which ~0.66 is identical by content to
the other sample's and ~0.45 physically shared.
"""

from __future__ import annotations

import os
import pickle
import shlex
import stat
import time
from typing import Any

from ..app import AppContext, HugeHeap, Tool, ToolError, WorkspaceApp
from ..records import Observation
from ..runtime.image import AGENT_GID, AGENT_HOME, AGENT_UID
from . import home
from .editor import Buffer
from .render import Compositor, Window, font
from .spreadsheet import CellError, FormulaError, Sheet, cell_name, format_value
from .terminal import Terminal

PRIVATE_DIR = "/var/lib/desktop"
ALLOWED_ROOTS = (AGENT_HOME, "/tmp")  # after resolving symlinks (/home/user -> /home/agent)
MAX_FILE = 16 << 20
MiB = 1 << 20


# -- the session cache ------------------------------------------------------------------------------------------------


def _walk_names(root: str, out: list[bytes]) -> None:
    try:
        it = os.scandir(root)
    except OSError:
        return
    with it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        try:
            is_dir = e.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            out.append(os.fsencode(e.path) + b"/\n")
            _walk_names(e.path, out)
        else:
            out.append(os.fsencode(e.path) + b"\n")


def _glyphs() -> bytes:
    from PIL import ImageFont

    parts = []
    for size in range(10, 42, 2):
        f = ImageFont.load_default(size=size)
        for code in range(32, 127):
            mask = f.getmask(chr(code))
            w, h = mask.size
            parts.append(size.to_bytes(2, "little") + code.to_bytes(2, "little") + w.to_bytes(2, "little")
                         + h.to_bytes(2, "little") + bytes(mask))
    return b"".join(parts)


class SessionCache:
    """What a desktop session holds after login, packed in one huge-page heap: the file-search index, the glyph
    cache and the icon cache. Built once, then only read."""

    def __init__(self, cache_mb: float, index_roots: tuple[str, ...]):
        import numpy as np

        names: list[bytes] = []
        for root in index_roots:
            _walk_names(root, names)
        index = b"\n" + b"".join(names)
        glyphs = _glyphs()
        fixed = len(index) + len(glyphs)
        size = max(int(cache_mb * MiB), fixed + 4096)
        size = (size + 4095) // 4096 * 4096
        self.heap = HugeHeap(size)
        m = self.heap.map
        m[0:len(index)] = index
        self.index_end = len(index)
        m[self.index_end:fixed] = glyphs
        icons_start = (fixed + 4095) // 4096 * 4096
        pages = (size - icons_start) // 4096
        self.icons = pages * 4096 // (128 * 128 * 4)
        if pages:
            view = np.frombuffer(m, dtype=np.uint8, count=pages * 4096, offset=icons_start).reshape(pages, 4096)
            x = np.arange(4096, dtype=np.uint32)
            step = 4096
            for start in range(0, pages, step):  # icon pixels: gradients that differ on every page
                p = np.arange(start, min(start + step, pages), dtype=np.uint32)[:, None]
                view[start:start + len(p)] = ((x * (1 + p % 7) + p * 13 + (x >> 9) * (p % 11)) & 0xFF).astype(np.uint8)
            stamp = np.frombuffer(m, dtype=np.uint64, count=pages * 512, offset=icons_start).reshape(pages, 512)
            stamp[:, 0] = np.arange(pages, dtype=np.uint64) + 0x1C0_0000_0000
        self.size = size

    def search(self, query: str, limit: int = 50) -> list[str]:
        q = query.encode()
        m, found, pos = self.heap.map, [], 0
        while len(found) < limit:
            pos = m.find(q, pos, self.index_end)
            if pos < 0:
                break
            start = m.rfind(b"\n", 0, pos) + 1
            end = m.find(b"\n", pos, self.index_end)
            found.append(m[start:end].decode("utf-8", "replace"))
            pos = end + 1
        return found

    def close(self) -> None:
        self.heap.close()


# -- the application ---------------------------------------------------------------------------------------------------


def _arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], tool: str, default: Any = ...) -> Any:
    if name not in args:
        if default is ...:
            raise ToolError(f"{tool} needs the argument {name!r}")
        return default
    value = args[name]
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise ToolError(f"{tool}: {name!r} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    if not isinstance(value, kind):
        what = kind.__name__ if isinstance(kind, type) else "a number"
        raise ToolError(f"{tool}: {name!r} must be {what}, got {value!r}")
    return value


def _no_extra(args: dict[str, Any], allowed: set[str], tool: str) -> None:
    extra = set(args) - allowed
    if extra:
        raise ToolError(f"{tool} got unknown arguments {sorted(extra)} (takes {sorted(allowed)})")


def resolve_user_path(path: str) -> str:
    """An editor/spreadsheet path as the agent may name it, resolved; ``ToolError`` outside the agent's files."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("'path' must be a non-empty string")
    p = path.strip()
    if p == "~" or p.startswith("~/"):
        p = AGENT_HOME + p[1:]
    if not p.startswith("/"):
        p = os.path.join(AGENT_HOME, p)
    real = os.path.realpath(p)
    if not any(real == r or real.startswith(r + "/") for r in ALLOWED_ROOTS):
        raise ToolError(f"{path}: permission denied (the editor opens files under {AGENT_HOME} or /tmp)")
    return real


def _open_nofollow(path: str, flags: int, mode: int = 0o644) -> int:
    """Open a resolved absolute path walking it one component at a time without following any symlink: an agent
    that swaps a directory for a symlink after the path was checked makes the open fail instead of redirecting a
    root-owned write (or read) outside its files."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        raise ToolError(f"{path} is a directory")
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=fd)
    except FileNotFoundError:
        raise ToolError(f"{path}: no such file or directory") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a directory") from None
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _read_bytes(path: str) -> bytes:
    """A regular file's bytes, opened without following any symlink on the way (see ``_open_nofollow``)."""
    fd = _open_nofollow(path, os.O_RDONLY)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ToolError(f"{path} is a directory" if stat.S_ISDIR(st.st_mode) else f"{path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_FILE:
            raise ToolError(f"{path} is too large to open ({st.st_size} bytes)")
        return f.read(MAX_FILE + 1)


def _read_text(path: str) -> str:
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not a UTF-8 text file") from None


def _write_text(path: str, text: str) -> None:
    if os.path.isdir(path):
        raise ToolError(f"{path} is a directory")
    existed = os.path.exists(path)
    fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "wb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ToolError(f"{path} is not a regular file")
        f.truncate(0)
        f.write(text.encode("utf-8"))
        if not existed:
            os.fchown(f.fileno(), AGENT_UID, AGENT_GID)


def _q(text: str, limit: int = 200) -> str:
    return text[:limit].replace("\\", "\\\\").replace('"', '\\"')


def directory_tree(path: str) -> dict[str, Any]:
    """OSWorld's directory tree (``list_directory``): name, type, children; children sorted by name."""
    tree: dict[str, Any] = {"name": os.path.basename(path.rstrip("/")) or "/", "type": "directory", "children": []}
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            tree["children"].append(directory_tree(e.path))
        else:
            tree["children"].append({"name": e.name, "type": "file"})
    return tree


class DesktopApp(WorkspaceApp):
    def __init__(self, cache_mb: float = 48, index_roots: tuple[str, ...] | list[str] = ("/usr",),
                 window_w: int = 1100, window_h: int = 700, scrollback_lines: int = 10_000,
                 undo_depth: int = 1000, screenshots: bool = True, png_level: int = 1, home_files: bool = True,
                 recording_frames: int = 16):
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

    def checkpoint(self) -> bytes:
        return pickle.dumps((self.terminal, self.buffers, self.sheets, self.sheet_modified, self.order,
                             self.versions))

    def restore(self, ctx: AppContext, data: bytes) -> None:
        self.ctx = ctx
        self._warm_up()
        (self.terminal, self.buffers, self.sheets, self.sheet_modified, self.order,
         self.versions) = pickle.loads(data)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()

    def tools(self) -> dict[str, Tool]:
        agent = {
            "terminal": self._terminal, "WAIT": self._wait, "search_files": self._search_files,
            "editor_open": self._editor_open, "editor_replace": self._editor_replace,
            "editor_insert": self._editor_insert, "editor_delete_lines": self._editor_delete_lines,
            "editor_undo": self._editor_undo, "editor_save": self._editor_save, "editor_close": self._editor_close,
            "sheet_open": self._sheet_open, "sheet_set": self._sheet_set, "sheet_get": self._sheet_get,
            "sheet_save": self._sheet_save, "sheet_close": self._sheet_close,
        }
        tools: dict[str, Tool] = {name: self._screen_after(name, fn) for name, fn in agent.items()}
        tools.update({"_exec": self._exec, "_read_file": self._read_file, "_list_directory": self._list_directory,
                      "_terminal_output": self._terminal_output, "_put_file": self._put_file,
                      "_screen": self._screen})
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

    def _screen_after(self, name: str, fn: Tool) -> Tool:
        def tool(args: dict[str, Any]) -> Observation:
            if not isinstance(args, dict):
                raise ToolError(f"{name} takes an object of arguments")
            return self.observe(fn(args))
        return tool

    def _screen(self, args: dict[str, Any]) -> Observation:
        return self.observe(Observation(output=self.terminal.text))

    # -- terminal -----------------------------------------------------------------------------------------------
    def _terminal(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"command", "timeout_s"}, "terminal")
        command = _arg(args, "command", str, "terminal")
        timeout = _arg(args, "timeout_s", (int, float), "terminal", 30.0)
        if not 0 < timeout <= 300:
            raise ToolError(f"terminal: timeout_s must be in (0, 300], got {timeout!r}")
        self.terminal.begin()
        result = self.ctx_run(self.terminal.wrap(command), float(timeout))
        output = self.terminal.record(command, result.output)
        if result.error:
            self.terminal.append(f"[{result.error}]")
        self._touch("terminal")
        return Observation(output=output, exit_code=result.exit_code, error=result.error)

    def ctx_run(self, cmd: str, timeout: float) -> Observation:
        return self.ctx.run_agent(cmd, timeout)

    def _wait(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"seconds"}, "WAIT")
        seconds = _arg(args, "seconds", (int, float), "WAIT", 1.0)
        if not 0 <= seconds <= 30:
            raise ToolError(f"WAIT: seconds must be in [0, 30], got {seconds!r}")
        time.sleep(seconds)
        return Observation(output="")

    def _search_files(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"query"}, "search_files")
        query = _arg(args, "query", str, "search_files")
        if not query or "\n" in query:
            raise ToolError("search_files: 'query' must be a non-empty single line")
        assert self.cache is not None
        hits = self.cache.search(query)
        return Observation(output="\n".join(hits), data={"count": len(hits)})

    # -- editor -------------------------------------------------------------------------------------------------
    def _buffer(self, args: dict[str, Any], tool: str) -> tuple[str, Buffer]:
        if "path" in args:
            path = resolve_user_path(_arg(args, "path", str, tool))
            if path not in self.buffers:
                raise ToolError(f"{tool}: {path} is not open in the editor")
            return path, self.buffers[path]
        for key in reversed(self.order):
            if key.startswith("editor:"):
                path = key.partition(":")[2]
                return path, self.buffers[path]
        raise ToolError(f"{tool}: no file is open in the editor (use editor_open first)")

    def _editor_open(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "editor_open")
        path = resolve_user_path(_arg(args, "path", str, "editor_open"))
        if path not in self.buffers:
            text = _read_text(path) if os.path.exists(path) else ""
            self.buffers[path] = Buffer(path, text, self.undo_depth)
        self._touch(f"editor:{path}")
        buf = self.buffers[path]
        return Observation(output=f"opened {path} ({len(buf.lines)} lines)\n{buf.text}")

    def _edited(self, path: str, message: str) -> Observation:
        self._touch(f"editor:{path}")
        return Observation(output=message)

    def _editor_replace(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"find", "replace", "count", "path"}, "editor_replace")
        find = _arg(args, "find", str, "editor_replace")
        replace = _arg(args, "replace", str, "editor_replace")
        count = _arg(args, "count", int, "editor_replace", None)
        if count is not None and count < 1:
            raise ToolError(f"editor_replace: count must be >= 1, got {count}")
        path, buf = self._buffer(args, "editor_replace")
        try:
            n = buf.replace(find, replace, count)
        except ValueError as exc:
            raise ToolError(f"editor_replace: {exc}") from None
        return self._edited(path, f"replaced {n} occurrence(s) in {path}")

    def _editor_insert(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"line", "text", "path"}, "editor_insert")
        line = _arg(args, "line", int, "editor_insert")
        text = _arg(args, "text", str, "editor_insert")
        path, buf = self._buffer(args, "editor_insert")
        try:
            buf.insert(line, text)
        except ValueError as exc:
            raise ToolError(f"editor_insert: {exc}") from None
        return self._edited(path, f"inserted {text.count(chr(10)) + 1} line(s) at line {line} of {path}")

    def _editor_delete_lines(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"start", "end", "path"}, "editor_delete_lines")
        start = _arg(args, "start", int, "editor_delete_lines")
        end = _arg(args, "end", int, "editor_delete_lines", start)
        path, buf = self._buffer(args, "editor_delete_lines")
        try:
            n = buf.delete_lines(start, end)
        except ValueError as exc:
            raise ToolError(f"editor_delete_lines: {exc}") from None
        return self._edited(path, f"deleted {n} line(s) from {path}")

    def _editor_undo(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "editor_undo")
        path, buf = self._buffer(args, "editor_undo")
        try:
            buf.undo_last()
        except ValueError as exc:
            raise ToolError(f"editor_undo: {exc}") from None
        return self._edited(path, f"undid the last edit of {path}")

    def _editor_save(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "editor_save")
        path, buf = self._buffer({}, "editor_save")
        target = resolve_user_path(args["path"]) if "path" in args else path
        _write_text(target, buf.text)
        if target != path:  # save as: the buffer now edits the new file
            if target in self.buffers:
                self._drop(f"editor:{target}")
            self._drop(f"editor:{path}")
            del self.buffers[path]
            buf.path = target
            self.buffers[target] = buf
        buf.modified = False
        self._touch(f"editor:{target}")
        return Observation(output=f"saved {target}")

    def _editor_close(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "editor_close")
        path, buf = self._buffer(args, "editor_close")
        self._drop(f"editor:{path}")
        del self.buffers[path]
        return Observation(output=f"closed {path}" + (" (unsaved changes discarded)" if buf.modified else ""))

    # -- spreadsheet --------------------------------------------------------------------------------------------
    def _sheet(self, args: dict[str, Any], tool: str) -> tuple[str, Sheet]:
        if "path" in args:
            path = resolve_user_path(_arg(args, "path", str, tool))
            if path not in self.sheets:
                raise ToolError(f"{tool}: {path} is not open in the spreadsheet")
            return path, self.sheets[path]
        for key in reversed(self.order):
            if key.startswith("sheet:"):
                path = key.partition(":")[2]
                return path, self.sheets[path]
        raise ToolError(f"{tool}: no sheet is open (use sheet_open first)")

    def _sheet_open(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "sheet_open")
        path = resolve_user_path(_arg(args, "path", str, "sheet_open"))
        if path not in self.sheets:
            text = _read_text(path) if os.path.exists(path) else ""
            self.sheets[path] = Sheet.from_csv(text, os.path.basename(path))
            self.sheet_modified[path] = False
        self._touch(f"sheet:{path}")
        rows, cols = self.sheets[path].extent
        return Observation(output=f"opened {path} ({rows} rows, {cols} columns)\n{self.sheets[path].to_csv()}")

    def _sheet_set(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"cell", "value", "path"}, "sheet_set")
        cell = _arg(args, "cell", str, "sheet_set")
        value = _arg(args, "value", (str, int, float), "sheet_set")
        path, sheet = self._sheet(args, "sheet_set")
        try:
            sheet.set(cell, value if isinstance(value, str) else format_value(value))
            shown = format_value(sheet.value(cell))
        except CellError as exc:
            raise ToolError(f"sheet_set: {exc}") from None
        except FormulaError as exc:
            raise ToolError(f"sheet_set: bad formula {value!r}: {exc}") from None
        self.sheet_modified[path] = True
        self._touch(f"sheet:{path}")
        return Observation(output=f"{cell.upper()} = {shown}")

    def _sheet_get(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"cell", "path"}, "sheet_get")
        cell = _arg(args, "cell", str, "sheet_get")
        _, sheet = self._sheet(args, "sheet_get")
        try:
            raw, shown = sheet.input_of(cell), format_value(sheet.value(cell))
        except CellError as exc:
            raise ToolError(f"sheet_get: {exc}") from None
        return Observation(output=shown, data={"input": format_value(raw)})

    def _sheet_save(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "sheet_save")
        path, sheet = self._sheet({}, "sheet_save")
        target = resolve_user_path(args["path"]) if "path" in args else path
        _write_text(target, sheet.to_csv())
        if target != path:
            if target in self.sheets:
                self._drop(f"sheet:{target}")
            self._drop(f"sheet:{path}")
            del self.sheets[path]
            self.sheet_modified.pop(path, None)
            self.sheets[target] = sheet
        self.sheet_modified[target] = False
        self._touch(f"sheet:{target}")
        return Observation(output=f"saved {target}")

    def _sheet_close(self, args: dict[str, Any]) -> Observation:
        _no_extra(args, {"path"}, "sheet_close")
        path, _ = self._sheet(args, "sheet_close")
        self._drop(f"sheet:{path}")
        del self.sheets[path]
        modified = self.sheet_modified.pop(path, False)
        return Observation(output=f"closed {path}" + (" (unsaved changes discarded)" if modified else ""))

    # -- internal tools (setup and evaluation) -------------------------------------------------------------------
    def _exec(self, args: dict[str, Any]) -> Observation:
        """Run a command as the agent user without touching the terminal (OSWorld's ``execute``)."""
        command = args.get("command")
        if isinstance(command, list) and all(isinstance(c, str) for c in command):
            command = shlex.join(command)
        if not isinstance(command, str):
            raise ToolError("_exec needs 'command' as a string or a list of strings")
        return self.ctx.run_agent(command, float(args.get("timeout_s", 120)))

    def _read_file(self, args: dict[str, Any]) -> Observation:
        """A file for a getter, read as root without following symlinks: an agent cannot point its result file at
        the task's private expected file (a symlink needs no access to its target). OSWorld's ``/home/user`` is
        our link to the agent's home and is the one alias taken."""
        path = os.path.normpath(str(args["path"]))
        if path == "/home/user" or path.startswith("/home/user/"):
            path = AGENT_HOME + path[len("/home/user"):]
        try:
            data = _read_bytes(path)
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
