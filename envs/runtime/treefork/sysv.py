"""SysV IPC of a tree's IPC namespace, as the kernel lists it (``/proc/sysvipc``, read from a thread inside that
namespace): its shared memory segments, and how many semaphore sets and message queues it has.

Owns: ``Ipc`` and ``read_ipc``. Which of them a clone can have again, and how, is ``reader.py``'s.
Must never: attach a segment or change the namespace of the calling thread.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import syscalls
from .plan import Segment
from .procfs import in_namespace_of


@dataclass(frozen=True)
class Ipc:
    """A namespace's SysV objects: its segments by id, its semaphore sets' and message queues' counts, and whether
    it is the reader's own namespace."""

    segments: dict[int, Segment]
    semaphores: int
    queues: int
    ours: bool


def _rows(path: str) -> list[list[str]]:
    return [line.split() for line in Path(path).read_text().splitlines()[1:] if line.strip()]


def _read_here() -> tuple[dict[int, Segment], int, int]:
    segments = {}
    for row in _rows("/proc/sysvipc/shm"):
        # key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss swap
        seg = Segment(key=int(row[0]), shmid=int(row[1]), mode=int(row[2], 8), size=int(row[3]), nattch=int(row[6]),
                      uid=int(row[7]), gid=int(row[8]))
        segments[seg.shmid] = seg
    return segments, len(_rows("/proc/sysvipc/sem")), len(_rows("/proc/sysvipc/msg"))


def read_ipc(host_pid: int) -> Ipc:
    """The SysV objects of ``host_pid``'s IPC namespace."""
    ours = os.stat(f"/proc/{host_pid}/ns/ipc").st_ino == os.stat("/proc/self/ns/ipc").st_ino
    segments, semaphores, queues = _read_here() if ours else \
        in_namespace_of(host_pid, "ipc", syscalls.CLONE_NEWIPC, _read_here, 30.0)
    return Ipc(segments=segments, semaphores=semaphores, queues=queues, ours=ours)
