"""Reading /proc for the tree fork: a process's status fields, its children, a tree in order, paths inside a root,
mapping lines; and running a reader inside a process's namespace (what /proc shows of sockets and SysV IPC is the
reading thread's namespace's).

Owns: these readers, shared by ``reader.py`` (the plan) and ``oracle.py`` (the comparison), and
``in_namespace_of``.
Must never: write to /proc, or change the namespaces of the calling thread.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from .. import syscalls
from .errors import TreeForkRefused

T = TypeVar("T")

MAPS = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) [0-9a-f]+ ([0-9a-f]+):([0-9a-f]+) (\d+)\s*(.*)$")


def status(host_pid: int, tid: int | None = None) -> dict[str, str]:
    path = f"/proc/{host_pid}/status" if tid is None else f"/proc/{host_pid}/task/{tid}/status"
    out = {}
    for line in Path(path).read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def last(value: str) -> int:
    """The innermost namespace's number of an NSpid/NSsid/NSpgid line."""
    return int(value.split()[-1])


def children(host_pid: int) -> list[int]:
    out = []
    for tid in sorted(os.listdir(f"/proc/{host_pid}/task"), key=int):
        text = Path(f"/proc/{host_pid}/task/{tid}/children").read_text()
        out += [int(c) for c in text.split()]
    return out


def unified_cgroup(host_pid: int) -> str | None:
    """The process's cgroup in the unified (v2) hierarchy, or None (cgroup v1 only)."""
    for line in Path(f"/proc/{host_pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def cgroup_below(host_pid: int, init_host_pid: int, culprit: str) -> str:
    """The process's cgroup relative to the tree's pid 1's ("" for that one), in the unified hierarchy ("" without
    one); a cgroup outside the pid 1's is refused."""
    own, top = unified_cgroup(host_pid), unified_cgroup(init_host_pid)
    if own is None or top is None or own == top:
        return ""
    if top == "/" or own.startswith(top.rstrip("/") + "/"):
        return own[len(top.rstrip("/")) + 1:]
    raise TreeForkRefused(culprit, f"in cgroup {own}, outside the tree's {top}")


def walk(init: int) -> Iterator[int]:
    """The tree's processes, parents first."""
    queue = [init]
    while queue:
        pid = queue.pop(0)
        yield pid
        queue += children(pid)


def inside(path: str, root: str, culprit: str) -> str:
    """``path`` (as we see it) as the source sees it, inside its root."""
    if not root or root == "/":
        return path
    if path == root:
        return "/"
    if not path.startswith(root + "/"):
        raise TreeForkRefused(culprit, f"{path} is outside the tree's root {root}")
    return path[len(root):]


def in_namespace_of(host_pid: int, kind: str, nstype: int, work: Callable[[], T], timeout: float | None = None) -> T:
    """``work()``'s result, run on a thread of its own that entered the ``kind`` namespace ("net", "ipc") of
    ``host_pid`` (the calling thread's stays as it is); its exception is raised here, and TimeoutError after
    ``timeout`` seconds."""
    result: list[T] = []
    failure: list[BaseException] = []

    def in_its_namespace() -> None:
        try:
            fd = os.open(f"/proc/{host_pid}/ns/{kind}", os.O_RDONLY)
            try:
                syscalls.setns(fd, nstype)
            finally:
                os.close(fd)
            result.append(work())
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    thread = threading.Thread(target=in_its_namespace, name=f"{kind}ns-{host_pid}", daemon=True)
    thread.start()
    thread.join(timeout)
    if failure:
        raise failure[0]
    if not result:
        raise TimeoutError(f"nothing from the {kind} namespace of pid {host_pid} in {timeout} s")
    return result[0]
