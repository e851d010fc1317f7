"""Memory accounting for workspaces, measured as DESIGN.md section 5 asks: PSS from smaps_rollup summed over a
workspace's processes, cross-checked against its cgroup charge.

Owns: reading /proc/PID/smaps_rollup and turning it into MemoryStats.
Must never: use RSS alone as "memory" (it counts a shared page once per process that maps it).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..records import MemoryStats

_FIELDS = {
    "Rss:": "rss",
    "Pss:": "pss",
    "Shared_Clean:": "shared",
    "Shared_Dirty:": "shared",
    "Private_Clean:": "private",
    "Private_Dirty:": "private",
    "AnonHugePages:": "anon_huge",
}


def process_memory(pid: int) -> MemoryStats:
    """One process's figures; a process that is gone counts as zero."""
    totals = dict.fromkeys(("rss", "pss", "shared", "private", "anon_huge"), 0)
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(" ")
                name = _FIELDS.get(key)
                if name is not None:
                    totals[name] += int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return MemoryStats()
    return MemoryStats(processes=1, **totals)


def processes_memory(pids: Iterable[int], cgroup_charge: int = 0) -> MemoryStats:
    total = MemoryStats(cgroup_charge=cgroup_charge)
    for pid in pids:
        total = total + process_memory(pid)
    return total
