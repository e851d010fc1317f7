"""How the desktop, running as root, touches files for an agent (uid 65000) and for the grader.

Owns: ``resolve_user_path`` (a path an agent names for the editor or the spreadsheet, resolved, inside its home or
/tmp), ``open_nofollow`` (a path opened one component at a time, never through a symlink, never blocking on a
FIFO), ``read_bytes``/``read_text``/``write_text`` (regular files only; ``as_agent``: only what the agent itself may
read or write by the file's owner and mode bits), ``directory_tree`` (OSWorld's ``list_directory``).

What an agent can try, and what stops it:

- a symlink (to ``/var/lib/desktop``, the task's private expected files, mode 0700): ``resolve_user_path`` resolves
  it and refuses anything outside the home and /tmp; the grader's reads never follow a symlink (``O_NOFOLLOW`` on
  every component), so a result file linked to the expected one reads as an error;
- a directory swapped for a symlink after the check: the component-by-component walk with ``O_NOFOLLOW`` fails;
- a FIFO: opened with ``O_NONBLOCK`` and refused as not a regular file (nothing waits for a writer);
- a hard link to a root-only file: the kernel refuses to make one (``fs.protected_hardlinks``, and the agent cannot
  search ``/var/lib/desktop``); were one there anyway, ``as_agent`` reads and writes refuse a file the agent's uid
  and gid could not open, so root never hands it over;
- ``..``: resolved before the check.

Must never: follow a symlink on behalf of root, block on a file, read more than ``MAX_FILE`` bytes, or keep a file
open (a fork needs no re-opening).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ..app import ToolError
from ..runtime.image import AGENT_GID, AGENT_HOME, AGENT_UID

PRIVATE_DIR = "/var/lib/desktop"
ALLOWED_ROOTS = (AGENT_HOME, "/tmp")  # after resolving symlinks (/home/user -> /home/agent)
MAX_FILE = 16 << 20


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


def open_nofollow(path: str, flags: int, mode: int = 0o644) -> int:
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
    except FileNotFoundError as exc:
        raise ToolError(f"{path}: no such file or directory") from exc
    except IsADirectoryError as exc:
        raise ToolError(f"{path} is a directory") from exc
    except OSError as exc:
        raise ToolError(f"{path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def agent_may(st: os.stat_result, access: int) -> bool:
    """Whether the agent's uid and gid may access a file with this status by its owner and mode bits (``access``:
    the owner's bit asked for, ``stat.S_IRUSR`` or ``stat.S_IWUSR``)."""
    if st.st_uid == AGENT_UID:
        return bool(st.st_mode & access)
    if st.st_gid == AGENT_GID:
        return bool(st.st_mode & (access >> 3))
    return bool(st.st_mode & (access >> 6))


def read_bytes(path: str, *, as_agent: bool = True) -> bytes:
    """A regular file's bytes, opened without following any symlink on the way (see ``open_nofollow``);
    ``as_agent``: only a file the agent may read itself."""
    fd = open_nofollow(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path} is a directory" if stat.S_ISDIR(st.st_mode) else f"{path} is not a regular file")
        if as_agent and not agent_may(st, stat.S_IRUSR):
            raise ToolError(f"{path}: permission denied")
        if st.st_size > MAX_FILE:
            raise ToolError(f"{path} is too large to open ({st.st_size} bytes)")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        return f.read(MAX_FILE + 1)


def read_text(path: str) -> str:
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{path} is not a UTF-8 text file") from exc


def write_text(path: str, text: str) -> None:
    """Write a file the agent may write (a new one is the agent's), without following any symlink."""
    if os.path.isdir(path):
        raise ToolError(f"{path} is a directory")
    existed = os.path.exists(path)
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT)
    with os.fdopen(fd, "wb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path} is not a regular file")
        if existed and not agent_may(st, stat.S_IWUSR):
            raise ToolError(f"{path}: permission denied")
        f.truncate(0)
        f.write(text.encode("utf-8"))
        if not existed:
            os.fchown(f.fileno(), AGENT_UID, AGENT_GID)


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
