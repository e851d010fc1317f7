"""An inotify instance of a frozen process, as the tree fork reads it: each watch's descriptor number, event mask and
the path of what it watches, from /proc's fdinfo (a watch is shown by the file handle of its inode, looked up again
with ``open_by_handle_at`` in the source's mount of that file system).

Owns: ``inotify_watches`` and ``queued_bytes``. The builder adds the watches again in the clone, in order, so that
each gets its source's descriptor number (``kmod/treefork/builder.c``); the reader refuses an instance with events
queued.
Must never: keep a descriptor open, or read an event (the queue is the source's).
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
from pathlib import Path

from .. import syscalls
from .errors import TreeForkRefused
from .plan import InotifyWatch
from .procfs import inside

SEARCH_DIRS = 20000
_WATCH = re.compile(r"^inotify wd:([0-9a-f]+) ino:([0-9a-f]+) sdev:([0-9a-f]+) mask:([0-9a-f]+) ignored_mask:[0-9a-f]+ "
                    r"fhandle-bytes:[0-9a-f]+ fhandle-type:([0-9a-f]+) f_handle:([0-9a-f]+)", re.M)


def _mounts_of(host_pid: int, sdev: int) -> list[str]:
    """The mount points, in the source's mount namespace, of the file system whose kernel device number is
    ``sdev`` (several when parts of it are bound in several places)."""
    major, minor = sdev >> 20, sdev & 0xFFFFF
    return [fields[4] for line in Path(f"/proc/{host_pid}/mountinfo").read_text().splitlines()
            if (fields := line.split())[2] == f"{major}:{minor}"]


def _search(tops: list[str], sdev: int, ino: int) -> tuple[str, str] | None:
    """Which of ``tops`` holds inode ``ino`` of device ``sdev``, and its path relative to it: breadth first over
    all of them together (a watch is seldom deep, and one mount, /usr say, must not be read through before another,
    /etc, is looked at), reading directories only (the inode numbers come with their entries), at most
    ``SEARCH_DIRS`` of them."""
    for top in tops:
        if _is(top, sdev, ino):
            return top, ""
    queue, read = [(top, top) for top in tops], 0
    while queue and read < SEARCH_DIRS:
        top, d = queue.pop(0)
        read += 1
        try:
            with os.scandir(d) as entries:
                for e in entries:
                    if e.inode() == ino and _is(e.path, sdev, ino):
                        return top, "/" + e.path[len(top):].lstrip("/")
                    if e.is_dir(follow_symlinks=False):
                        queue.append((top, e.path))
        except OSError:
            continue
    return None


def _path_of(host_pid: int, sdev: int, ino: int, handle_type: int, handle: bytes, root: str,
             culprit: str) -> str | None:
    """Where the file a handle names is, in the tree's root (``root``: as we see it): looked up in each mount of its file system until one holds it
    (a handle resolved through a bind mount of another part of the file system is not reachable there). A file
    system without file handles (9p) is searched for the inode instead, a bounded search."""
    mounts = _mounts_of(host_pid, sdev)
    for mount in mounts:
        mount_fd = os.open(f"/proc/{host_pid}/root{mount}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            top = os.readlink(f"/proc/self/fd/{mount_fd}")
            fd = syscalls.open_by_handle_at(mount_fd, handle_type, handle)
        except OSError:
            continue
        finally:
            os.close(mount_fd)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        if path == top or path.startswith(top.rstrip("/") + "/"):
            if path.endswith(" (deleted)"):
                raise TreeForkRefused(culprit, "an inotify watch on a deleted file")
            return inside(path, root, culprit)
    known = _FOUND.get((sdev, ino))
    if known is not None and _is(f"/proc/{host_pid}/root{known}", sdev, ino):
        return known
    tops = {f"/proc/{host_pid}/root{mount}": mount for mount in mounts}
    if (found := _search(list(tops), sdev, ino)) is not None:
        top, below = found
        path = (tops[top].rstrip("/") + below) or "/"
        _FOUND[sdev, ino] = path
        while len(_FOUND) > FOUND_MAX:
            del _FOUND[next(iter(_FOUND))]
        return path
    return None


# what the search found, by (device, inode): a tree forked again and again (a source's every fork, its clones')
# watches the same inodes, at the same paths inside its root; an entry is used only while the path still names
# that inode
_FOUND: dict[tuple[int, int], str] = {}
FOUND_MAX = 4096


def _is(path: str, sdev: int, ino: int) -> bool:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return st.st_ino == ino and (os.major(st.st_dev), os.minor(st.st_dev)) == (sdev >> 20, sdev & 0xFFFFF)


def inotify_watches(host_pid: int, fdinfo: str, root: str, culprit: str) -> list[InotifyWatch]:
    """The watches of an inotify descriptor of ``host_pid`` (``fdinfo``: its /proc fdinfo), by ascending
    descriptor number, with the paths they watch inside ``root`` (the tree's root as we see it)."""
    out = []
    for m in _WATCH.finditer(fdinfo):
        wd, ino, sdev, mask, handle_type, handle = (int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16),
                                                    int(m.group(4), 16), int(m.group(5), 16),
                                                    bytes.fromhex(m.group(6)))
        path = _path_of(host_pid, sdev, ino, handle_type, handle, root, culprit)
        if path is None:
            raise TreeForkRefused(culprit, f"watch {wd} names a file no mount of the tree reaches (gone?)")
        out.append(InotifyWatch(wd=wd, mask=mask, path=path))
    return sorted(out, key=lambda w: w.wd)


def queued_bytes(host_pid: int, num: int) -> int:
    """The bytes of events waiting in an inotify instance's queue (FIONREAD on a copy of its descriptor)."""
    dup = syscalls.descriptor_of(host_pid, num)
    try:
        return int(struct.unpack("i", fcntl.ioctl(dup, 0x541B, b"\0\0\0\0"))[0])  # FIONREAD
    finally:
        os.close(dup)
