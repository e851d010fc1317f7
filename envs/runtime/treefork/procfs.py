"""Reading /proc for the tree fork: a process's status fields, its children, a tree in order, paths inside a root,
mapping lines.

Owns: these readers, shared by ``reader.py`` (the plan) and ``oracle.py`` (the comparison).
Must never: write to /proc.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from .errors import TreeForkRefused

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
