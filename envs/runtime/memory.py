"""Memory accounting for workspaces, measured as docs/design.md section 5 asks: PSS from smaps_rollup summed over a
workspace's processes, cross-checked against its cgroup charge.

Owns: reading /proc/PID/smaps_rollup (and page tables from /proc/PID/status) into MemoryStats, and ``RunMemory``:
a run's memory by both measures side by side (cgroup charge; PSS sum plus the tmpfs/shmem pages no process maps),
its page tables, and what the engine and the nursery use themselves (outside the run's cgroup).
Must never: use RSS alone as "memory" (it counts a shared page once per process that maps it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import msgspec

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


def page_tables(pid: int) -> int:
    """The process's page tables (``VmPTE``), bytes; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmPTE:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


class RunMemory(msgspec.Struct, frozen=True, kw_only=True):
    """A run's memory at one instant, bytes. ``cgroup_charge``: the run's cgroup (every workspace, shared pages
    counted once, page cache and tmpfs included); ``pss``: PSS summed over the run's processes, plus ``shmem``
    (tmpfs and shared memory charged to the run, which PSS counts only where mapped); ``private``: their private
    pages; ``page_tables``: their page tables (in neither figure above under cgroup v1); ``engine`` and
    ``nursery``: those processes' own PSS, outside the run's cgroup."""

    cgroup_charge: int = 0
    pss: int = 0
    shmem: int = 0
    private: int = 0
    page_tables: int = 0
    processes: int = 0
    engine: int = 0
    nursery: int = 0


def run_memory(pids: Iterable[int], cgroup_charge: int, shmem: int, nursery_pid: int | None) -> RunMemory:
    """Read every process of the run (blocking: one smaps_rollup and status read per process)."""
    pids = list(pids)
    total = processes_memory(pids)
    return RunMemory(cgroup_charge=cgroup_charge, pss=total.pss, shmem=shmem, private=total.private,
                     page_tables=sum(page_tables(pid) for pid in pids), processes=total.processes,
                     engine=process_memory(os.getpid()).pss,
                     nursery=process_memory(nursery_pid).pss if nursery_pid else 0)


def processes_memory(pids: Iterable[int], cgroup_charge: int = 0) -> MemoryStats:
    total = MemoryStats(cgroup_charge=cgroup_charge)
    for pid in pids:
        total = total + process_memory(pid)
    return total
