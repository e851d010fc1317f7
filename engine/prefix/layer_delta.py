"""A layer's delta against its parent's snapshot: which files of a writable layer differ, and applying them back.

Owns: ``Entry`` (one path of a layer as a checkpoint records it), ``diff_layer`` (the entries of a layer that differ
from its parent snapshot's, and the paths it lacks), walking, comparing and re-creating files (metadata, xattrs,
overlayfs whiteouts), and a directory fsync. A layer file is unchanged when its metadata, size, mtime and ctime
match the parent snapshot's (btrfs snapshots keep ctimes, and nobody can set a ctime back), and, when the parent
changed it within ``RACY_NS`` of its last change, its bytes too.
Must never: call a file unchanged that may have changed (a wrong cached file would change a trajectory).
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .errors import StoreError

INLINE_BYTES = 4096  # smaller files live in the manifest
# A file the parent changed this close to the parent's last change may have been changed again by the child within
# one tick of the kernel's coarse clock (<= 10 ms at HZ=100) without its size, mtime or ctime moving: compare its
# bytes (git's "racy" entries, with a margin).
RACY_NS = 100_000_000


class Entry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One path of a layer: ``kind`` is file, dir, symlink or whiteout (overlayfs's 0:0 character device)."""

    path: str
    kind: str
    mode: int
    uid: int = 0
    gid: int = 0
    mtime_ns: int = 0
    size: int = 0
    chunks: list[str] = []
    inline: bytes = b""
    target: str = ""
    xattrs: dict[str, bytes] = {}


def under(path: str, roots: set[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots) if roots else False


def diff_layer(layer: Path, parent: Path | None, chunk_bytes: int,
          chunk: Callable[[memoryview], str]) -> tuple[list[Entry], list[str], int]:
    """The entries of ``layer`` that differ from ``parent``, the paths of ``parent`` it lacks (topmost only), and
    the size of every file in ``layer``. ``parent`` is a snapshot ``layer`` was made from (btrfs keeps ctimes)."""
    mine, theirs = _walk(layer), _walk(parent) if parent is not None else {}
    racy_after = max((st.st_ctime_ns for st in theirs.values()), default=0) - RACY_NS
    changed, total = [], 0
    for rel, st in mine.items():
        kind = _kind(st)
        if kind == "file":
            total += st.st_size
        old = theirs.get(rel)
        if old is not None and parent is not None and \
                _same(layer / rel, st, parent / rel, old, racy_after, chunk_bytes):  # (theirs is {} without parent)
            continue
        meta: dict[str, Any] = dict(path=rel, kind=kind, mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid,
                                    mtime_ns=st.st_mtime_ns, xattrs=_xattrs(layer / rel))
        if kind == "symlink":
            meta["target"] = os.readlink(layer / rel)
        elif kind == "file":
            data = (layer / rel).read_bytes()
            meta["size"] = len(data)
            if len(data) <= INLINE_BYTES:
                meta["inline"] = data
            else:
                meta["chunks"] = [chunk(memoryview(data)[at:at + chunk_bytes])
                                  for at in range(0, len(data), chunk_bytes)]
        changed.append(Entry(**meta))
    gone = set(theirs) - set(mine)
    deleted = sorted(p for p in gone if "/" not in p or not under(p.rsplit("/", 1)[0], gone))
    return changed, deleted, total


def _walk(root: Path) -> dict[str, os.stat_result]:
    found: dict[str, os.stat_result] = {}
    todo = [""]
    while todo:
        rel = todo.pop()
        with os.scandir(root / rel) as it:
            for entry in sorted(it, key=lambda e: e.name):
                path = f"{rel}/{entry.name}" if rel else entry.name
                found[path] = entry.stat(follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    todo.append(path)
    return dict(sorted(found.items(), key=lambda kv: kv[0].split("/")))


def _kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
        return "whiteout"
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise StoreError(f"cannot checkpoint special file (mode {st.st_mode:o})")


def _same(a: Path, sa: os.stat_result, b: Path, sb: os.stat_result, racy_after: int, block: int) -> bool:
    """Unchanged: same metadata, and for a file the same size, mtime and ctime (nobody can set a ctime back), and
    for a racy one the same bytes. A file found changed is recorded; its chunks' hashes still spare the writes of
    unchanged content, so a touched but identical file costs only its entry."""
    if (sa.st_mode, sa.st_uid, sa.st_gid) != (sb.st_mode, sb.st_uid, sb.st_gid) or _xattrs(a) != _xattrs(b):
        return False
    kind = _kind(sa)
    if kind == "symlink":
        return os.readlink(a) == os.readlink(b) and sa.st_mtime_ns == sb.st_mtime_ns
    if kind != "file":
        return sa.st_mtime_ns == sb.st_mtime_ns
    if (sa.st_size, sa.st_mtime_ns, sa.st_ctime_ns) != (sb.st_size, sb.st_mtime_ns, sb.st_ctime_ns):
        return False
    if sb.st_ctime_ns < racy_after:
        return True
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while (x := fa.read(block)) == fb.read(block):
            if not x:
                return True
    return False


def _xattrs(path: Path) -> dict[str, bytes]:
    try:
        return {k: os.getxattr(path, k, follow_symlinks=False) for k in os.listxattr(path, follow_symlinks=False)}
    except OSError:
        return {}


def set_meta(path: Path, e: Entry) -> None:
    for k, v in e.xattrs.items():
        os.setxattr(path, k, v, follow_symlinks=False)
    if os.geteuid() == 0:
        os.lchown(path, e.uid, e.gid)
    if e.kind != "symlink":
        os.chmod(path, e.mode)
    os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists() or os.path.lexists(path):
        path.unlink()
